// Jagged family kernels (csrc/recops/jagged/kernels) against scalar loops: jagged <-> padded dense
// copies with one and two jagged dims, the scans (complete / exclusive / inclusive cumsum) and
// offsets_range, including empty inputs and zero-length segments.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#include "recops/common/half_bits.h"
#include "recops/common/prefix_sum.h"
#include "recops/jagged/kernels/cumsum.h"
#include "recops/jagged/kernels/jagged_dense.h"
#include "recops/jagged/kernels/offsets_range.h"
#include "test_util.h"

namespace recops::jagged::kernels {
namespace {

using test::offsets_of;
using test::random_integers;
using test::ScopedThreads;

// A jagged tensor: offsets per level (level d indexes rows of level d + 1) and `inner` elements
// per values row.
template <typename index_t>
struct Jagged {
  std::vector<std::vector<index_t>> offsets;
  std::vector<int64_t> max_lengths;
  int64_t inner = 1;

  int64_t batch() const { return static_cast<int64_t>(offsets[0].size()) - 1; }
  int64_t rows() const { return offsets.back().back(); }
  JaggedLayout<index_t> layout() const {
    JaggedLayout<index_t> l;
    l.num_jagged_dims = static_cast<int>(offsets.size());
    for (int d = 0; d < l.num_jagged_dims; ++d) {
      l.offsets[d] = offsets[d].data();
      l.max_lengths[d] = max_lengths[d];
    }
    l.batch = batch();
    l.inner = inner;
    return l;
  }
  int64_t dense_numel() const {
    int64_t n = batch() * inner;
    for (const int64_t m : max_lengths) n *= m;
    return n;
  }
};

// Calls fn(dense_row, values_row) for every dense row [inner] of the padded view, values_row -1
// where the position is padding; walks coordinates (b, i_0, ..., i_{K-1}) in dense order.
template <typename index_t, typename Fn>
void for_each_dense_row(const Jagged<index_t>& j, const Fn& fn) {
  const int K = static_cast<int>(j.offsets.size());
  int64_t dense_row = 0;
  // row: the row of level `level` the coordinate so far selects (-1: past a row's length).
  std::function<void(int, int64_t)> walk = [&](int level, int64_t row) {
    for (int64_t i = 0; i < j.max_lengths[level]; ++i) {
      int64_t child = -1;
      if (row >= 0) {
        const int64_t begin = j.offsets[level][row], end = j.offsets[level][row + 1];
        if (i < end - begin) child = begin + i;
      }
      if (level + 1 == K) {
        fn(dense_row++, child);
      } else {
        walk(level + 1, child);
      }
    }
  };
  for (int64_t b = 0; b < j.batch(); ++b) walk(0, b);
}

template <typename elem_t, typename index_t>
void check_jagged_dense_round_trip(const Jagged<index_t>& j, elem_t padding) {
  const int64_t inner = j.inner;
  std::vector<elem_t> values(j.rows() * inner);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<elem_t>(3 * i + 1);
  std::vector<elem_t> dense(j.dense_numel(), elem_t{0});
  jagged_to_dense(j.layout(), values.data(), padding, dense.data());

  std::vector<elem_t> expected_dense(j.dense_numel());
  const elem_t untouched = static_cast<elem_t>(12345);
  std::vector<elem_t> expected_values(values.size(), untouched);  // rows no slab reaches
  std::vector<bool> row_reached(j.rows(), false);
  for_each_dense_row(j, [&](int64_t dense_row, int64_t values_row) {
    for (int64_t c = 0; c < inner; ++c) {
      expected_dense[dense_row * inner + c] =
          values_row >= 0 ? values[values_row * inner + c] : padding;
      if (values_row >= 0)
        expected_values[values_row * inner + c] = expected_dense[dense_row * inner + c];
    }
    if (values_row >= 0) row_reached[values_row] = true;
  });
  EXPECT_EQ(dense, expected_dense);

  // Back: reached rows get their dense row; rows of a reached run past the dense extent become 0.
  const JaggedLayout<index_t> layout = j.layout();
  for (int64_t slab = 0; slab < layout.num_slabs(); ++slab) {
    int64_t begin = 0, length = 0;
    if (!layout.segment_of_slab(slab, &begin, &length)) continue;
    for (int64_t r = begin; r < begin + length; ++r) {
      if (!row_reached[r]) std::fill_n(expected_values.begin() + r * inner, inner, elem_t{0});
    }
  }
  std::vector<elem_t> back(values.size(), untouched);
  dense_to_jagged(layout, dense.data(), back.data());
  EXPECT_EQ(back, expected_values);
}

TEST(JaggedDense, OneJaggedDimScalarRowsWithTruncationAndEmptyRows) {
  Jagged<int32_t> j;
  j.offsets = {offsets_of<int32_t>({3, 0, 5, 1})};
  j.max_lengths = {4};
  check_jagged_dense_round_trip<uint32_t>(j, 7);
  j.max_lengths = {0};
  check_jagged_dense_round_trip<uint32_t>(j, 7);
}

TEST(JaggedDense, OneJaggedDimVectorRowsAndFirstOffsetAboveZero) {
  Jagged<int64_t> j;
  j.offsets = {{2, 4, 4, 7}};  // rows 0 and 1 belong to no bag
  j.max_lengths = {2};
  j.inner = 3;
  check_jagged_dense_round_trip<uint16_t>(j, 0xBEEF);
}

TEST(JaggedDense, TwoJaggedDims) {
  Jagged<int64_t> j;
  j.offsets = {offsets_of<int64_t>({2, 0, 3}), offsets_of<int64_t>({1, 0, 4, 2, 3})};
  j.max_lengths = {2, 3};  // the third bag's third row is truncated
  j.inner = 2;
  check_jagged_dense_round_trip<uint64_t>(j, ~uint64_t{0});
}

TEST(JaggedDense, EmptyBatch) {
  Jagged<int32_t> j;
  j.offsets = {{0}};
  j.max_lengths = {5};
  check_jagged_dense_round_trip<uint8_t>(j, 1);
}

TEST(JaggedDense, ManySlabsInParallelAndStreamed) {
  ScopedThreads threads(4);
  Jagged<int32_t> j;
  j.offsets = {offsets_of(random_integers<int32_t>(20000, 0, 6))};
  j.max_lengths = {5};
  check_jagged_dense_round_trip<uint32_t>(j, 0);
  // Rows of 200 floats: long enough runs for streaming stores, forced on by the threshold.
  Jagged<int32_t> wide;
  wide.offsets = {offsets_of(random_integers<int32_t>(300, 0, 4, 2))};
  wide.max_lengths = {3};
  wide.inner = 200;
  setenv("RECOPS_STREAM_ABOVE_BYTES", "0", 1);
  check_jagged_dense_round_trip<uint32_t>(wide, 0x3F800000);
  unsetenv("RECOPS_STREAM_ABOVE_BYTES");
}

// out[i] = carry + in[0] + ... + in[i] (or in[i - 1]), accumulated in acc_t in order.
template <bool kInclusive, typename acc_t, typename T>
std::vector<T> scalar_scan(const std::vector<T>& in) {
  std::vector<T> out(in.size());
  acc_t carry = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    const acc_t next = carry + static_cast<acc_t>(in[i]);
    out[i] = static_cast<T>(kInclusive ? next : carry);
    carry = next;
  }
  return out;
}

template <typename T>
std::vector<T> as(const std::vector<float>& values) {
  std::vector<T> out;
  for (const float v : values) out.push_back(static_cast<T>(v));
  return out;
}

// Compared as bits: exact, and NaN-safe.
template <typename T>
std::vector<uint64_t> bits_of(const std::vector<T>& values) {
  std::vector<uint64_t> out;
  for (const T& v : values) {
    uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof(T));
    out.push_back(bits);
  }
  return out;
}

