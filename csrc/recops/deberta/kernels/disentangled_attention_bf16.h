// DeBERTa disentangled attention on bf16 operands: disentangled_attention.h's algorithm (work
// items, query blocks, key tiles, the diagonal layout of the position terms) with every tile
// product on the bf16 micro-kernel, fp32 accumulation (gemm_bf16; VNNI layouts and zero padding
// from attention/kernels/bf16_layouts.h). Everything between the products runs in
// fp32 on the fp32 product tiles, with the fp32 kernel's code (disentangled_tiles.h): position
// terms and their gradients, masking, the online softmax, dropout and the softmax backward; a
// tile's result is rounded to bf16 once, as the next product's operand (TileKernels' conversions).
//
// Operands, bf16 and zero padded to kBf16Granule (padding rows and columns of every fp32 tile
// are zero before they are rounded, so they add nothing):
//  * per item (one (batch, head) pair), laid out from the inputs: K^T and pos_key times the
//    scale, rounded once (HF's bf16 reference divides K by the scale in bf16 as well), so that Q
//    enters four products exactly; V (forward); V^T, K, pos_key^T, pos_query^T (backward);
//  * per query block: Q, Q^T, and in backward dO, dO^T;
//  * per key tile (its n keys padded to w): the probabilities P, the score gradients dS; per
//    block / item: dC2P^T / dP2C^T.
// The position scores C2P^T (per block) and P2C^T (per item) are bf16 products too; they and the
// score tiles are fp32 results, read by the diagonal layout as in the fp32 kernel.
//
// Results: O rows rounded to bf16 from the block's fp32 accumulator; dQ rows rounded to bf16 once
// the block is done; dK, dV (per-chunk partials) and d pos_key, d pos_query (per-thread partials)
// stay fp32, as the fp32 kernel's, for the adapter to sum and round; the log-sum-exp and the
// probabilities (when asked for) are fp32. Extra memory per thread: the fp32 kernel's scratch plus
// bf16 copies of one unit's K, V and position tables and of dP2C^T.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "recops/attention/kernels/bf16_layouts.h"
#include "recops/common/blas.h"
#include "recops/common/half_bits.h"
#include "recops/common/parallel.h"
#include "recops/deberta/kernels/disentangled_tiles.h"

namespace recops::attention::kernels {

inline const uint16_t* bf16_bits_of(const Bf16* x) {
  return reinterpret_cast<const uint16_t*>(x);
}
inline uint16_t* bf16_bits_of(Bf16* x) {
  return reinterpret_cast<uint16_t*>(x);
}

// x[i] <- bf16(scale * x[i]) for n bf16 values, through an fp32 chunk and the vectorised
// rounding of the tile conversions.
inline void scale_bf16(const TileKernels& kernels, uint16_t* x, int64_t n, float scale) {
  constexpr int64_t kChunk = 256;
  float wide[kChunk];
  for (int64_t i0 = 0; i0 < n; i0 += kChunk) {
    const int64_t m = std::min(kChunk, n - i0);
    for (int64_t i = 0; i < m; ++i) wide[i] = float_from_bf16_bits(x[i0 + i]);
    kernels.to_bf16(wide, x + i0, m, scale);
  }
}

// The sizes of a call's bf16 products: head dims, keys and position rows rounded up to
// kBf16Granule.
struct Bf16Padding {
  int64_t dqk, dv, keys, positions;

