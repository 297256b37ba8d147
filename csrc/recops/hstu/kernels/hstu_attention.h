// HSTU attention on CPU: O_i = sum_j silu(alpha q_i.k_j + bias_ij) * scale * M_ij * v_j.
//
// One forward and one backward body, templated on a precision policy P (fp32_products.h's
// Fp32Precision for fp32 / float64, bf16_products.h's Bf16Precision for bf16), which brings the
// operands it lays out once per call, the per-thread scratch, the block's padding and the
// products of one head. Per query block (block_schedule.h) and head: the mask and bias tiles
// (mask_and_bias.h) are built once per block and shared by the heads unless they have a head dim,
// then the head's products. Backward recomputes the tile (never storing [N, N]); dQ rows belong to
// the item, dK/dV accumulate transposed per item, then in per-chunk partials that the adapter
// sums; the bias gradient is summed over the heads that share the bias before it is scattered.
// Extra memory: per-thread tiles O(kQueryBlock * N) plus O(H * D * N), about one copy of K and V.
#pragma once

#include <algorithm>
#include <cstdint>

#include "recops/hstu/kernels/batch.h"
#include "recops/hstu/kernels/block_schedule.h"
#include "recops/hstu/kernels/mask_and_bias.h"

namespace recops::attention::kernels {

// Tiles of the HSTU kernels (the scratch's fp32 tiles).
enum HstuTile : int { kMask, kBias, kScores, kGrads, kGradSum };
constexpr int kForwardTiles = kScores + 1;
constexpr int kBackwardTiles = kGradSum + 1;

// out [rows, H, Dv] (zero-initialised by the caller).
template <typename P>
void hstu_forward(const P& prec, const MaskSource<typename P::Compute>& mask,
                  const BiasSource<typename P::Compute>& bias, int64_t chunks,
                  typename P::Element* out) {
  using C = typename P::Compute;
  const Sequences& seqs = prec.sequences();
  const int64_t H = prec.shape().heads, dv = prec.shape().dv;
  for_each_block_in_parallel(
      seqs, mask, chunks,
      [&](int64_t slot) {
        return prec.scratch(kForwardTiles, bias.kind == BiasKind::kRelative, slot);
      },
      [&](typename P::Scratch& t, const Block& block) {
        const PaddedBlock pb = prec.pad(block);
        const Block& blk = pb.blk;
        const int64_t row0 = seqs.query_row(blk.b, blk.row0);
        C* mask_tile = prec.forward_mask_tile(mask) ? t.tile(kMask) : nullptr;
        const C* bias_tile = bias.kind == BiasKind::kNone ? nullptr : t.tile(kBias);
        prec.begin_forward_block(t, mask, pb);
        for (int64_t h = 0; h < H; ++h) {
          build_mask_and_bias_tiles(mask, bias, seqs, blk, pb.rows_pad, h, mask_tile, t.tile(kBias),
                                    t.buckets());
          prec.silu_head_forward(t, mask, pb, h, bias_tile, mask_tile, t.tile(kScores),
                                 out + (row0 * H + h) * dv, H * dv);
        }
      });
}

template <typename T>
struct HstuGrads {
  QkvGrads<T> qkv;
  BiasGrads<T> bias;
};

// grad_out [rows, H, Dv]; dQ, dK, dV in the compute type.
template <typename P>
void hstu_backward(const P& prec, const typename P::Element* grad_out,
                   const MaskSource<typename P::Compute>& mask,
                   const BiasSource<typename P::Compute>& bias, int64_t chunks,
                   const HstuGrads<typename P::Compute>& grads) {
  using C = typename P::Compute;
  const Sequences& seqs = prec.sequences();
  const int64_t H = prec.shape().heads, dqk = prec.shape().dqk, dv = prec.shape().dv;
  const bool has_bias = bias.kind != BiasKind::kNone;
  const bool shared_bias_grad = has_bias && !bias.per_head();
  for_each_backward_block(
      seqs, mask, chunks, grads.qkv,
      [&](int64_t slot) {
        return prec.backward_scratch(kBackwardTiles, bias.kind == BiasKind::kRelative, slot);
      },
      [&](typename P::BackwardScratch& scratch, const Block& block) {
        auto& t = scratch.tiles;
        const PaddedBlock pb = prec.pad(block);
        const Block& blk = pb.blk;
        const int64_t row0 = seqs.query_row(blk.b, blk.row0);
        const int64_t tile = pb.rows_pad * blk.stride();
        if (shared_bias_grad) std::fill_n(t.tile(kGradSum), tile, C(0));
        for (int64_t h = 0; h < H; ++h) {
          build_mask_and_bias_tiles(mask, bias, seqs, blk, pb.rows_pad, h, t.tile(kMask),
                                    t.tile(kBias), t.buckets());
          C* ds = t.tile(kGrads);
          prec.silu_head_backward(scratch, pb, h, grad_out + (row0 * H + h) * dv, H * dv,
                                  has_bias ? t.tile(kBias) : nullptr, t.tile(kMask),
                                  t.tile(kScores), ds, grads.qkv.dq + (row0 * H + h) * dqk,
                                  H * dqk);
          if (shared_bias_grad) {
            add_into(t.tile(kGradSum), static_cast<const C*>(ds), tile);
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
