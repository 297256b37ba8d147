// The fp32 tile products of the HSTU-family kernels on fp32_operands.h's K^T and V^T, and what
// each thread needs for them. The kernels accumulate dK = dS^T Q and dV = A^T dO, which gemm_nn
// (untransposed operands only) computes transposed:
//  * TransposedGradients: per thread, the current work item's dK^T [H, Dqk, N] and dV^T
//    [H, Dv, N], accumulated over its query blocks and added into the item's dK / dV partial when
//    it ends, plus the transposed (scaled) Q and dO of the current block and head;
//  * silu_head_backward: the backward products of one head of one block (HSTU, and FuXi-alpha's
//    semantic channel).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>

#include "recops/attention/kernels/tile_variants.h"
#include "recops/common/blas.h"
#include "recops/hstu/kernels/batch.h"
#include "recops/hstu/kernels/block_schedule.h"
#include "recops/hstu/kernels/fp32_operands.h"

namespace recops::attention::kernels {

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

// Per-thread scratch of the fp32 HSTU-family backward: tile_count tiles (TileArena) and the
// transposed gradient accumulators.
template <typename T>
struct BackwardScratch {
  BackwardScratch(int tile_count, bool with_buckets, int64_t slot, const HstuShape<T>& shape,
                  int64_t max_len)
      : tiles(tile_count, max_len, with_buckets, slot),
        grads(shape.heads, shape.dqk, shape.dv, max_len) {}

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

// Backward of one head of one block of silu attention (HSTU; FuXi-alpha's semantic channel):
// recomputes S = Q K^T and dA = dO V^T, turns them into A (in s) and dS (in ds) with the mask and
// optional bias tiles, then dQ = alpha dS K, dK^T += (alpha Q^T) dS, dV^T += dO^T A. `go` is the
// head's dO with row stride ld_go.
template <typename T>
void silu_head_backward(const TileOps<T>& passes, const HstuShape<T>& shape,
                        const HstuTensors<T>& in, const KeyValueTransposes<T>& kv,
                        const Sequences& seqs, const Block& blk, int64_t h, const T* go,
                        int64_t ld_go, const T* bias, const T* mask, T* s, T* ds, T* dq_rows,
                        TransposedGradients<T>& tg) {
  const int64_t H = shape.heads, dqk = shape.dqk, dv = shape.dv;
  const int64_t row0 = seqs.row_begin[blk.b] + blk.row0;
  const int64_t key0 = seqs.row_begin[blk.b] + blk.key0;
  const T* q = in.q.at(row0, h, dqk);
  T* dq = dq_rows + (row0 * H + h) * dqk;
  gemm_nn(blk.rows, blk.keys, dqk, q, in.q.stride, kv.k_t(blk.b, h, blk.key0), kv.ld(), s, blk.keys,
          false);
  gemm_nn(blk.rows, blk.keys, dv, go, ld_go, kv.v_t(blk.b, h, blk.key0), kv.ld(), ds, blk.keys,
          false);
  passes.silu_score_grads(s, ds, bias, mask, blk.rows * blk.keys, shape.alpha, shape.silu_scale);
  gemm_nn(blk.rows, dqk, blk.keys, ds, blk.keys, in.k.at(key0, h, dqk), in.k.stride, dq, H * dqk,
          false);
  scale_rows(dq, blk.rows, dqk, H * dqk, shape.alpha);
  gemm_nn(dqk, blk.keys, blk.rows, tg.q_t(q, blk.rows, in.q.stride, shape.alpha), kQueryBlock, ds,
          blk.keys, tg.dk_t(h, blk.key0), tg.ld(), true);
  gemm_nn(dv, blk.keys, blk.rows, tg.go_t(go, blk.rows, ld_go), kQueryBlock, s, blk.keys,
          tg.dv_t(h, blk.key0), tg.ld(), true);
}

}  // namespace recops::attention::kernels
