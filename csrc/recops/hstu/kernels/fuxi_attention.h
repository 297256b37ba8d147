// FuXi-alpha attention on CPU: three channels that share V and the mask M,
//   semantic   O_s = (silu(alpha Q K^T) * scale * M) V
//   temporal   O_t = (M * bias_ts) V
//   positional O_p = (M * bias_pos) V,
// the two bias channels shared by all heads. One pass over each query block's key range serves
// all channels: the masked bias tiles are built once per block, and per head the loaded V panel
// feeds three products. Backward recomputes tiles like HSTU's; the bias gradients are
// M * sum_h dO_c,h V_h^T, scattered once per block.
#pragma once

#include <cstdint>
#include <vector>

#include "recops/hstu/kernels/hstu_attention.h"

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

template <typename T>
void multiply_into(T* tile, const T* mask, int64_t n) {
  for (int64_t j = 0; j < n; ++j) tile[j] *= mask[j];
}

// The mask tile and the masked bias tiles of head h (rebuilt per head only for per-head masks);
// returns whether it built them. Rows [blk.rows, rows_pad) are zero (the bf16 kernels' padding).
template <typename T>
bool build_fuxi_tiles(const MaskSource<T>& mask, const BiasSource<T>& time,
                      const BiasSource<T>& position, const Sequences& seqs, const Block& blk,
                      int64_t rows_pad, const StructuredMask& sm, int64_t h,
                      const FuxiLayout& layout, TileArena<T>& t) {
  if (h > 0 && !mask.per_head()) return false;
  const int64_t tile = rows_pad * blk.stride();
  build_mask_tile(mask, sm, blk, h, t.tile(kFuxiMask));
  zero_padded_rows(t.tile(kFuxiMask), blk, rows_pad);
  const std::pair<FuxiChannel, int> channels[2] = {{FuxiChannel::kTime, kFuxiTime},
                                                   {FuxiChannel::kPosition, kFuxiPosition}};
  for (const auto& [channel, index] : channels) {
    if (!layout.has(channel)) continue;
    const bool time_channel = channel == FuxiChannel::kTime;
    build_bias_tile(time_channel ? time : position, seqs, blk, 0, t.tile(index),
                    time_channel ? t.buckets() : nullptr);
    zero_padded_rows(t.tile(index), blk, rows_pad);
    multiply_into(t.tile(index), t.tile(kFuxiMask), tile);
  }
  return true;
}

// out: zero-initialised, addressed by `layout`.
template <typename T>
void fuxi_forward(const Sequences& seqs, const HstuShape<T>& shape, const HstuTensors<T>& in,
                  const MaskSource<T>& mask, const BiasSource<T>& time,
                  const BiasSource<T>& position, int64_t chunks, const FuxiLayout& layout, T* out) {
  const int64_t H = shape.heads, dqk = shape.dqk, dv = shape.dv;
  const std::vector<WorkItem> items = make_work_items(seqs.length, seqs.count, chunks);
  const bool with_buckets = time.kind == BiasKind::kRelative;
  const KeyValueTransposes<T> kv(seqs, H, dqk, dv, in.k, nullptr);
  const TileOps<T>& passes = tile_ops<T>();
  parallel_for_dynamic(
      static_cast<int64_t>(items.size()),
      [&](int64_t slot) {
        return TileArena<T>(kFuxiForwardTiles, seqs.max_len, with_buckets, slot);
      },
      [&](TileArena<T>& t, int64_t index) {
        for_each_block(
            seqs, mask, items[index], chunks, [&](const Block& blk, const StructuredMask& sm) {
              const int64_t row0 = seqs.row_begin[blk.b] + blk.row0;
              const int64_t key0 = seqs.row_begin[blk.b] + blk.key0;
              for (int64_t h = 0; h < H; ++h) {
                build_fuxi_tiles(mask, time, position, seqs, blk, blk.rows, sm, h, layout, t);
                const T* v = in.v + (key0 * H + h) * dv;
                T* s = t.tile(kFuxiScores);
                gemm_nn(blk.rows, blk.keys, dqk, in.q + (row0 * H + h) * dqk, H * dqk,
                        kv.k_t(blk.b, h, blk.key0), kv.ld(), s, blk.keys, false);
                passes.silu_scores(s, static_cast<const T*>(nullptr), t.tile(kFuxiMask),
                                   blk.rows * blk.keys, shape.alpha, shape.silu_scale);
                const std::pair<FuxiChannel, const T*> weights[3] = {
                    {FuxiChannel::kSemantic, s},
                    {FuxiChannel::kTime, t.tile(kFuxiTime)},
                    {FuxiChannel::kPosition, t.tile(kFuxiPosition)}};
                for (const auto& [channel, a] : weights) {
                  if (!layout.has(channel)) continue;
                  gemm_nn(blk.rows, dv, blk.keys, a, blk.keys, v, H * dv,
                          out + layout.at(row0, h, channel), layout.row_stride, false);
                }
              }
            });
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
      seqs, shape, mask, kFuxiBackwardTiles, time.kind == BiasKind::kRelative, chunks, grads.qkv,
      [&](TileArena<T>& t, TransposedGradients<T>& tg, const Block& blk, const StructuredMask& sm) {
        const int64_t row0 = seqs.row_begin[blk.b] + blk.row0;
        const int64_t tile = blk.rows * blk.keys;
        const std::pair<FuxiChannel, int> bias_channels[2] = {
            {FuxiChannel::kTime, kFuxiTimeGrad}, {FuxiChannel::kPosition, kFuxiPositionGrad}};
        for (const auto& [channel, grad_tile] : bias_channels) {
          if (layout.has(channel)) std::fill(t.tile(grad_tile), t.tile(grad_tile) + tile, T(0));
        }
        for (int64_t h = 0; h < H; ++h) {
          build_fuxi_tiles(mask, time, position, seqs, blk, blk.rows, sm, h, layout, t);
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
