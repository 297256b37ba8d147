// Segment permutation on raw bytes: output segment i is a copy of input segment permute[i].
// Segments are contiguous runs of rows, so each one moves with a single memcpy whatever the
// dtype; segments are independent and copied in parallel.
#pragma once

#include <ATen/Parallel.h>

#include <cstdint>
#include <cstring>

#include "recops/common/parallel.h"

namespace recops::sparse::kernels {

// dst segment i (rows [dst_offsets[i], dst_offsets[i+1])) = src segment permute[i]
// (rows [src_offsets[p], src_offsets[p+1])). Offsets count rows of `row_bytes` bytes.
template <typename perm_t>
void permute_segments(const perm_t* permute, int64_t num_out, const int64_t* src_offsets,
                      const int64_t* dst_offsets, const char* src, char* dst, int64_t row_bytes) {
  const int64_t total_bytes = dst_offsets[num_out] * row_bytes;
  const int64_t avg_bytes = num_out > 0 ? total_bytes / num_out : 0;
  at::parallel_for(0, num_out, grain_for_bytes(avg_bytes), [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t p = permute[i];
      const int64_t bytes = (src_offsets[p + 1] - src_offsets[p]) * row_bytes;
      if (bytes > 0) {
        std::memcpy(dst + dst_offsets[i] * row_bytes, src + src_offsets[p] * row_bytes, bytes);
      }
    }
  });
}

// dst row i = src row permute[i], all rows `row_bytes` wide.
template <typename perm_t>
void permute_rows(const perm_t* permute, int64_t num_out, const char* src, char* dst,
                  int64_t row_bytes) {
  at::parallel_for(0, num_out, grain_for_bytes(row_bytes), [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      std::memcpy(dst + i * row_bytes, src + static_cast<int64_t>(permute[i]) * row_bytes,
                  row_bytes);
    }
  });
}

// sums[r] = sum of row r of a [rows, cols] matrix of non-negative lengths.
template <typename index_t>
void row_sums(const index_t* lengths, int64_t rows, int64_t cols, int64_t* sums) {
  at::parallel_for(0, rows, grain_for_bytes(cols * sizeof(index_t)), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      int64_t sum = 0;
      for (int64_t c = 0; c < cols; ++c) sum += lengths[r * cols + c];
      sums[r] = sum;
    }
  });
}

// inverse[permute[i]] = i.
template <typename perm_t>
void invert_permutation(const perm_t* permute, int64_t n, perm_t* inverse) {
  at::parallel_for(0, n, grain_for_bytes(2 * sizeof(perm_t)), [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) inverse[permute[i]] = static_cast<perm_t>(i);
  });
}

}  // namespace recops::sparse::kernels