template <typename T>
void check_scans(const std::vector<T>& in) {
  using acc_t = accumulate_t<T>;
  std::vector<T> out(in.size());
  prefix_sum<true, acc_t>(in.data(), out.data(), static_cast<int64_t>(in.size()));
  EXPECT_EQ(bits_of(out), bits_of(scalar_scan<true, acc_t>(in)));
  prefix_sum<false, acc_t>(in.data(), out.data(), static_cast<int64_t>(in.size()));
  EXPECT_EQ(bits_of(out), bits_of(scalar_scan<false, acc_t>(in)));
}

TEST(Scans, ExclusiveAndInclusiveEveryElementType) {
  const std::vector<float> small = {1.5f, -2.0f, 0.25f, 3.0f, 0.0f, 7.0f, -0.5f, 1.0f, 2.0f, 9.0f};
  check_scans(as<float>(small));
  check_scans(as<double>(small));
  check_scans(as<Fp16>(small));
  check_scans(as<Bf16>(small));
  check_scans(std::vector<uint8_t>{200, 100, 7, 0, 255});  // wraps as uint8 does
  check_scans(std::vector<int32_t>{});
  check_scans(random_integers<int32_t>(37, -1000, 1000));
  ScopedThreads threads(4);
  check_scans(random_integers<int64_t>(300000, -5, 1000));  // the parallel two-phase scan
  check_scans(random_integers<int32_t>(300000, 0, 3));
}

