// Scatter-add of values into bins (a histogram of weights), the inner loop of every backward that
// sums gradients by table slot. Bins often repeat in runs (bucket ids of neighbouring elements,
// hot embedding rows); a single table would then serialise on store-to-load forwarding, one add
// waiting for the previous one to the same bin. Small tables therefore get kHotLanes interleaved
// copies (element i adds into copy i % kHotLanes) that the caller sums afterwards.
#pragma once

#include <cstdint>
#include <type_traits>

namespace recops {

constexpr int kHotLanes = 8;
constexpr int64_t kHotLaneBytes = 16 * 1024;  // largest set of copies that stays in L1

// Whether bin b is one of num_bins (negative values wrap to huge unsigned ones).
template <typename bin_t>
bool in_range(bin_t b, int64_t num_bins) {
  return static_cast<uint64_t>(b) < static_cast<uint64_t>(num_bins);
}

// Calls fn(std::integral_constant<int, lanes>{}) with kHotLanes when that many copies of a table
// of num_bins acc_t entries fit kHotLaneBytes, else with 1.
template <typename acc_t, typename Fn>
decltype(auto) dispatch_histogram_lanes(int64_t num_bins, Fn&& fn) {
  if (kHotLanes * num_bins * static_cast<int64_t>(sizeof(acc_t)) <= kHotLaneBytes) {
    return fn(std::integral_constant<int, kHotLanes>{});
  }
  return fn(std::integral_constant<int, 1>{});
}

// hist[(i % kLanes) * num_bins + bins[i]] += values[i] for i < n. Stops at the first i whose bin is
// outside [0, num_bins) and returns it (the accumulation is then partial), else returns -1.
template <int kLanes, typename acc_t, typename value_t, typename bin_t>
int64_t histogram_add(const value_t* values, const bin_t* bins, int64_t n, int64_t num_bins,
                      acc_t* hist) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) {
      const bin_t b = bins[i + l];
      if (!in_range(b, num_bins)) return i + l;
      hist[l * num_bins + b] += static_cast<acc_t>(values[i + l]);
    }
  }
  for (; i < n; ++i) {
    const bin_t b = bins[i];
    if (!in_range(b, num_bins)) return i;
    hist[b] += static_cast<acc_t>(values[i]);
  }
  return -1;
}

}  // namespace recops