  explicit Bf16Padding(const DisentangledShape<float>& s)
      : dqk(round_up(s.dqk, kBf16Granule)),
        dv(round_up(s.dv, kBf16Granule)),
        keys(round_up(s.k_len, kBf16Granule)),
        positions(round_up(s.positions, kBf16Granule)) {}
};

// Per-thread scratch of the bf16 kernels (see the file comment): the fp32 SoftmaxTiles, position
// rows and P2C^T rows padded, and the bf16 operands.
struct DisentangledBf16Scratch : SoftmaxTiles<float> {
  DisentangledBf16Scratch(const DisentangledShape<float>& s, bool backward, int64_t thread_slot)
      : DisentangledBf16Scratch(s, backward, thread_slot, Bf16Padding(s)) {}
  DisentangledBf16Scratch(const DisentangledShape<float>& s, bool backward, int64_t thread_slot,
                          const Bf16Padding& padding)
      : SoftmaxTiles<float>(s, backward, padding.positions, padding.keys),
        pad(padding),
        slot(thread_slot),
        acc(kQueryBlock * (backward ? pad.dqk : pad.dv)),
        dq_t(s.c2p && backward ? pad.dqk * kQueryBlock : 0),
        dk_t(backward ? pad.dqk * pad.keys : 0),
        dv_t(backward ? pad.dv * pad.keys : 0),
        dpos_key(s.c2p && backward ? pad.positions * pad.dqk : 0),
        dpos_query(s.p2c && backward ? pad.positions * pad.dqk : 0),
        k_t_scaled(pad.dqk * pad.keys),
        k_vnni(backward ? pad.keys * pad.dqk : 0),
        v_vnni(backward ? 0 : pad.keys * pad.dv),
        v_t_vnni(backward ? pad.dv * pad.keys : 0),
        pos_key_scaled(s.c2p ? pad.positions * pad.dqk : 0),
        pos_key_t(s.c2p && backward ? pad.dqk * pad.positions : 0),
        pos_query(s.p2c ? pad.positions * pad.dqk : 0),
        pos_query_t(s.p2c && backward ? pad.dqk * pad.positions : 0),
        q(kQueryBlock * pad.dqk),
        q_t_vnni(s.c2p ? pad.dqk * kQueryBlock : 0),
        q_t(backward ? pad.dqk * kQueryBlock : 0),
        q_vnni(s.c2p && backward ? kQueryBlock * pad.dqk : 0),
        go(backward ? kQueryBlock * pad.dv : 0),
        go_t(backward ? pad.dv * kQueryBlock : 0),
        probs(kQueryBlock * kKeyTile),
        ds(backward ? kQueryBlock * kKeyTile : 0),
        ds_vnni(backward ? kQueryBlock * kKeyTile : 0),
        dpos(backward ? std::max(dc2p_t.size(), dp2c_t.size()) : 0),
        dpos_vnni(dpos.size()) {}
  ~DisentangledBf16Scratch() { gemm_bf16_release(); }
  DisentangledBf16Scratch(const DisentangledBf16Scratch&) = delete;
  DisentangledBf16Scratch& operator=(const DisentangledBf16Scratch&) = delete;

