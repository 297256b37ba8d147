// Element-wise passes over one [rows x keys] score tile, shared by the attention kernels. Plain
// loops over contiguous rows that GCC vectorises (fast_exp has no libm call); compiled per
// instruction set and called through tile_variants.h's table.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "recops/common/cpu_isa.h"
#include "recops/common/vec_math.h"

namespace recops::attention::kernels {

// loop(has_bias, has_mask) with both as compile-time constants (std::bool_constant), so that
// each case compiles to its own loop without loads from a null operand.
template <typename Loop>
RECOPS_ALWAYS_INLINE void with_optional_operands(const void* bias, const void* mask, Loop&& loop) {
  if (bias == nullptr) {
    if (mask == nullptr) return loop(std::false_type{}, std::false_type{});
    return loop(std::false_type{}, std::true_type{});
  }
  if (mask == nullptr) return loop(std::true_type{}, std::false_type{});
  loop(std::true_type{}, std::true_type{});
}

// HSTU forward: s <- silu(alpha * s + bias) * scale * mask (bias may be null).
template <typename T>
RECOPS_ALWAYS_INLINE void silu_scores_generic(T* s, const T* bias, const T* mask, int64_t n,
                                              T alpha, T scale) {
  if (bias == nullptr) {
    for (int64_t j = 0; j < n; ++j) {
      const T x = alpha * s[j];
      s[j] = x * fast_sigmoid(x) * scale * mask[j];
    }
  } else {
    for (int64_t j = 0; j < n; ++j) {
      const T x = alpha * s[j] + bias[j];
      s[j] = x * fast_sigmoid(x) * scale * mask[j];
    }
  }
}

// HSTU backward, recomputing the forward from the raw scores s = q.k:
//   x = alpha * s + bias, a = silu(x) * scale * mask, dx = dp * scale * mask * silu'(x).
// Overwrites s with a and dp with dx.
template <typename T>
RECOPS_ALWAYS_INLINE void silu_score_grad(T* s, T* dp, T x, T m, int64_t j) {
  const T sig = fast_sigmoid(x);
  s[j] = x * sig * m;
  dp[j] = dp[j] * m * sig * (T(1) + x * (T(1) - sig));
}

template <typename T>
RECOPS_ALWAYS_INLINE void silu_score_grads_generic(T* s, T* dp, const T* bias, const T* mask,
                                                   int64_t n, T alpha, T scale) {
  // Two loops rather than `bias ? bias[j] : 0` in one: GCC vectorises that as a masked load from
  // the null pointer, and the CPU's fault suppression for each such load costs a microcode
  // assist (the no-bias backward ran 18x slower).
  if (bias == nullptr) {
    for (int64_t j = 0; j < n; ++j) silu_score_grad(s, dp, alpha * s[j], scale * mask[j], j);
  } else {
    for (int64_t j = 0; j < n; ++j) {
      silu_score_grad(s, dp, alpha * s[j] + bias[j], scale * mask[j], j);
    }
  }
}

template <typename T>
void add_into(T* acc, const T* x, int64_t n) {
  for (int64_t j = 0; j < n; ++j) acc[j] += x[j];
}

template <typename T>
void multiply_into(T* acc, const T* x, int64_t n) {
  for (int64_t j = 0; j < n; ++j) acc[j] *= x[j];
}

// The bf16 bit pattern nearest to x (ties to even; NaN stays NaN): common/half_bits.h's
// bf16_bits_from_float, with the NaN case as a select so that the tile loops calling it vectorise
// (always inlined into each instruction-set variant).
RECOPS_ALWAYS_INLINE uint16_t bf16_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? 0x7fc0u : rounded);
}

}  // namespace recops::attention::kernels
