// The output walk of the jagged index-select ops: an output jagged tensor whose segment k ends at
// row out_ends[k] (inclusive offsets; segment k starts where segment k - 1 ends, segment 0 at row
// 0) is filled in parallel chunks of rows, each segment piece from wherever its op says.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "recops/common/parallel.h"

namespace recops::jagged::kernels {

// The first row of segment k of a jagged tensor with inclusive offsets `ends`.
inline int64_t segment_begin(const int64_t* ends, int64_t k) {
  return k == 0 ? 0 : ends[k - 1];
}

// Calls fill(k, rel, row, count) for every non-empty piece of the output rows [0, num_rows):
// rows [row, row + count) of the output, rows [rel, rel + count) of its segment k. Chunks of
// about `grain` rows run in parallel; a chunk finds its first segment by binary search
// (out_ends is non-decreasing and out_ends[num_segments - 1] >= num_rows, checked by the
// caller). fill returns false for a segment it cannot fill (bad data); the smallest such k is
// returned, -1 when every piece was filled.
template <typename Fill>
int64_t fill_selected_segments(const int64_t* out_ends, int64_t num_segments, int64_t num_rows,
                               int64_t grain, const Fill& fill) {
  std::atomic<int64_t> first_bad{num_segments};
  parallel_for(0, num_rows, grain, [&](int64_t r0, int64_t r1) {
    int64_t k = std::upper_bound(out_ends, out_ends + num_segments, r0) - out_ends;
    for (int64_t row = r0; row < r1 && k < num_segments; ++k) {
      const int64_t end = std::min(out_ends[k], r1);
      if (end <= row) continue;  // an empty segment
      if (!fill(k, row - segment_begin(out_ends, k), row, end - row)) {
        int64_t seen = first_bad.load();
        while (k < seen && !first_bad.compare_exchange_weak(seen, k)) {
        }
      }
      row = end;
    }
  });
  const int64_t bad = first_bad.load();
  return bad == num_segments ? -1 : bad;
}

}  // namespace recops::jagged::kernels
