// The loss family's kernels (csrc/recops/loss/kernels/): the sampled softmax loss in double
// against plain loops of its definition (forward) and their central differences (backward), and
// each instruction set's fp32 kernels against the double ones.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "recops/loss/kernels/loss_kernels.h"
#include "test_util.h"

namespace recops::loss::kernels {
namespace {

std::vector<double> random_doubles(int64_t n, uint32_t seed, double scale) {
  const std::vector<float> f = test::random_floats(n, seed);
  std::vector<double> d(f.size());
  for (size_t i = 0; i < f.size(); ++i) d[i] = scale * f[i];
  return d;
}

// 70 rows (a block and a part), d = 9 (queries of row stride 11), 13 negatives, ids in [1, 4]
// so that some negatives are masked.
struct Data {
  int64_t rows = 70, dim = 9, ld_q = 11, count = 13;
  std::vector<double> q = random_doubles(rows * ld_q, 1, 1.0),
                      p = random_doubles(rows * dim, 2, 1.0),
                      n = random_doubles(count * dim, 3, 1.0), w = random_doubles(rows, 4, 1.0);
  std::vector<int64_t> pid, nid;
  Data() {
    for (int64_t i = 0; i < rows; ++i) pid.push_back(1 + i % 4);
    for (int64_t j = 0; j < count; ++j) nid.push_back(1 + (j * 7) % 5);
    for (double& x : w) x = std::abs(x);
  }
  template <typename T>
  SampledSoftmaxProblem<T> problem(const T* qs, const T* ps, const T* ns) const {
    return {rows,       dim, count, qs,         ld_q,     ps,  dim,
            pid.data(), ns,  dim,   nid.data(), w.data(), 0.5, 1e-6};
  }
};

// The loss by its definition.
double loops(const Data& d) {
  double total = 0, weight = 0;
  auto unit = [&](const double* x, int64_t k) {
    double s = 0;
    for (int64_t i = 0; i < d.dim; ++i) s += x[i] * x[i];
    return x[k] / std::max(std::sqrt(s), 1e-6);
  };
  for (int64_t i = 0; i < d.rows; ++i) {
    std::vector<double> logits;
    double positive = 0;
    for (int64_t k = 0; k < d.dim; ++k) positive += d.q[i * d.ld_q + k] * unit(&d.p[i * d.dim], k);
    logits.push_back(positive / 0.5);
    for (int64_t j = 0; j < d.count; ++j) {
      double s = 0;
      for (int64_t k = 0; k < d.dim; ++k) s += d.q[i * d.ld_q + k] * unit(&d.n[j * d.dim], k);
      logits.push_back(d.nid[j] == d.pid[i] ? -5e4 : s / 0.5);
    }
    double m = logits[0], z = 0;
    for (double l : logits) m = std::max(m, l);
    for (double l : logits) z += std::exp(l - m);
    total += d.w[i] * (m + std::log(z) - logits[0]);
    weight += d.w[i];
  }
  return total / weight;
}

TEST(SampledSoftmax, DoubleEqualsLoopsAndFiniteDifferences) {
  Data d;
  const LossKernels<double>& k = loss_kernels<double>();
  const LossSums sums = k.loss(d.problem(d.q.data(), d.p.data(), d.n.data()), nullptr);
  EXPECT_NEAR(sums.weighted_loss / sums.weight, loops(d), 1e-12);
  std::vector<double> gq(d.rows * d.dim), gp(gq.size()), gn(d.count * d.dim);
  const SampledSoftmaxGrads<double> grads{gq.data(), gp.data(), gn.data()};
  // Asked for the gradients too, the pass returns the same sums.
  const LossSums with_grads = k.loss(d.problem(d.q.data(), d.p.data(), d.n.data()), &grads);
  EXPECT_EQ(with_grads.weighted_loss, sums.weighted_loss);
  EXPECT_EQ(with_grads.weight, sums.weight);
  const auto check = [&](std::vector<double>& values, int64_t index, double analytic) {
    const double h = 1e-6, saved = values[index];
    values[index] = saved + h;
    const double up = loops(d);
    values[index] = saved - h;
    const double down = loops(d);
    values[index] = saved;
    EXPECT_NEAR(analytic, (up - down) / (2 * h), 1e-7) << index;
  };
  for (int64_t i : {0L, 35L, 69L}) {
    for (int64_t c : {0L, 8L}) {
      check(d.q, i * d.ld_q + c, gq[i * d.dim + c]);
      check(d.p, i * d.dim + c, gp[i * d.dim + c]);
    }
  }
  for (int64_t j : {0L, 6L, 12L}) check(d.n, j * d.dim + 4, gn[j * d.dim + 4]);
}

class SampledSoftmaxVariants : public ::testing::TestWithParam<CpuIsa> {};

TEST_P(SampledSoftmaxVariants, Fp32EqualsDouble) {
  RECOPS_SKIP_UNLESS_CPU_RUNS(GetParam());
  Data d;
  const std::vector<float> q(d.q.begin(), d.q.end()), p(d.p.begin(), d.p.end()),
      n(d.n.begin(), d.n.end());
  // The double kernels on the fp32 values.
  d.q.assign(q.begin(), q.end());
  d.p.assign(p.begin(), p.end());
  d.n.assign(n.begin(), n.end());
  std::vector<double> gq(d.rows * d.dim), gp(gq.size()), gn(d.count * d.dim);
  std::vector<float> fq(gq.size()), fp(gq.size()), fn(gn.size());
  const SampledSoftmaxGrads<double> want_grads{gq.data(), gp.data(), gn.data()};
  const SampledSoftmaxGrads<float> got_grads{fq.data(), fp.data(), fn.data()};
  const LossSums want =
      loss_kernels<double>().loss(d.problem(d.q.data(), d.p.data(), d.n.data()), &want_grads);
  const LossSums got =
      loss_kernels<float>(GetParam()).loss(d.problem(q.data(), p.data(), n.data()), &got_grads);
  EXPECT_NEAR(got.weighted_loss / got.weight, want.weighted_loss / want.weight, 1e-5);
  test::expect_near_all(std::vector<double>(fq.begin(), fq.end()), gq, 1e-5, "grad_queries");
  test::expect_near_all(std::vector<double>(fp.begin(), fp.end()), gp, 1e-5, "grad_positives");
  test::expect_near_all(std::vector<double>(fn.begin(), fn.end()), gn, 1e-5, "grad_negatives");
}

INSTANTIATE_TEST_SUITE_P(Isa, SampledSoftmaxVariants,
                         ::testing::Values(CpuIsa::kBaseline, CpuIsa::kAvx2, CpuIsa::kAvx512),
                         [](const auto& info) { return std::string(test::isa_name(info.param)); });

}  // namespace
}  // namespace recops::loss::kernels
