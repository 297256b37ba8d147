// Grain-size policy for at::parallel_for: give each task roughly kTargetBytesPerTask of memory
// traffic so thread start-up is amortised, but never less than one item.
#pragma once

#include <algorithm>
#include <cstdint>

namespace recops {

constexpr int64_t kTargetBytesPerTask = 64 * 1024;

inline int64_t grain_for_bytes(int64_t bytes_per_item) {
  return std::max<int64_t>(1, kTargetBytesPerTask / std::max<int64_t>(1, bytes_per_item));
}

}  // namespace recops
