// FuXi-alpha attention on CPU: three channels that share V and the mask M,
//   semantic   O_s = (silu(alpha Q K^T) * scale * M) V
//   temporal   O_t = (M * bias_ts) V
//   positional O_p = (M * bias_pos) V,
// the two bias channels shared by all heads. One pass over each query block's key range serves
// all channels: the masked bias tiles are built once per block, and per head the loaded V panel
// feeds three products. Backward recomputes tiles like HSTU's; the bias gradients are
// M * sum_h dO_c,h V_h^T, scattered once per block.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <utility>

#include "recops/attention/kernels/tile_variants.h"
#include "recops/common/blas.h"
#include "recops/hstu/kernels/batch.h"
#include "recops/hstu/kernels/block_schedule.h"
#include "recops/hstu/kernels/fp32_operands.h"
#include "recops/hstu/kernels/fp32_products.h"
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

// The masked bias tiles of the time and position channels in arena t (null where the layout drops
// a channel), for build_masked_bias_tiles.
template <typename T>
std::array<MaskedBiasTile<T>, 2> fuxi_bias_tiles(const FuxiLayout& layout,
                                                 const BiasSource<T>& time,
                                                 const BiasSource<T>& position, TileArena<T>& t) {
  return {
      {{time, layout.has(FuxiChannel::kTime) ? t.tile(kFuxiTime) : nullptr, t.buckets()},
       {position, layout.has(FuxiChannel::kPosition) ? t.tile(kFuxiPosition) : nullptr, nullptr}}};
}

// out: zero-initialised, addressed by `layout`.
template <typename T>
void fuxi_forward(const Sequences& seqs, const HstuShape<T>& shape, const HstuTensors<T>& in,
                  const MaskSource<T>& mask, const BiasSource<T>& time,
                  const BiasSource<T>& position, int64_t chunks, const FuxiLayout& layout, T* out) {
  const int64_t H = shape.heads, dqk = shape.dqk, dv = shape.dv;
  const bool with_buckets = time.kind == BiasKind::kRelative;
  const KeyValueTransposes<T> kv(seqs, H, dqk, dv, in.k, Rows<T>{});
  const TileOps<T>& passes = tile_ops<T>();
  for_each_block_in_parallel(
      seqs, mask, chunks,
      [&](int64_t slot) {
        return TileArena<T>(kFuxiForwardTiles, seqs.max_len, with_buckets, slot);
      },
      [&](TileArena<T>& t, const Block& blk) {
        const int64_t row0 = seqs.row_begin[blk.b] + blk.row0;
        const int64_t key0 = seqs.row_begin[blk.b] + blk.key0;
        const auto bias_tiles = fuxi_bias_tiles(layout, time, position, t);
        for (int64_t h = 0; h < H; ++h) {
          build_masked_bias_tiles(mask, seqs, blk, blk.rows, h, t.tile(kFuxiMask), bias_tiles);
          const T* v = in.v.at(key0, h, dv);
          T* s = t.tile(kFuxiScores);
          gemm_nn(blk.rows, blk.keys, dqk, in.q.at(row0, h, dqk), in.q.stride,
                  kv.k_t(blk.b, h, blk.key0), kv.ld(), s, blk.keys, false);
          passes.silu_scores(s, static_cast<const T*>(nullptr), t.tile(kFuxiMask),
                             blk.rows * blk.keys, shape.alpha, shape.silu_scale);
          const std::pair<FuxiChannel, const T*> weights[3] = {
              {FuxiChannel::kSemantic, s},
              {FuxiChannel::kTime, t.tile(kFuxiTime)},
              {FuxiChannel::kPosition, t.tile(kFuxiPosition)}};
          for (const auto& [channel, a] : weights) {
            if (!layout.has(channel)) continue;
            gemm_nn(blk.rows, dv, blk.keys, a, blk.keys, v, in.v.stride,
                    out + layout.at(row0, h, channel), layout.row_stride, false);
          }
        }
      });
}

template <typename T>
struct FuxiGrads {
  QkvGrads<T> qkv;
  BiasGrads<T> time, position;
};

template <typename T>
void fuxi_backward(const Sequences& seqs, const HstuShape<T>& shape, const HstuTensors<T>& in,
                   const T* grad_out, const MaskSource<T>& mask, const BiasSource<T>& time,
                   const BiasSource<T>& position, int64_t chunks, const FuxiLayout& layout,
                   const FuxiGrads<T>& grads) {
  const int64_t H = shape.heads, dv = shape.dv;
  const KeyValueTransposes<T> kv(seqs, H, shape.dqk, dv, in.k, in.v);
  const TileOps<T>& passes = tile_ops<T>();
  for_each_backward_block(
      seqs, mask, chunks, grads.qkv,
      [&](int64_t slot) {
        return BackwardScratch<T>(kFuxiBackwardTiles, time.kind == BiasKind::kRelative, slot, shape,
                                  seqs.max_len);
      },
      [&](BackwardScratch<T>& scratch, const Block& blk) {
        TileArena<T>& t = scratch.tiles;
        TransposedGradients<T>& tg = scratch.grads;
        const int64_t row0 = seqs.row_begin[blk.b] + blk.row0;
        const int64_t tile = blk.rows * blk.keys;
        const std::pair<FuxiChannel, int> bias_channels[2] = {
            {FuxiChannel::kTime, kFuxiTimeGrad}, {FuxiChannel::kPosition, kFuxiPositionGrad}};
        for (const auto& [channel, grad_tile] : bias_channels) {
          if (layout.has(channel)) std::fill(t.tile(grad_tile), t.tile(grad_tile) + tile, T(0));
        }
        const auto bias_tiles = fuxi_bias_tiles(layout, time, position, t);
        for (int64_t h = 0; h < H; ++h) {
          build_masked_bias_tiles(mask, seqs, blk, blk.rows, h, t.tile(kFuxiMask), bias_tiles);
          T* s = t.tile(kFuxiScores);
          // Semantic channel: as HSTU without bias.
          silu_head_backward(passes, shape, in, kv, seqs, blk, h,
                             grad_out + layout.at(row0, h, FuxiChannel::kSemantic),
                             layout.row_stride, static_cast<const T*>(nullptr), t.tile(kFuxiMask),
                             s, t.tile(kFuxiGrads), grads.qkv.dq, tg);
          // Bias channels: dV^T += dO_c^T (M * bias); dbias += M * (dO_c V^T) (s as scratch).
          const std::pair<FuxiChannel, int> weights[2] = {{FuxiChannel::kTime, kFuxiTime},
                                                          {FuxiChannel::kPosition, kFuxiPosition}};
          for (int c = 0; c < 2; ++c) {
            const FuxiChannel channel = weights[c].first;
            if (!layout.has(channel)) continue;
            const T* go_c = grad_out + layout.at(row0, h, channel);
            gemm_nn(dv, blk.keys, blk.rows, tg.go_t(go_c, blk.rows, layout.row_stride), kQueryBlock,
                    t.tile(weights[c].second), blk.keys, tg.dv_t(h, blk.key0), tg.ld(), true);
            gemm_nn(blk.rows, blk.keys, dv, go_c, layout.row_stride, kv.v_t(blk.b, h, blk.key0),
                    kv.ld(), s, blk.keys, false);
            multiply_into(s, static_cast<const T*>(t.tile(kFuxiMask)), tile);
            add_into(t.tile(bias_channels[c].second), static_cast<const T*>(s), tile);
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
