// HSTU attention on bf16 tiles (hstu_attention.h's algorithm with bf16 operands): per query block
// and head, S = Q K^T and O = A V (backward also dA = dO V^T, dQ = alpha dS K,
// dK^T += alpha Q^T dS, dV^T += dO^T A) run on the bf16 micro-kernel with fp32 accumulation
// (bf16_operands.h); the SiLU, mask and bias arithmetic stays in fp32 on the fp32 score tiles
// (tile_ops.h), whose results are rounded to bf16 once as the next product's operand. Outputs are
// stored as bf16 from the fp32 product tiles; dQ, dK, dV leave as fp32 (dK / dV as per-chunk
// partials, summed and rounded by the adapter). Extra memory: per-thread tiles
// O(kQueryBlock * N) plus O(H * D * N), bf16 VNNI copies of K and V.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "recops/common/parallel.h"
#include "recops/hstu/kernels/bf16_operands.h"
#include "recops/hstu/kernels/hstu_attention.h"
#include "recops/hstu/kernels/tiles.h"

namespace recops::attention::kernels {

// q, k [rows, H, Dqk] and v [rows, H, Dv] as bf16 bits.
struct Bf16Tensors {
  const uint16_t* q = nullptr;
  const uint16_t* k = nullptr;
  const uint16_t* v = nullptr;
};

// Per-thread scratch of the bf16 kernels: the fp32 tiles (TileArena, rows of up to n_pad), bf16
// operand tiles and an fp32 product tile of kQueryBlock x max(Dqk, Dv) (padded).
struct Bf16Scratch {
  Bf16Scratch(int tiles, int bf16_tiles, const PackedOperands& ops, bool with_buckets, int64_t slot)
      : fp32(tiles, ops.n_pad(), with_buckets, slot),
        tile_size(kQueryBlock * ops.n_pad()),
        bf16(new uint16_t[bf16_tiles * tile_size + kQueryBlock * ops.dqk_pad()]),
        product(new float[kQueryBlock * std::max(ops.dqk_pad(), ops.dv_pad())]) {}
  uint16_t* tile(int index) { return bf16.get() + index * tile_size; }
  ~Bf16Scratch() { gemm_bf16_release(); }
  Bf16Scratch(const Bf16Scratch&) = delete;
  Bf16Scratch& operator=(const Bf16Scratch&) = delete;

