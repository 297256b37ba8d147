// Element-wise passes over a softmax attention tile (the DeBERTa kernel): masking,
// online-softmax exponentials, dropout from a counter-based hash, the softmax backward, and the
// diagonal layout of the relative-position terms.
//
// Diagonal layout: a [rows x n] tile of query rows r and keys j is stored diagonal-major as
// diag[c * lanes + r] with c = j - r + rows - 1, so that each diagonal c (c in [0, n + rows - 1))
// is one relative distance i - j and has one position index delta[c]. There the position terms
// are contiguous slices of the transposed tables, C2P^T[delta[c], r] and
// P2C^T[delta[c], j = first + c + r], and their gradients are contiguous adds: no gathers, no
// scatters, no conflicting writes. Lanes of a diagonal that fall outside the tile are never read
// or written. Shearing a tile to or from that layout works on groups of 16
// rows so that the lines in flight stay in L1.
//
// Plain loops that GCC vectorises, compiled per instruction set and called through
// tile_variants.h's table (whose fp32 shearing moves 16 x 16 blocks through registers,
// kernels/variant.h); float64 runs the baseline build (validation, not speed).
#pragma once

#include <cstdint>
#include <limits>

#include "recops/common/counter_rng.h"
#include "recops/common/cpu_isa.h"
#include "recops/common/vec_math.h"

namespace recops::attention::kernels {

constexpr int64_t kShearGroup = 16;

// s[j] <- keep[j] ? s[j] : -inf (keep may be null); returns the row max.
template <typename T>
RECOPS_ALWAYS_INLINE T mask_row_generic(T* s, int64_t n, const uint8_t* keep) {
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  T m = kNegInf;
  if (keep != nullptr) {
#pragma omp simd reduction(max : m)
    for (int64_t j = 0; j < n; ++j) {
      const T x = keep[j] != 0 ? s[j] : kNegInf;
      s[j] = x;
      m = x > m ? x : m;
    }
  } else {
#pragma omp simd reduction(max : m)
    for (int64_t j = 0; j < n; ++j) m = s[j] > m ? s[j] : m;
  }
  return m;
}

// p[j] *= dropout factor of element j0 + j.
template <typename T>
RECOPS_ALWAYS_INLINE void dropout_row_generic(T* p, int64_t n, const RowDropout<T>& dropout,
                                              int64_t j0) {
  const RowDropout<T> local = dropout;  // a copy: stores to p cannot change it
  for (int64_t j = 0; j < n; ++j) p[j] *= local.factor(j0 + j);
}

// Softmax backward of one row, from its scores s (masked), the row's log-sum-exp and
// D = sum_j P_j dP_j, with dp = dL/d(dropped probabilities):
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
  const RowDropout<T> local = *dropout;  // a copy: stores to s, dp cannot change it
  for (int64_t j = 0; j < n; ++j) {
    const T p = softmax_exp(s[j] - lse);
    const T f = local.factor(j0 + j);
    dp[j] = scale * p * (f * dp[j] - d);
    s[j] = f * p;
  }
}

// Lanes [first, last) of diagonal c of a rows x n tile are pairs inside the tile.
RECOPS_ALWAYS_INLINE int64_t first_lane(int64_t c, int64_t rows) {
  return c < rows - 1 ? rows - 1 - c : 0;
}
RECOPS_ALWAYS_INLINE int64_t last_lane(int64_t c, int64_t rows, int64_t n) {
  return c > n - 1 ? n + rows - 1 - c : rows;
}

// Position terms of a rows x n tile in diagonal layout: for each diagonal c and each lane r of a
// pair inside the tile,
//   diag[c * lanes + r] = c2p_t[delta[c] * c2p_ld + r] + p2c_t[delta[c] * p2c_ld + first + c + r]
// with `first` the key column of lane 0 of diagonal 0 (either table may be null, not both).
template <typename T>
RECOPS_ALWAYS_INLINE void expand_position_terms_generic(T* diag, int64_t rows, int64_t n,
                                                        int64_t lanes, const int32_t* delta,
                                                        const T* c2p_t, int64_t c2p_ld,
                                                        const T* p2c_t, int64_t p2c_ld,
                                                        int64_t first) {
  for (int64_t c = 0; c < n + rows - 1; ++c) {
    T* out = diag + c * lanes;
    const int64_t lo = first_lane(c, rows), hi = last_lane(c, rows, n);
    const T* a = c2p_t == nullptr ? nullptr : c2p_t + delta[c] * c2p_ld;
    const T* b = p2c_t == nullptr ? nullptr : p2c_t + delta[c] * p2c_ld + first + c;
    if (a != nullptr && b != nullptr) {
      for (int64_t r = lo; r < hi; ++r) out[r] = a[r] + b[r];
    } else {
      const T* x = a != nullptr ? a : b;
      for (int64_t r = lo; r < hi; ++r) out[r] = x[r];
    }
  }
}

