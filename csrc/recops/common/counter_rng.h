// Counter-based random numbers: a stateless hash of (seed, counter), so that a kernel can
// regenerate exactly the same random draw for any element in any order (a dropout mask recomputed
// in backward instead of stored). The per-element part is 32-bit integer arithmetic that
// vectorises.
#pragma once

#include <cstdint>

#include "recops/common/cpu_isa.h"

namespace recops {

// SplitMix64's finaliser: a bijective 64-bit mix.
inline uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ULL;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// A bijective 32-bit mix with low bias (Wellons' "lowbias32").
RECOPS_ALWAYS_INLINE uint32_t mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7FEB352DU;
  x ^= x >> 15;
  x *= 0x846CA68BU;
  return x ^ (x >> 16);
}

// Random bits of the elements of one row: row_key(seed, row) once per row, then bits(j) per
// element j. Distinct (row, j) pairs draw independent-looking 32-bit values.
struct CounterRow {
  uint32_t lo, hi;

  static CounterRow make(uint64_t seed, uint64_t row) {
    const uint64_t key = mix64(mix64(seed) + row * 0x9E3779B97F4A7C15ULL);
    return CounterRow{static_cast<uint32_t>(key), static_cast<uint32_t>(key >> 32)};
  }
  RECOPS_ALWAYS_INLINE uint32_t bits(uint32_t j) const { return mix32(mix32(j + lo) ^ hi); }
};

// Bernoulli(1 - p) keep decisions from 24 random bits: keep iff bits >> 8 >= threshold(p).
inline uint32_t keep_threshold(double drop_probability) {
  return static_cast<uint32_t>(drop_probability * double(1 << 24) + 0.5);
}

// The seed of stream `offset` of a call's seed: the dropouts that share one seed (the layers or
// sites of a step) draw independent masks by taking distinct offsets.
inline uint64_t stream_seed(uint64_t seed, uint64_t offset) {
  return mix64(seed ^ mix64(offset + 0x9E3779B97F4A7C15ULL));
}

// Dropout of one row: element j of the row is kept iff rng.bits(j) >> 8 >= threshold, and kept
// values are multiplied by scale = 1 / (1 - p).
template <typename T>
struct RowDropout {
  CounterRow rng;
  uint32_t threshold;
  T scale;

  RECOPS_ALWAYS_INLINE T factor(int64_t j) const {
    return (rng.bits(static_cast<uint32_t>(j)) >> 8) >= threshold ? scale : T(0);
  }
};

}  // namespace recops