  TileArena<float> fp32;
  int64_t tile_size;
  std::unique_ptr<uint16_t[]> bf16;
  std::unique_ptr<float[]> product;
};

// The fp32 mask and (unless none) bias tiles of a padded block for head h, built for h == 0 and
// again per head when they have a head dim.
inline void build_padded_tiles(const MaskSource<float>& mask, const BiasSource<float>& bias,
                               const Sequences& seqs, const PaddedBlock& pb,
                               const StructuredMask& sm, int64_t h, float* mask_tile,
                               float* bias_tile, int32_t* buckets) {
  if (h == 0 || mask.per_head()) {
    build_mask_tile(mask, sm, pb.blk, h, mask_tile);
    zero_padded_rows(mask_tile, pb.blk, pb.rows_pad);
  }
  if (bias.kind != BiasKind::kNone && (h == 0 || bias.per_head())) {
    build_bias_tile(bias, seqs, pb.blk, h, bias_tile, buckets);
    zero_padded_rows(bias_tile, pb.blk, pb.rows_pad);
  }
}

// dst rows (row stride ld_dst) = the first rows x cols of an fp32 product tile (row stride
// ld_src), as bf16 bits or fp32.
inline void store_rows(const TileKernels& passes, const float* src, int64_t rows, int64_t cols,
                       int64_t ld_src, uint16_t* dst, int64_t ld_dst) {
  for (int64_t r = 0; r < rows; ++r) passes.to_bf16(src + r * ld_src, dst + r * ld_dst, cols, 1.0f);
}
inline void store_rows(const TileKernels&, const float* src, int64_t rows, int64_t cols,
                       int64_t ld_src, float* dst, int64_t ld_dst) {
  for (int64_t r = 0; r < rows; ++r) std::memcpy(dst + r * ld_dst, src + r * ld_src, cols * 4);
}

// out [rows, H, Dv] bf16 bits (zero-initialised by the caller).
inline void hstu_forward_bf16(const Sequences& seqs, const HstuShape<float>& shape,
                              const Bf16Tensors& in, const MaskSource<float>& mask,
                              const BiasSource<float>& bias, int64_t chunks, uint16_t* out) {
  enum Fp32Tile : int { kM, kB, kS, kCount };
  enum Bf16Tile : int { kA, kBf16Count };  // then the padded Q block
  const int64_t H = shape.heads, dqk = shape.dqk, dv = shape.dv;
  const std::vector<WorkItem> items = make_work_items(seqs.length, seqs.count, chunks);
  const PackedOperands ops(seqs, H, dqk, dv, in.k, in.v, {true, false, false, true});
  const int64_t dqk_pad = ops.dqk_pad(), dv_pad = ops.dv_pad();
  const TileKernels& passes = tile_kernels(cpu_isa());
  parallel_for_dynamic(
      static_cast<int64_t>(items.size()),
      [&](int64_t slot) {
        return Bf16Scratch(kCount, kBf16Count, ops, bias.kind == BiasKind::kRelative, slot);
      },
      [&](Bf16Scratch& t, int64_t index) {
        for_each_block(
            seqs, mask, items[index], chunks, [&](const Block& block, const StructuredMask& sm) {
              const PaddedBlock pb = pad_block(block);
              const Block& blk = pb.blk;
              const int64_t row0 = seqs.row_begin[blk.b] + blk.row0;
              const int64_t ld = blk.ld, tile = pb.rows_pad * ld;
              float* s = t.fp32.tile(kS);
              uint16_t* a = t.tile(kA);
              uint16_t* q = t.tile(kBf16Count);
              for (int64_t h = 0; h < H; ++h) {
                build_padded_tiles(mask, bias, seqs, pb, sm, h, t.fp32.tile(kM), t.fp32.tile(kB),
                                   t.fp32.buckets());
                copy_padded(in.q + (row0 * H + h) * dqk, blk.rows, dqk, H * dqk, q, pb.rows_pad,
                            dqk_pad);
                gemm_bf16(pb.rows_pad, ld, dqk_pad, q, dqk_pad, ops.k_t(blk.b, h, blk.key0),
                          ops.n_pad(), s, ld, false);
                passes.silu_scores_to_bf16(s,
                                           bias.kind == BiasKind::kNone ? nullptr : t.fp32.tile(kB),
                                           t.fp32.tile(kM), tile, shape.alpha, shape.silu_scale, a);
                gemm_bf16(pb.rows_pad, dv_pad, ld, a, ld, ops.v(blk.b, h, blk.key0), dv_pad,
                          t.product.get(), dv_pad, false);
                store_rows(passes, t.product.get(), blk.rows, dv, dv_pad, out + (row0 * H + h) * dv,
                           H * dv);
              }
            });
      });
}

// Per-thread scratch of the bf16 backward: tiles and the key-side gradient accumulators.
struct Bf16BackwardScratch {
  Bf16Scratch tiles;
  Bf16Gradients grads;
};

// The bf16 counterpart of for_each_backward_block: fn(scratch, block, structured_mask) for every
// (padded) query block of every item, then the item's dK^T, dV^T added into its chunk's partial.
template <typename Fn>
void for_each_backward_block_bf16(const Sequences& seqs, const HstuShape<float>& shape,
                                  const MaskSource<float>& mask, const PackedOperands& ops,
                                  int tiles, int bf16_tiles, bool with_buckets, int64_t chunks,
                                  const QkvGrads<float>& qkv, Fn&& fn) {
  const int64_t H = shape.heads;
  const std::vector<WorkItem> items = make_work_items(seqs.length, seqs.count, chunks);
  parallel_for_dynamic(
      static_cast<int64_t>(items.size()),
      [&](int64_t slot) {
        return Bf16BackwardScratch{Bf16Scratch(tiles, bf16_tiles, ops, with_buckets, slot),
                                   Bf16Gradients(H, shape.dqk, shape.dv, ops)};
      },
      [&](Bf16BackwardScratch& scratch, int64_t index) {
        const WorkItem item = items[index];
        scratch.grads.begin_item();
        for_each_block(seqs, mask, item, chunks, [&](const Block& blk, const StructuredMask& sm) {
          fn(scratch, pad_block(blk), sm);
        });
        const int64_t first = seqs.row_begin[item.sequence];
        scratch.grads.end_item(seqs.length[item.sequence],
                               qkv.dk_partial(item.chunk) + first * H * shape.dqk,
                               qkv.dv_partial(item.chunk) + first * H * shape.dv);
      });
}

// The bf16 tiles of silu_head_backward_bf16 (Bf16Scratch indices).
enum SiluBf16Tile : int { kAVnni, kDsRows, kDsVnni, kSiluBf16Tiles };

// Backward of one head of one padded block of silu attention on bf16 tiles (HSTU; FuXi-alpha's
// semantic channel), after tg.load_block: S and dA, then A (in s) and dS (in ds, fp32, without
// alpha) from the mask and optional bias tiles, dQ rows (fp32, written), dK^T and dV^T
// (accumulated).
inline void silu_head_backward_bf16(const TileKernels& passes, const HstuShape<float>& shape,
                                    const PackedOperands& ops, const PaddedBlock& pb, int64_t h,
                                    const float* bias, const float* mask, float* s, float* ds,
                                    Bf16Scratch& t, Bf16Gradients& tg, float* dq_rows,
                                    int64_t ld_dq) {
  const Block& blk = pb.blk;
  const int64_t ld = blk.ld, rows_pad = pb.rows_pad, tile = rows_pad * ld;
  const int64_t dqk_pad = ops.dqk_pad(), dv_pad = ops.dv_pad();
  gemm_bf16(rows_pad, ld, dqk_pad, tg.q(), dqk_pad, ops.k_t(blk.b, h, blk.key0), ops.n_pad(), s, ld,
            false);
  gemm_bf16(rows_pad, ld, dv_pad, tg.go(), dv_pad, ops.v_t(blk.b, h, blk.key0), ops.n_pad(), ds, ld,
            false);
  passes.fp32.silu_score_grads(s, ds, bias, mask, tile, shape.alpha, shape.silu_scale);
  passes.backward_operands_to_bf16(s, ds, rows_pad, ld, shape.alpha, t.tile(kAVnni),
                                   t.tile(kDsRows), t.tile(kDsVnni));
  gemm_bf16(rows_pad, dqk_pad, ld, t.tile(kDsRows), ld, ops.k(blk.b, h, blk.key0), dqk_pad,
            t.product.get(), dqk_pad, false);
  store_rows(passes, t.product.get(), blk.rows, shape.dqk, dqk_pad, dq_rows, ld_dq);
  gemm_bf16(dqk_pad, ld, rows_pad, tg.q_t(), rows_pad, t.tile(kDsVnni), ld, tg.dk_t(h, blk.key0),
            tg.ld(), true);
  gemm_bf16(dv_pad, ld, rows_pad, tg.go_t(), rows_pad, t.tile(kAVnni), ld, tg.dv_t(h, blk.key0),
            tg.ld(), true);
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
  for_each_backward_block_bf16(
      seqs, shape, mask, ops, kBackwardTiles, kSiluBf16Tiles, bias.kind == BiasKind::kRelative,
      chunks, grads.qkv,
      [&](Bf16BackwardScratch& scratch, const PaddedBlock& pb, const StructuredMask& sm) {
        Bf16Scratch& t = scratch.tiles;
        const Block& blk = pb.blk;
        const int64_t row0 = seqs.row_begin[blk.b] + blk.row0;
        const int64_t tile = pb.rows_pad * blk.ld;
        float* grad_sum = t.fp32.tile(kGradSum);
        if (shared_bias_grad) std::fill(grad_sum, grad_sum + tile, 0.0f);
        for (int64_t h = 0; h < H; ++h) {
          build_padded_tiles(mask, bias, seqs, pb, sm, h, t.fp32.tile(kMask), t.fp32.tile(kBias),
                             t.fp32.buckets());
          scratch.grads.load_block(in.q + (row0 * H + h) * dqk, H * dqk,
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
