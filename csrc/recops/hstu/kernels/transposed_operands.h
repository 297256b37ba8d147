// Operand layouts for the tile products of the HSTU-family kernels. gemm_nn (oneDNN's brgemm
// micro-kernel, common/blas.h) multiplies untransposed row-major operands only, while the kernels
// multiply by K^T and V^T (scores Q K^T, dO V^T) and accumulate dK = dS^T Q and dV = A^T dO:
//  * KeyValueTransposes: per sequence, K^T [H, Dqk, N] and (for backward) V^T [H, Dv, N], built
//    once per call in parallel: about one extra copy of K (and V). The leading dimension N (the
//    maximum length) stays the same from batch to batch, as gemm_nn's kernel cache wants;
//  * TransposedGradients: per thread, the current work item's dK^T [H, Dqk, N] and dV^T
//    [H, Dv, N], accumulated over its query blocks and added into the item's dK / dV partial when
//    it ends, plus the transposed (scaled) Q and dO of the current block and head.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>

#include "recops/common/blas.h"
#include "recops/common/parallel.h"
#include "recops/hstu/kernels/tiles.h"

namespace recops::attention::kernels {

// dst [B, cols, N] = per sequence b, its rows [row_begin[b], + length[b]) of src [rows, cols]
// transposed (columns past the length are left as they are), sequences split between threads.
template <typename T>
void transpose_sequences(const Sequences& seqs, int64_t cols, const T* src, T* dst) {
  parallel_for(0, seqs.count, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      transpose(seqs.length[b], cols, src + seqs.row_begin[b] * cols, cols,
                dst + b * cols * seqs.max_len, seqs.max_len);
    }
  });
}

template <typename T>
class KeyValueTransposes {
 public:
  KeyValueTransposes(const Sequences& seqs, int64_t heads, int64_t dqk, int64_t dv, const T* k,
                     const T* v)
      : heads_(heads),
        dqk_(dqk),
        dv_(dv),
        max_len_(seqs.max_len),
        k_t_(new T[seqs.count * heads * dqk * max_len_]),
        v_t_(v != nullptr ? new T[seqs.count * heads * dv * max_len_] : nullptr) {
    transpose_sequences(seqs, heads * dqk, k, k_t_.get());
    if (v != nullptr) transpose_sequences(seqs, heads * dv, v, v_t_.get());
  }

  // Column key0 (a key of sequence b) of head h's K^T / V^T (leading dimension ld()). Columns
  // past a sequence's length are never written (nor read).
  const T* k_t(int64_t b, int64_t h, int64_t key0) const {
    return k_t_.get() + ((b * heads_ + h) * dqk_) * max_len_ + key0;
  }
  const T* v_t(int64_t b, int64_t h, int64_t key0) const {
    return v_t_.get() + ((b * heads_ + h) * dv_) * max_len_ + key0;
  }
  int64_t ld() const { return max_len_; }

 private:
  int64_t heads_, dqk_, dv_, max_len_;
  std::unique_ptr<T[]> k_t_, v_t_;  // uninitialised: a zero fill would be a wasted pass
};

template <typename T>
class TransposedGradients {
 public:
  TransposedGradients(int64_t heads, int64_t dqk, int64_t dv, int64_t max_len)
      : heads_(heads),
        dqk_(dqk),
        dv_(dv),
        max_len_(max_len),
        q_t_(new T[dqk * kQueryBlock]),
        go_t_(new T[dv * kQueryBlock]),
        dk_t_(new T[heads * dqk * max_len]),
        dv_t_(new T[heads * dv * max_len]) {}

  // Zeroes the accumulators for an item over a sequence of `length` keys.
  void begin_item(int64_t length) {
    for (int64_t c = 0; c < heads_ * dqk_; ++c)
      std::fill_n(dk_t_.get() + c * max_len_, length, T(0));
    for (int64_t c = 0; c < heads_ * dv_; ++c)
      std::fill_n(dv_t_.get() + c * max_len_, length, T(0));
  }

  // scale Q^T [Dqk, rows] and dO^T [Dv, rows] of a block (leading dimension kQueryBlock).
  const T* q_t(const T* q, int64_t rows, int64_t ld_q, T scale) {
    transpose(rows, dqk_, q, ld_q, q_t_.get(), kQueryBlock, scale);
    return q_t_.get();
  }
  const T* go_t(const T* go, int64_t rows, int64_t ld_go) {
    transpose(rows, dv_, go, ld_go, go_t_.get(), kQueryBlock);
    return go_t_.get();
  }

  // Column key0 (a key of the item's sequence) of head h's dK^T / dV^T (leading dimension ld()).
  T* dk_t(int64_t h, int64_t key0) { return dk_t_.get() + h * dqk_ * max_len_ + key0; }
  T* dv_t(int64_t h, int64_t key0) { return dv_t_.get() + h * dv_ * max_len_ + key0; }
  int64_t ld() const { return max_len_; }

  // Adds the item's dK^T / dV^T into the first `length` rows of dK [rows, H, Dqk] and
  // dV [rows, H, Dv] (pointers at the sequence's first row).
  void end_item(int64_t length, T* dk, T* dv) {
    for (int64_t h = 0; h < heads_; ++h) {
      transpose(dqk_, length, dk_t(h, 0), max_len_, dk + h * dqk_, heads_ * dqk_, T(1), true);
      transpose(dv_, length, dv_t(h, 0), max_len_, dv + h * dv_, heads_ * dv_, T(1), true);
    }
  }

 private:
  int64_t heads_, dqk_, dv_, max_len_;
  std::unique_ptr<T[]> q_t_, go_t_, dk_t_, dv_t_;  // uninitialised; begin_item zeroes dK^T, dV^T
};

// Per-thread scratch of the HSTU-family backward: the tiles and the transposed gradient
// accumulators.
template <typename T>
struct BackwardScratch {
  TileArena<T> tiles;
  TransposedGradients<T> grads;
};

// Scales `rows` rows of `cols` values (row stride ld) by alpha.
template <typename T>
void scale_rows(T* x, int64_t rows, int64_t cols, int64_t ld, T alpha) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) x[r * ld + c] *= alpha;
  }
}

}  // namespace recops::attention::kernels
