// HSTU attention on CPU: O_i = sum_j silu(alpha q_i.k_j + bias_ij) * scale * M_ij * v_j.
//
// Per query block (block_schedule.h) and head: two tile products (Q K^T, then A V) around one
// element-wise pass; the mask and bias tiles (mask_and_bias.h) are built once per block and
// shared by the heads unless they have a head dim. The products run on gemm_nn with K^T, V^T laid
// out once per call (fp32_operands.h; the backward's in fp32_products.h). Backward recomputes the
// tile (never storing [N, N]); dQ rows belong to the item, dK/dV accumulate transposed per item,
// then in per-chunk partials that the adapter sums. Extra memory: per-thread tiles O(kQueryBlock *
// N) plus O(H * D * N), one copy of K and V, and O(C * L * H * D) partials.
#pragma once

#include <algorithm>
#include <cstdint>

#include "recops/attention/kernels/tile_variants.h"
#include "recops/common/blas.h"
#include "recops/hstu/kernels/batch.h"
#include "recops/hstu/kernels/block_schedule.h"
#include "recops/hstu/kernels/fp32_operands.h"
#include "recops/hstu/kernels/fp32_products.h"
#include "recops/hstu/kernels/mask_and_bias.h"

namespace recops::attention::kernels {

// Tiles of the HSTU kernels (TileArena indices).
enum HstuTile : int { kMask, kBias, kScores, kGrads, kGradSum };
constexpr int kForwardTiles = kScores + 1;
constexpr int kBackwardTiles = kGradSum + 1;

// out [rows, H, Dv] (zero-initialised by the caller).
template <typename T>
void hstu_forward(const Sequences& seqs, const HstuShape<T>& shape, const HstuTensors<T>& in,
                  const MaskSource<T>& mask, const BiasSource<T>& bias, int64_t chunks, T* out) {
  const int64_t H = shape.heads, dqk = shape.dqk, dv = shape.dv;
  const KeyValueTransposes<T> kv(seqs, H, dqk, dv, in.k, Rows<T>{});
  const TileOps<T>& passes = tile_ops<T>();
  for_each_block_in_parallel(
      seqs, mask, chunks,
      [&](int64_t slot) {
        return TileArena<T>(kForwardTiles, seqs.max_len, bias.kind == BiasKind::kRelative, slot);
      },
      [&](TileArena<T>& t, const Block& blk) {
        const int64_t row0 = seqs.row_begin[blk.b] + blk.row0;
        const int64_t key0 = seqs.row_begin[blk.b] + blk.key0;
        for (int64_t h = 0; h < H; ++h) {
          build_mask_and_bias_tiles(mask, bias, seqs, blk, blk.rows, h, t.tile(kMask),
                                    t.tile(kBias), t.buckets());
          T* s = t.tile(kScores);
          gemm_nn(blk.rows, blk.keys, dqk, in.q.at(row0, h, dqk), in.q.stride,
                  kv.k_t(blk.b, h, blk.key0), kv.ld(), s, blk.keys, false);
          passes.silu_scores(s, bias.kind == BiasKind::kNone ? nullptr : t.tile(kBias),
                             t.tile(kMask), blk.rows * blk.keys, shape.alpha, shape.silu_scale);
          gemm_nn(blk.rows, dv, blk.keys, s, blk.keys, in.v.at(key0, h, dv), in.v.stride,
                  out + (row0 * H + h) * dv, H * dv, false);
        }
      });
}

template <typename T>
struct HstuGrads {
  QkvGrads<T> qkv;
  BiasGrads<T> bias;
};

template <typename T>
void hstu_backward(const Sequences& seqs, const HstuShape<T>& shape, const HstuTensors<T>& in,
                   const T* grad_out, const MaskSource<T>& mask, const BiasSource<T>& bias,
                   int64_t chunks, const HstuGrads<T>& grads) {
  const int64_t H = shape.heads, dv = shape.dv;
  const bool has_bias = bias.kind != BiasKind::kNone;
  const bool shared_bias_grad = has_bias && !bias.per_head();
  const KeyValueTransposes<T> kv(seqs, H, shape.dqk, dv, in.k, in.v);
  const TileOps<T>& passes = tile_ops<T>();
  for_each_backward_block(
      seqs, mask, chunks, grads.qkv,
      [&](int64_t slot) {
        return BackwardScratch<T>(kBackwardTiles, bias.kind == BiasKind::kRelative, slot, shape,
                                  seqs.max_len);
      },
      [&](BackwardScratch<T>& scratch, const Block& blk) {
        TileArena<T>& t = scratch.tiles;
        TransposedGradients<T>& tg = scratch.grads;
        const int64_t row0 = seqs.row_begin[blk.b] + blk.row0;
        const int64_t tile = blk.rows * blk.keys;
        if (shared_bias_grad) std::fill(t.tile(kGradSum), t.tile(kGradSum) + tile, T(0));
        for (int64_t h = 0; h < H; ++h) {
          build_mask_and_bias_tiles(mask, bias, seqs, blk, blk.rows, h, t.tile(kMask),
                                    t.tile(kBias), t.buckets());
          T* ds = t.tile(kGrads);
          silu_head_backward(passes, shape, in, kv, seqs, blk, h, grad_out + (row0 * H + h) * dv,
                             H * dv, has_bias ? t.tile(kBias) : nullptr, t.tile(kMask),
                             t.tile(kScores), ds, grads.qkv.dq, tg);
          if (shared_bias_grad) {
            add_into(t.tile(kGradSum), ds, tile);
          } else if (has_bias) {
            accumulate_bias_grads(bias, seqs, blk, h, ds, t.buckets(), grads.bias, t.slot());
          }
        }
        if (shared_bias_grad) {
          accumulate_bias_grads(bias, seqs, blk, 0, t.tile(kGradSum), t.buckets(), grads.bias,
                                t.slot());
        }
      });
}

}  // namespace recops::attention::kernels
