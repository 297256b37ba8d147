// The retrieval family's kernel (csrc/recops/retrieval/kernels/): mips_topk against plain loops of
// its definition (scores in double, excluded ones -inf, a stable sort NaN first), on integer
// rows whose fp32 scores are exact, for every instruction set, query rows few and many (the two
// products), one span of candidates and several (one thread and two).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

#include "recops/retrieval/kernels/mips_topk.h"
#include "test_util.h"

namespace recops::retrieval::kernels {
namespace {

struct Case {
  int64_t rows, count, dim, ld, k;
  bool exclusions;
};

struct Data {
  Case c;
  std::vector<double> q, cand;
  std::vector<int64_t> offsets, excluded;

  explicit Data(const Case& c_)
      : c(c_),
        q(test::random_integers<double>(c.rows * c.ld, -3, 3, 1)),
        cand(test::random_integers<double>(c.count * c.ld, -3, 3, 2)) {
    if (!c.exclusions) return;
    const auto lengths = test::random_integers<int64_t>(c.rows, 0, 5, 3);
    offsets = test::offsets_of(lengths);
    excluded = test::random_integers<int64_t>(offsets.back(), 0, c.count - 1, 4);
  }

  template <typename T>
  MipsTopkProblem<T> problem(const std::vector<T>& qs, const std::vector<T>& cs) const {
    return {c.rows,
            c.count,
            c.dim,
            c.k,
            qs.data(),
            c.ld,
            cs.data(),
            c.ld,
            c.exclusions ? offsets.data() : nullptr,
            c.exclusions ? excluded.data() : nullptr};
  }

  // The definition: (values, indices) [rows, k].
  std::pair<std::vector<double>, std::vector<int64_t>> expected() const {
    std::vector<double> values;
    std::vector<int64_t> indices;
    for (int64_t m = 0; m < c.rows; ++m) {
      std::vector<double> s(c.count);
      for (int64_t j = 0; j < c.count; ++j) {
        for (int64_t e = 0; e < c.dim; ++e) s[j] += q[m * c.ld + e] * cand[j * c.ld + e];
      }
      if (c.exclusions) {
        for (int64_t i = offsets[m]; i < offsets[m + 1]; ++i) {
          s[excluded[i]] = -std::numeric_limits<double>::infinity();
        }
      }
      std::vector<int64_t> order(c.count);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
        if (std::isnan(s[a]) != std::isnan(s[b])) return std::isnan(s[a]);
        return s[a] > s[b];
      });
      for (int64_t i = 0; i < c.k; ++i) {
        values.push_back(s[order[i]]);
        indices.push_back(order[i]);
      }
    }
    return {values, indices};
  }
};

class MipsTopk : public ::testing::TestWithParam<std::tuple<CpuIsa, Case>> {};

TEST_P(MipsTopk, EqualsTheDefinition) {
  const auto [isa, c] = GetParam();
  RECOPS_SKIP_UNLESS_CPU_RUNS(isa);
  const Data d(c);
  const auto [want_values, want_indices] = d.expected();
  const std::vector<float> qf(d.q.begin(), d.q.end()), cf(d.cand.begin(), d.cand.end());
  for (const int threads : {1, 2}) {
    test::ScopedThreads scoped(threads);
    std::vector<double> values(c.rows * c.k);
    std::vector<int64_t> indices(c.rows * c.k);
    mips_topk(d.problem(d.q, d.cand), values.data(), indices.data(), isa);
    EXPECT_EQ(indices, want_indices) << "double, threads " << threads;
    EXPECT_EQ(values, want_values) << "double, threads " << threads;
    std::vector<float> fvalues(c.rows * c.k);
    std::fill(indices.begin(), indices.end(), -1);
    mips_topk(d.problem(qf, cf), fvalues.data(), indices.data(), isa);
    EXPECT_EQ(indices, want_indices) << "float, threads " << threads;
    EXPECT_EQ(std::vector<double>(fvalues.begin(), fvalues.end()), want_values)
        << "float, threads " << threads;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, MipsTopk,
    ::testing::Combine(::testing::Values(CpuIsa::kBaseline, CpuIsa::kAvx2, CpuIsa::kAvx512),
                       ::testing::Values(Case{1, 5000, 64, 64, 10, true},  // two spans
                                         Case{3, 600, 9, 11, 600, false},  // k = N
                                         Case{20, 700, 17, 17, 25, true},  // transposed product
                                         Case{60, 300, 33, 40, 7, true},   // two blocks
                                         Case{5, 40, 0, 1, 12, false})),   // d = 0: all ties
    [](const auto& info) {
      const Case& c = std::get<1>(info.param);
      return std::string(test::isa_name(std::get<0>(info.param))) + "_rows" +
             std::to_string(c.rows) + "_n" + std::to_string(c.count) + "_d" + std::to_string(c.dim);
    });

}  // namespace
}  // namespace recops::retrieval::kernels
