// DeBERTa disentangled attention on CPU (docs/ops.md section 6):
//   A[i,j] = scale * (q_i.k_j + [c2p] q_i.pos_key[d(i,j)] + [p2c] k_j.pos_query[d(i,j)]),
//   P = softmax_j(A masked), O = dropout(P) V,
// with d(i,j) the clamped (log-bucketed) relative-position index of the pair.
//
// Tiling (work_items.h): a unit is one (batch, head) pair; work items (unit, chunk) own
// interleaved blocks of kQueryBlock query rows, run by the attention kernels' one work loop. Every
// product is a gemm_nn tile product (oneDNN's brgemm micro-kernel, common/blas.h) on operands laid
// out for it. Per item, the position scores P2C^T = pos_query K^T [2 span, keys] are computed once;
// per query block, C2P^T = pos_key Q_block^T [2 span, rows]. Backward computes them again rather
// than keeping O(B H S span) of them between the passes. A query block then streams over key tiles
// of kKeyTile keys: one product for Q K^T, the position terms of the tile built in diagonal layout
// (one relative distance per diagonal, contiguous slices of the transposed tables, see
// softmax_tile_ops.h) and added to it, masking and an online softmax row by row (running max and
// sum per row, fp32 or float64), one product for P V into the output rows. The log-sum-exp of
// every row is saved; backward forms D = rowsum(dO * O) per block, recomputes the probabilities
// tile by tile, shears each score-gradient tile into diagonals and adds them to dC2P^T / dP2C^T
// by the diagonal's index (contiguous adds, no scatter), and turns those into dq, dk, d pos_key and
// d pos_query with four more products per block / item. Tiles far from the diagonal, where the
// clamped distance gives every pair one index, skip the diagonal layout (a per-row plus a per-key
// term; row and column sums of the gradient). dq rows belong to the item; dk, dv go to per-chunk
// partials and d pos_key / d pos_query to per-thread partials that the adapter sums. Dropout
// regenerates its mask from a counter-based hash of (seed, unit, row, key). Extra memory: per
// thread O(kQueryBlock
// * (kKeyTile + span) + k_len * span), never [S, S] (unless the caller asks for the probabilities).
// The arithmetic on the score tiles (everything between the products) is disentangled_tiles.h's,
// shared with the bf16-operand kernel (disentangled_attention_bf16.h); this file runs the products
// on fp32 or float64 operands.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "recops/common/blas.h"
#include "recops/common/parallel.h"
#include "recops/deberta/kernels/disentangled_tiles.h"

namespace recops::attention::kernels {

// Per-thread scratch; the BLAS stays single-threaded while it lives. The position scores and
// their gradients are kept transposed, as the diagonal layout reads them: C2P^T
// [positions, kQueryBlock] for the block, P2C^T [positions, k_len] for the item. The tile
// products run on gemm_nn, which takes no transposes: the operands that enter transposed are
// laid out here once per item (scale K^T, V^T, pos_key^T, pos_query^T) or per query block
// (Q^T, scale Q^T, dO^T), and dK, dV are accumulated transposed over the item.
template <typename T>
struct SoftmaxScratch : SoftmaxTiles<T> {
  SingleThreadedBlas blas;
  std::vector<T> k_t, v_t, q_t, q_t_scaled, go_t, dq_t, pos_key_t, pos_query_t, dk_t, dv_t;
  int64_t slot;

