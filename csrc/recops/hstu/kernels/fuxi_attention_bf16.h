// FuXi-alpha attention on bf16 tiles: fuxi_attention.h's algorithm with hstu_attention_bf16.h's
// products (bf16_products.h: bf16 operands, fp32 accumulation, fp32 SiLU / mask / bias tiles). The
// masked bias tiles are rounded to bf16 once per block (per head only with a per-head mask) as
// the weights of their channels' products with V.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>

#include "recops/attention/kernels/tile_variants.h"
#include "recops/common/cpu_isa.h"
#include "recops/hstu/kernels/batch.h"
#include "recops/hstu/kernels/bf16_operands.h"
#include "recops/hstu/kernels/bf16_products.h"
#include "recops/hstu/kernels/block_schedule.h"
#include "recops/hstu/kernels/fuxi_attention.h"
#include "recops/hstu/kernels/mask_and_bias.h"

namespace recops::attention::kernels {

// out: zero-initialised bf16 bits, addressed by `layout`.
inline void fuxi_forward_bf16(const Sequences& seqs, const HstuShape<float>& shape,
                              const Bf16Tensors& in, const MaskSource<float>& mask,
                              const BiasSource<float>& time, const BiasSource<float>& position,
                              int64_t chunks, const FuxiLayout& layout, uint16_t* out) {
  enum Bf16Tile : int { kSemanticA, kTimeA, kPositionA, kBf16Count };  // then the Q block
  const int64_t H = shape.heads, dqk = shape.dqk, dv = shape.dv;
  const PackedOperands ops(seqs, H, dqk, dv, in.k, in.v, {true, false, false, true});
  const int64_t dqk_pad = ops.dqk_pad(), dv_pad = ops.dv_pad();
  const TileKernels& passes = tile_kernels(cpu_isa());
  for_each_block_in_parallel(
      seqs, mask, chunks,
      [&](int64_t slot) {
        return Bf16Scratch(kFuxiForwardTiles, kBf16Count, ops, time.kind == BiasKind::kRelative,
                           slot);
      },
      [&](Bf16Scratch& t, const Block& block) {
        const PaddedBlock pb = pad_block(block);
        const Block& blk = pb.blk;
        const int64_t row0 = seqs.row_begin[blk.b] + blk.row0;
        const int64_t ld = blk.ld, tile = pb.rows_pad * ld;
        float* s = t.fp32.tile(kFuxiScores);
        uint16_t* q = t.tile(kBf16Count);
        const std::pair<FuxiChannel, int> weights[3] = {{FuxiChannel::kSemantic, kSemanticA},
                                                        {FuxiChannel::kTime, kTimeA},
                                                        {FuxiChannel::kPosition, kPositionA}};
        const auto bias_tiles = fuxi_bias_tiles(layout, time, position, t.fp32);
        for (int64_t h = 0; h < H; ++h) {
          if (build_masked_bias_tiles(mask, seqs, blk, pb.rows_pad, h, t.fp32.tile(kFuxiMask),
                                      bias_tiles)) {
            if (layout.has(FuxiChannel::kTime)) {
              passes.to_bf16(t.fp32.tile(kFuxiTime), t.tile(kTimeA), tile, 1.0f);
            }
            if (layout.has(FuxiChannel::kPosition)) {
              passes.to_bf16(t.fp32.tile(kFuxiPosition), t.tile(kPositionA), tile, 1.0f);
            }
          }
          copy_padded(in.q.at(row0, h, dqk), blk.rows, dqk, in.q.stride, q, pb.rows_pad, dqk_pad);
          gemm_bf16(pb.rows_pad, ld, dqk_pad, q, dqk_pad, ops.k_t(blk.b, h, blk.key0), ops.n_pad(),
                    s, ld, false);
          passes.silu_scores_to_bf16(s, nullptr, t.fp32.tile(kFuxiMask), tile, shape.alpha,
                                     shape.silu_scale, t.tile(kSemanticA));
          for (const auto& [channel, a] : weights) {
            if (!layout.has(channel)) continue;
            gemm_bf16(pb.rows_pad, dv_pad, ld, t.tile(a), ld, ops.v(blk.b, h, blk.key0), dv_pad,
                      t.product.get(), dv_pad, false);
            store_rows(passes, t.product.get(), blk.rows, dv, dv_pad,
                       out + layout.at(row0, h, channel), layout.row_stride);
          }
        }
      });
}

// grad_out bf16 bits addressed by `layout`; grads as fuxi_backward's (fp32).
inline void fuxi_backward_bf16(const Sequences& seqs, const HstuShape<float>& shape,
                               const Bf16Tensors& in, const uint16_t* grad_out,
                               const MaskSource<float>& mask, const BiasSource<float>& time,
                               const BiasSource<float>& position, int64_t chunks,
                               const FuxiLayout& layout, const FuxiGrads<float>& grads) {
  // Bf16Scratch tiles: silu_head_backward_bf16's, then the masked bias tiles in VNNI layout.
  constexpr int kTimeVnni = kSiluBf16Tiles, kPositionVnni = kSiluBf16Tiles + 1;
  const int64_t H = shape.heads, dqk = shape.dqk;
  const PackedOperands ops(seqs, H, dqk, shape.dv, in.k, in.v, {true, true, true, false});
  const TileKernels& passes = tile_kernels(cpu_isa());
  for_each_backward_block(
      seqs, mask, chunks, grads.qkv,
      [&](int64_t slot) {
        return Bf16BackwardScratch(kFuxiBackwardTiles, kPositionVnni + 1, ops,
                                   time.kind == BiasKind::kRelative, slot, shape);
      },
      [&](Bf16BackwardScratch& scratch, const Block& block) {
        Bf16Scratch& t = scratch.tiles;
        Bf16Gradients& tg = scratch.grads;
        const PaddedBlock pb = pad_block(block);
        const Block& blk = pb.blk;
        const int64_t row0 = seqs.row_begin[blk.b] + blk.row0;
        const int64_t ld = blk.ld, tile = pb.rows_pad * ld;
        const struct {
          FuxiChannel channel;
          int weight, weight_vnni, grad;
        } bias_channels[2] = {
            {FuxiChannel::kTime, kFuxiTime, kTimeVnni, kFuxiTimeGrad},
            {FuxiChannel::kPosition, kFuxiPosition, kPositionVnni, kFuxiPositionGrad}};
        for (const auto& c : bias_channels) {
          if (layout.has(c.channel)) std::fill_n(t.fp32.tile(c.grad), tile, 0.0f);
        }
        float* s = t.fp32.tile(kFuxiScores);
        const auto bias_tiles = fuxi_bias_tiles(layout, time, position, t.fp32);
        for (int64_t h = 0; h < H; ++h) {
          if (build_masked_bias_tiles(mask, seqs, blk, pb.rows_pad, h, t.fp32.tile(kFuxiMask),
                                      bias_tiles)) {
            for (const auto& c : bias_channels) {
              if (!layout.has(c.channel)) continue;
              passes.to_bf16_vnni(t.fp32.tile(c.weight), pb.rows_pad, ld, t.tile(c.weight_vnni),
                                  1.0f);
            }
          }
          // Semantic channel: as HSTU without bias.
          tg.load_block(in.q.at(row0, h, dqk), in.q.stride,
                        grad_out + layout.at(row0, h, FuxiChannel::kSemantic), layout.row_stride,
                        blk.rows, pb.rows_pad);
          silu_head_backward_bf16(passes, shape, ops, pb, h, nullptr, t.fp32.tile(kFuxiMask), s,
                                  t.fp32.tile(kFuxiGrads), t, tg,
                                  grads.qkv.dq + (row0 * H + h) * dqk, H * dqk);
          // Bias channels: dV^T += dO_c^T (M * bias); dbias += M * (dO_c V^T) (s as scratch).
          for (const auto& c : bias_channels) {
            if (!layout.has(c.channel)) continue;
            tg.load_go(grad_out + layout.at(row0, h, c.channel), layout.row_stride, blk.rows,
                       pb.rows_pad);
            gemm_bf16(ops.dv_pad(), ld, pb.rows_pad, tg.go_t(), pb.rows_pad, t.tile(c.weight_vnni),
                      ld, tg.dv_t(h, blk.key0), tg.ld(), true);
            gemm_bf16(pb.rows_pad, ld, ops.dv_pad(), tg.go(), ops.dv_pad(),
                      ops.v_t(blk.b, h, blk.key0), ops.n_pad(), s, ld, false);
            multiply_into(s, static_cast<const float*>(t.fp32.tile(kFuxiMask)), tile);
            add_into(t.fp32.tile(c.grad), static_cast<const float*>(s), tile);
          }
        }
        if (layout.has(FuxiChannel::kTime)) {
          accumulate_bias_grads(time, seqs, blk, 0, t.fp32.tile(kFuxiTimeGrad), t.fp32.buckets(),
                                grads.time, t.fp32.slot());
        }
        if (layout.has(FuxiChannel::kPosition)) {
          accumulate_bias_grads(position, seqs, blk, 0, t.fp32.tile(kFuxiPositionGrad), nullptr,
                                grads.position, t.fp32.slot());
        }
      });
}

}  // namespace recops::attention::kernels
