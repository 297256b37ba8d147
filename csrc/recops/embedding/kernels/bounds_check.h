// Validation (and, when asked, repair) of a TBE batch's offsets and indices, FBGEMM's
// bounds_check_indices: a bag whose offsets are out of order or outside the indices is clamped
// into range (start = clamp(start, 0, N), end = clamp(end, start, N), bags in order), and an index
// outside its table's rows becomes 0, except -1, FBGEMM's mark of a pruned row, which is left for
// the lookup (inference skips it; training refuses it). Without repair nothing is written.
#pragma once

#include <algorithm>
#include <cstdint>

#include "recops/common/parallel.h"

namespace recops::embedding::kernels {

struct BoundsReport {
  int64_t bad_bags = 0;          // bags whose offsets were out of order or out of range
  int64_t first_bad_bag = -1;    // its position among all bags
  int64_t bad_indices = 0;       // indices outside their table
  int64_t first_bad_index = -1;  // position in indices
};

struct IndexErrors {
  int64_t count = 0;
  int64_t first = -1;
};

inline IndexErrors combine(const IndexErrors& a, const IndexErrors& b) {
  IndexErrors out{a.count + b.count, a.first};
  if (b.first >= 0 && (out.first < 0 || b.first < out.first)) out.first = b.first;
  return out;
}

// FBGEMM's rule first: the last bag ends at the last index, so a repair moves the last offset
// there (the caller raises instead when not repairing). Then offsets (bags in order, so a
// repaired end is the next bag's start); indices are only checked once every bag lies inside
// [0, N) in order, i.e. never after unrepaired bad offsets. offsets has num_bags + 1 entries;
// feature t has the bags [bag_offsets[t], bag_offsets[t + 1]), and bags past bag_offsets[T] (a
// variable batch size may leave some) are not checked, as in FBGEMM.
template <typename index_t>
BoundsReport check_bounds(const int64_t* rows, int64_t T, const int64_t* bag_offsets,
                          int64_t num_bags, index_t* indices, index_t* offsets, int64_t num_indices,
                          bool repair) {
  BoundsReport report;
  const int64_t bags = bag_offsets[T];
  const auto n = static_cast<index_t>(num_indices);  // fits: the adapter checked
  if (repair && offsets[num_bags] != n) offsets[num_bags] = n;
  for (int64_t k = 0; k < bags; ++k) {
    const index_t start = offsets[k];
    const index_t end = offsets[k + 1];
    if (start >= 0 && start <= end && end <= n) continue;
    if (report.bad_bags++ == 0) report.first_bad_bag = k;
    if (!repair) return report;
    offsets[k] = std::max<index_t>(0, std::min(start, n));
    offsets[k + 1] = std::max(offsets[k], std::min(end, n));
  }
  // One pass over all indices, in chunks that may span features (one parallel region).
  const int64_t first = bags > 0 ? offsets[0] : 0;
  const int64_t last = bags > 0 ? offsets[bags] : 0;
  const IndexErrors errors = parallel_reduce(
      first, last, int64_t{1} << 14, IndexErrors{},
      [&](int64_t p_begin, int64_t p_end, IndexErrors acc) {
        // The feature of p_begin: the last whose first index is at or before it.
        int64_t t = 0;
        while (t + 1 < T && offsets[bag_offsets[t + 1]] <= p_begin) ++t;
        for (int64_t p = p_begin; p < p_end; ++p) {
          while (p >= offsets[bag_offsets[t + 1]]) ++t;
          const int64_t index = indices[p];
          if ((index >= 0 && index < rows[t]) || index == -1) continue;
          if (acc.count++ == 0) acc.first = p;
          if (repair) indices[p] = 0;
        }
        return acc;
      },
      combine);
  report.bad_indices = errors.count;
  report.first_bad_index = errors.first;
  return report;
}

}  // namespace recops::embedding::kernels
