// MurmurHash3's 128-bit finalisation of one (x, y) pair of 64-bit words, folded to 64 bits: the
// hash FBGEMM's zero-collision hashing (faster_hash_ops) places ids with. Torch-free.
#pragma once

#include <cstdint>

namespace recops::hashing::kernels {

inline uint64_t rotate_left(uint64_t v, int bits) {
  return (v << bits) | (v >> (64 - bits));
}

// MurmurHash3's 64-bit finaliser (fmix64).
inline uint64_t mix64(uint64_t h) {
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdULL;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ULL;
  h ^= h >> 33;
  return h;
}

// MurmurHash3_x64_128 of the 16-byte block (x, y) with `seed`, the two halves added and xor-ed
// together as FBGEMM's murmur_hash3_2x64 returns them.
inline uint64_t murmur_hash3_2x64(uint64_t x, uint64_t y, uint64_t seed) {
  constexpr uint64_t c1 = 0x87c37b91114253d5ULL;
  constexpr uint64_t c2 = 0x4cf5ad432745937fULL;
  uint64_t h1 = seed;
  uint64_t h2 = seed;
  h1 ^= rotate_left(x * c1, 31) * c2;
  h1 = rotate_left(h1, 27) + h2;
  h1 = h1 * 5 + 0x52dce729;
  h2 ^= rotate_left(y * c2, 33) * c1;
  h2 = rotate_left(h2, 31) + h1;
  h2 = h2 * 5 + 0x38495ab5;
  h1 ^= 16;  // the block's length in bytes
  h2 ^= 16;
  h1 += h2;
  h2 += h1;
  h1 = mix64(h1);
  h2 = mix64(h2);
  h1 += h2;
  h2 += h1;
  return h1 ^ h2;
}

}  // namespace recops::hashing::kernels
