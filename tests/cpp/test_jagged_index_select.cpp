// The jagged selection kernels (csrc/recops/jagged/kernels) against scalar loops: segment_sum_csr,
// jagged_index_select / jagged_index_add on inclusive offsets (grouped and serial paths),
// keyed_jagged_index_select_dim1 and jagged_unique_indices, on 1 and 4 threads.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "recops/jagged/kernels/jagged_index_select.h"
#include "recops/jagged/kernels/jagged_unique_indices.h"
#include "recops/jagged/kernels/keyed_jagged_index_select.h"
#include "recops/jagged/kernels/segment_sum.h"
#include "test_util.h"

namespace recops::jagged::kernels {
namespace {

using test::offsets_of;
using test::random_integers;
using test::ScopedThreads;

std::vector<int64_t> inclusive(const std::vector<int64_t>& lengths) {
  std::vector<int64_t> ends(lengths.size());
  int64_t total = 0;
  for (size_t i = 0; i < lengths.size(); ++i) ends[i] = total += lengths[i];
  return ends;
}

TEST(JaggedSelection, SegmentSumCsr) {
  const auto lengths = random_integers<int32_t>(700, 0, 9, 3);
  const auto csr = offsets_of(lengths);
  const int64_t batch = 5;
  const auto values = random_integers<int64_t>(csr.back() * batch, -1000, 1000, 4);
  for (int threads : {1, 4}) {
    ScopedThreads scoped(threads);
    std::vector<int64_t> out(lengths.size());
    segment_sum_csr(csr.data(), static_cast<int64_t>(lengths.size()), batch, values.data(),
                    out.data());
    for (size_t s = 0; s < lengths.size(); ++s) {
      int64_t expected = 0;
      for (int64_t i = csr[s] * batch; i < csr[s + 1] * batch; ++i) expected += values[i];
      ASSERT_EQ(out[s], expected) << s;
    }
  }
}

TEST(JaggedSelection, SelectAndAddAgainstLoops) {
  const int64_t cols = 3;
  const auto in_lengths = random_integers<int64_t>(300, 0, 6, 5);
  const auto indices = random_integers<int32_t>(900, 0, 299, 6);
  std::vector<int64_t> out_lengths;
  for (int32_t i : indices) out_lengths.push_back(in_lengths[i]);
  const auto in_ends = inclusive(in_lengths), out_ends = inclusive(out_lengths);
  const int64_t in_rows = in_ends.back(), out_rows = out_ends.back();
  const auto values = random_integers<int64_t>(in_rows * cols, -50, 50, 7);
  for (int threads : {1, 4}) {
    ScopedThreads scoped(threads);
    std::vector<int64_t> selected(out_rows * cols);
    ByteRows src{reinterpret_cast<const char*>(values.data()), in_rows, cols * 8, cols * 8};
    ASSERT_EQ(jagged_index_select_rows(src, indices.data(), in_ends.data(), 300, out_ends.data(),
                                       900, reinterpret_cast<char*>(selected.data()), out_rows),
              -1);
    std::vector<int64_t> expected_select, expected_add(in_rows * cols, 0);
    for (size_t k = 0; k < indices.size(); ++k) {
      const int64_t first = indices[k] == 0 ? 0 : in_ends[indices[k] - 1];
      for (int64_t r = 0; r < in_lengths[indices[k]]; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          expected_select.push_back(values[(first + r) * cols + c]);
        }
      }
    }
    ASSERT_EQ(selected, expected_select);
    // The gradient: selected rows added back (duplicates accumulate).
    for (size_t k = 0; k < indices.size(); ++k) {
      const int64_t first = indices[k] == 0 ? 0 : in_ends[indices[k] - 1];
      const int64_t from = k == 0 ? 0 : out_ends[k - 1];
      for (int64_t r = 0; r < in_lengths[indices[k]]; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          expected_add[(first + r) * cols + c] += selected[(from + r) * cols + c];
        }
      }
    }
    std::vector<int64_t> added(in_rows * cols, 0);
    ValueRows<int64_t> grad{selected.data(), out_rows, cols, cols};
    ASSERT_EQ(jagged_index_add_rows(grad, indices.data(), out_ends.data(), 900, in_ends.data(), 300,
                                    added.data(), in_rows),
              -1);
    ASSERT_EQ(added, expected_add);
  }
}

