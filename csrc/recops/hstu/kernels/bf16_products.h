// The bf16 precision of the HSTU-family kernels: Bf16Precision, the policy hstu_attention.h's
// bodies run on for bf16 inputs where the CPU multiplies bf16 (bf16_tiles_available):
// every tile product on the bf16 micro-kernel with fp32 accumulation, on bf16_operands.h's
// per-call operands and on the block's Q, dO, A, dS rounded to bf16 once as the next product's
// operand; the SiLU, mask and bias arithmetic stays in fp32 on the fp32 score tiles (tile_ops.h).
// Outputs are stored as bf16 from the fp32 product tiles (store_rows); dQ, dK, dV leave as fp32
// (dK / dV as per-chunk partials, summed and rounded by the adapter). What each thread needs:
// Bf16Gradients and Bf16Scratch. The forward runs fused on AMX tiles where it can (HSTU;
// fused_forward_available).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>

#include "recops/attention/kernels/tile_variants.h"
#include "recops/common/blas.h"
#include "recops/common/cpu_isa.h"
#include "recops/hstu/kernels/batch.h"
#include "recops/hstu/kernels/bf16_operands.h"
#include "recops/hstu/kernels/block_schedule.h"
#include "recops/hstu/kernels/mask_and_bias.h"

namespace recops::attention::kernels {

// The bf16 backward's fp32 gradient accumulators (over n_pad keys) and the block's bf16 Q, Q^T,
// dO and dO^T, zero padded (gemm_bf16 takes untransposed operands only).
class Bf16Gradients : public KeyGradients<float> {
 public:
  Bf16Gradients(const HstuShape<float>& s, const PackedOperands& ops)
      : KeyGradients(s.heads, s.dqk, s.dv, ops.dqk_pad(), ops.dv_pad(), ops.n_pad(), kBf16Granule),
        kernels_(tile_kernels(cpu_isa())),
        q_(new uint16_t[kQueryBlock * dqk_pad_]),
        go_(new uint16_t[kQueryBlock * dv_pad_]),
        q_t_(new uint16_t[dqk_pad_ * kQueryBlock]),
        go_t_(new uint16_t[dv_pad_ * kQueryBlock]) {}

  // The block's Q [rows_pad, dqk_pad] and Q^T, dO [rows_pad, dv_pad] and dO^T (load_go: dO and
  // dO^T only).
  void load_block(const uint16_t* q, int64_t ld_q, const uint16_t* go, int64_t ld_go, int64_t rows,
                  int64_t rows_pad) {
    copy_padded(q, rows, dqk_, ld_q, q_.get(), rows_pad, dqk_pad_);
    transpose_padded(kernels_, q_.get(), rows_pad, dqk_pad_, q_t());
    load_go(go, ld_go, rows, rows_pad);
  }
  void load_go(const uint16_t* go, int64_t ld_go, int64_t rows, int64_t rows_pad) {
    copy_padded(go, rows, dv_, ld_go, go_.get(), rows_pad, dv_pad_);
    transpose_padded(kernels_, go_.get(), rows_pad, dv_pad_, go_t());
  }
  const uint16_t* q() const { return q_.get(); }
  const uint16_t* go() const { return go_.get(); }
  // The block's Q^T [dqk_pad, kQueryBlock] and dO^T [dv_pad, kQueryBlock].
  uint16_t* q_t() { return q_t_.get(); }
  uint16_t* go_t() { return go_t_.get(); }

