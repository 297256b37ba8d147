// FuXi-alpha attention on CPU: three channels that share V and the mask M,
//   semantic   O_s = (silu(alpha Q K^T) * scale * M) V
//   temporal   O_t = (M * bias_ts) V
//   positional O_p = (M * bias_pos) V,
// the two bias channels shared by all heads. One forward and one backward body, templated on
// hstu_attention.h's precision policies; the semantic channel is HSTU's head without bias. One
// pass over each query block's key range serves all channels: the masked bias tiles are built
// (and, for bf16 products, rounded) once per block, per head only with a per-head mask. Backward
// recomputes tiles like HSTU's; the bias gradients are M * sum_h dO_c,h V_h^T, scattered once per
// block.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>

#include "recops/hstu/kernels/batch.h"
#include "recops/hstu/kernels/block_schedule.h"
#include "recops/hstu/kernels/mask_and_bias.h"

namespace recops::attention::kernels {

enum class FuxiChannel : int { kSemantic = 0, kTime = 1, kPosition = 2 };

// Where channel c of head h of row r starts in the output (and in its gradient):
// row * row_stride + channel_offset[c] + h * head_stride; channel_offset < 0: channel absent.
struct FuxiLayout {
  int64_t row_stride = 0, head_stride = 0;
  int64_t channel_offset[3] = {0, -1, -1};
  bool has(FuxiChannel c) const { return channel_offset[static_cast<int>(c)] >= 0; }
  int64_t at(int64_t row, int64_t head, FuxiChannel c) const {
    return row * row_stride + channel_offset[static_cast<int>(c)] + head * head_stride;
  }
};

// Tiles of the FuXi kernels (TileArena indices).
enum FuxiTile : int { kFuxiMask, kFuxiTime, kFuxiPosition, kFuxiScores, kFuxiGrads };
constexpr int kFuxiForwardTiles = kFuxiScores + 1;
constexpr int kFuxiTimeGrad = kFuxiGrads + 1, kFuxiPositionGrad = kFuxiGrads + 2;
constexpr int kFuxiBackwardTiles = kFuxiPositionGrad + 1;

// The bias channels: their fp32 weight tile, gradient tile and the precision's weight slot.
struct FuxiBiasChannel {
  FuxiChannel channel;
  int weights, grads, slot;
};
constexpr FuxiBiasChannel kFuxiBiasChannels[2] = {
    {FuxiChannel::kTime, kFuxiTime, kFuxiTimeGrad, 0},
    {FuxiChannel::kPosition, kFuxiPosition, kFuxiPositionGrad, 1}};

// The masked bias tiles of the time and position channels in arena t (null where the layout drops
// a channel), for build_masked_bias_tiles.
template <typename T, typename Arena>
std::array<MaskedBiasTile<T>, 2> fuxi_bias_tiles(const FuxiLayout& layout,
                                                 const BiasSource<T>& time,
                                                 const BiasSource<T>& position, Arena& t) {
  return {
      {{time, layout.has(FuxiChannel::kTime) ? t.tile(kFuxiTime) : nullptr, t.buckets()},
       {position, layout.has(FuxiChannel::kPosition) ? t.tile(kFuxiPosition) : nullptr, nullptr}}};
}

// The mask tile and the masked bias tiles of head h (build_masked_bias_tiles), and the weights the
// precision multiplies them by (VNNI for the backward) when they were rebuilt.
template <typename P, typename Arena>
void fuxi_block_tiles(const P& prec, const MaskSource<typename P::Compute>& mask,
                      const PaddedBlock& pb, int64_t h, const FuxiLayout& layout,
                      const std::array<MaskedBiasTile<typename P::Compute>, 2>& bias_tiles,
                      Arena& t, bool vnni) {
  if (!build_masked_bias_tiles(mask, prec.sequences(), pb.blk, pb.rows_pad, h, t.tile(kFuxiMask),
                               bias_tiles)) {
    return;
  }
  for (const FuxiBiasChannel& c : kFuxiBiasChannels) {
    if (layout.has(c.channel)) prec.round_weights(t, pb, c.weights, c.slot, vnni);
  }
}

// out: zero-initialised, addressed by `layout`.
template <typename P>
void fuxi_forward(const P& prec, const MaskSource<typename P::Compute>& mask,
                  const BiasSource<typename P::Compute>& time,
                  const BiasSource<typename P::Compute>& position, int64_t chunks,
                  const FuxiLayout& layout, typename P::Element* out) {
  const Sequences& seqs = prec.sequences();
  const int64_t H = prec.shape().heads;
  for_each_block_in_parallel(
      seqs, mask, chunks,
      [&](int64_t slot) {
        return prec.scratch(kFuxiForwardTiles, time.kind == BiasKind::kRelative, slot);
      },
      [&](typename P::Scratch& t, const Block& block) {
        const PaddedBlock pb = prec.pad(block);
        const int64_t row0 = seqs.query_row(pb.blk.b, pb.blk.row0);
        const auto bias_tiles = fuxi_bias_tiles(layout, time, position, t);
        prec.begin_forward_block(t, mask, pb);
        for (int64_t h = 0; h < H; ++h) {
          fuxi_block_tiles(prec, mask, pb, h, layout, bias_tiles, t, false);
          prec.silu_head_forward(
              t, mask, pb, h, nullptr, prec.forward_mask_tile(mask) ? t.tile(kFuxiMask) : nullptr,
              t.tile(kFuxiScores), out + layout.at(row0, h, FuxiChannel::kSemantic),
              layout.row_stride);
          for (const FuxiBiasChannel& c : kFuxiBiasChannels) {
            if (!layout.has(c.channel)) continue;
            prec.weighted_values(t, pb, h, prec.weights(t, c.weights, c.slot),
                                 out + layout.at(row0, h, c.channel), layout.row_stride);
          }
        }
      });
}

template <typename T>
struct FuxiGrads {
  QkvGrads<T> qkv;
  BiasGrads<T> time, position;
};

// grad_out addressed by `layout`; dQ, dK, dV and the bias gradients in the compute type.
template <typename P>
void fuxi_backward(const P& prec, const typename P::Element* grad_out,
                   const MaskSource<typename P::Compute>& mask,
                   const BiasSource<typename P::Compute>& time,
                   const BiasSource<typename P::Compute>& position, int64_t chunks,
                   const FuxiLayout& layout, const FuxiGrads<typename P::Compute>& grads) {
  using C = typename P::Compute;
  const Sequences& seqs = prec.sequences();
  const int64_t H = prec.shape().heads, dqk = prec.shape().dqk;
  for_each_backward_block(
      seqs, mask, chunks, grads.qkv,
      [&](int64_t slot) {
        return prec.backward_scratch(kFuxiBackwardTiles, time.kind == BiasKind::kRelative, slot);
      },
      [&](typename P::BackwardScratch& scratch, const Block& block) {
        auto& t = scratch.tiles;
        const PaddedBlock pb = prec.pad(block);
        const Block& blk = pb.blk;
        const int64_t row0 = seqs.query_row(blk.b, blk.row0);
        const int64_t tile = pb.rows_pad * blk.stride();
        for (const FuxiBiasChannel& c : kFuxiBiasChannels) {
          if (layout.has(c.channel)) std::fill_n(t.tile(c.grads), tile, C(0));
        }
        const auto bias_tiles = fuxi_bias_tiles(layout, time, position, t);
        C* s = t.tile(kFuxiScores);
        const C* mask_tile = t.tile(kFuxiMask);
        for (int64_t h = 0; h < H; ++h) {
          fuxi_block_tiles(prec, mask, pb, h, layout, bias_tiles, t, true);
          // Semantic channel: as HSTU without bias.
          prec.silu_head_backward(scratch, pb, h,
                                  grad_out + layout.at(row0, h, FuxiChannel::kSemantic),
                                  layout.row_stride, nullptr, mask_tile, s, t.tile(kFuxiGrads),
                                  grads.qkv.dq + (row0 * H + h) * dqk, H * dqk);
          // Bias channels: dV^T += dO_c^T (M * bias); dbias += M * (dO_c V^T) (s as scratch).
          for (const FuxiBiasChannel& c : kFuxiBiasChannels) {
            if (!layout.has(c.channel)) continue;
            prec.weights_backward(scratch, pb, h, grad_out + layout.at(row0, h, c.channel),
                                  layout.row_stride, prec.weights(t, c.weights, c.slot), s);
            multiply_into(s, mask_tile, tile);
            add_into(t.tile(c.grads), static_cast<const C*>(s), tile);
          }
        }
        if (layout.has(FuxiChannel::kTime)) {
          accumulate_bias_grads(time, seqs, blk, 0, t.tile(kFuxiTimeGrad), t.buckets(), grads.time,
                                t.slot());
        }
        if (layout.has(FuxiChannel::kPosition)) {
          accumulate_bias_grads(position, seqs, blk, 0, t.tile(kFuxiPositionGrad), nullptr,
                                grads.position, t.slot());
        }
      });
}

}  // namespace recops::attention::kernels
