// HSTU attention on bf16 tiles (hstu_attention.h's algorithm with bf16 operands): per query block
// and head, S = Q K^T and O = A V (backward also dA = dO V^T, dQ = alpha dS K,
// dK^T += alpha Q^T dS, dV^T += dO^T A) run on the bf16 micro-kernel with fp32 accumulation
// (bf16_operands.h, bf16_products.h); the SiLU, mask and bias arithmetic stays in fp32 on the
// fp32 score tiles (tile_ops.h), whose results are rounded to bf16 once as the next product's
// operand. Outputs are stored as bf16 from the fp32 product tiles; dQ, dK, dV leave as fp32
// (dK / dV as per-chunk partials, summed and rounded by the adapter). Extra memory: per-thread
// tiles O(kQueryBlock * N) plus O(H * D * N), bf16 VNNI copies of K and V.
#pragma once

#include <algorithm>
#include <cstdint>

#include "recops/attention/kernels/tile_variants.h"
#include "recops/common/cpu_isa.h"
#include "recops/hstu/kernels/batch.h"
#include "recops/hstu/kernels/bf16_operands.h"
#include "recops/hstu/kernels/bf16_products.h"
#include "recops/hstu/kernels/block_schedule.h"
#include "recops/hstu/kernels/hstu_attention.h"
#include "recops/hstu/kernels/mask_and_bias.h"

