// expand_into_jagged_permute (csrc/recops/sparse/kernels/expand_into_jagged_permute.h) against a
// scalar loop: random segment permutations with empty segments, both index widths, 1 and 4
// threads, and the overflow report of int32 ramps.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "recops/sparse/kernels/expand_into_jagged_permute.h"
#include "test_util.h"

namespace recops::sparse::kernels {
namespace {

using test::random_integers;
using test::ScopedThreads;

template <typename perm_t, typename offset_t>
void check_random(int64_t segments, int threads, unsigned seed) {
  const std::vector<int64_t> lengths = random_integers<int64_t>(segments, 0, 6, seed);
  std::vector<perm_t> permute(segments);
  std::iota(permute.begin(), permute.end(), perm_t{0});
  std::shuffle(permute.begin(), permute.end(), std::mt19937(seed));
  std::vector<offset_t> input_offsets(segments + 1, 0), output_offsets(segments + 1, 0);
  for (int64_t t = 0; t < segments; ++t) {
    input_offsets[t + 1] = input_offsets[t] + static_cast<offset_t>(lengths[t]);
    output_offsets[t + 1] = output_offsets[t] + static_cast<offset_t>(lengths[permute[t]]);
  }
  std::vector<offset_t> want;
  for (int64_t t = 0; t < segments; ++t) {
    for (int64_t i = 0; i < lengths[permute[t]]; ++i) {
      want.push_back(static_cast<offset_t>(input_offsets[permute[t]] + i));
    }
  }
  std::vector<offset_t> got(want.size(), -7);
  {
    ScopedThreads scope(threads);
    EXPECT_TRUE(expand_into_jagged_permute(permute.data(), segments, input_offsets.data(),
                                           output_offsets.data(), got.data()));
  }
  EXPECT_EQ(got, want);
}

TEST(ExpandIntoJaggedPermute, MatchesScalarLoop) {
  for (int threads : {1, 4}) {
    for (int64_t segments : {0, 1, 9, 2000}) {
      check_random<int32_t, int32_t>(segments, threads, 1);
      check_random<int64_t, int32_t>(segments, threads, 2);
      check_random<int32_t, int64_t>(segments, threads, 3);
      check_random<int64_t, int64_t>(segments, threads, 4);
    }
  }
}

TEST(ExpandIntoJaggedPermute, ReportsRampsPastTheOffsetType) {
  const int32_t top = std::numeric_limits<int32_t>::max();
  const std::vector<int32_t> permute = {1, 0};
  const std::vector<int32_t> input_offsets = {0, top - 1, top};
  const std::vector<int32_t> fits = {0, 2, 3}, overflows = {0, 3, 4};
  std::vector<int32_t> out(4, -7);
  EXPECT_TRUE(
      expand_into_jagged_permute(permute.data(), 2, input_offsets.data(), fits.data(), out.data()));
  EXPECT_EQ(out[0], top - 1);
  EXPECT_EQ(out[1], top);
  EXPECT_FALSE(expand_into_jagged_permute(permute.data(), 2, input_offsets.data(), overflows.data(),
                                          out.data()));
  EXPECT_EQ(first_overflowing_segment(permute.data(), 2, input_offsets.data(), overflows.data()),
            0);
  EXPECT_EQ(first_overflowing_segment(permute.data(), 2, input_offsets.data(), fits.data()), -1);
}

}  // namespace
}  // namespace recops::sparse::kernels
