// FBGEMM's jagged_index_select_2d_forward and its gradient, jagged_index_add_2d_forward, on 2-D
// jagged tensors given by inclusive offsets (segment k covers rows [ends[k - 1], ends[k]), segment
// 0 starts at row 0).
//
// select: output segment k is the first rows of input segment indices[k]. Output row r of segment
//   k at position rel is input row segment_begin(input_ends, indices[k]) + rel.
// add: the transpose. Input row r of segment k at position rel is added into output row
//   segment_begin(output_ends, indices[k]) + rel.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "recops/common/half_bits.h"
#include "recops/common/parallel.h"
#include "recops/common/streaming.h"
#include "recops/jagged/kernels/selected_segments.h"

namespace recops::jagged::kernels {

// Rows of a 2-D array as bytes: row i starts at data + i * row_stride, row_bytes long.
struct ByteRows {
  const char* data = nullptr;
  int64_t rows = 0;
  int64_t row_stride = 0;  // bytes
  int64_t row_bytes = 0;
};

// The first output segment with rows among [0, num_rows) whose index is outside
// [0, num_input_segments) or whose rows would come from outside the src_rows input rows, or -1.
// Run before the output is allocated, as its size comes from the offsets (output_ends
// non-decreasing from >= 0, checked by the caller).
template <typename index_t>
int64_t first_bad_selection(const index_t* indices, const int64_t* input_ends,
                            int64_t num_input_segments, const int64_t* output_ends,
                            int64_t num_output_segments, int64_t num_rows, int64_t src_rows) {
  for (int64_t k = 0; k < num_output_segments; ++k) {
    const int64_t begin = segment_begin(output_ends, k);
    if (begin >= num_rows) break;
    const int64_t count = std::min(output_ends[k], num_rows) - begin;
    if (count <= 0) continue;
    const int64_t index = indices[k];
    if (index < 0 || index >= num_input_segments) return k;
    const int64_t first = segment_begin(input_ends, index);
    if (first < 0 || first > src_rows || count > src_rows - first) return k;
  }
  return -1;
}

// jagged_index_select_2d_forward into `out` (num_rows contiguous rows of src.row_bytes). The
// caller has checked that output_ends is non-decreasing, starts at >= 0 and that its last entry is
// >= num_rows. Returns -1, or the first output segment whose index is outside
// [0, num_input_segments) or whose rows would lie outside the input.
template <typename index_t>
int64_t jagged_index_select_rows(const ByteRows& src, const index_t* indices,
                                 const int64_t* input_ends, int64_t num_input_segments,
                                 const int64_t* output_ends, int64_t num_output_segments, char* out,
                                 int64_t num_rows) {
  const int64_t row_bytes = src.row_bytes;
  const auto fill = [&](int64_t k, int64_t rel, int64_t row, int64_t count) {
    const int64_t index = indices[k];
    if (index < 0 || index >= num_input_segments) return false;
    const int64_t begin = segment_begin(input_ends, index);
    if (begin < 0 || begin > src.rows || rel > src.rows - begin - count) return false;
    const int64_t first = begin + rel;
    char* dst = out + row * row_bytes;
    const char* from = src.data + first * src.row_stride;
    if (src.row_stride == row_bytes) {
      copy_bytes(dst, from, count * row_bytes, /*streaming=*/false);
    } else {
      for (int64_t i = 0; i < count; ++i) {
        copy_bytes(dst + i * row_bytes, from + i * src.row_stride, row_bytes, false);
      }
    }
    return true;
  };
  return fill_selected_segments(output_ends, num_output_segments, num_rows,
                                grain_for_bytes(row_bytes), fill);
}

// out[i] += in[i] for i in [0, n), in value_t's accumulate type (integers wrap).
template <typename value_t>
void add_row(const value_t* in, value_t* out, int64_t n) {
  if constexpr (std::is_integral_v<value_t>) {
    using unsigned_t = std::make_unsigned_t<value_t>;
    for (int64_t i = 0; i < n; ++i) {
      out[i] =
          static_cast<value_t>(static_cast<unsigned_t>(out[i]) + static_cast<unsigned_t>(in[i]));
    }
  } else {
    using acc_t = accumulate_t<value_t>;
    for (int64_t i = 0; i < n; ++i) {
      out[i] = static_cast<value_t>(static_cast<acc_t>(out[i]) + static_cast<acc_t>(in[i]));
    }
  }
}

// The 2-D values of jagged_index_add: rows of `cols` elements, row i at data + i * row_stride.
template <typename value_t>
struct ValueRows {
  const value_t* data = nullptr;
  int64_t rows = 0;
  int64_t row_stride = 0;  // elements
  int64_t cols = 0;
};

// jagged_index_add_2d_forward: adds every row of `src` (src.rows <= input_ends[last], checked by
// the caller with input_ends non-decreasing from >= 0) into `out` (num_out_rows zeroed rows of
// src.cols). Returns -1, or the first input segment whose index is outside
// [0, num_output_segments) or whose rows would land outside the output.
//
// Input segments with the same index add into the same rows; they are grouped by index so that
// each group runs on one thread, in input order, with no locks: the result does not depend on the
// thread count. That needs the groups' output rows to be disjoint (output_ends non-decreasing and
// no input segment longer than its output segment), true of every gradient of
// jagged_index_select; other inputs are added serially, in input order.
template <typename value_t, typename index_t>
int64_t jagged_index_add_rows(const ValueRows<value_t>& src, const index_t* indices,
                              const int64_t* input_ends, int64_t num_input_segments,
                              const int64_t* output_ends, int64_t num_output_segments, value_t* out,
                              int64_t num_out_rows) {
  // Segments past the last input row add nothing; the rest are checked before any add.
  const int64_t used =
      src.rows == 0 ? 0
                    : std::upper_bound(input_ends, input_ends + num_input_segments, src.rows - 1) -
                          input_ends + 1;
  const auto rows_of = [&](int64_t k) {
    return std::min(input_ends[k], src.rows) - segment_begin(input_ends, k);
  };
  bool disjoint = true;
  for (int64_t k = 0; k + 1 < num_output_segments && disjoint; ++k) {
    disjoint = output_ends[k] <= output_ends[k + 1];
  }
  if (num_output_segments > 0 && output_ends[0] < 0) disjoint = false;
  for (int64_t k = 0; k < used; ++k) {
    const int64_t count = rows_of(k);
    if (count <= 0) continue;
    const int64_t index = indices[k];
    if (index < 0 || index >= num_output_segments) return k;
    const int64_t first = segment_begin(output_ends, index);
    if (first < 0 || first > num_out_rows - count) return k;
    disjoint = disjoint && count <= output_ends[index] - first;
  }
  const auto add_segment = [&](int64_t k) {
    const int64_t count = rows_of(k);
    const int64_t in_first = segment_begin(input_ends, k);
    const int64_t out_first = segment_begin(output_ends, indices[k]);
    for (int64_t i = 0; i < count; ++i) {
      add_row(src.data + (in_first + i) * src.row_stride, out + (out_first + i) * src.cols,
              src.cols);
    }
  };
  if (!disjoint) {
    for (int64_t k = 0; k < used; ++k) {
      if (rows_of(k) > 0) add_segment(k);
    }
    return -1;
  }
  // Input segments grouped by index (a stable counting sort): group g is
  // order[group_begin[g], group_begin[g + 1]).
  std::vector<int64_t> group_begin(num_output_segments + 1, 0);
  for (int64_t k = 0; k < used; ++k) {
    if (rows_of(k) > 0) ++group_begin[indices[k] + 1];
  }
  for (int64_t g = 0; g < num_output_segments; ++g) group_begin[g + 1] += group_begin[g];
  std::vector<int64_t> order(group_begin[num_output_segments]);
  std::vector<int64_t> next(group_begin.begin(), group_begin.end() - 1);
  for (int64_t k = 0; k < used; ++k) {
    if (rows_of(k) > 0) order[next[indices[k]]++] = k;
  }
  const int64_t avg_bytes =
      num_output_segments == 0
          ? 1
          : src.rows * src.cols * static_cast<int64_t>(sizeof(value_t)) / num_output_segments;
  parallel_for(0, num_output_segments, grain_for_bytes(avg_bytes), [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) {
      for (int64_t i = group_begin[g]; i < group_begin[g + 1]; ++i) add_segment(order[i]);
    }
  });
  return -1;
}

}  // namespace recops::jagged::kernels
