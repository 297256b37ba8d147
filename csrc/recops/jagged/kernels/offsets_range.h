// offsets_range: position of every element inside its segment, segments given by offsets.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <numeric>

#include "recops/common/parallel.h"

namespace recops::jagged::kernels {

// Segment i covers [offsets[i], offsets[i + 1]), the last one ends at range_size. Elements before
// offsets[0] belong to no segment and are set to 0.
template <typename index_t>
void offsets_range(const index_t* offsets, int64_t num_segments, int64_t range_size,
                   index_t* out) {
  if (num_segments == 0) {
    std::fill(out, out + range_size, index_t{0});
    return;
  }
  std::fill(out, out + static_cast<int64_t>(offsets[0]), index_t{0});
  const int64_t avg_bytes = range_size * static_cast<int64_t>(sizeof(index_t)) / num_segments;
  at::parallel_for(0, num_segments, grain_for_bytes(avg_bytes), [&](int64_t s0, int64_t s1) {
    for (int64_t s = s0; s < s1; ++s) {
      const int64_t end = s + 1 < num_segments ? static_cast<int64_t>(offsets[s + 1]) : range_size;
      std::iota(out + offsets[s], out + end, index_t{0});
    }
  });
}

}  // namespace recops::jagged::kernels
