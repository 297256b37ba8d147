// HSTU-family attention on CPU: up to three channels that share V and the mask M,
//   semantic   O_s = (silu(alpha Q K^T + bias_s) * scale * M) V
//   temporal   O_t = (M * bias_t) V
//   positional O_p = (M * bias_p) V.
// HSTU is the semantic channel with its bias; FuXi-alpha is the semantic channel without bias and
// the two weight channels (time, position), whose biases all heads share.
//
// One forward and one backward body, templated on a precision policy P (fp32_products.h's
// Fp32Precision for fp32 / float64, bf16_products.h's Bf16Precision for bf16), which brings the
// operands it lays out (per call, or per thread as blocks need them), the per-thread scratch,
// the block's padding and the products of one head. Per query block (block_schedule.h) and head:
// the mask and bias tiles (mask_and_bias.h) are built once per block and shared by the heads unless
// they have a head dim, then the head's products; the weight channels' masked bias tiles are
// rounded to the precision's weights only when rebuilt. The time channel of a block that sees many
// keys goes by runs of keys of one time bucket instead of a tile (time_runs.h), the position
// channel of a long fp32 sequence under a plain causal mask by a convolution over the whole
// sequence (position_fft.h), after the blocks. Backward recomputes
// the tile (never storing [N, N]); dQ rows belong to the item, dK/dV accumulate transposed per
// item, then in per-chunk partials that the adapter sums; a bias gradient is summed over the heads
// that share the bias before it is scattered, once per block. A forward with fewer query blocks
// than threads (a serving step) splits each block's keys between the threads instead
// (forward_key_parts), each part past the first adding through a copy of the output. Extra memory:
// per-thread tiles O(query block * N) (N: the longest sequence), fp32's per-thread K^T and V^T of
// one sequence, O(H * D * N), or bf16's copies of K and V, and for the time channel by runs the
// per-thread running sums of V and differences of dV, H * Dv * N doubles each.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "recops/hstu/kernels/batch.h"
#include "recops/hstu/kernels/block_schedule.h"
#include "recops/hstu/kernels/mask_and_bias.h"
#include "recops/hstu/kernels/position_fft.h"
#include "recops/hstu/kernels/time_runs.h"

namespace recops::attention::kernels {

enum Channel : int { kSemantic = 0, kTime = 1, kPosition = 2, kChannels = 3 };

// Where channel c of head h of row r starts in the output (and in its gradient):
// row * row_stride + channel_offset[c] + h * head_stride; channel_offset < 0: channel absent.
struct ChannelLayout {
  int64_t row_stride = 0, head_stride = 0;
  int64_t channel_offset[kChannels] = {0, -1, -1};

  // The semantic channel alone, [rows, H, Dv] (HSTU).
  static ChannelLayout heads(int64_t heads, int64_t dv) { return {heads * dv, dv, {0, -1, -1}}; }
  int64_t at(int64_t row, int64_t head, int c) const {
    return row * row_stride + channel_offset[c] + head * head_stride;
  }
};

// The bias of each channel (kind kNone: none); a weight channel is present when it has one (and
// then has its place in the layout).
template <typename T>
using ChannelBiases = std::array<BiasSource<T>, kChannels>;

template <typename T>
struct HstuGrads {
  QkvGrads<T> qkv;
  std::array<BiasGrads<T>, kChannels> bias;
};

// The tiles of the scratch (TileArena indices): the mask, the scores, then the bias tile of each
// channel with a bias, and for the backward dS and the gradient sum of each bias several heads
// share (with one head, its gradient is the sum: no tile to clear and add into).
struct ChannelTiles {
  static constexpr int kMask = 0, kScores = 1;
  int bias[kChannels] = {-1, -1, -1}, grad_sum[kChannels] = {-1, -1, -1};
  int grads = -1, count = kScores + 1;
  bool buckets = false;  // a relative bias with a time table (at most one: the arena has one)

