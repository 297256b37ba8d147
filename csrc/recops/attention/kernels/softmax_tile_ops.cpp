#include "recops/attention/kernels/softmax_tile_ops.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "recops/common/isa.h"

namespace recops::attention::kernels {

RECOPS_ISA_CLONES float mask_row(float* s, int64_t n, const uint8_t* keep) {
  return mask_row_generic(s, n, keep);
}

RECOPS_ISA_CLONES float exp_row(float* s, int64_t n, float m) {
  return exp_row_generic(s, n, m);
}

RECOPS_ISA_CLONES void dropout_row(float* p, int64_t n, const RowDropout<float>& dropout,
                                   int64_t j0) {
  dropout_row_generic(p, n, dropout, j0);
}

RECOPS_ISA_CLONES void softmax_grad_row(float* s, float* dp, int64_t n, float lse, float d,
                                        float scale, const RowDropout<float>* dropout, int64_t j0) {
  softmax_grad_row_generic(s, dp, n, lse, d, scale, dropout, j0);
}

RECOPS_ISA_CLONES void expand_position_terms(float* diag, int64_t rows, int64_t n, int64_t lanes,
                                             const int32_t* delta, const float* c2p_t,
                                             int64_t c2p_ld, const float* p2c_t, int64_t p2c_ld,
                                             int64_t first) {
  expand_position_terms_generic(diag, rows, n, lanes, delta, c2p_t, c2p_ld, p2c_t, p2c_ld, first);
}

// fp32 shearing moves 16 x 16 blocks through registers: 16 contiguous loads, an in-register
// transpose, 16 contiguous stores. Within a group of 16 rows r0 + t, block m holds diagonals
// e0 + e' (e0 = rows - 1 - r0 + 16 m, lanes r0 + t) = tile row r0 + t, columns 16 m + t + e'.
// Columns no full block covers go element by element.
namespace {

using Vec16 = float __attribute__((vector_size(64)));
using Index16 = int32_t __attribute__((vector_size(64)));

// (Vectors by reference: by value they would change the ABI across ISA levels.)
RECOPS_ALWAYS_INLINE void load16(const float* p, Vec16& v) {
  std::memcpy(&v, p, sizeof(v));
}

RECOPS_ALWAYS_INLINE void store16(float* p, const Vec16& v) {
  std::memcpy(p, &v, sizeof(v));
}

// Swaps the off-diagonal B x B sub-blocks of rows a and b = a + B.
template <int B, int... J>
RECOPS_ALWAYS_INLINE void swap_sub_blocks(Vec16& a, Vec16& b, std::integer_sequence<int, J...>) {
  constexpr Index16 kLow = {((J & B) != 0 ? 16 + J - B : J)...};
  constexpr Index16 kHigh = {((J & B) != 0 ? 16 + J : J + B)...};
  const Vec16 low = __builtin_shuffle(a, b, kLow);
  b = __builtin_shuffle(a, b, kHigh);
  a = low;
}

template <int B>
RECOPS_ALWAYS_INLINE void transpose_stage(Vec16* m) {
  for (int i = 0; i < 16; ++i) {
    if ((i & B) == 0) swap_sub_blocks<B>(m[i], m[i + B], std::make_integer_sequence<int, 16>());
  }
}

RECOPS_ALWAYS_INLINE void transpose16(Vec16* m) {
  transpose_stage<1>(m);
  transpose_stage<2>(m);
  transpose_stage<4>(m);
  transpose_stage<8>(m);
}

// Full 16 x 16 blocks in a group of 16 rows of an n-column tile.
inline int64_t full_blocks(int64_t n) {
  return n >= 31 ? (n - 31) / 16 + 1 : 0;
}

}  // namespace

RECOPS_ISA_CLONES void unshear_add(const float* diag, int64_t rows, int64_t n, int64_t lanes,
                                   float* tile) {
  int64_t r0 = 0;
  for (; r0 + 16 <= rows; r0 += 16) {
    const int64_t blocks = full_blocks(n);
    for (int64_t m = 0; m < blocks; ++m) {
      Vec16 v[16];
      const float* d = diag + (rows - 1 - r0 + 16 * m) * lanes + r0;
      for (int e = 0; e < 16; ++e) load16(d + e * lanes, v[e]);
      transpose16(v);
      for (int t = 0; t < 16; ++t) {
        float* row = tile + (r0 + t) * n + 16 * m + t;
        Vec16 sum;
        load16(row, sum);
        sum += v[t];
        store16(row, sum);
      }
    }
    for (int64_t t = 0; t < 16; ++t) {
      const int64_t r = r0 + t;
      const float* d = diag + (rows - 1 - r) * lanes + r;
      float* row = tile + r * n;
      for (int64_t j = 0; j < std::min(t, n); ++j) row[j] += d[j * lanes];
      for (int64_t j = 16 * blocks + t; j < n; ++j) row[j] += d[j * lanes];
    }
  }
  if (r0 < rows) {  // the last rows: element by element
    for (int64_t r = r0; r < rows; ++r) {
      const float* d = diag + (rows - 1 - r) * lanes + r;
      for (int64_t j = 0; j < n; ++j) tile[r * n + j] += d[j * lanes];
    }
  }
}

RECOPS_ISA_CLONES void shear_tile(const float* tile, int64_t rows, int64_t n, float* diag,
                                  int64_t lanes) {
  int64_t r0 = 0;
  for (; r0 + 16 <= rows; r0 += 16) {
    const int64_t blocks = full_blocks(n);
    for (int64_t m = 0; m < blocks; ++m) {
      Vec16 v[16];
      for (int t = 0; t < 16; ++t) load16(tile + (r0 + t) * n + 16 * m + t, v[t]);
      transpose16(v);
      float* d = diag + (rows - 1 - r0 + 16 * m) * lanes + r0;
      for (int e = 0; e < 16; ++e) store16(d + e * lanes, v[e]);
    }
    for (int64_t t = 0; t < 16; ++t) {
      const int64_t r = r0 + t;
      float* d = diag + (rows - 1 - r) * lanes + r;
      const float* row = tile + r * n;
      for (int64_t j = 0; j < std::min(t, n); ++j) d[j * lanes] = row[j];
      for (int64_t j = 16 * blocks + t; j < n; ++j) d[j * lanes] = row[j];
    }
  }
  for (int64_t r = r0; r < rows; ++r) {
    float* d = diag + (rows - 1 - r) * lanes + r;
    for (int64_t j = 0; j < n; ++j) d[j * lanes] = tile[r * n + j];
  }
}

RECOPS_ISA_CLONES void accumulate_position_grads(const float* diag, int64_t rows, int64_t n,
                                                 int64_t lanes, const int32_t* delta, float* dc2p_t,
                                                 int64_t dc2p_ld, float* dp2c_t, int64_t dp2c_ld,
                                                 int64_t first) {
  accumulate_position_grads_generic(diag, rows, n, lanes, delta, dc2p_t, dc2p_ld, dp2c_t, dp2c_ld,
                                    first);
}

RECOPS_ISA_CLONES void add_uniform_position_terms(float* tile, int64_t rows, int64_t n,
                                                  const float* c2p, const float* p2c) {
  add_uniform_position_terms_generic(tile, rows, n, c2p, p2c);
}

RECOPS_ISA_CLONES void accumulate_uniform_position_grads(const float* ds, int64_t rows, int64_t n,
                                                         float* dc2p, float* dp2c) {
  accumulate_uniform_position_grads_generic(ds, rows, n, dc2p, dp2c);
}

}  // namespace recops::attention::kernels