TEST(JaggedSelection, AddOverlappingTargetsSerially) {
  // Input segments 0 and 1 both target output segment 0, which is shorter than them: the serial
  // path, in input order.
  const std::vector<float> values = {1, 2, 3, 4, 5, 6};
  const std::vector<int64_t> in_ends = {3, 6}, out_ends = {1, 4};
  const std::vector<int64_t> indices = {0, 0};
  std::vector<float> out(4, 0.0f);
  ValueRows<float> src{values.data(), 6, 1, 1};
  ASSERT_EQ(jagged_index_add_rows(src, indices.data(), in_ends.data(), 2, out_ends.data(), 2,
                                  out.data(), 4),
            -1);
  EXPECT_EQ(out, (std::vector<float>{5, 7, 9, 0}));
  // A target beyond the output is reported, nothing added.
  std::vector<float> small(2, 0.0f);
  EXPECT_EQ(jagged_index_add_rows(src, indices.data(), in_ends.data(), 2, out_ends.data(), 2,
                                  small.data(), 2),
            0);
}

TEST(JaggedSelection, SelectReportsBadSegments) {
  const std::vector<float> values = {1, 2, 3};
  const std::vector<int64_t> in_ends = {1, 3}, out_ends = {2, 4};
  std::vector<float> out(4);
  ByteRows src{reinterpret_cast<const char*>(values.data()), 3, 4, 4};
  const std::vector<int64_t> out_of_range = {1, 2};
  EXPECT_EQ(jagged_index_select_rows(src, out_of_range.data(), in_ends.data(), 2, out_ends.data(),
                                     2, reinterpret_cast<char*>(out.data()), 4),
            1);
  const std::vector<int64_t> past_values = {0, 1};  // segment 0 reads rows 0..1, 1 reads 1..2
  EXPECT_EQ(jagged_index_select_rows(src, past_values.data(), in_ends.data(), 2, out_ends.data(), 2,
                                     reinterpret_cast<char*>(out.data()), 4),
            -1);
  const std::vector<int64_t> beyond = {1, 1};  // rows 1..2 then 1..2: fine; offsets past: not
  const std::vector<int64_t> far_ends = {2, 5};
  EXPECT_EQ(jagged_index_select_rows(src, beyond.data(), far_ends.data(), 2, out_ends.data(), 2,
                                     reinterpret_cast<char*>(out.data()), 4),
            0);
}

TEST(JaggedSelection, KeyedSelectDim1) {
  const int64_t batch = 50, keys = 3;
  const auto lengths = random_integers<int32_t>(batch * keys, 0, 4, 9);
  const auto offsets = offsets_of(lengths);
  const auto values = random_integers<int16_t>(offsets.back(), -100, 100, 10);
  const auto indices = random_integers<int64_t>(80, 0, batch - 1, 11);
  KeyedSelection sel{batch, 80};
  const int64_t num_out = keys * 80;
  for (int threads : {1, 4}) {
    ScopedThreads scoped(threads);
    std::vector<int32_t> out_lengths(num_out);
    std::vector<int64_t> out_ends(num_out);
    ASSERT_EQ(select_keyed_lengths(sel, lengths.data(), offsets.data(), indices.data(), num_out,
                                   offsets.back(), out_lengths.data(), out_ends.data()),
              -1);
    std::vector<int16_t> out(num_out ? out_ends.back() : 0);
    ByteStream stream{reinterpret_cast<const char*>(values.data()), offsets.back(),
                      reinterpret_cast<char*>(out.data()), 2};
    ASSERT_EQ(select_keyed_segments(sel, offsets.data(), indices.data(), out_ends.data(), num_out,
                                    &stream, 1),
              -1);
    std::vector<int16_t> expected;
    for (int64_t key = 0; key < keys; ++key) {
      for (int64_t j = 0; j < 80; ++j) {
        const int64_t s = key * batch + indices[j];
        ASSERT_EQ(out_lengths[key * 80 + j], lengths[s]);
        for (int32_t i = offsets[s]; i < offsets[s + 1]; ++i) expected.push_back(values[i]);
      }
    }
    ASSERT_EQ(out, expected);
  }
}

