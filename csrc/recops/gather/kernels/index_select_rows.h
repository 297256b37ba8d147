// Row gathers and their backward, on raw pointers: the kernels of FBGEMM's index_select_dim0
// family (group_index_select_dim0, batch_index_select_dim0), where several tables of rows are
// gathered in one call.
//
//  * gather_row_groups: out row j of group g = row index_g[j] of table g, one memcpy per row. The
//    rows of all groups form one range split into near-equal chunks, so many small groups and one
//    large group parallelise alike.
//  * scatter_add_rows: grad_in[k] = sum of grad_out rows j with index[j] == k, without atomics:
//    owner-computes as in gather.h, with rows in place of scalars. Destination rows are split into
//    one power-of-two range per chunk, the positions j are bucketed by range with a counting sort
//    (two passes over the index), then one thread sums each range. Each row's sum is formed in
//    position order whatever the thread count, so results are deterministic.
//
// Both validate each index right before using it and report the first bad one; nothing outside
// the tables is read or written.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#include "recops/common/parallel.h"
#include "recops/common/streaming.h"
#include "recops/gather/kernels/gather.h"

namespace recops::gather::kernels {

// A group's indices: int32 or int64, chosen per group.
struct RowIndex {
  const void* data = nullptr;
  bool is_int64 = true;

