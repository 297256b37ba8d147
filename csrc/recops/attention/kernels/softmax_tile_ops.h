// Element-wise passes over one row of a softmax attention tile (the DeBERTa kernel): position
// terms gathered by relative-position index, masking, online-softmax exponentials, dropout from a
// counter-based hash, and the softmax backward. Plain loops over contiguous rows that GCC
// vectorises; the fp32 versions are compiled per ISA level (softmax_tile_ops.cpp), float64 runs
// the generic bodies (validation, not speed).
#pragma once

#include <cstdint>
#include <limits>

#include "recops/common/counter_rng.h"
#include "recops/common/isa.h"
#include "recops/common/vec_math.h"

namespace recops::attention::kernels {

// Dropout of one score row: element j of the row is kept iff rng.bits(j) >> 8 >= threshold, and
// kept values are multiplied by scale = 1 / (1 - p).
template <typename T>
struct RowDropout {
  CounterRow rng;
  uint32_t threshold;
  T scale;

  RECOPS_ALWAYS_INLINE T factor(int64_t j) const {
    return (rng.bits(static_cast<uint32_t>(j)) >> 8) >= threshold ? scale : T(0);
  }
};

// Scores of one row of a [rows x n] tile, from the raw products s = q_i . k_j:
//   s[j] <- keep[j] ? scale * (s[j] + c2p[delta[j]] + p2c[j * p2c_ld + delta[j]]) : -inf,
// where delta is the row's relative-position index per key, c2p the row's q_i . pos_key^T and
// p2c the keys' k_j . pos_query^T rows (each of c2p, p2c, keep may be null). Returns the row max.
template <typename T>
RECOPS_ALWAYS_INLINE T disentangled_score_row_generic(T* s, int64_t n, T scale,
                                                      const int32_t* delta, const T* c2p,
                                                      const T* p2c, int32_t p2c_ld,
                                                      const uint8_t* keep) {
  if (c2p != nullptr) {
    for (int64_t j = 0; j < n; ++j) s[j] += c2p[delta[j]];
  }
  if (p2c != nullptr) {
    for (int32_t j = 0; j < static_cast<int32_t>(n); ++j) s[j] += p2c[j * p2c_ld + delta[j]];
  }
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  T m = kNegInf;
  if (keep != nullptr) {
#pragma omp simd reduction(max : m)
    for (int64_t j = 0; j < n; ++j) {
      const T x = keep[j] != 0 ? scale * s[j] : kNegInf;
      s[j] = x;
      m = x > m ? x : m;
    }
  } else {
#pragma omp simd reduction(max : m)
    for (int64_t j = 0; j < n; ++j) {
      const T x = scale * s[j];
      s[j] = x;
      m = x > m ? x : m;
    }
  }
  return m;
}

// s[j] <- exp(s[j] - m) (0 for s[j] = -inf); returns the row sum.
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

// p[j] *= dropout factor of element j0 + j.
template <typename T>
RECOPS_ALWAYS_INLINE void dropout_row_generic(T* p, int64_t n, const RowDropout<T>& dropout,
                                              int64_t j0) {
  for (int64_t j = 0; j < n; ++j) p[j] *= dropout.factor(j0 + j);
}

// Softmax backward of one row, from its scores s (as disentangled_score_row leaves them), the
// row's log-sum-exp and D = sum_j P_j dP_j, with dp = dL/d(dropped probabilities):
//   P = exp(s - lse), f = dropout factor (1 without dropout),
//   dp <- scale * P * (f * dp - D)   (the gradient of the unscaled scores times scale),
//   s  <- f * P                      (the dropped probabilities, for dV).
template <typename T>
RECOPS_ALWAYS_INLINE void softmax_grad_row_generic(T* s, T* dp, int64_t n, T lse, T d, T scale,
                                                   const RowDropout<T>* dropout, int64_t j0) {
  if (dropout == nullptr) {
    for (int64_t j = 0; j < n; ++j) {
      const T p = softmax_exp(s[j] - lse);
      dp[j] = scale * p * (dp[j] - d);
      s[j] = p;
    }
    return;
  }
  for (int64_t j = 0; j < n; ++j) {
    const T p = softmax_exp(s[j] - lse);
    const T f = dropout->factor(j0 + j);
    dp[j] = scale * p * (f * dp[j] - d);
    s[j] = f * p;
  }
}

// Gradients of the gathered position terms of one row: dc2p[delta[j]] += ds[j] and
// dp2c[j * p2c_ld + delta[j]] += ds[j] (either sink may be null). Indices repeat within a row
// (clamped and log-bucketed distances), so this stays scalar.
template <typename T>
RECOPS_ALWAYS_INLINE void scatter_position_grads_generic(const T* ds, int64_t n,
                                                         const int32_t* delta, T* dc2p, T* dp2c,
                                                         int32_t p2c_ld) {
  if (dc2p != nullptr) {
    for (int64_t j = 0; j < n; ++j) dc2p[delta[j]] += ds[j];
  }
  if (dp2c != nullptr) {
    for (int32_t j = 0; j < static_cast<int32_t>(n); ++j) dp2c[j * p2c_ld + delta[j]] += ds[j];
  }
}

// fp32 versions, compiled per ISA level (softmax_tile_ops.cpp).
float disentangled_score_row(float* s, int64_t n, float scale, const int32_t* delta,
                             const float* c2p, const float* p2c, int32_t p2c_ld,
                             const uint8_t* keep);
float exp_row(float* s, int64_t n, float m);
void dropout_row(float* p, int64_t n, const RowDropout<float>& dropout, int64_t j0);
void softmax_grad_row(float* s, float* dp, int64_t n, float lse, float d, float scale,
                      const RowDropout<float>* dropout, int64_t j0);
void scatter_position_grads(const float* ds, int64_t n, const int32_t* delta, float* dc2p,
                            float* dp2c, int32_t p2c_ld);

inline double disentangled_score_row(double* s, int64_t n, double scale, const int32_t* delta,
                                     const double* c2p, const double* p2c, int32_t p2c_ld,
                                     const uint8_t* keep) {
  return disentangled_score_row_generic(s, n, scale, delta, c2p, p2c, p2c_ld, keep);
}
inline double exp_row(double* s, int64_t n, double m) {
  return exp_row_generic(s, n, m);
}
inline void dropout_row(double* p, int64_t n, const RowDropout<double>& dropout, int64_t j0) {
  dropout_row_generic(p, n, dropout, j0);
}
inline void softmax_grad_row(double* s, double* dp, int64_t n, double lse, double d, double scale,
                             const RowDropout<double>* dropout, int64_t j0) {
  softmax_grad_row_generic(s, dp, n, lse, d, scale, dropout, j0);
}
inline void scatter_position_grads(const double* ds, int64_t n, const int32_t* delta, double* dc2p,
                                   double* dp2c, int32_t p2c_ld) {
  scatter_position_grads_generic(ds, n, delta, dc2p, dp2c, p2c_ld);
}

}  // namespace recops::attention::kernels