TEST(JaggedSelection, UniqueIndices) {
  // Two features of hash sizes 3 and 4, two bags each.
  const std::vector<int64_t> hsc = {0, 3, 7}, hso = {0, 1, 2}, offsets = {0, 3, 4, 6, 9};
  const std::vector<int64_t> indices = {2, 0, 2, 1, 3, 3, 0, 1, 3};
  KeyedIndices<int64_t> in{hsc.data(), hso.data(), offsets.data(), indices.data(), 2, 4, 9};
  std::vector<int64_t> linear(9), reverse(9), unique(9);
  ASSERT_EQ(linearize_indices(in, linear.data()), -1);
  EXPECT_EQ(linear, (std::vector<int64_t>{2, 0, 2, 1, 6, 6, 3, 4, 6}));
  const int64_t count = rank_unique(linear.data(), 9, reverse.data(), unique.data());
  ASSERT_EQ(count, 6);
  unique.resize(count);
  EXPECT_EQ(unique, (std::vector<int64_t>{0, 1, 2, 3, 4, 6}));
  EXPECT_EQ(reverse, (std::vector<int64_t>{2, 0, 2, 1, 5, 5, 3, 4, 5}));
  std::vector<int64_t> unique_indices(count);
  first_index_of_each_rank(indices.data(), reverse.data(), 9, unique_indices.data());
  EXPECT_EQ(unique_indices, (std::vector<int64_t>{0, 1, 2, 0, 1, 3}));
  std::vector<int64_t> lengths(4, 0);
  unique_lengths(in, unique.data(), count, lengths.data());
  EXPECT_EQ(lengths, (std::vector<int64_t>{2, 1, 2, 1}));  // 3 distinct in feature 0, 3 in 1
  // The radix sort (values spread past the dense table) gives the same ranks.
  std::vector<int64_t> spread = {5'000'000, 0, 5'000'000, 7}, rev2(4), uniq2(4);
  ASSERT_EQ(rank_unique(spread.data(), 4, rev2.data(), uniq2.data()), 3);
  EXPECT_EQ(rev2, (std::vector<int64_t>{2, 0, 2, 1}));
  // Spreads of 32 bits or more take the comparison sort.
  const int64_t far = int64_t{1} << 40;
  std::vector<int64_t> wide = {far, 3, far, 0}, rev3(4), uniq3(4);
  ASSERT_EQ(rank_unique(wide.data(), 4, rev3.data(), uniq3.data()), 3);
  EXPECT_EQ(rev3, (std::vector<int64_t>{2, 1, 2, 0}));
  uniq3.resize(3);
  EXPECT_EQ(uniq3, (std::vector<int64_t>{0, 3, far}));
  // Random values over 26 bits (several radix passes): ranks agree with an ordered set.
  std::mt19937_64 rng(7);
  std::vector<int64_t> values(20'000), rev4(values.size()), uniq4(values.size());
  for (int64_t& v : values) v = static_cast<int64_t>(rng() % (uint64_t{1} << 26));
  const std::set<int64_t> distinct(values.begin(), values.end());
  ASSERT_EQ(
      rank_unique(values.data(), static_cast<int64_t>(values.size()), rev4.data(), uniq4.data()),
      static_cast<int64_t>(distinct.size()));
  uniq4.resize(distinct.size());
  EXPECT_EQ(uniq4, std::vector<int64_t>(distinct.begin(), distinct.end()));
  for (size_t i = 0; i < values.size(); ++i) ASSERT_EQ(uniq4[rev4[i]], values[i]);
  // An index past its feature's hash size is reported.
  const std::vector<int64_t> bad = {2, 0, 3, 1, 3, 3, 0, 1, 3};
  in.indices = bad.data();
  EXPECT_EQ(linearize_indices(in, linear.data()), 2);
}

}  // namespace
}  // namespace recops::jagged::kernels
