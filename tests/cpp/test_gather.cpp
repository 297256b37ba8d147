// Gather family kernels (csrc/recops/gather/kernels) against scalar loops: gather_for_rank1's
// y = x[index] and its backward, the scatter-add, on both of its strategies (per-chunk partial
// histograms and owner-computes ranges), for every floating type; bad indices are reported by
// position.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "recops/common/half_bits.h"
#include "recops/gather/kernels/gather.h"
#include "test_util.h"

namespace recops::gather::kernels {
namespace {

using test::random_integers;
using test::ScopedThreads;

template <typename value_t, typename index_t>
void check_gather(int64_t n, int64_t num_indices) {
  std::vector<value_t> x(n);
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<value_t>(i * 7 + 3);
  const std::vector<index_t> index = random_integers<index_t>(num_indices, 0, n - 1);
  std::vector<value_t> y(num_indices), expected(num_indices);
  for (int64_t i = 0; i < num_indices; ++i) expected[i] = x[index[i]];
  EXPECT_EQ(gather(x.data(), n, index.data(), num_indices, y.data()), -1);
  EXPECT_EQ(y, expected);
}

TEST(Gather, GathersEveryWidthAndIndexType) {
  check_gather<uint32_t, int32_t>(10, 25);
  check_gather<uint64_t, int64_t>(1000, 3);
  check_gather<uint16_t, int64_t>(5, 0);
  ScopedThreads threads(4);
  check_gather<uint32_t, int64_t>(100000, 300000);
}

TEST(Gather, ReportsTheFirstBadIndex) {
  ScopedThreads threads(4);
  const std::vector<uint32_t> x = {1, 2, 3};
  for (const int64_t num_indices : {int64_t{6}, int64_t{200000}}) {
    std::vector<int64_t> index(num_indices, 1);
    index[num_indices - 2] = 3;
    index[num_indices - 1] = -1;
    std::vector<uint32_t> y(num_indices);
    EXPECT_EQ(gather(x.data(), 3, index.data(), num_indices, y.data()), num_indices - 2);
  }
}

template <typename T>
double as_double(T x) {
  return static_cast<double>(static_cast<accumulate_t<T>>(x));
}

// out[k] = sum of grad[i] over index[i] == k, accumulated in double.
template <typename scalar_t, typename index_t>
std::vector<double> scalar_scatter_add(const std::vector<scalar_t>& grad,
                                       const std::vector<index_t>& index, int64_t n) {
  std::vector<double> out(n, 0.0);
  for (size_t i = 0; i < index.size(); ++i) out[index[i]] += as_double(grad[i]);
  return out;
}

template <typename scalar_t, typename index_t>
void check_scatter_add(int64_t n, int64_t num_indices, double tolerance) {
  using acc_t = accumulate_t<scalar_t>;
  const std::vector<float> values = test::random_floats(num_indices);
  std::vector<scalar_t> grad;
  for (const float v : values) grad.push_back(static_cast<scalar_t>(v));
  // Runs of one index, as neighbouring elements often share a bin.
  std::vector<index_t> index = random_integers<index_t>(num_indices, 0, n - 1);
  for (int64_t i = 1; i < num_indices; i += 3) index[i] = index[i - 1];
  std::vector<scalar_t> out(n, static_cast<scalar_t>(99.0f));
  EXPECT_EQ(scatter_add<acc_t>(grad.data(), index.data(), num_indices, n, out.data()), -1);
  const std::vector<double> expected = scalar_scatter_add(grad, index, n);
  for (int64_t k = 0; k < n; ++k) {
    ASSERT_NEAR(as_double(out[k]), expected[k], tolerance * (1 + std::abs(expected[k])))
        << "slot " << k << " of " << n;
  }
}

TEST(ScatterAdd, PartialHistogramsEveryFloatingType) {
  check_scatter_add<float, int32_t>(7, 50, 1e-6);
  check_scatter_add<double, int64_t>(129, 1000, 1e-12);
  check_scatter_add<float, int64_t>(3, 0, 0);  // no indices: all zero
  ScopedThreads threads(4);
  // Several chunks, few slots: partial tables, with (n = 129) and without interleaved lanes.
  check_scatter_add<float, int64_t>(129, 400000, 1e-5);
  check_scatter_add<double, int32_t>(5000, 400000, 1e-12);
  check_scatter_add<Fp16, int32_t>(129, 100000, 2e-3);
  check_scatter_add<Bf16, int64_t>(129, 100000, 1e-2);
}

TEST(ScatterAdd, OwnerComputesRangesWhenSlotsOutnumberIndices) {
  ScopedThreads threads(4);
  check_scatter_add<float, int64_t>(200000, 100000, 1e-6);
  check_scatter_add<double, int32_t>(100001, 70000, 1e-12);
  check_scatter_add<Bf16, int32_t>(300000, 50000, 1e-2);
}

TEST(ScatterAdd, ReportsTheFirstBadIndex) {
  ScopedThreads threads(4);
  for (const int64_t n : {int64_t{10}, int64_t{500000}}) {  // partial tables, owned ranges
    const int64_t num_indices = 100000;
    std::vector<int32_t> index = random_integers<int32_t>(num_indices, 0, n - 1);
    index[70000] = static_cast<int32_t>(n);
    index[90000] = -1;
    const std::vector<float> grad(num_indices, 1.0f);
    std::vector<float> out(n);
    EXPECT_EQ(scatter_add<float>(grad.data(), index.data(), num_indices, n, out.data()), 70000);
  }
}

}  // namespace
}  // namespace recops::gather::kernels
