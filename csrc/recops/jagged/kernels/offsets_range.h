// offsets_range: position of every element inside its segment, segments given by offsets.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>

#include "recops/common/parallel.h"

namespace recops::jagged::kernels {

// Segments of at most this many elements are written with one fixed-size copy of 0, 1, ..., 15
// instead of a loop whose trip count (and thus branch outcome) changes from segment to segment.
constexpr int64_t kShortSegment = 16;

template <typename index_t>
struct IotaTable {
  static constexpr index_t kValues[kShortSegment] = {0, 1, 2,  3,  4,  5,  6,  7,
                                                     8, 9, 10, 11, 12, 13, 14, 15};
};

// Segment i covers [offsets[i], offsets[i + 1]), the last one ends at range_size. Elements before
// offsets[0] belong to no segment and are set to 0.
template <typename index_t>
void offsets_range(const index_t* offsets, int64_t num_segments, int64_t range_size, index_t* out) {
  if (num_segments == 0) {
    std::fill(out, out + range_size, index_t{0});
    return;
  }
  std::fill(out, out + static_cast<int64_t>(offsets[0]), index_t{0});
  const auto segment_end = [&](int64_t s) {
    return s + 1 < num_segments ? static_cast<int64_t>(offsets[s + 1]) : range_size;
  };
  const int64_t avg_bytes = range_size * static_cast<int64_t>(sizeof(index_t)) / num_segments;
  parallel_for(0, num_segments, grain_for_bytes(avg_bytes), [&](int64_t s0, int64_t s1) {
    // Segments tile [offsets[s0], task_end) in order, so a short segment may write the whole
    // table: the excess lands on this task's later segments, which are written afterwards.
    const int64_t task_end = segment_end(s1 - 1);
    for (int64_t s = s0; s < s1; ++s) {
      const int64_t begin = offsets[s];
      const int64_t end = segment_end(s);
      if (end - begin <= kShortSegment && task_end - begin >= kShortSegment) {
        std::memcpy(out + begin, IotaTable<index_t>::kValues, sizeof(IotaTable<index_t>::kValues));
      } else {
        std::iota(out + begin, out + end, index_t{0});
      }
    }
  });
}

}  // namespace recops::jagged::kernels
