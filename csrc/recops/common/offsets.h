// Offsets from lengths on all threads: offsets[0] = 0, offsets[i + 1] = offsets[i] + length(i).
// Ops that regroup segments (the sparse permutes) need both their input's and their output's
// offsets before they can copy anything; computed serially they took 15% of a 409600-segment
// permute and half of a feature-major one.
#pragma once

#include <ATen/Parallel.h>

#include <cstdint>
#include <vector>

#include "recops/common/parallel.h"

namespace recops {

// Entries per chunk of the parallel computation.
constexpr int64_t kOffsetsChunk = 64 * 1024;

// out[i + 1 - begin] = carry + length(begin) + ... + length(i) for i in [begin, end); returns
// the last of them. (The functor and pointer by value: captured by reference in a parallel lambda
// they would be reloaded after every store.)
template <typename LengthFn>
int64_t running_sums(const LengthFn length, int64_t begin, int64_t end, int64_t carry,
                     int64_t* out) {
  for (int64_t i = begin; i < end; ++i) {
    carry += length(i);
    out[i + 1 - begin] = carry;
  }
  return carry;
}

template <typename LengthFn>
int64_t sum_lengths(const LengthFn length, int64_t begin, int64_t end) {
  int64_t sum = 0;
  for (int64_t i = begin; i < end; ++i) sum += length(i);
  return sum;
}

// offsets (n + 1 entries) from length(i), i < n; `length` must be safe to call from any thread.
// Each chunk's total first, then each chunk's running sums from the totals before it: the
// lengths (often int32) are read twice, the offsets written once.
template <typename LengthFn>
void offsets_from_lengths(int64_t n, const LengthFn& length, int64_t* offsets) {
  offsets[0] = 0;
  if (n <= kOffsetsChunk || at::in_parallel_region()) {
    running_sums(length, 0, n, 0, offsets);
    return;
  }
  const int64_t chunks = (n + kOffsetsChunk - 1) / kOffsetsChunk;
  std::vector<int64_t> totals(chunks);
  parallel_phases<2>(n, kOffsetsChunk, [&](int phase, int64_t begin, int64_t end) {
    const int64_t chunk = begin / kOffsetsChunk;
    if (phase == 0) {
      totals[chunk] = sum_lengths(length, begin, end);
      return;
    }
    int64_t carry = 0;
    for (int64_t before = 0; before < chunk; ++before) carry += totals[before];
    running_sums(length, begin, end, carry, offsets + begin);
  });
}

}  // namespace recops
