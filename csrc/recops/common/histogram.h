// Scatter-add of values into bins (a histogram of weights), the inner loop of every backward that
// sums gradients by table slot. Bins often repeat in runs (bucket ids of neighbouring elements,
// hot embedding rows); a single table would then serialise on store-to-load forwarding, one add
// waiting for the previous one to the same bin. Small tables therefore get kHotLanes interleaved
// copies (element i adds into lane i % kHotLanes of its bin: entry bin * lanes + lane) that the
// caller folds with sum_lanes afterwards.
#pragma once

#include <cstdint>
#include <type_traits>

#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include "recops/common/cpu_isa.h"

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

// The scatter-add is bound by load and store slots (one load and one store of the bin per
// element), so the values of a group are loaded together: out[l] = values[l] for l < 8.
template <typename acc_t, typename value_t>
RECOPS_ALWAYS_INLINE void load_group_of_8(const value_t* values, acc_t* out) {
  for (int l = 0; l < 8; ++l) out[l] = static_cast<acc_t>(values[l]);
}

#if defined(__SSE2__) && defined(__GNUC__)
// Two vector loads split by shuffles instead of eight scalar loads (about 10% faster scatter-add
// of float gradients into a 129-bin table). The empty asm pins the vectors in registers: without
// it GCC turns each shuffle of a loaded vector back into a scalar load.
template <>
RECOPS_ALWAYS_INLINE void load_group_of_8<float, float>(const float* values, float* out) {
  __m128 low = _mm_loadu_ps(values);
  __m128 high = _mm_loadu_ps(values + 4);
  asm("" : "+x"(low), "+x"(high));
  out[0] = _mm_cvtss_f32(low);
  out[1] = _mm_cvtss_f32(_mm_shuffle_ps(low, low, 1));
  out[2] = _mm_cvtss_f32(_mm_movehl_ps(low, low));
  out[3] = _mm_cvtss_f32(_mm_shuffle_ps(low, low, 3));
  out[4] = _mm_cvtss_f32(high);
  out[5] = _mm_cvtss_f32(_mm_shuffle_ps(high, high, 1));
  out[6] = _mm_cvtss_f32(_mm_movehl_ps(high, high));
  out[7] = _mm_cvtss_f32(_mm_shuffle_ps(high, high, 3));
}
#endif

// hist[bins[i] * kLanes + i % kLanes] += values[i] for i < n. Stops at the first i whose bin is
// outside [0, num_bins) and returns it (the accumulation is then partial), else returns -1.
template <int kLanes, typename acc_t, typename value_t, typename bin_t>
int64_t histogram_add(const value_t* values, const bin_t* bins, int64_t n, int64_t num_bins,
                      acc_t* hist) {
  static_assert(8 % kLanes == 0, "a group of 8 elements covers whole lanes");
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    bin_t b[8];
    for (int l = 0; l < 8; ++l) {
      b[l] = bins[i + l];
      if (!in_range(b[l], num_bins)) return i + l;
    }
    acc_t v[8];
    load_group_of_8(values + i, v);
    for (int l = 0; l < 8; ++l) hist[static_cast<int64_t>(b[l]) * kLanes + l % kLanes] += v[l];
  }
  for (; i < n; ++i) {
    const bin_t b = bins[i];
    if (!in_range(b, num_bins)) return i;
    hist[static_cast<int64_t>(b) * kLanes] += static_cast<acc_t>(values[i]);
  }
  return -1;
}

// Entries of per-chunk tables between the tables of two chunks, rounded so that no cache line
// holds entries of two chunks: threads filling neighbouring tables would otherwise bounce that
// line between cores on every add to its bins.
template <typename acc_t>
int64_t chunk_table_stride(int64_t entries) {
  constexpr int64_t kLine = 64 / sizeof(acc_t);
  return (entries + kLine - 1) / kLine * kLine + kLine;
}

// The total of bin k's lanes in a table filled by histogram_add<kLanes>.
template <int kLanes, typename acc_t>
acc_t sum_lanes(const acc_t* hist, int64_t k) {
  acc_t sum = 0;
  for (int l = 0; l < kLanes; ++l) sum += hist[k * kLanes + l];
  return sum;
}

}  // namespace recops