TEST(Scans, ParallelFloatScanMatchesWithinRounding) {
  ScopedThreads threads(4);
  const std::vector<float> in = test::random_floats(300000);
  std::vector<float> out(in.size());
  prefix_sum<true, float>(in.data(), out.data(), static_cast<int64_t>(in.size()));
  const std::vector<float> expected = scalar_scan<true, double>(in);
  for (size_t i = 0; i < in.size(); i += 997) EXPECT_NEAR(out[i], expected[i], 1e-2) << i;
}

TEST(Scans, CompleteCumsumRows) {
  for (const int64_t rows : {1, 5}) {
    for (const int64_t n : {0, 1, 9}) {
      const std::vector<int64_t> in = random_integers<int64_t>(rows * n, -3, 50);
      std::vector<int64_t> out(rows * (n + 1), -1);
      complete_cumsum_rows<int64_t>(in.data(), out.data(), rows, n);
      for (int64_t r = 0; r < rows; ++r) {
        int64_t sum = 0;
        EXPECT_EQ(out[r * (n + 1)], 0);
        for (int64_t i = 0; i < n; ++i) {
          sum += in[r * n + i];
          EXPECT_EQ(out[r * (n + 1) + i + 1], sum);
        }
      }
    }
  }
  const std::vector<Bf16> in = as<Bf16>({1.0f, 2.0f, 0.5f});
  std::vector<Bf16> out(4);
  complete_cumsum_rows<float>(in.data(), out.data(), 1, 3);
  EXPECT_EQ(bits_of(out), bits_of(as<Bf16>({0.0f, 1.0f, 3.0f, 3.5f})));
}

template <typename index_t>
std::vector<index_t> scalar_offsets_range(const std::vector<index_t>& offsets, int64_t range_size) {
  std::vector<index_t> out(range_size, 0);
  for (size_t s = 0; s < offsets.size(); ++s) {
    const int64_t end = s + 1 < offsets.size() ? offsets[s + 1] : range_size;
    for (int64_t p = offsets[s]; p < end; ++p) out[p] = static_cast<index_t>(p - offsets[s]);
  }
  return out;
}

template <typename index_t>
void check_offsets_range(const std::vector<index_t>& offsets, int64_t range_size) {
  std::vector<index_t> out(range_size, -1);
  offsets_range(offsets.data(), static_cast<int64_t>(offsets.size()), range_size, out.data());
  EXPECT_EQ(out, scalar_offsets_range(offsets, range_size));
}

TEST(OffsetsRange, ShortLongAndEmptySegments) {
  check_offsets_range<int32_t>({0, 3, 3, 10, 40}, 45);
  check_offsets_range<int64_t>({2, 5, 5}, 9);  // positions before offsets[0] are 0
  check_offsets_range<int64_t>({}, 6);
  check_offsets_range<int32_t>({}, 0);
  check_offsets_range<int32_t>({0, 0, 0}, 0);
  ScopedThreads threads(4);
  std::vector<int64_t> lengths = random_integers<int64_t>(50000, 0, 40);
  std::vector<int64_t> offsets = offsets_of(lengths);
  const int64_t range = offsets.back();
  offsets.pop_back();
  check_offsets_range(offsets, range);
}

}  // namespace
}  // namespace recops::jagged::kernels
