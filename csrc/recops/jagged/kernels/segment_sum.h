// segment_sum_csr (FBGEMM's): sums of consecutive runs of a flat value array, run i covering
// values[csr_seg[i] * batch_size, csr_seg[i + 1] * batch_size).
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "recops/common/half_bits.h"
#include "recops/common/parallel.h"

namespace recops::jagged::kernels {

// The type a segment sum accumulates in: fp32 for the 16-bit floats, the unsigned integer of the
// same width for integers (so an overflowing sum wraps, as FBGEMM's integer sum does, without
// signed overflow), the type itself for float and double.
template <typename T>
struct SegmentSumAccumulator {
  using type = accumulate_t<T>;
};
template <>
struct SegmentSumAccumulator<int32_t> {
  using type = uint32_t;
};
template <>
struct SegmentSumAccumulator<int64_t> {
  using type = uint64_t;
};

// The sum of values[begin, end), in eight independent lanes so the loop vectorises.
template <typename value_t>
value_t sum_run(const value_t* values, int64_t begin, int64_t end) {
  using acc_t = typename SegmentSumAccumulator<value_t>::type;
  constexpr int kLanes = 8;
  acc_t lanes[kLanes] = {};
  int64_t i = begin;
  for (; i + kLanes <= end; i += kLanes) {
    for (int k = 0; k < kLanes; ++k) lanes[k] += static_cast<acc_t>(values[i + k]);
  }
  acc_t total = 0;
  for (; i < end; ++i) total += static_cast<acc_t>(values[i]);
  for (int k = 0; k < kLanes; ++k) total += lanes[k];
  return static_cast<value_t>(total);
}

// out[i] = sum of values[csr_seg[i] * batch_size, csr_seg[i + 1] * batch_size) for i in
// [0, num_segments). The caller has checked that csr_seg (num_segments + 1 entries) starts at
// >= 0, never decreases and that csr_seg[num_segments] * batch_size fits in the values.
template <typename value_t, typename index_t>
void segment_sum_csr(const index_t* csr_seg, int64_t num_segments, int64_t batch_size,
                     const value_t* values, value_t* out) {
  if (num_segments <= 0) return;
  const int64_t total = static_cast<int64_t>(csr_seg[num_segments]) * batch_size;
  // About kTargetBytesPerTask of values per task on average, at least one segment.
  const int64_t per_segment = std::max<int64_t>(1, total / num_segments) * sizeof(value_t);
  parallel_for(0, num_segments, grain_for_bytes(per_segment), [&](int64_t s0, int64_t s1) {
    for (int64_t s = s0; s < s1; ++s) {
      out[s] = sum_run(values, static_cast<int64_t>(csr_seg[s]) * batch_size,
                       static_cast<int64_t>(csr_seg[s + 1]) * batch_size);
    }
  });
}

}  // namespace recops::jagged::kernels