namespace recops::attention::kernels {

// The runs of tile columns query row r of a block sees: a structured mask's visible_runs, or
// every key of the block under a custom mask (whose tile then gives the multipliers).
inline int row_runs(const MaskSource<float>& mask, const StructuredMask& structured,
                    const Block& blk, int64_t r, int64_t begin[4], int64_t end[4]) {
  if (mask.kind != MaskKind::kCustom) return visible_runs(structured, blk, r, begin, end);
  begin[0] = 0;
  end[0] = blk.keys;
  return blk.keys > 0 ? 1 : 0;
}

// A = the SiLU pass of a block's fp32 scores s [rows_pad, ld] (bias and mask tiles alike, or
// null), rounded to bf16. It runs on each row's visible runs and writes zeros around them, so a
// structured mask needs no mask tile (building and reading one cost as much as the SiLU itself
// at N = 2048).
inline void silu_block_to_bf16(const TileKernels& passes, const MaskSource<float>& mask,
                               const Block& blk, int64_t rows_pad, const float* s,
                               const float* bias, const float* mask_tile,
                               const HstuShape<float>& shape, uint16_t* a) {
  const int64_t ld = blk.ld;
  const StructuredMask structured = mask.structured(blk.b, blk.length);
  std::fill(a + blk.rows * ld, a + rows_pad * ld, uint16_t(0));
  for (int64_t r = 0; r < blk.rows; ++r) {
    int64_t begin[4], end[4];
    const int runs = row_runs(mask, structured, blk, r, begin, end);
    uint16_t* row = a + r * ld;
    int64_t done = 0;
    for (int k = 0; k < runs; ++k) {
      std::fill(row + done, row + begin[k], uint16_t(0));
      const int64_t at = r * ld + begin[k];
      passes.silu_scores_to_bf16(s + at, bias == nullptr ? nullptr : bias + at,
                                 mask_tile == nullptr ? nullptr : mask_tile + at, end[k] - begin[k],
                                 shape.alpha, shape.silu_scale, row + begin[k]);
      done = end[k];
    }
    std::fill(row + done, row + ld, uint16_t(0));
  }
}

// Bit j % 32 of visible[r * (ld / 32) + j / 32] is set when query row r of a block (ld a multiple
// of 32) sees tile column j; rows [blk.rows, rows_pad) see none.
inline void fill_visibility(const MaskSource<float>& mask, const Block& blk, int64_t rows_pad,
                            uint32_t* visible) {
  const int64_t words = blk.ld / 32;
  std::fill(visible, visible + rows_pad * words, 0u);
  const StructuredMask structured = mask.structured(blk.b, blk.length);
  for (int64_t r = 0; r < blk.rows; ++r) {
    int64_t begin[4], end[4];
    const int runs = row_runs(mask, structured, blk, r, begin, end);
    uint32_t* row = visible + r * words;
    for (int k = 0; k < runs; ++k) {
      for (int64_t w = begin[k] / 32; w * 32 < end[k]; ++w) {
        const int64_t lo = std::max(begin[k] - w * 32, int64_t{0});
        const int64_t hi = std::min(end[k] - w * 32, int64_t{32});
        row[w] |= static_cast<uint32_t>(((uint64_t{1} << hi) - 1) & ~((uint64_t{1} << lo) - 1));
      }
    }
  }
}

// Whether the bf16 forward runs fused on AMX tiles (native_bf16::silu_attention_tile).
inline bool fused_forward_available(const HstuShape<float>& shape) {
  return cpu_isa() >= CpuIsa::kAmx && native_bf16::amx_tiles_available() &&
         round_up(shape.dv, native_bf16::kFusedGranule) <= native_bf16::kMaxFusedDv;
}

// out [rows, H, Dv] bf16 bits (zero-initialised by the caller). Per block and head, either the
// fused AMX tile per 16 query rows (fused_forward_available; keys and head dims padded to 32, K^T
// packed in 32-key blocks, the mask as visibility bits) or two brgemm products around
// silu_block_to_bf16 (padding to 16).
inline void hstu_forward_bf16(const Sequences& seqs, const HstuShape<float>& shape,
                              const Bf16Tensors& in, const MaskSource<float>& mask,
                              const BiasSource<float>& bias, int64_t chunks, uint16_t* out) {
  enum Fp32Tile : int { kM, kB, kS, kCount };  // the fused path has no score tile
  enum Bf16Tile : int { kA, kBf16Count };      // A, or the fused path's bits; then the Q block
  const bool fused = fused_forward_available(shape);
  const int64_t granule = fused ? native_bf16::kFusedGranule : kBf16Granule;
  const int64_t H = shape.heads, dqk = shape.dqk, dv = shape.dv;
  const PackedOperands ops(seqs, H, dqk, dv, in.k, in.v, {true, false, false, true}, granule,
                           fused ? granule : 0);
  const int64_t dqk_pad = ops.dqk_pad(), dv_pad = ops.dv_pad();
  const TileKernels& passes = tile_kernels(cpu_isa());
  for_each_block_in_parallel(
      seqs, mask, chunks,
      [&](int64_t slot) {
        return Bf16Scratch(fused ? kS : kCount, kBf16Count, ops, bias.kind == BiasKind::kRelative,
                           slot);
      },
      [&](Bf16Scratch& t, const Block& block) {
        const PaddedBlock pb = pad_block(block, granule);
        const Block& blk = pb.blk;
        const int64_t row0 = seqs.row_begin[blk.b] + blk.row0;
        const int64_t ld = blk.ld;
        const float* bias_tile = bias.kind == BiasKind::kNone ? nullptr : t.fp32.tile(kB);
        float* mask_tile = mask.kind == MaskKind::kCustom ? t.fp32.tile(kM) : nullptr;
        // The bits take rows_pad * ld / 32 words of a tile of rows_pad * ld bf16 values.
        uint32_t* visible = reinterpret_cast<uint32_t*>(t.tile(kA));
        uint16_t* q = t.tile(kBf16Count);
        if (fused) fill_visibility(mask, blk, pb.rows_pad, visible);
        for (int64_t h = 0; h < H; ++h) {
          build_mask_and_bias_tiles(mask, bias, seqs, blk, pb.rows_pad, h, mask_tile,
                                    t.fp32.tile(kB), t.fp32.buckets());
          copy_padded(in.q.at(row0, h, dqk), blk.rows, dqk, in.q.stride, q, pb.rows_pad, dqk_pad);
          uint16_t* out_rows = out + (row0 * H + h) * dv;
          if (!fused) {
            gemm_bf16(pb.rows_pad, ld, dqk_pad, q, dqk_pad, ops.k_t(blk.b, h, blk.key0),
                      ops.n_pad(), t.fp32.tile(kS), ld, false);
            silu_block_to_bf16(passes, mask, blk, pb.rows_pad, t.fp32.tile(kS), bias_tile,
                               mask_tile, shape, t.tile(kA));
            gemm_bf16(pb.rows_pad, dv_pad, ld, t.tile(kA), ld, ops.v(blk.b, h, blk.key0), dv_pad,
                      t.product.get(), dv_pad, false);
            store_rows(passes, t.product.get(), blk.rows, dv, dv_pad, out_rows, H * dv);
            continue;
          }
          const int64_t words = ld / native_bf16::kFusedGranule;
          for (int64_t r = 0; r < blk.rows; r += 16) {
            native_bf16::silu_attention_tile(
                {q + r * dqk_pad, ops.k_t(blk.b, h, blk.key0), ops.k_t_ld(), ops.k_t_step(granule),
                 ops.v(blk.b, h, blk.key0), dqk_pad, dv_pad, ld, visible + r * words,
                 bias_tile == nullptr ? nullptr : bias_tile + r * ld,
                 mask_tile == nullptr ? nullptr : mask_tile + r * ld, ld, shape.alpha,
                 shape.silu_scale, t.product.get()});
            store_rows(passes, t.product.get(), std::min<int64_t>(16, blk.rows - r), dv, dv_pad,
                       out_rows + r * H * dv, H * dv);
          }
        }
      });
}

// grad_out [rows, H, Dv] bf16 bits; grads as hstu_backward's (fp32).
inline void hstu_backward_bf16(const Sequences& seqs, const HstuShape<float>& shape,
                               const Bf16Tensors& in, const uint16_t* grad_out,
                               const MaskSource<float>& mask, const BiasSource<float>& bias,
                               int64_t chunks, const HstuGrads<float>& grads) {
  const int64_t H = shape.heads, dqk = shape.dqk, dv = shape.dv;
  const bool has_bias = bias.kind != BiasKind::kNone;
  const bool shared_bias_grad = has_bias && !bias.per_head();
  const PackedOperands ops(seqs, H, dqk, dv, in.k, in.v, {true, true, true, false});
  const TileKernels& passes = tile_kernels(cpu_isa());
  for_each_backward_block(
      seqs, mask, chunks, grads.qkv,
      [&](int64_t slot) {
        return Bf16BackwardScratch(kBackwardTiles, kSiluBf16Tiles, ops,
                                   bias.kind == BiasKind::kRelative, slot, shape);
      },
      [&](Bf16BackwardScratch& scratch, const Block& block) {
        Bf16Scratch& t = scratch.tiles;
        const PaddedBlock pb = pad_block(block);
        const Block& blk = pb.blk;
        const int64_t row0 = seqs.row_begin[blk.b] + blk.row0;
        const int64_t tile = pb.rows_pad * blk.ld;
        float* grad_sum = t.fp32.tile(kGradSum);
        if (shared_bias_grad) std::fill(grad_sum, grad_sum + tile, 0.0f);
        for (int64_t h = 0; h < H; ++h) {
          build_mask_and_bias_tiles(mask, bias, seqs, blk, pb.rows_pad, h, t.fp32.tile(kMask),
                                    t.fp32.tile(kBias), t.fp32.buckets());
          scratch.grads.load_block(in.q.at(row0, h, dqk), in.q.stride,
                                   grad_out + (row0 * H + h) * dv, H * dv, blk.rows, pb.rows_pad);
          float* ds = t.fp32.tile(kGrads);
          silu_head_backward_bf16(passes, shape, ops, pb, h,
                                  has_bias ? t.fp32.tile(kBias) : nullptr, t.fp32.tile(kMask),
                                  t.fp32.tile(kScores), ds, t, scratch.grads,
                                  grads.qkv.dq + (row0 * H + h) * dqk, H * dqk);
          if (shared_bias_grad) {
            add_into(grad_sum, ds, tile);
          } else if (has_bias) {
            accumulate_bias_grads(bias, seqs, blk, h, ds, t.fp32.buckets(), grads.bias,
                                  t.fp32.slot());
          }
        }
        if (shared_bias_grad) {
          accumulate_bias_grads(bias, seqs, blk, 0, grad_sum, t.fp32.buckets(), grads.bias,
                                t.fp32.slot());
        }
      });
}

}  // namespace recops::attention::kernels
