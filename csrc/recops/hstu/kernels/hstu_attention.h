// HSTU attention on CPU: O_i = sum_j silu(alpha q_i.k_j + bias_ij) * scale * M_ij * v_j.
//
// Per query block (tiles.h) and head: two tile products (Q K^T, then A V) around one
// element-wise pass; the mask and bias tiles are built once per block and shared by the heads
// unless they have a head dim. The products run on gemm_nn with K^T, V^T laid out once per call
// (transposed_operands.h). Backward recomputes the tile (never storing [N, N]); dQ rows belong
// to the item, dK/dV accumulate transposed per item, then in per-chunk partials that the adapter
// sums. Extra memory: per-thread tiles O(kQueryBlock * N) plus O(H * D * N), one copy of K and
// V, and O(C * L * H * D) partials.
#pragma once

#include <cstdint>
#include <vector>

#include "recops/common/blas.h"
#include "recops/common/parallel.h"
#include "recops/hstu/kernels/tiles.h"
#include "recops/hstu/kernels/transposed_operands.h"

namespace recops::attention::kernels {

template <typename T>
struct HstuShape {
  int64_t heads = 1, dqk = 0, dv = 0;
  T alpha = T(1), silu_scale = T(1);
};

// Tiles of the HSTU kernels (TileArena indices).
enum HstuTile : int { kMask, kBias, kScores, kGrads, kGradSum };
constexpr int kForwardTiles = kScores + 1;
constexpr int kBackwardTiles = kGradSum + 1;

template <typename T>
struct HstuTensors {
  const T* q = nullptr;  // [rows, H, Dqk]
  const T* k = nullptr;  // [rows, H, Dqk]
  const T* v = nullptr;  // [rows, H, Dv]
};

// out [rows, H, Dv] (zero-initialised by the caller).
template <typename T>
void hstu_forward(const Sequences& seqs, const HstuShape<T>& shape, const HstuTensors<T>& in,
                  const MaskSource<T>& mask, const BiasSource<T>& bias, int64_t chunks, T* out) {
  const int64_t H = shape.heads, dqk = shape.dqk, dv = shape.dv;
  const std::vector<WorkItem> items = make_work_items(seqs.length, seqs.count, chunks);
  const KeyValueTransposes<T> kv(seqs, H, dqk, dv, in.k, nullptr);
  const TileOps<T>& passes = tile_ops<T>();
  parallel_for_dynamic(
      static_cast<int64_t>(items.size()),
      [&](int64_t slot) {
        return TileArena<T>(kForwardTiles, seqs.max_len, bias.kind == BiasKind::kRelative, slot);
      },
      [&](TileArena<T>& t, int64_t index) {
        for_each_block(
            seqs, mask, items[index], chunks, [&](const Block& blk, const StructuredMask& sm) {
              const int64_t row0 = seqs.row_begin[blk.b] + blk.row0;
              const int64_t key0 = seqs.row_begin[blk.b] + blk.key0;
              for (int64_t h = 0; h < H; ++h) {
                if (h == 0 || mask.per_head()) build_mask_tile(mask, sm, blk, h, t.tile(kMask));
                if (bias.kind != BiasKind::kNone && (h == 0 || bias.per_head())) {
                  build_bias_tile(bias, seqs, blk, h, t.tile(kBias), t.buckets());
                }
                T* s = t.tile(kScores);
                gemm_nn(blk.rows, blk.keys, dqk, in.q + (row0 * H + h) * dqk, H * dqk,
                        kv.k_t(blk.b, h, blk.key0), kv.ld(), s, blk.keys, false);
                passes.silu_scores(s, bias.kind == BiasKind::kNone ? nullptr : t.tile(kBias),
                                   t.tile(kMask), blk.rows * blk.keys, shape.alpha,
                                   shape.silu_scale);
                gemm_nn(blk.rows, dv, blk.keys, s, blk.keys, in.v + (key0 * H + h) * dv, H * dv,
                        out + (row0 * H + h) * dv, H * dv, false);
              }
            });
      });
}

template <typename T>
struct HstuGrads {
  QkvGrads<T> qkv;
  BiasGrads<T> bias;
};

// Runs the backward of the HSTU family over its work items with per-thread tiles (`tiles` of
// them) and transposed gradient accumulators: fn(tiles, grads, block, structured_mask) for every
// query block of an item, then the item's dK^T, dV^T added into its chunk's dK, dV partial.
template <typename T, typename Fn>
void for_each_backward_block(const Sequences& seqs, const HstuShape<T>& shape,
                             const MaskSource<T>& mask, int tiles, bool with_buckets,
                             int64_t chunks, const QkvGrads<T>& qkv, Fn&& fn) {
  const int64_t H = shape.heads;
  const std::vector<WorkItem> items = make_work_items(seqs.length, seqs.count, chunks);
  parallel_for_dynamic(
      static_cast<int64_t>(items.size()),
      [&](int64_t slot) {
        return BackwardScratch<T>{TileArena<T>(tiles, seqs.max_len, with_buckets, slot),
                                  TransposedGradients<T>(H, shape.dqk, shape.dv, seqs.max_len)};
      },
      [&](BackwardScratch<T>& scratch, int64_t index) {
        const WorkItem item = items[index];
        scratch.grads.begin_item(seqs.length[item.sequence]);
        for_each_block(seqs, mask, item, chunks, [&](const Block& blk, const StructuredMask& sm) {
          fn(scratch.tiles, scratch.grads, blk, sm);
        });
        const int64_t first = seqs.row_begin[item.sequence];
        scratch.grads.end_item(seqs.length[item.sequence],
                               qkv.dk_partial(item.chunk) + first * H * shape.dqk,
                               qkv.dv_partial(item.chunk) + first * H * shape.dv);
      });
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
  const T* q = in.q + (row0 * H + h) * dqk;
  T* dq = dq_rows + (row0 * H + h) * dqk;
  gemm_nn(blk.rows, blk.keys, dqk, q, H * dqk, kv.k_t(blk.b, h, blk.key0), kv.ld(), s, blk.keys,
          false);
  gemm_nn(blk.rows, blk.keys, dv, go, ld_go, kv.v_t(blk.b, h, blk.key0), kv.ld(), ds, blk.keys,
          false);
  passes.silu_score_grads(s, ds, bias, mask, blk.rows * blk.keys, shape.alpha, shape.silu_scale);
  gemm_nn(blk.rows, dqk, blk.keys, ds, blk.keys, in.k + (key0 * H + h) * dqk, H * dqk, dq, H * dqk,
          false);
  scale_rows(dq, blk.rows, dqk, H * dqk, shape.alpha);
  gemm_nn(dqk, blk.keys, blk.rows, tg.q_t(q, blk.rows, H * dqk, shape.alpha), kQueryBlock, ds,
          blk.keys, tg.dk_t(h, blk.key0), tg.ld(), true);
  gemm_nn(dv, blk.keys, blk.rows, tg.go_t(go, blk.rows, ld_go), kQueryBlock, s, blk.keys,
          tg.dv_t(h, blk.key0), tg.ld(), true);
}

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
      seqs, shape, mask, kBackwardTiles, bias.kind == BiasKind::kRelative, chunks, grads.qkv,
      [&](TileArena<T>& t, TransposedGradients<T>& tg, const Block& blk, const StructuredMask& sm) {
        const int64_t row0 = seqs.row_begin[blk.b] + blk.row0;
        const int64_t tile = blk.rows * blk.keys;
        if (shared_bias_grad) std::fill(t.tile(kGradSum), t.tile(kGradSum) + tile, T(0));
        for (int64_t h = 0; h < H; ++h) {
          if (h == 0 || mask.per_head()) build_mask_tile(mask, sm, blk, h, t.tile(kMask));
          if (has_bias && (h == 0 || bias.per_head())) {
            build_bias_tile(bias, seqs, blk, h, t.tile(kBias), t.buckets());
          }
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
