// The bf16 tile products of the HSTU-family kernels on bf16_operands.h's per-call operands, and
// what each thread needs for them:
//  * the block's operands: Q and dO copied into zero-padded bf16 tiles (copy_padded), and their
//    transposes;
//  * Bf16Gradients: the current work item's fp32 dK^T [H, Dqk, N] and dV^T [H, Dv, N]
//    (accumulated by dK^T += Q^T dS, dV^T += dO^T A) and the block's bf16 Q, Q^T, dO, dO^T;
//  * Bf16Scratch: the fp32 tiles, bf16 operand tiles and an fp32 product tile, whose rows
//    store_rows writes out as bf16 or fp32;
//  * silu_head_backward_bf16: the backward products of one head of one block (HSTU, and
//    FuXi-alpha's semantic channel).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>

#include "recops/attention/kernels/tile_variants.h"
#include "recops/common/blas.h"
#include "recops/hstu/kernels/batch.h"
#include "recops/hstu/kernels/bf16_operands.h"
#include "recops/hstu/kernels/block_schedule.h"

namespace recops::attention::kernels {

// Per-thread bf16 block operands and fp32 key-side gradient accumulators of the bf16 backward.
class Bf16Gradients {
 public:
  Bf16Gradients(int64_t heads, int64_t dqk, int64_t dv, const PackedOperands& ops)
      : kernels_(tile_kernels(cpu_isa())),
        heads_(heads),
        dqk_(dqk),
        dv_(dv),
        dqk_pad_(ops.dqk_pad()),
        dv_pad_(ops.dv_pad()),
        n_pad_(ops.n_pad()),
        q_(new uint16_t[kQueryBlock * dqk_pad_]),
        q_t_(new uint16_t[kQueryBlock * dqk_pad_]),
        go_(new uint16_t[kQueryBlock * dv_pad_]),
        go_t_(new uint16_t[kQueryBlock * dv_pad_]),
        dk_t_(new float[heads * dqk_pad_ * n_pad_]),
        dv_t_(new float[heads * dv_pad_ * n_pad_]) {}

  // Zeroes the accumulators whole: a padded block accumulates past the item's `length` keys.
  void begin_item(int64_t /*length*/) {
    std::fill_n(dk_t_.get(), heads_ * dqk_pad_ * n_pad_, 0.0f);
    std::fill_n(dv_t_.get(), heads_ * dv_pad_ * n_pad_, 0.0f);
  }

  // The block's Q [rows_pad, dqk_pad] and Q^T, dO [rows_pad, dv_pad] and dO^T, zero padded
  // (load_go: dO and dO^T only).
  void load_block(const uint16_t* q, int64_t ld_q, const uint16_t* go, int64_t ld_go, int64_t rows,
                  int64_t rows_pad) {
    copy_padded(q, rows, dqk_, ld_q, q_.get(), rows_pad, dqk_pad_);
    transpose_padded(kernels_, q_.get(), rows_pad, dqk_pad_, q_t_.get());
    load_go(go, ld_go, rows, rows_pad);
  }
  void load_go(const uint16_t* go, int64_t ld_go, int64_t rows, int64_t rows_pad) {
    copy_padded(go, rows, dv_, ld_go, go_.get(), rows_pad, dv_pad_);
    transpose_padded(kernels_, go_.get(), rows_pad, dv_pad_, go_t_.get());
  }
  const uint16_t* q() const { return q_.get(); }
  const uint16_t* q_t() const { return q_t_.get(); }
  const uint16_t* go() const { return go_.get(); }
  const uint16_t* go_t() const { return go_t_.get(); }

  float* dk_t(int64_t h, int64_t key0) { return dk_t_.get() + h * dqk_pad_ * n_pad_ + key0; }
  float* dv_t(int64_t h, int64_t key0) { return dv_t_.get() + h * dv_pad_ * n_pad_ + key0; }
  int64_t ld() const { return n_pad_; }

  // Adds the item's dK^T / dV^T into the first `length` rows of dK [rows, H, Dqk] and
  // dV [rows, H, Dv] (fp32, pointers at the sequence's first row).
  void end_item(int64_t length, float* dk, float* dv) {
    for (int64_t h = 0; h < heads_; ++h) {
      transpose(dqk_, length, dk_t(h, 0), n_pad_, dk + h * dqk_, heads_ * dqk_, 1.0f, true);
      transpose(dv_, length, dv_t(h, 0), n_pad_, dv + h * dv_, heads_ * dv_, 1.0f, true);
    }
  }

 private:
  const TileKernels& kernels_;
  int64_t heads_, dqk_, dv_, dqk_pad_, dv_pad_, n_pad_;
  std::unique_ptr<uint16_t[]> q_, q_t_, go_, go_t_;
  std::unique_ptr<float[]> dk_t_, dv_t_;
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

// Per-thread scratch of the bf16 backward: tiles and the key-side gradient accumulators.
struct Bf16BackwardScratch {
  Bf16BackwardScratch(int tile_count, int bf16_tile_count, const PackedOperands& ops,
                      bool with_buckets, int64_t slot, const HstuShape<float>& shape)
      : tiles(tile_count, bf16_tile_count, ops, with_buckets, slot),
        grads(shape.heads, shape.dqk, shape.dv, ops) {}

  Bf16Scratch tiles;
  Bf16Gradients grads;
};

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

}  // namespace recops::attention::kernels