  int64_t operator[](int64_t j) const {
    return is_int64 ? static_cast<const int64_t*>(data)[j] : static_cast<const int32_t*>(data)[j];
  }
};

// One table of a gather: `count` output rows, row j at dst + j * dst_stride bytes, copied from
// row index[j] of the `rows` x row_bytes table at src.
struct RowGather {
  const char* src = nullptr;
  int64_t rows = 0;
  int64_t row_bytes = 0;
  RowIndex index;
  int64_t count = 0;
  char* dst = nullptr;
  int64_t dst_stride = 0;
};

// The first bad index of a multi-group call: group and position within it, or group -1.
struct BadIndex {
  int64_t group = -1;
  int64_t position = -1;
};

// Gathers every group's rows. Returns the first (group, position) whose index is outside
// [0, rows) (the output is then incomplete), or group -1.
inline BadIndex gather_row_groups(const RowGather* groups, int64_t num_groups) {
  std::vector<int64_t> start(num_groups + 1, 0);
  int64_t bytes = 0;
  for (int64_t g = 0; g < num_groups; ++g) {
    start[g + 1] = start[g] + groups[g].count;
    bytes += groups[g].count * groups[g].row_bytes;
  }
  const int64_t total = start[num_groups];
  if (total == 0) return {};
  const int64_t row_cost = bytes / total + 8;  // the copy, and the index read
  const int64_t chunks = num_chunks(total, grain_for_bytes(row_cost));
  std::vector<int64_t> bad(chunks, -1);  // a global row number
  for_each_chunk(total, chunks, [&](int64_t c, int64_t begin, int64_t end) {
    int64_t g = std::upper_bound(start.begin(), start.end(), begin) - start.begin() - 1;
    for (int64_t i = begin; i < end; ++i) {
      while (start[g + 1] <= i) ++g;
      const RowGather& group = groups[g];
      const int64_t j = i - start[g];
      const int64_t k = group.index[j];
      if (k < 0 || k >= group.rows) {
        bad[c] = i;
        return;
      }
      // copy_bytes: memcpy that also takes the null pointers of rows without elements.
      copy_bytes(group.dst + j * group.dst_stride, group.src + k * group.row_bytes, group.row_bytes,
                 /*streaming=*/false);
    }
  });
  const int64_t first = first_reported(bad);
  if (first < 0) return {};
  const int64_t g = std::upper_bound(start.begin(), start.end(), first) - start.begin() - 1;
  return {g, first - start[g]};
}

// acc[d] += grad[d] for d < width.
template <typename acc_t, typename scalar_t>
inline void add_row(const scalar_t* grad, int64_t width, acc_t* acc) {
  for (int64_t d = 0; d < width; ++d) acc[d] += static_cast<acc_t>(grad[d]);
}

// Sums the rows of positions [begin, end) of `positions` (grad rows, all with index in [lo, hi))
// into out rows [lo, hi), in the order given. acc holds (hi - lo) * width entries when acc_t is
// not scalar_t.
template <typename acc_t, typename scalar_t>
void sum_rows_into(const scalar_t* grad, int64_t grad_stride, const RowIndex& index,
                   const int64_t* positions, int64_t begin, int64_t end, int64_t lo, int64_t hi,
                   int64_t width, acc_t* acc, scalar_t* out) {
  acc_t* sums;
  if constexpr (std::is_same_v<acc_t, scalar_t>) {
    sums = out + lo * width;
  } else {
    sums = acc;
  }
  std::fill(sums, sums + (hi - lo) * width, acc_t(0));
  for (int64_t p = begin; p < end; ++p) {
    const int64_t j = positions == nullptr ? p : positions[p];
    add_row(grad + j * grad_stride, width, sums + (index[j] - lo) * width);
  }
  if constexpr (!std::is_same_v<acc_t, scalar_t>) {
    for (int64_t e = 0; e < (hi - lo) * width; ++e) out[lo * width + e] = scalar_t(sums[e]);
  }
}

// out[k, :] = sum of grad[j, :] over j < count with index[j] == k, for k < rows; grad rows are
// grad_stride elements apart, out is rows x width and contiguous. Accumulates in acc_t. Returns
// the first position whose index is outside [0, rows) (out is then undefined), or -1.
template <typename acc_t, typename scalar_t>
int64_t scatter_add_rows(const scalar_t* grad, int64_t grad_stride, const RowIndex& index,
                         int64_t count, int64_t rows, int64_t width, scalar_t* out) {
  const int64_t row_bytes = width * static_cast<int64_t>(sizeof(scalar_t));
  // Chunks of positions for the two index passes; ranges of rows for the sums, enough to share
  // both the additions and the zeroing of a large table among threads.
  const int64_t chunks = num_chunks(count, grain_for_bytes(row_bytes + 8));
  const int64_t target_ranges = std::max(chunks, num_chunks(rows, grain_for_bytes(row_bytes)));
  if (target_ranges == 1 || rows <= 1) {
    for (int64_t j = 0; j < count; ++j) {
      if (index[j] < 0 || index[j] >= rows) return j;
    }
    std::unique_ptr<acc_t[]> acc;
    if constexpr (!std::is_same_v<acc_t, scalar_t>) acc.reset(new acc_t[rows * width]);
    sum_rows_into(grad, grad_stride, index, static_cast<const int64_t*>(nullptr), 0, count, 0, rows,
                  width, acc.get(), out);
    return -1;
  }
  // Ranges of 2^shift rows, at most target_ranges of them.
  int shift = 0;
  while (((rows - 1) >> shift) + 1 > target_ranges) ++shift;
  const int64_t range_size = int64_t{1} << shift;
  const int64_t ranges = ((rows - 1) >> shift) + 1;

  // Pass 1: validate and count each chunk's positions per range.
  std::vector<int64_t> counts(chunks * ranges, 0);
  std::vector<int64_t> bad(chunks, -1);
  for_each_chunk(count, chunks, [&](int64_t c, int64_t begin, int64_t end) {
    bad[c] = index.is_int64 ? count_ranges(static_cast<const int64_t*>(index.data), begin, end,
                                           rows, shift, counts.data() + c * ranges)
                            : count_ranges(static_cast<const int32_t*>(index.data), begin, end,
                                           rows, shift, counts.data() + c * ranges);
  });
  const int64_t first_bad = first_reported(bad);
  if (first_bad >= 0) return first_bad;

  // Range r's positions are contiguous, ordered by chunk then position: counts become cursors.
  const std::vector<int64_t> range_begin = counts_to_cursors(counts, chunks, ranges);

  // Pass 2: bucket the positions by range.
  std::unique_ptr<int64_t[]> positions(new int64_t[count]);
  for_each_chunk(count, chunks, [&](int64_t c, int64_t begin, int64_t end) {
    int64_t* next = counts.data() + c * ranges;
    for (int64_t j = begin; j < end; ++j) positions[next[index[j] >> shift]++] = j;
  });

  // Pass 3: each range is summed by one thread, in position order.
  parallel_for(0, ranges, 1, [&](int64_t r0, int64_t r1) {
    std::unique_ptr<acc_t[]> acc;
    if constexpr (!std::is_same_v<acc_t, scalar_t>) acc.reset(new acc_t[range_size * width]);
    for (int64_t r = r0; r < r1; ++r) {
      sum_rows_into(grad, grad_stride, index, positions.get(), range_begin[r], range_begin[r + 1],
                    r * range_size, std::min(rows, (r + 1) * range_size), width, acc.get(), out);
    }
  });
  return -1;
}

}  // namespace recops::gather::kernels