  Bf16Padding pad;
  int64_t slot;
  // fp32 beside SoftmaxTiles: the block's output (forward) or dQ (backward) accumulator, the
  // item's dK^T, dV^T and table gradients.
  std::vector<float> acc, dq_t, dk_t, dv_t, dpos_key, dpos_query;
  // bf16 bits: the item's operands, the block's, the tiles' (P, dS, dC2P^T or dP2C^T).
  std::vector<uint16_t> k_t_scaled, k_vnni, v_vnni, v_t_vnni, pos_key_scaled, pos_key_t, pos_query;
  std::vector<uint16_t> pos_query_t, q, q_t_vnni, q_t, q_vnni, go, go_t;
  std::vector<uint16_t> probs, ds, ds_vnni, dpos, dpos_vnni;
};

// Lays out the item's operands; P2C^T = pos_query (scale K^T); zeroes the backward's
// accumulators.
inline void prepare_item_bf16(const TileKernels& kernels, const DisentangledShape<float>& s,
                              const Unit<Bf16>& unit, bool backward, DisentangledBf16Scratch& t) {
  const Bf16Padding& pad = t.pad;
  const uint16_t* k = bf16_bits_of(unit.k);
  const uint16_t* v = bf16_bits_of(unit.v);
  const int64_t ld_pos = s.heads * s.dqk;
  pack_vnni_transposed(kernels, k, unit.keys, s.dqk, s.dqk, pad.dqk, pad.keys, t.k_t_scaled.data());
  scale_bf16(kernels, t.k_t_scaled.data(), pad.dqk * pad.keys, s.scale);
  if (backward) {
    pack_vnni_rows(k, unit.keys, s.dqk, s.dqk, pad.keys, pad.dqk, t.k_vnni.data());
    pack_vnni_transposed(kernels, v, unit.keys, s.dv, s.dv, pad.dv, pad.keys, t.v_t_vnni.data());
  } else {
    pack_vnni_rows(v, unit.keys, s.dv, s.dv, pad.keys, pad.dv, t.v_vnni.data());
  }
  if (s.c2p) {
    copy_padded(bf16_bits_of(unit.pos_key), s.positions, s.dqk, ld_pos, t.pos_key_scaled.data(),
                pad.positions, pad.dqk);
    if (backward) {
      transpose_padded(kernels, t.pos_key_scaled.data(), pad.positions, pad.dqk,
                       t.pos_key_t.data());
    }
    scale_bf16(kernels, t.pos_key_scaled.data(), pad.positions * pad.dqk, s.scale);
  }
  const int64_t keys_pad = round_up(unit.keys, kBf16Granule);
  if (s.p2c) {
    copy_padded(bf16_bits_of(unit.pos_query), s.positions, s.dqk, ld_pos, t.pos_query.data(),
                pad.positions, pad.dqk);
    if (backward) {
      transpose_padded(kernels, t.pos_query.data(), pad.positions, pad.dqk, t.pos_query_t.data());
    }
    if (keys_pad > 0) {
      gemm_bf16(pad.positions, keys_pad, pad.dqk, t.pos_query.data(), pad.dqk, t.k_t_scaled.data(),
                pad.keys, t.p2c_t.data(), pad.keys, false);
    }
  }
  if (backward) {
    for (auto* acc : {&t.dk_t, &t.dv_t, &t.dp2c_t, &t.dpos_key, &t.dpos_query}) {
      std::fill(acc->begin(), acc->end(), 0.0f);
    }
  }
}

// The block's Q rows [rows_pad, dqk] and, with c2p, C2P^T = (scale pos_key) Q^T.
inline void prepare_block_bf16(const TileKernels& kernels, const DisentangledShape<float>& s,
                               const Unit<Bf16>& unit, int64_t row0, int64_t rows, int64_t rows_pad,
                               DisentangledBf16Scratch& t) {
  const Bf16Padding& pad = t.pad;
  const uint16_t* q = bf16_bits_of(unit.q) + row0 * s.dqk;
  copy_padded(q, rows, s.dqk, s.dqk, t.q.data(), rows_pad, pad.dqk);
  if (!s.c2p) return;
  pack_vnni_transposed(kernels, q, rows, s.dqk, s.dqk, pad.dqk, kQueryBlock, t.q_t_vnni.data());
  gemm_bf16(pad.positions, rows_pad, pad.dqk, t.pos_key_scaled.data(), pad.dqk, t.q_t_vnni.data(),
            kQueryBlock, t.c2p_t.data(), kQueryBlock, false);
}

// The [rows_pad x w] tile of scaled scores of the block's rows and keys [kt0, kt0 + w), position
// terms added to its first `rows` rows; the padding rows are zero.
inline void block_scores_bf16(const TileOps<float>& passes, const DisentangledProblem<Bf16>& p,
                              int64_t row0, int64_t rows, int64_t rows_pad, int64_t kt0, int64_t w,
                              DisentangledBf16Scratch& t, float* tile) {
  const Bf16Padding& pad = t.pad;
  gemm_bf16(rows_pad, w, pad.dqk, t.q.data(), pad.dqk, t.k_t_scaled.data() + 2 * kt0, pad.keys,
            tile, w, false);
  // Zero Q rows give zero products, unless K holds an inf or NaN: make sure.
  std::fill(tile + rows * w, tile + rows_pad * w, 0.0f);
  if (p.delta != nullptr)
    add_position_terms(passes, p, t.positions(p.shape), row0, rows, kt0, w, tile);
}

inline void forward_block_bf16(const TileKernels& kernels, const DisentangledProblem<Bf16>& p,
                               const Unit<Bf16>& unit, int64_t row0, int64_t rows,
                               DisentangledBf16Scratch& t, const DisentangledOutputs<Bf16>& o) {
  const DisentangledShape<float>& s = p.shape;
  const Bf16Padding& pad = t.pad;
  const int64_t rows_pad = round_up(rows, kBf16Granule);
  const int64_t first_row = unit.index * s.q_len + row0;
  float* probs = o.probs == nullptr ? nullptr : o.probs + first_row * s.k_len;
  prepare_block_bf16(kernels, s, unit, row0, rows, rows_pad, t);
  const OnlineSoftmax<float> st{t.row_max.data(), t.row_sum.data(), t.acc.data(), pad.dv};
  std::fill(st.max, st.max + rows, -std::numeric_limits<float>::infinity());
  std::fill(st.sum, st.sum + rows, 0.0f);
  std::fill(st.acc, st.acc + rows_pad * pad.dv, 0.0f);
  for (int64_t kt0 = 0; kt0 < unit.keys; kt0 += kKeyTile) {
    const int64_t n = std::min(kKeyTile, unit.keys - kt0), w = round_up(n, kBf16Granule);
    float* tile = t.scores.data();
    block_scores_bf16(kernels.fp32, p, row0, rows, rows_pad, kt0, w, t, tile);
    softmax_tile_rows(kernels.fp32, p, unit, row0, rows, kt0, n, tile, w, st, probs);
    kernels.to_bf16(tile, t.probs.data(), rows_pad * w, 1.0f);
    gemm_bf16(rows_pad, pad.dv, w, t.probs.data(), w, t.v_vnni.data() + kt0 * pad.dv, pad.dv,
              st.acc, pad.dv, true);
  }
  uint16_t* out = bf16_bits_of(o.out) + first_row * s.dv;
  finish_softmax_rows(kernels.fp32, p, unit, row0, rows, st.max, st.sum, o.lse + first_row, probs,
                      [&](int64_t r, float factor) {
                        kernels.to_bf16(st.acc + r * pad.dv, out + r * s.dv, s.dv, factor);
                      });
}

// fp32 and float64 run disentangled_attention.h's template; bf16 this overload.
inline void disentangled_forward(const DisentangledProblem<Bf16>& p, int64_t chunks,
                                 const DisentangledOutputs<Bf16>& o) {
  const TileKernels& kernels = tile_kernels(cpu_isa());
  for_each_unit_block(
      p, chunks, [&](int64_t slot) { return DisentangledBf16Scratch(p.shape, false, slot); },
      [&](DisentangledBf16Scratch& t, const Unit<Bf16>& unit) {
        prepare_item_bf16(kernels, p.shape, unit, false, t);
      },
      [&](DisentangledBf16Scratch& t, const Unit<Bf16>& unit, int64_t row0, int64_t rows) {
        forward_block_bf16(kernels, p, unit, row0, rows, t, o);
      },
      [](DisentangledBf16Scratch&, const Unit<Bf16>&, const WorkItem&) {});
}

// dQ^T += pos_key^T dC2P^T (added to the block's dQ accumulator) and d pos_key += dC2P^T Q, from
// the block's dC2P^T.
inline void block_c2p_grads_bf16(const TileKernels& kernels, const DisentangledShape<float>& s,
                                 const Unit<Bf16>& unit, int64_t row0, int64_t rows,
                                 int64_t rows_pad, DisentangledBf16Scratch& t) {
  const Bf16Padding& pad = t.pad;
  kernels.to_bf16(t.dc2p_t.data(), t.dpos.data(), pad.positions * kQueryBlock, 1.0f);
  kernels.to_bf16_vnni(t.dc2p_t.data(), pad.positions, kQueryBlock, t.dpos_vnni.data(), 1.0f);
  gemm_bf16(pad.dqk, rows_pad, pad.positions, t.pos_key_t.data(), pad.positions, t.dpos_vnni.data(),
            kQueryBlock, t.dq_t.data(), kQueryBlock, false);
  kernels.fp32.transpose_scaled(t.dq_t.data(), s.dqk, rows, kQueryBlock, t.acc.data(), pad.dqk,
                                1.0f, true);
  pack_vnni_rows(bf16_bits_of(unit.q) + row0 * s.dqk, rows, s.dqk, s.dqk, rows_pad, pad.dqk,
                 t.q_vnni.data());
  gemm_bf16(pad.positions, pad.dqk, rows_pad, t.dpos.data(), kQueryBlock, t.q_vnni.data(), pad.dqk,
            t.dpos_key.data(), pad.dqk, true);
}

inline void backward_block_bf16(const TileKernels& kernels, const DisentangledProblem<Bf16>& p,
                                const Unit<Bf16>& unit, int64_t row0, int64_t rows,
                                DisentangledBf16Scratch& t,
                                const DisentangledBackwardInputs<Bf16>& in,
                                const DisentangledGrads<Bf16>& g) {
  const DisentangledShape<float>& s = p.shape;
  const Bf16Padding& pad = t.pad;
  const int64_t rows_pad = round_up(rows, kBf16Granule);
  const int64_t first_row = unit.index * s.q_len + row0;
  block_row_dots(s, in, first_row, rows, t.row_d.data());
  prepare_block_bf16(kernels, s, unit, row0, rows, rows_pad, t);
  transpose_padded(kernels, t.q.data(), rows_pad, pad.dqk, t.q_t.data());
  copy_padded(bf16_bits_of(in.grad_out) + first_row * s.dv, rows, s.dv, s.dv, t.go.data(), rows_pad,
              pad.dv);
  transpose_padded(kernels, t.go.data(), rows_pad, pad.dv, t.go_t.data());
  std::fill(t.dc2p_t.begin(), t.dc2p_t.end(), 0.0f);
  float* dq = t.acc.data();
  std::fill(dq, dq + rows_pad * pad.dqk, 0.0f);
  for (int64_t kt0 = 0; kt0 < unit.keys; kt0 += kKeyTile) {
    const int64_t n = std::min(kKeyTile, unit.keys - kt0), w = round_up(n, kBf16Granule);
    float* tile = t.scores.data();
    float* dtile = t.grads.data();
    block_scores_bf16(kernels.fp32, p, row0, rows, rows_pad, kt0, w, t, tile);
    gemm_bf16(rows_pad, w, pad.dv, t.go.data(), pad.dv, t.v_t_vnni.data() + 2 * kt0, pad.keys,
              dtile, w, false);
    std::fill(dtile + rows * w, dtile + rows_pad * w, 0.0f);
    softmax_grad_tile_rows(kernels.fp32, p, unit, in, row0, rows, kt0, n, tile, dtile, w,
                           in.lse + first_row, t.row_d.data());
    if (p.delta != nullptr) {
      add_position_grads(kernels.fp32, p, t.position_grads(s), row0, rows, kt0, w, dtile);
    }
    // dV^T += dO^T P, dQ += dS K, dK^T += Q^T dS.
    kernels.backward_operands_to_bf16(tile, dtile, rows_pad, w, 1.0f, t.probs.data(), t.ds.data(),
                                      t.ds_vnni.data());
    gemm_bf16(pad.dv, w, rows_pad, t.go_t.data(), rows_pad, t.probs.data(), w, t.dv_t.data() + kt0,
              pad.keys, true);
    gemm_bf16(rows_pad, pad.dqk, w, t.ds.data(), w, t.k_vnni.data() + kt0 * pad.dqk, pad.dqk, dq,
              pad.dqk, true);
    gemm_bf16(pad.dqk, w, rows_pad, t.q_t.data(), rows_pad, t.ds_vnni.data(), w,
              t.dk_t.data() + kt0, pad.keys, true);
  }
  if (s.c2p) block_c2p_grads_bf16(kernels, s, unit, row0, rows, rows_pad, t);
  uint16_t* dq_out = bf16_bits_of(g.dq) + first_row * s.dqk;
  for (int64_t r = 0; r < rows; ++r) {
    kernels.to_bf16(dq + r * pad.dqk, dq_out + r * s.dqk, s.dqk, 1.0f);
  }
}

// dst (rows of stride ld_dst) += the first rows x cols of src (rows of stride ld_src).
inline void add_rows(const float* src, int64_t rows, int64_t cols, int64_t ld_src, float* dst,
                     int64_t ld_dst) {
  for (int64_t r = 0; r < rows; ++r) add_into(dst + r * ld_dst, src + r * ld_src, cols);
}

// The end of an item's backward: dK^T += pos_query^T dP2C^T and d pos_query += dP2C^T K (p2c),
// then the item's accumulators added into its dK, dV partial and the thread's table partials.
inline void finish_item_bf16(const TileKernels& kernels, const DisentangledShape<float>& s,
                             const Unit<Bf16>& unit, DisentangledBf16Scratch& t,
                             const DisentangledGrads<Bf16>& g, float* dk, float* dv) {
  const Bf16Padding& pad = t.pad;
  const int64_t keys_pad = round_up(unit.keys, kBf16Granule);
  const int64_t ld_pos = s.heads * s.dqk;
  const int64_t table = t.slot * s.positions * ld_pos + unit.h * s.dqk;
  if (s.p2c && keys_pad > 0) {
    kernels.to_bf16(t.dp2c_t.data(), t.dpos.data(), pad.positions * pad.keys, 1.0f);
    kernels.to_bf16_vnni(t.dp2c_t.data(), pad.positions, pad.keys, t.dpos_vnni.data(), 1.0f);
    gemm_bf16(pad.dqk, keys_pad, pad.positions, t.pos_query_t.data(), pad.positions,
              t.dpos_vnni.data(), pad.keys, t.dk_t.data(), pad.keys, true);
    gemm_bf16(pad.positions, pad.dqk, keys_pad, t.dpos.data(), pad.keys, t.k_vnni.data(), pad.dqk,
              t.dpos_query.data(), pad.dqk, true);
  }
  if (s.p2c)
    add_rows(t.dpos_query.data(), s.positions, s.dqk, pad.dqk, g.dpos_query + table, ld_pos);
  if (s.c2p) add_rows(t.dpos_key.data(), s.positions, s.dqk, pad.dqk, g.dpos_key + table, ld_pos);
  kernels.fp32.transpose_scaled(t.dk_t.data(), s.dqk, unit.keys, pad.keys, dk, s.dqk, 1.0f, true);
  kernels.fp32.transpose_scaled(t.dv_t.data(), s.dv, unit.keys, pad.keys, dv, s.dv, 1.0f, true);
}

inline void disentangled_backward(const DisentangledProblem<Bf16>& p, int64_t chunks,
                                  const DisentangledBackwardInputs<Bf16>& in,
                                  const DisentangledGrads<Bf16>& g) {
  const DisentangledShape<float>& s = p.shape;
  const int64_t units = s.batch * s.heads;
  const TileKernels& kernels = tile_kernels(cpu_isa());
  for_each_unit_block(
      p, chunks, [&](int64_t slot) { return DisentangledBf16Scratch(s, true, slot); },
      [&](DisentangledBf16Scratch& t, const Unit<Bf16>& unit) {
        prepare_item_bf16(kernels, s, unit, true, t);
      },
      [&](DisentangledBf16Scratch& t, const Unit<Bf16>& unit, int64_t row0, int64_t rows) {
        backward_block_bf16(kernels, p, unit, row0, rows, t, in, g);
      },
      [&](DisentangledBf16Scratch& t, const Unit<Bf16>& unit, const WorkItem& item) {
        const int64_t part = item.chunk * units + unit.index;
        finish_item_bf16(kernels, s, unit, t, g, g.dk + part * s.k_len * s.dqk,
                         g.dv + part * s.k_len * s.dv);
      });
}

}  // namespace recops::attention::kernels