 private:
  const TileKernels& kernels_;
  std::unique_ptr<uint16_t[]> q_, go_, q_t_, go_t_;
};

// Per-thread scratch of the bf16 kernels: the fp32 tiles (the TileArena, `rows` rows of up to
// n_pad), bf16 operand tiles and an fp32 product tile of kQueryBlock x max(Dqk, Dv) (padded).
struct Bf16Scratch : TileArena<float> {
  Bf16Scratch(int tiles, int bf16_tiles, int64_t rows, const PackedOperands& ops, bool with_buckets,
              int64_t slot)
      : TileArena<float>(tiles, rows, ops.n_pad(), with_buckets, slot),
        bf16(new uint16_t[bf16_tiles * tile_size() + kQueryBlock * ops.dqk_pad()]),
        product(new float[kQueryBlock * std::max(ops.dqk_pad(), ops.dv_pad())]) {}
  uint16_t* bf16_tile(int index) { return bf16.get() + index * tile_size(); }
  ~Bf16Scratch() { gemm_bf16_release(); }
  Bf16Scratch(const Bf16Scratch&) = delete;
  Bf16Scratch& operator=(const Bf16Scratch&) = delete;

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

// A = the SiLU pass of a block's fp32 scores s [rows_pad, ld] (bias and mask tiles alike, or
// null), rounded to bf16. It runs on each row's visible runs and writes zeros around them, so a
// structured mask needs no mask tile (building and reading one cost as much as the SiLU itself
// at N = 2048).
inline void silu_block_to_bf16(const TileKernels& passes, const MaskSource<float>& mask,
                               const Block& blk, int64_t rows_pad, const float* s,
                               const float* bias, const float* mask_tile,
                               const HstuShape<float>& shape, uint16_t* a) {
  const int64_t ld = blk.ld;
  std::fill(a + blk.rows * ld, a + rows_pad * ld, uint16_t(0));
  for_each_row_run_and_gap(
      mask, blk, ld,
      [&](int64_t r, int64_t begin, int64_t end) {
        const int64_t at = r * ld + begin;
        passes.silu_scores_to_bf16(s + at, bias == nullptr ? nullptr : bias + at,
                                   mask_tile == nullptr ? nullptr : mask_tile + at, end - begin,
                                   shape.alpha, shape.silu_scale, a + at);
      },
      [&](int64_t r, int64_t begin, int64_t end) {
        std::fill(a + r * ld + begin, a + r * ld + end, uint16_t(0));
      });
}

// Whether the bf16 forward runs fused on AMX tiles (native_bf16::silu_attention_tile).
inline bool fused_forward_available(const HstuShape<float>& shape) {
  return cpu_isa() >= CpuIsa::kAmx && native_bf16::amx_tiles_available() &&
         round_up(shape.dv, native_bf16::kFusedGranule) <= native_bf16::kMaxFusedDv;
}

// The bf16 precision policy (see the file comment). Blocks are padded to the granule: keys and
// head dims to kBf16Granule (to native_bf16::kFusedGranule on the fused forward), query rows to
// kBf16Granule.
class Bf16Precision {
 public:
  using Element = uint16_t;  // bf16 bits
  using Compute = float;
  using Scratch = Bf16Scratch;
  using BackwardScratch = kernels::BackwardScratch<Bf16Scratch, Bf16Gradients>;
  using Weights = const uint16_t*;  // bf16 weights (VNNI layout in the backward)

  // bf16 tiles: A (or the fused forward's visibility bits), dS as rows and in VNNI layout, two
  // channels' weights; then the block's Q.
  enum Bf16Tile : int { kA, kDsRows, kDsVnni, kWeights, kBf16Tiles = kWeights + 2 };

  // may_fuse: the forward may run on native_bf16::silu_attention_tile (HSTU's, whose tile takes
  // no bias channels).
  Bf16Precision(const Sequences& seqs, const HstuShape<float>& shape, const Bf16Tensors& in,
                bool backward, bool may_fuse = false)
      : seqs_(seqs),
        shape_(shape),
        in_(in),
        fused_(!backward && may_fuse && fused_forward_available(shape)),
        granule_(fused_ ? native_bf16::kFusedGranule : kBf16Granule),
        ops_(seqs, shape.heads, shape.dqk, shape.dv, in.k, in.v,
             {true, backward, backward, !backward}, granule_, fused_ ? granule_ : 0),
        passes_(tile_kernels(cpu_isa())) {}

