// The TBE forward's other layouts (kernels/tbe.h): a variable batch size per feature (FBGEMM's
// VBE: per-feature bag ranges, rows written where output_offsets say) and INT8 rows (D codes, then
// a float32 scale and bias), in every instruction-set variant the CPU runs, against sums written
// out here.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "recops/embedding/kernels/bounds_check.h"
#include "recops/embedding/kernels/tbe.h"
#include "test_util.h"

namespace recops::embedding::kernels {
namespace {

class TbeLayouts : public ::testing::TestWithParam<CpuIsa> {};

// Two features of dims 2 and 3 on tables of 4 rows (row r of feature t holds 10 t + r + d / 10);
// feature 0 has bags {1, 2} and {} and {3}, feature 1 has bag {0, 3}: as two ranks of batch sizes
// [[1, 2], [1, 0]], the output is rank 0's f0 row, f1 row, then rank 1's two f0 rows.
TEST_P(TbeLayouts, VariableBatchWritesRowsWhereTheOutputOffsetsSay) {
  RECOPS_SKIP_UNLESS_CPU_RUNS(GetParam());
  const std::vector<int32_t> D_offsets = {0, 2, 5};
  const std::vector<int64_t> weights_offsets = {0, 8}, rows = {4, 4};
  std::vector<float> weights(8 + 12);
  for (int64_t r = 0; r < 4; ++r) {
    for (int64_t d = 0; d < 2; ++d) weights[r * 2 + d] = r + d / 10.0f;
    for (int64_t d = 0; d < 3; ++d) weights[8 + r * 3 + d] = 10 + r + d / 10.0f;
  }
  const std::vector<int64_t> indices = {1, 2, 3, 0, 3};
  const std::vector<int64_t> offsets = {0, 2, 2, 3, 5};
  const std::vector<int64_t> bag_offsets = {0, 3, 4};
  // Bags 0..2 (feature 0) and 3 (feature 1), rank-major: f0 bag 0, f1 bag 0, f0 bags 1 and 2.
  const std::vector<int64_t> output_offsets = {0, 5, 7, 2};
  FeatureLayout layout;
  layout.num_features = 2;
  layout.batch_size = 3;
  layout.total_D = 5;
  layout.max_D = 3;
  layout.D_offsets = D_offsets.data();
  layout.weights_offsets = weights_offsets.data();
  layout.rows = rows.data();
  layout.bag_offsets = bag_offsets.data();
  layout.output_offsets = output_offsets.data();
  EXPECT_EQ(layout.num_bags(), 4);
  EXPECT_EQ(layout.bags_of(0), 3);
  EXPECT_EQ(layout.output_offset(1, 0), 2);
  ForwardArgs args;
  args.layout = layout;
  args.bags.indices = indices.data();
  args.bags.offsets = offsets.data();
  args.bags.num_indices = 5;
  args.weights = weights.data();
  std::vector<float> out(9, -1.0f);
  args.out = out.data();
  EXPECT_EQ(tbe_kernels(GetParam()).forward(args), -1);
  const std::vector<float> expected = {3, 3.2f, 23, 23.2f, 23.4f, 0, 0, 3, 3.1f};
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_NEAR(out[i], expected[i], 1e-5) << i;
}

// One table of 3 INT8 rows of dim 5: code c, scale 0.5 (r + 1), bias r - 1.
TEST_P(TbeLayouts, Int8RowsAreScaledCodesPlusBias) {
  RECOPS_SKIP_UNLESS_CPU_RUNS(GetParam());
  constexpr int64_t D = 5, kRowSize = D + kInt8RowTail;
  std::vector<uint8_t> weights(3 * kRowSize);
  for (int64_t r = 0; r < 3; ++r) {
    for (int64_t d = 0; d < D; ++d) weights[r * kRowSize + d] = static_cast<uint8_t>(40 * r + d);
    const float scale_bias[2] = {0.5f * (r + 1), r - 1.0f};
    std::memcpy(weights.data() + r * kRowSize + D, scale_bias, sizeof(scale_bias));
  }
  const auto value = [](int64_t r, int64_t d) { return 0.5f * (r + 1) * (40 * r + d) + r - 1; };
  const std::vector<int32_t> D_offsets = {0, D};
  const std::vector<int64_t> weights_offsets = {0}, rows = {3};
  const std::vector<int64_t> indices = {2, 0, 1, 7}, offsets = {0, 2, 3};
  const std::vector<float> psw = {2, 1, 1, 1};
  FeatureLayout layout;
  layout.num_features = 1;
  layout.batch_size = 2;
  layout.total_D = D;
  layout.max_D = D;
  layout.D_offsets = D_offsets.data();
  layout.weights_offsets = weights_offsets.data();
  layout.rows = rows.data();
  ForwardArgs args;
  args.layout = layout;
  args.bags.indices = indices.data();
  args.bags.offsets = offsets.data();
  args.bags.num_indices = 3;
  args.bags.per_sample_weights = psw.data();
  args.int8_weights = true;
  args.weights = weights.data();
  std::vector<float> out(2 * D);
  args.out = out.data();
  EXPECT_EQ(tbe_kernels(GetParam()).forward(args), -1);
  for (int64_t d = 0; d < D; ++d) {
    EXPECT_NEAR(out[d], 2 * value(2, d) + value(0, d), 1e-4) << d;
    EXPECT_NEAR(out[D + d], value(1, d), 1e-4) << d;
  }
  const std::vector<int64_t> bad_offsets = {0, 2, 4};  // bag 1 reaches the out-of-range 7
  args.bags.offsets = bad_offsets.data();
  args.bags.num_indices = 4;
  EXPECT_EQ(tbe_kernels(GetParam()).forward(args), 3);
}

// Bounds checks take each feature's bag range: index 5 is in range for feature 0 (6 rows) and
// out of range for feature 1 (4 rows), whose single bag is bag 2.
TEST(TbeBoundsCheck, VariableBatchChecksEachIndexAgainstItsFeature) {
  const std::vector<int64_t> rows = {6, 4}, bag_offsets = {0, 2, 3};
  std::vector<int64_t> indices = {5, 5, 5}, offsets = {0, 1, 2, 3};
  const BoundsReport report = check_bounds<int64_t>(rows.data(), 2, bag_offsets.data(), 3,
                                                    indices.data(), offsets.data(), 3,
                                                    /*repair=*/true);
  EXPECT_EQ(report.bad_indices, 1);
  EXPECT_EQ(report.first_bad_index, 2);
  EXPECT_EQ(indices, (std::vector<int64_t>{5, 5, 0}));
}

// FBGEMM's rules: -1 marks a pruned row and is left alone; bags past the last feature's (a
// variable batch size covering fewer bags than offsets has) are not checked, but the last offset
// is still set to the number of indices.
TEST(TbeBoundsCheck, PrunedRowsAndUncoveredBags) {
  const std::vector<int64_t> rows = {6}, bag_offsets = {0, 1};
  std::vector<int64_t> indices = {-1, 9, -2}, offsets = {0, 1, 7, 5};
  const BoundsReport report = check_bounds<int64_t>(rows.data(), 1, bag_offsets.data(), 3,
                                                    indices.data(), offsets.data(), 3,
                                                    /*repair=*/true);
  EXPECT_EQ(report.bad_bags, 0);
  EXPECT_EQ(report.bad_indices, 0);
  EXPECT_EQ(indices, (std::vector<int64_t>{-1, 9, -2}));
  EXPECT_EQ(offsets, (std::vector<int64_t>{0, 1, 7, 3}));
}

INSTANTIATE_TEST_SUITE_P(Isa, TbeLayouts,
                         ::testing::Values(CpuIsa::kBaseline, CpuIsa::kAvx2, CpuIsa::kAvx512),
                         [](const auto& info) { return std::string(test::isa_name(info.param)); });

}  // namespace
}  // namespace recops::embedding::kernels
