// The element permutation of a segment permutation (FBGEMM's expand_into_jagged_permute): output
// segment t, entries [output_offsets[t], output_offsets[t + 1]), numbers the entries of input
// segment permute[t] from its start, input_offsets[permute[t]], upwards. Gathering a jagged
// tensor's entries with the result moves its segments as `permute` says.
//
// Segments are independent and filled in parallel; each fill is a vectorisable ramp.
#pragma once

#include <atomic>
#include <cstdint>
#include <limits>

#include "recops/common/parallel.h"

namespace recops::sparse::kernels {

// Whether the last entry of a ramp from `start` of `length` entries fits offset_t.
template <typename offset_t>
bool ramp_fits(int64_t start, int64_t length) {
  return length == 0 ||
         start <= static_cast<int64_t>(std::numeric_limits<offset_t>::max()) - (length - 1);
}

// First segment whose ramp does not fit offset_t, or -1. (Serial: only names the culprit after
// expand_into_jagged_permute has reported one.)
template <typename perm_t, typename offset_t>
int64_t first_overflowing_segment(const perm_t* permute, int64_t num_segments,
                                  const offset_t* input_offsets, const offset_t* output_offsets) {
  for (int64_t t = 0; t < num_segments; ++t) {
    const int64_t length = static_cast<int64_t>(output_offsets[t + 1]) - output_offsets[t];
    if (!ramp_fits<offset_t>(input_offsets[permute[t]], length)) return t;
  }
  return -1;
}

// Fills output[output_offsets[0], output_offsets[num_segments]). permute's entries are in
// [0, num_segments) and output_offsets non-decreasing (checked by the caller). Returns false,
// having skipped them, when some segment's ramp would overflow offset_t.
template <typename perm_t, typename offset_t>
bool expand_into_jagged_permute(const perm_t* permute, int64_t num_segments,
                                const offset_t* input_offsets, const offset_t* output_offsets,
                                offset_t* output) {
  if (num_segments == 0) return true;
  const int64_t total = static_cast<int64_t>(output_offsets[num_segments]) - output_offsets[0];
  const int64_t bytes_per_segment = total / num_segments * static_cast<int64_t>(sizeof(offset_t));
  std::atomic<bool> fits{true};
  parallel_for(0, num_segments, grain_for_bytes(bytes_per_segment + 16),
               [&](int64_t t0, int64_t t1) {
                 bool chunk_fits = true;
                 for (int64_t t = t0; t < t1; ++t) {
                   const int64_t begin = output_offsets[t];
                   const int64_t length = static_cast<int64_t>(output_offsets[t + 1]) - begin;
                   const int64_t start = input_offsets[permute[t]];
                   if (!ramp_fits<offset_t>(start, length)) {
                     chunk_fits = false;
                     continue;
                   }
                   offset_t* out = output + begin;
                   const offset_t first = static_cast<offset_t>(start);
                   for (int64_t i = 0; i < length; ++i) out[i] = first + static_cast<offset_t>(i);
                 }
                 if (!chunk_fits) fits.store(false, std::memory_order_relaxed);
               });
  return fits.load();
}

}  // namespace recops::sparse::kernels