  const Sequences& sequences() const { return seqs_; }
  const HstuShape<float>& shape() const { return shape_; }
  const Rows<Element>& values() const { return in_.v; }
  Scratch scratch(int tiles, bool with_buckets, int64_t slot) const {
    return Scratch(tiles, kBf16Tiles, tile_rows(seqs_, kBf16Granule), ops_, with_buckets, slot);
  }
  BackwardScratch backward_scratch(int tiles, bool with_buckets, int64_t slot) const {
    return {scratch(tiles, with_buckets, slot), Bf16Gradients(shape_, ops_)};
  }
  PaddedBlock pad(const Block& blk) const { return pad_block(blk, granule_); }
  // The forward's SiLU runs on a structured mask's visible runs: only a custom mask needs a tile.
  bool forward_mask_tile(const MaskSource<float>& mask) const {
    return mask.kind == MaskKind::kCustom;
  }
  // The backward's SiLU pass multiplies by the mask tile, whatever the mask.
  bool backward_mask_tile(const MaskSource<float>&) const { return true; }
  void begin_forward_block(Scratch& t, const MaskSource<float>& mask, const PaddedBlock& pb) const {
    if (fused_) fill_visibility(mask, pb.blk, pb.rows_pad, visibility(t));
  }
  // A channel's fp32 weight tile rounded to bf16 weight slot `slot` (VNNI for the backward).
  void round_weights(Scratch& t, const PaddedBlock& pb, int tile, int slot, bool vnni) const {
    uint16_t* w = t.bf16_tile(kWeights + slot);
    if (vnni) {
      passes_.to_bf16_vnni(t.tile(tile), pb.rows_pad, pb.blk.ld, w, 1.0f);
    } else {
      passes_.to_bf16(t.tile(tile), w, pb.rows_pad * pb.blk.ld, 1.0f);
    }
  }
  Weights weights(Scratch& t, int, int slot) const { return t.bf16_tile(kWeights + slot); }

  // out rows (row stride ld_out, bf16) = W V for head h of the block.
  void weighted_values(Scratch& t, const PaddedBlock& pb, int64_t h, Weights w, uint16_t* out,
                       int64_t ld_out) const {
    const Block& blk = pb.blk;
    const int64_t dv_pad = ops_.dv_pad();
    gemm_bf16(pb.rows_pad, dv_pad, blk.ld, w, blk.ld, ops_.v(blk.b, h, blk.key0), dv_pad,
              t.product.get(), dv_pad, false);
    store_rows(passes_, t.product.get(), blk.rows, shape_.dv, dv_pad, out, ld_out);
  }

  // out rows = silu(alpha Q K^T + bias) * scale * mask V for head h (bias null: none; mask null:
  // the structured mask's runs): the fused AMX tile per 16 query rows, or two brgemm products
  // around silu_block_to_bf16 (the scores in s).
  void silu_head_forward(Scratch& t, const MaskSource<float>& mask, const PaddedBlock& pb,
                         int64_t h, const float* bias, const float* mask_tile, float* s,
                         uint16_t* out, int64_t ld_out) const {
    const Block& blk = pb.blk;
    const int64_t ld = blk.ld, dqk_pad = ops_.dqk_pad(), dv_pad = ops_.dv_pad();
    uint16_t* q = t.bf16_tile(kBf16Tiles);
    copy_padded(in_.q.at(query_row(blk), h, shape_.dqk), blk.rows, shape_.dqk, in_.q.stride, q,
                pb.rows_pad, dqk_pad);
    if (!fused_) {
      gemm_bf16(pb.rows_pad, ld, dqk_pad, q, dqk_pad, ops_.k_t(blk.b, h, blk.key0), ops_.k_t_ld(),
                s, ld, false);
      silu_block_to_bf16(passes_, mask, blk, pb.rows_pad, s, bias, mask_tile, shape_,
                         t.bf16_tile(kA));
      weighted_values(t, pb, h, t.bf16_tile(kA), out, ld_out);
      return;
    }
    const int64_t words = ld / native_bf16::kFusedGranule;
    for (int64_t r = 0; r < blk.rows; r += 16) {
      native_bf16::silu_attention_tile({q + r * dqk_pad, ops_.k_t(blk.b, h, blk.key0),
                                        ops_.k_t_ld(), ops_.k_t_step(), ops_.v(blk.b, h, blk.key0),
                                        dqk_pad, dv_pad, ld, visibility(t) + r * words,
                                        bias == nullptr ? nullptr : bias + r * ld,
                                        mask_tile == nullptr ? nullptr : mask_tile + r * ld, ld,
                                        shape_.alpha, shape_.silu_scale, t.product.get()});
      store_rows(passes_, t.product.get(), std::min<int64_t>(16, blk.rows - r), shape_.dv, dv_pad,
                 out + r * ld_out, ld_out);
    }
  }

