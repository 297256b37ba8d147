// Scans of index arrays for the first entry that breaks a rule (offsets that decrease, negative
// lengths, indices out of range), torch-free: adapters validate with them (common/checks.h) and
// kernels use them to name bad data.
//
// These scans run on every call of the ops they guard, over inputs as long as the op's own
// work, so each first answers "is anything wrong" with a reduction the compiler vectorises (an
// integer OR or max; a loop that returns at the first bad entry stays scalar, about 1 ns per
// entry), and only then looks for the first offender to name it.
#pragma once

#include <cstdint>
#include <limits>
#include <type_traits>

namespace recops {

// The first i with offsets[i + 1] < offsets[i], or -1.
template <typename index_t>
int64_t first_decrease(const index_t* offsets, int64_t n) {
  uint32_t any = 0;
  for (int64_t i = 0; i + 1 < n; ++i) any |= static_cast<uint32_t>(offsets[i + 1] < offsets[i]);
  if (any == 0) return -1;
  for (int64_t i = 0; i + 1 < n; ++i) {
    if (offsets[i + 1] < offsets[i]) return i;
  }
  return -1;
}

// The first i with lengths[i] < 0, or -1.
template <typename index_t>
int64_t first_negative(const index_t* lengths, int64_t n) {
  index_t bits = 0;  // the sign bit of the OR is set iff some entry is negative
  for (int64_t i = 0; i < n; ++i) bits |= lengths[i];
  if (bits >= 0) return -1;
  for (int64_t i = 0; i < n; ++i) {
    if (lengths[i] < 0) return i;
  }
  return -1;
}

// The first i with index[i] outside [0, bound), or -1.
template <typename index_t>
int64_t first_out_of_range(const index_t* index, int64_t n, int64_t bound) {
  using unsigned_t = std::make_unsigned_t<index_t>;
  if (bound > static_cast<int64_t>(std::numeric_limits<index_t>::max())) {
    return first_negative(index, n);  // every non-negative entry is below bound
  }
  // Compared unsigned, a negative entry is a huge value: one compare covers both ends.
  const unsigned_t limit = static_cast<unsigned_t>(bound);
  unsigned_t any = 0;
  for (int64_t i = 0; i < n; ++i) any |= static_cast<unsigned_t>(index[i]) >= limit;
  if (any == 0) return -1;
  for (int64_t i = 0; i < n; ++i) {
    if (static_cast<unsigned_t>(index[i]) >= limit) return i;
  }
  return -1;
}

}  // namespace recops
