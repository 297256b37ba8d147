// Branch-free float math written so that GCC auto-vectorises loops calling it (no libm calls):
// exp by range reduction to [-ln2/2, ln2/2] and a degree-6 polynomial (rel. error ~2e-7); and
// sums in lanes of partial sums, which vectorise where one running sum would not (GCC does not
// reassociate floating-point additions) and add up in the same order on every instruction set.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "recops/common/cpu_isa.h"

namespace recops {

RECOPS_ALWAYS_INLINE float bits_to_float(int32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// exp(x) for x in [-87, 88]; exactly 0 below (so masked scores, -inf, drop out) and +inf above.
// The range is applied to the result, not by clamping x: GCC evaluates a caller at a clamped
// x's constant and blends that branch into every vector, and for fast_sigmoid that constant,
// 1 / (1 + exp(88)), is subnormal. Multiplying by it makes a subnormal result in every vector,
// a microcode assist each on Intel cores (silu ran 11x slower on Sapphire Rapids).
RECOPS_ALWAYS_INLINE float fast_exp(float x) {
  // Round x / ln2 to the nearest integer with the 1.5 * 2^23 trick (exact for |t| < 2^22).
  const float shift = 12582912.0f;
  const float t = x * 1.44269504088896341f + shift;
  const float n = t - shift;
  uint32_t t_bits;
  std::memcpy(&t_bits, &t, sizeof(t_bits));
  const uint32_t biased_exponent = t_bits - 0x4B400000u + 127u;  // n + 127, for |n| < 2^22
  const float r = (x - n * 0.693145751953125f) - n * 1.428606765330187045e-06f;
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const float e = p * bits_to_float(static_cast<int32_t>(biased_exponent << 23));
  return x < -87.0f ? 0.0f : (x > 88.0f ? std::numeric_limits<float>::infinity() : e);
}

// exp of a softmax argument (a score minus its row maximum, so x <= 0; masked scores are -inf).
RECOPS_ALWAYS_INLINE float softmax_exp(float x) {
  return fast_exp(x);
}

RECOPS_ALWAYS_INLINE float fast_sigmoid(float x) {
  return 1.0f / (1.0f + fast_exp(-x));
}

// double keeps libm's exp: it serves float64 validation, not speed.
inline double fast_sigmoid(double x) {
  return 1.0 / (1.0 + std::exp(-x));
}
inline double softmax_exp(double x) {
  return std::exp(x);
}

// s[j] <- exp(s[j] - m) (0 for s[j] = -inf); returns the row sum, a vector reduction (its lanes
// add in the instruction set's order).
template <typename T>
RECOPS_ALWAYS_INLINE T exp_row_generic(T* s, int64_t n, T m) {
  T sum = T(0);
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < n; ++j) {
    const T p = softmax_exp(s[j] - m);
    s[j] = p;
    sum += p;
  }
  return sum;
}

// The sum of lanes[0, kWidth) in a fixed tree, halves added lane by lane (kWidth a power of two).
template <int64_t kWidth, typename T>
RECOPS_ALWAYS_INLINE T fold_lanes(T* lanes) {
  if constexpr (kWidth == 1) {
    return lanes[0];
  } else {
    for (int64_t l = 0; l < kWidth / 2; ++l) lanes[l] += lanes[l + kWidth / 2];
    return fold_lanes<kWidth / 2>(lanes);
  }
}

// The sum of term(j) over j < n in C (double unless asked): term j goes to lane j % L, L the
// lanes of a 64-byte vector of C (the tail after the last whole group of L to a sum of its own),
// then the lanes fold_lanes.
template <typename C = double, typename Term>
RECOPS_ALWAYS_INLINE C lane_sum(int64_t n, const Term& term) {
  constexpr int64_t kLanes = 64 / sizeof(C);
  C lanes[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    for (int64_t l = 0; l < kLanes; ++l) lanes[l] += term(j + l);
  }
  C tail = 0;
  for (; j < n; ++j) tail += term(j);
  return fold_lanes<kLanes>(lanes) + tail;
}

}  // namespace recops