// tile[r * n + j] += diag[(j - r + rows - 1) * lanes + r] for r < rows, j < n.
template <typename T>
RECOPS_ALWAYS_INLINE void unshear_add_generic(const T* diag, int64_t rows, int64_t n, int64_t lanes,
                                              T* tile) {
  for (int64_t r0 = 0; r0 < rows; r0 += kShearGroup) {
    const int64_t group = rows - r0 < kShearGroup ? rows - r0 : kShearGroup;
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t t = 0; t < group; ++t) {
        const int64_t r = r0 + t;
        tile[r * n + j] += diag[(j - r + rows - 1) * lanes + r];
      }
    }
  }
}

// diag[(j - r + rows - 1) * lanes + r] = tile[r * n + j] (lanes of pairs outside the tile are
// left as they are).
template <typename T>
RECOPS_ALWAYS_INLINE void shear_tile_generic(const T* tile, int64_t rows, int64_t n, T* diag,
                                             int64_t lanes) {
  for (int64_t r0 = 0; r0 < rows; r0 += kShearGroup) {
    const int64_t group = rows - r0 < kShearGroup ? rows - r0 : kShearGroup;
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t t = 0; t < group; ++t) {
        const int64_t r = r0 + t;
        diag[(j - r + rows - 1) * lanes + r] = tile[r * n + j];
      }
    }
  }
}

// Gradients of the position terms from a sheared score-gradient tile (the transpose of
// expand_position_terms): for each lane r of a pair inside the tile,
// dc2p_t[delta[c] * dc2p_ld + r] += diag[c * lanes + r] and
// dp2c_t[delta[c] * dp2c_ld + first + c + r] += diag[c * lanes + r] (either sink may be null).
template <typename T>
RECOPS_ALWAYS_INLINE void accumulate_position_grads_generic(const T* diag, int64_t rows, int64_t n,
                                                            int64_t lanes, const int32_t* delta,
                                                            T* dc2p_t, int64_t dc2p_ld, T* dp2c_t,
                                                            int64_t dp2c_ld, int64_t first) {
  for (int64_t c = 0; c < n + rows - 1; ++c) {
    const T* g = diag + c * lanes;
    const int64_t lo = first_lane(c, rows), hi = last_lane(c, rows, n);
    if (dc2p_t != nullptr) {
      T* d = dc2p_t + delta[c] * dc2p_ld;
      for (int64_t r = lo; r < hi; ++r) d[r] += g[r];
    }
    if (dp2c_t != nullptr) {
      T* d = dp2c_t + delta[c] * dp2c_ld + first + c;
      for (int64_t r = lo; r < hi; ++r) d[r] += g[r];
    }
  }
}

// A tile whose pairs all have one position index (far from the diagonal, where the distance is
// clamped) needs no diagonal layout: tile[r * n + j] += c2p[r] + p2c[j], with c2p the index's row
// of C2P^T (per query) and p2c its row of P2C^T (per key); either may be null.
template <typename T>
RECOPS_ALWAYS_INLINE void add_uniform_position_terms_generic(T* tile, int64_t rows, int64_t n,
                                                             const T* c2p, const T* p2c) {
  for (int64_t r = 0; r < rows; ++r) {
    T* row = tile + r * n;
    const T a = c2p == nullptr ? T(0) : c2p[r];
    if (p2c == nullptr) {
      for (int64_t j = 0; j < n; ++j) row[j] += a;
    } else {
      for (int64_t j = 0; j < n; ++j) row[j] += a + p2c[j];
    }
  }
}

// Its gradients: dc2p[r] += sum_j ds[r * n + j], dp2c[j] += sum_r ds[r * n + j].
template <typename T>
RECOPS_ALWAYS_INLINE void accumulate_uniform_position_grads_generic(const T* ds, int64_t rows,
                                                                    int64_t n, T* dc2p, T* dp2c) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* row = ds + r * n;
    if (dc2p != nullptr) {
      T sum = T(0);
#pragma omp simd reduction(+ : sum)
      for (int64_t j = 0; j < n; ++j) sum += row[j];
      dc2p[r] += sum;
    }
    if (dp2c != nullptr) {
      for (int64_t j = 0; j < n; ++j) dp2c[j] += row[j];
    }
  }
}

}  // namespace recops::attention::kernels