  SoftmaxScratch(const DisentangledShape<T>& s, bool backward, int64_t thread_slot)
      : SoftmaxTiles<T>(s, backward, s.positions, s.k_len),
        blas(),
        k_t(s.dqk * s.k_len),
        v_t(backward ? s.dv * s.k_len : 0),
        q_t(backward ? s.dqk * kQueryBlock : 0),
        q_t_scaled(s.c2p ? s.dqk * kQueryBlock : 0),
        go_t(backward ? s.dv * kQueryBlock : 0),
        dq_t(s.c2p && backward ? s.dqk * kQueryBlock : 0),
        pos_key_t(s.c2p && backward ? s.dqk * s.positions : 0),
        pos_query_t(s.p2c && backward ? s.dqk * s.positions : 0),
        dk_t(backward ? s.dqk * s.k_len : 0),
        dv_t(backward ? s.dv * s.k_len : 0),
        slot(thread_slot) {}
};

// Lays out scale K^T [dqk, k_len] for the unit's keys (the right operand of Q K^T and of P2C^T).
template <typename T>
void unit_scaled_k_t(const DisentangledShape<T>& s, const Unit<T>& unit, SoftmaxScratch<T>& t) {
  transpose(unit.keys, s.dqk, unit.k, s.dqk, t.k_t.data(), s.k_len, s.scale);
}

// P2C^T = pos_query (scale K^T) for the unit's keys.
template <typename T>
void unit_p2c(const DisentangledShape<T>& s, const Unit<T>& unit, SoftmaxScratch<T>& t) {
  gemm_nn(s.positions, unit.keys, s.dqk, unit.pos_query, s.heads * s.dqk, t.k_t.data(), s.k_len,
          t.p2c_t.data(), s.k_len, false);
}

// C2P^T = pos_key (scale Q_block^T) for the block's rows.
template <typename T>
void block_c2p(const DisentangledShape<T>& s, const Unit<T>& unit, int64_t row0, int64_t rows,
               SoftmaxScratch<T>& t) {
  transpose(rows, s.dqk, unit.q + row0 * s.dqk, s.dqk, t.q_t_scaled.data(), kQueryBlock, s.scale);
  gemm_nn(s.positions, rows, s.dqk, unit.pos_key, s.heads * s.dqk, t.q_t_scaled.data(), kQueryBlock,
          t.c2p_t.data(), kQueryBlock, false);
}

template <typename T>
void forward_block(const TileOps<T>& passes, const DisentangledProblem<T>& p, const Unit<T>& unit,
                   int64_t row0, int64_t rows, SoftmaxScratch<T>& t,
                   const DisentangledOutputs<T>& o) {
  const DisentangledShape<T>& s = p.shape;
  const T* q = unit.q + row0 * s.dqk;
  const int64_t first_row = unit.index * s.q_len + row0;
  T* out = o.out + first_row * s.dv;
  T* probs = o.probs == nullptr ? nullptr : o.probs + first_row * s.k_len;
  if (s.c2p) block_c2p(s, unit, row0, rows, t);
  const OnlineSoftmax<T> st{t.row_max.data(), t.row_sum.data(), out, s.dv};
  std::fill(st.max, st.max + rows, -std::numeric_limits<T>::infinity());
  std::fill(st.sum, st.sum + rows, T(0));
  for (int64_t kt0 = 0; kt0 < unit.keys; kt0 += kKeyTile) {
    const int64_t n = std::min(kKeyTile, unit.keys - kt0);
    T* tile = t.scores.data();
    gemm_nn(rows, n, s.dqk, q, s.dqk, t.k_t.data() + kt0, s.k_len, tile, n, false);
    if (p.delta != nullptr) add_position_terms(passes, p, t.positions(s), row0, rows, kt0, n, tile);
    softmax_tile_rows(passes, p, unit, row0, rows, kt0, n, tile, n, st, probs);
    gemm_nn(rows, s.dv, n, tile, n, unit.v + kt0 * s.dv, s.dv, out, s.dv, true);
  }
  finish_softmax_rows(passes, p, unit, row0, rows, st.max, st.sum, o.lse + first_row, probs,
                      [&](int64_t r, T factor) {
                        for (int64_t c = 0; c < s.dv; ++c) out[r * s.dv + c] *= factor;
                      });
}

template <typename T>
void disentangled_forward(const DisentangledProblem<T>& p, int64_t chunks,
                          const DisentangledOutputs<T>& o) {
  const TileOps<T>& passes = tile_ops<T>();
  for_each_unit_block(
      p, chunks, [&](int64_t slot) { return SoftmaxScratch<T>(p.shape, false, slot); },
      [&](SoftmaxScratch<T>& t, const Unit<T>& unit) {
        unit_scaled_k_t(p.shape, unit, t);
        if (p.shape.p2c) unit_p2c(p.shape, unit, t);
      },
      [&](SoftmaxScratch<T>& t, const Unit<T>& unit, int64_t row0, int64_t rows) {
        forward_block(passes, p, unit, row0, rows, t, o);
      },
      [](SoftmaxScratch<T>&, const Unit<T>&, const WorkItem&) {});
}

template <typename T>
void backward_block(const TileOps<T>& passes, const DisentangledProblem<T>& p, const Unit<T>& unit,
                    int64_t row0, int64_t rows, SoftmaxScratch<T>& t,
                    const DisentangledBackwardInputs<T>& in, const DisentangledGrads<T>& g) {
  const DisentangledShape<T>& s = p.shape;
  const T* q = unit.q + row0 * s.dqk;
  const int64_t first_row = unit.index * s.q_len + row0;
  const T* go = in.grad_out + first_row * s.dv;
  T* dq = g.dq + first_row * s.dqk;
  block_row_dots(s, in, first_row, rows, t.row_d.data());
  transpose(rows, s.dqk, q, s.dqk, t.q_t.data(), kQueryBlock);
  transpose(rows, s.dv, go, s.dv, t.go_t.data(), kQueryBlock);
  if (s.c2p) {
    block_c2p(s, unit, row0, rows, t);
    std::fill(t.dc2p_t.begin(), t.dc2p_t.end(), T(0));
  }
  for (int64_t kt0 = 0; kt0 < unit.keys; kt0 += kKeyTile) {
    const int64_t n = std::min(kKeyTile, unit.keys - kt0);
    T* tile = t.scores.data();
    T* dtile = t.grads.data();
    gemm_nn(rows, n, s.dqk, q, s.dqk, t.k_t.data() + kt0, s.k_len, tile, n, false);
    gemm_nn(rows, n, s.dv, go, s.dv, t.v_t.data() + kt0, s.k_len, dtile, n, false);
    if (p.delta != nullptr) add_position_terms(passes, p, t.positions(s), row0, rows, kt0, n, tile);
    softmax_grad_tile_rows(passes, p, unit, in, row0, rows, kt0, n, tile, dtile, n,
                           in.lse + first_row, t.row_d.data());
    if (p.delta != nullptr) {
      add_position_grads(passes, p, t.position_grads(s), row0, rows, kt0, n, dtile);
    }
    // dV^T += dO^T P, dQ += dS K, dK^T += Q^T dS.
    gemm_nn(s.dv, n, rows, t.go_t.data(), kQueryBlock, tile, n, t.dv_t.data() + kt0, s.k_len, true);
    gemm_nn(rows, s.dqk, n, dtile, n, unit.k + kt0 * s.dqk, s.dqk, dq, s.dqk, true);
    gemm_nn(s.dqk, n, rows, t.q_t.data(), kQueryBlock, dtile, n, t.dk_t.data() + kt0, s.k_len,
            true);
  }
  if (s.c2p) {
    // dQ^T = pos_key^T dC2P^T, added to dQ; d pos_key += dC2P^T Q.
    gemm_nn(s.dqk, rows, s.positions, t.pos_key_t.data(), s.positions, t.dc2p_t.data(), kQueryBlock,
            t.dq_t.data(), kQueryBlock, false);
    passes.transpose_scaled(t.dq_t.data(), s.dqk, rows, kQueryBlock, dq, s.dqk, T(1), true);
    const int64_t ld = s.heads * s.dqk;
    T* dpk = g.dpos_key + t.slot * s.positions * ld + unit.h * s.dqk;
    gemm_nn(s.positions, s.dqk, rows, t.dc2p_t.data(), kQueryBlock, q, s.dqk, dpk, ld, true);
  }
}

// Lays out the item's transposed operands and zeroes its transposed dK, dV accumulators.
template <typename T>
void prepare_backward_item(const DisentangledShape<T>& s, const Unit<T>& unit,
                           SoftmaxScratch<T>& t) {
  const int64_t ld = s.heads * s.dqk;
  unit_scaled_k_t(s, unit, t);
  transpose(unit.keys, s.dv, unit.v, s.dv, t.v_t.data(), s.k_len);
  if (s.c2p) transpose(s.positions, s.dqk, unit.pos_key, ld, t.pos_key_t.data(), s.positions);
  if (s.p2c) {
    transpose(s.positions, s.dqk, unit.pos_query, ld, t.pos_query_t.data(), s.positions);
    unit_p2c(s, unit, t);
    std::fill(t.dp2c_t.begin(), t.dp2c_t.end(), T(0));
  }
  std::fill(t.dk_t.begin(), t.dk_t.end(), T(0));
  std::fill(t.dv_t.begin(), t.dv_t.end(), T(0));
}

template <typename T>
void disentangled_backward(const DisentangledProblem<T>& p, int64_t chunks,
                           const DisentangledBackwardInputs<T>& in, const DisentangledGrads<T>& g) {
  const DisentangledShape<T>& s = p.shape;
  const int64_t units = s.batch * s.heads;
  const TileOps<T>& passes = tile_ops<T>();
  for_each_unit_block(
      p, chunks, [&](int64_t slot) { return SoftmaxScratch<T>(s, true, slot); },
      [&](SoftmaxScratch<T>& t, const Unit<T>& unit) { prepare_backward_item(s, unit, t); },
      [&](SoftmaxScratch<T>& t, const Unit<T>& unit, int64_t row0, int64_t rows) {
        backward_block(passes, p, unit, row0, rows, t, in, g);
      },
      [&](SoftmaxScratch<T>& t, const Unit<T>& unit, const WorkItem& item) {
        T* dk = g.dk + (item.chunk * units + unit.index) * s.k_len * s.dqk;
        T* dv = g.dv + (item.chunk * units + unit.index) * s.k_len * s.dv;
        if (s.p2c) {
          // dK^T += pos_query^T dP2C^T, d pos_query += dP2C^T K.
          const int64_t ld = s.heads * s.dqk;
          gemm_nn(s.dqk, unit.keys, s.positions, t.pos_query_t.data(), s.positions, t.dp2c_t.data(),
                  s.k_len, t.dk_t.data(), s.k_len, true);
          T* dpq = g.dpos_query + t.slot * s.positions * ld + unit.h * s.dqk;
          gemm_nn(s.positions, s.dqk, unit.keys, t.dp2c_t.data(), s.k_len, unit.k, s.dqk, dpq, ld,
                  true);
        }
        // The item owns its dK, dV partial: add the transposed accumulators into it.
        passes.transpose_scaled(t.dk_t.data(), s.dqk, unit.keys, s.k_len, dk, s.dqk, T(1), true);
        passes.transpose_scaled(t.dv_t.data(), s.dv, unit.keys, s.k_len, dv, s.dv, T(1), true);
      });
}

}  // namespace recops::attention::kernels