  template <typename T>
  ChannelTiles(const ChannelBiases<T>& biases, bool backward, int64_t heads) {
    for (int c = 0; c < kChannels; ++c) {
      if (biases[c].kind != BiasKind::kNone) bias[c] = count++;
      buckets = buckets || biases[c].ts_w != nullptr;
    }
    if (!backward) return;
    grads = count++;
    for (int c = 0; c < kChannels; ++c) {
      if (bias[c] >= 0 && !biases[c].per_head() && heads > 1) grad_sum[c] = count++;
    }
  }
  template <typename Arena>
  auto* bias_tile(Arena& t, int c) const {
    return bias[c] < 0 ? nullptr : t.tile(bias[c]);
  }
  // Whether a block needs the mask tile: its SiLU pass reads it (silu_mask), or a weight channel's
  // bias tile is multiplied by a custom mask (under a structured mask it is built masked:
  // build_bias_tile).
  bool need_mask(bool silu_mask, MaskKind mask) const {
    return silu_mask || (mask == MaskKind::kCustom && (bias[kTime] >= 0 || bias[kPosition] >= 0));
  }
  // The tiles of a block whose channel c runs without any (the time channel by runs of keys).
  ChannelTiles without(int c) const {
    ChannelTiles tiles = *this;
    tiles.bias[c] = tiles.grad_sum[c] = -1;
    return tiles;
  }
};

// The mask tile (unless with_mask is false) and the bias tiles of head h (build_head_tiles), and
// the weights the precision multiplies the rebuilt weight channels by (VNNI for the backward).
template <typename P, typename Arena>
void block_tiles(const P& prec, const MaskSource<typename P::Compute>& mask,
                 const ChannelBiases<typename P::Compute>& biases, const ChannelTiles& tiles,
                 const PaddedBlock& pb, int64_t h, Arena& t, bool with_mask, bool vnni) {
  using C = typename P::Compute;
  const std::array<BiasTile<C>, kChannels> bias_tiles{
      {{biases[kSemantic], tiles.bias_tile(t, kSemantic), false},
       {biases[kTime], tiles.bias_tile(t, kTime), true},
       {biases[kPosition], tiles.bias_tile(t, kPosition), true}}};
  if (!build_head_tiles(mask, prec.sequences(), pb.blk, pb.rows_pad, h,
                        with_mask ? t.tile(ChannelTiles::kMask) : nullptr, bias_tiles,
                        t.buckets())) {
    return;
  }
  for (int c = kTime; c < kChannels; ++c) {
    if (tiles.bias[c] >= 0) prec.round_weights(t, pb, tiles.bias[c], c - kTime, vnni);
  }
}

// The position channel's convolution by FFT (position_fft.h) for a precision whose elements are
// fp32; none for the others.
template <typename P>
PositionFft position_fft(const P& prec, const MaskSource<typename P::Compute>& mask,
                         const ChannelBiases<typename P::Compute>& biases) {
  if constexpr (std::is_same_v<typename P::Element, float>) {
    return PositionFft(prec.sequences(), mask, biases[kPosition]);
  } else {
    return PositionFft(prec.sequences());
  }
}

// A block's tiles: the call's, less the time channel's when it goes by runs and the position
// channel's when its sequence goes by FFT.
inline ChannelTiles block_channel_tiles(const ChannelTiles& all, bool time_by_runs,
                                        bool position_by_fft) {
  ChannelTiles tiles = time_by_runs ? all.without(kTime) : all;
  return position_by_fft ? tiles.without(kPosition) : tiles;
}

// out addressed by `layout`: every query row is written (by its block, which sees at least one
// key); the other rows are left as they are (inputs.h's query_rows_output zeroes them).
template <typename P>
void hstu_forward(const P& prec, const MaskSource<typename P::Compute>& mask,
                  const ChannelBiases<typename P::Compute>& biases, int64_t chunks,
                  const ChannelLayout& layout, typename P::Element* out) {
  using E = typename P::Element;
  const Sequences& seqs = prec.sequences();
  const int64_t H = prec.shape().heads, dv = prec.shape().dv;
  const ChannelTiles all_tiles(biases, false, H);
  const bool time_runs = time_channel_by_runs(biases[kTime], mask);
  const PositionFft by_fft = position_fft(prec, mask, biases);
  const bool silu_mask = prec.forward_mask_tile(mask);
  // Key parts past the first write zeroed copies of the output, added into it at the end (in the
  // compute type: a bf16 output is not split, so that it is rounded once).
  const int64_t parts =
      std::is_same_v<E, typename P::Compute> ? forward_key_parts(seqs) : int64_t{1};
  int64_t out_size = 0;
  for (int64_t b = 0; b < seqs.count && parts > 1; ++b) {
    out_size = std::max(out_size, (seqs.q_row_begin[b] + seqs.q_length[b]) * layout.row_stride);
  }
  std::vector<E> partials((parts - 1) * out_size, E(0));
  for_each_block_in_parallel(
      seqs, mask, chunks, parts,
      [&](int64_t slot) { return prec.scratch(all_tiles.count, all_tiles.buckets, slot); },
      [&](typename P::Scratch& t, const Block& block, int64_t part) {
        E* dst = part == 0 ? out : partials.data() + (part - 1) * out_size;
        const PaddedBlock pb = prec.pad(block);
        const int64_t row0 = seqs.query_row(pb.blk.b, pb.blk.row0);
        const bool by_runs = time_runs && time_runs_pay(pb.blk);
        const ChannelTiles tiles = block_channel_tiles(all_tiles, by_runs, by_fft.covers(pb.blk.b));
        const bool with_mask = tiles.need_mask(silu_mask, mask.kind);
        prec.begin_forward_block(t, mask, pb);
        for (int64_t h = 0; h < H; ++h) {
          block_tiles(prec, mask, biases, tiles, pb, h, t, with_mask, false);
          prec.silu_head_forward(t, mask, pb, h, tiles.bias_tile(t, kSemantic),
                                 silu_mask ? t.tile(ChannelTiles::kMask) : nullptr,
                                 t.tile(ChannelTiles::kScores), dst + layout.at(row0, h, kSemantic),
                                 layout.row_stride);
          for (int c = kTime; c < kChannels; ++c) {
            if (tiles.bias[c] < 0) continue;
            prec.weighted_values(t, pb, h, prec.weights(t, tiles.bias[c], c - kTime),
                                 dst + layout.at(row0, h, c), layout.row_stride);
          }
        }
        if (by_runs) {
          time_channel_forward(biases[kTime], mask, seqs, prec.values(), H, dv, pb.blk,
                               t.time_runs(), dst + layout.at(row0, 0, kTime), layout.row_stride,
                               layout.head_stride);
        }
      });
  for (int64_t p = 0; p + 1 < parts; ++p) add_into(out, partials.data() + p * out_size, out_size);
  if constexpr (std::is_same_v<E, float>) {
    if (!by_fft.any()) return;
    by_fft.forward(prec.values(), H, dv, out + layout.channel_offset[kPosition], layout.row_stride,
                   layout.head_stride);
  }
}

// grad_out addressed by `layout`; dQ, dK, dV and the bias gradients in the compute type.
template <typename P>
void hstu_backward(const P& prec, const typename P::Element* grad_out,
                   const MaskSource<typename P::Compute>& mask,
                   const ChannelBiases<typename P::Compute>& biases, int64_t chunks,
                   const ChannelLayout& layout, const HstuGrads<typename P::Compute>& grads) {
  using C = typename P::Compute;
  const Sequences& seqs = prec.sequences();
  const int64_t H = prec.shape().heads, dqk = prec.shape().dqk, dv = prec.shape().dv;
  const ChannelTiles all_tiles(biases, true, H);
  const bool time_runs = time_channel_by_runs(biases[kTime], mask);
  const PositionFft by_fft = position_fft(prec, mask, biases);
  const bool silu_mask = prec.backward_mask_tile(mask);
  for_each_backward_block(
      seqs, mask, chunks, grads.qkv,
      [&](int64_t slot) { return prec.backward_scratch(all_tiles.count, all_tiles.buckets, slot); },
      [&](typename P::BackwardScratch& scratch, const Block& block) {
        auto& t = scratch.tiles;
        const PaddedBlock pb = prec.pad(block);
        const Block& blk = pb.blk;
        const int64_t row0 = seqs.query_row(blk.b, blk.row0);
        const bool by_runs = time_runs && time_runs_pay(blk);
        const ChannelTiles tiles = block_channel_tiles(all_tiles, by_runs, by_fft.covers(blk.b));
        const bool with_mask = tiles.need_mask(silu_mask, mask.kind);
        const int64_t tile = pb.rows_pad * blk.stride();
        const C* mask_tile = with_mask ? t.tile(ChannelTiles::kMask) : nullptr;
        C* s = t.tile(ChannelTiles::kScores);
        for (const int sum : tiles.grad_sum) {
          if (sum >= 0) std::fill_n(t.tile(sum), tile, C(0));
        }
        // Channel c's bias gradient of head h: scattered now (a per-head bias) or summed.
        const auto add_bias_grad = [&](int c, int64_t h, const C* g) {
          if (tiles.grad_sum[c] >= 0) {
            add_into(t.tile(tiles.grad_sum[c]), g, tile);
          } else {
            accumulate_bias_grads(biases[c], mask, seqs, blk, h, g, t.buckets(), grads.bias[c],
                                  t.slot());
          }
        };
        for (int64_t h = 0; h < H; ++h) {
          block_tiles(prec, mask, biases, tiles, pb, h, t, with_mask, true);
          C* ds = t.tile(tiles.grads);
          prec.silu_head_backward(scratch, mask, pb, h, grad_out + layout.at(row0, h, kSemantic),
                                  layout.row_stride, tiles.bias_tile(t, kSemantic),
                                  silu_mask ? mask_tile : nullptr, s, ds,
                                  grads.qkv.dq + (row0 * H + h) * dqk, H * dqk);
          if (tiles.bias[kSemantic] >= 0) add_bias_grad(kSemantic, h, ds);
          // Weight channels: dV^T += dO_c^T (M * bias); dbias += M * (dO_c V^T) (s as scratch).
          for (int c = kTime; c < kChannels; ++c) {
            if (tiles.bias[c] < 0) continue;
            prec.weights_backward(scratch, pb, h, grad_out + layout.at(row0, h, c),
                                  layout.row_stride, prec.weights(t, tiles.bias[c], c - kTime), s);
            mask_bias_grads(biases[c], mask, blk, mask_tile, s, tile);
            add_bias_grad(c, h, s);
          }
        }
        for (int c = 0; c < kChannels; ++c) {
          if (tiles.grad_sum[c] < 0) continue;
          accumulate_bias_grads(biases[c], mask, seqs, blk, 0, t.tile(tiles.grad_sum[c]),
                                t.buckets(), grads.bias[c], t.slot());
        }
        if (by_runs) {
          const BiasGrads<C>& sink = grads.bias[kTime];
          time_channel_backward(
              biases[kTime], mask, seqs, prec.values(), H, dv, blk, t.time_runs(),
              grad_out + layout.at(row0, 0, kTime), layout.row_stride, layout.head_stride,
              scratch.grads,
              sink.ts_w == nullptr ? nullptr : sink.ts_w + t.slot() * sink.ts_thread_stride);
        }
      });
  // After every item has written or added its chunk's dV: the covered sequences' position
  // channel adds into chunk 0's.
  if constexpr (std::is_same_v<typename P::Element, float>) {
    if (!by_fft.any()) return;
    by_fft.backward(prec.values(), H, dv, grad_out + layout.channel_offset[kPosition],
                    layout.row_stride, layout.head_stride, grads.qkv.dv_partial(0),
                    grads.bias[kPosition].pos_w);
  }
}

}  // namespace recops::attention::kernels