  // Backward of head h of a padded block of silu attention (HSTU; FuXi-alpha's semantic
  // channel): S and dA, then A (in s) and dS (in ds, fp32, without alpha) from the mask and
  // optional bias tiles, dQ rows (fp32, written to dq, row stride ld_dq), dK^T and dV^T
  // (accumulated). `go` is the head's dO (bf16) with row stride ld_go.
  void silu_head_backward(BackwardScratch& scratch, const MaskSource<float>&, const PaddedBlock& pb,
                          int64_t h, const uint16_t* go, int64_t ld_go, const float* bias,
                          const float* mask, float* s, float* ds, float* dq, int64_t ld_dq) const {
    const Block& blk = pb.blk;
    Bf16Scratch& t = scratch.tiles;
    Bf16Gradients& tg = scratch.grads;
    const int64_t ld = blk.ld, rows_pad = pb.rows_pad;
    const int64_t dqk_pad = ops_.dqk_pad(), dv_pad = ops_.dv_pad();
    tg.load_block(in_.q.at(query_row(blk), h, shape_.dqk), in_.q.stride, go, ld_go, blk.rows,
                  rows_pad);
    gemm_bf16(rows_pad, ld, dqk_pad, tg.q(), dqk_pad, ops_.k_t(blk.b, h, blk.key0), ops_.k_t_ld(),
              s, ld, false);
    gemm_bf16(rows_pad, ld, dv_pad, tg.go(), dv_pad, ops_.v_t(blk.b, h, blk.key0), ops_.n_pad(), ds,
              ld, false);
    passes_.fp32.silu_score_grads(s, ds, bias, mask, rows_pad * ld, shape_.alpha,
                                  shape_.silu_scale);
    passes_.backward_operands_to_bf16(s, ds, rows_pad, ld, shape_.alpha, t.bf16_tile(kA),
                                      t.bf16_tile(kDsRows), t.bf16_tile(kDsVnni));
    gemm_bf16(rows_pad, dqk_pad, ld, t.bf16_tile(kDsRows), ld, ops_.k(blk.b, h, blk.key0), dqk_pad,
              t.product.get(), dqk_pad, false);
    store_rows(passes_, t.product.get(), blk.rows, shape_.dqk, dqk_pad, dq, ld_dq);
    gemm_bf16(dqk_pad, ld, rows_pad, tg.q_t(), rows_pad, t.bf16_tile(kDsVnni), ld,
              tg.dk_t(h, blk.key0), tg.ld(), true);
    gemm_bf16(dv_pad, ld, rows_pad, tg.go_t(), rows_pad, t.bf16_tile(kA), ld, tg.dv_t(h, blk.key0),
              tg.ld(), true);
  }

  // A channel of fixed weights W (VNNI; FuXi-alpha's bias channels), head h, dO_c = go (row
  // stride ld_go): dV^T += dO_c^T W, and s = dO_c V^T (the weights' gradient before the mask).
  void weights_backward(BackwardScratch& scratch, const PaddedBlock& pb, int64_t h,
                        const uint16_t* go, int64_t ld_go, Weights w, float* s) const {
    const Block& blk = pb.blk;
    Bf16Gradients& tg = scratch.grads;
    const int64_t dv_pad = ops_.dv_pad();
    tg.load_go(go, ld_go, blk.rows, pb.rows_pad);
    gemm_bf16(dv_pad, blk.ld, pb.rows_pad, tg.go_t(), pb.rows_pad, w, blk.ld, tg.dv_t(h, blk.key0),
              tg.ld(), true);
    gemm_bf16(pb.rows_pad, blk.ld, dv_pad, tg.go(), dv_pad, ops_.v_t(blk.b, h, blk.key0),
              ops_.n_pad(), s, blk.ld, false);
  }

 private:
  int64_t query_row(const Block& blk) const { return seqs_.query_row(blk.b, blk.row0); }
  // The fused forward's visibility bits take rows_pad * ld / 32 words of the A tile.
  static uint32_t* visibility(Scratch& t) { return reinterpret_cast<uint32_t*>(t.bf16_tile(kA)); }

  const Sequences& seqs_;
  HstuShape<float> shape_;
  Bf16Tensors in_;
  bool fused_;
  int64_t granule_;
  PackedOperands ops_;
  const TileKernels& passes_;
};

}  // namespace recops::attention::kernels
