// bf16 operands of the HSTU-family tile products, laid out once per call (the layouts:
// attention/kernels/bf16_layouts.h). Padded query rows and keys are masked out, padded head dims
// are zero.
//
// PackedOperands holds, per sequence and head, built once per call in parallel: K^T [Dqk, N] and
// (backward) V^T [Dv, N] and K [N, Dqk] in VNNI layout for S = Q K^T, dA = dO V^T, dQ = dS K,
// and (forward) V [N, Dv] for O = A V. Each is about one bf16 copy of K or V. A query block is
// padded to the granule (pad_block) to meet them.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>

#include "recops/attention/kernels/bf16_layouts.h"
#include "recops/common/parallel.h"
#include "recops/hstu/kernels/batch.h"

namespace recops::attention::kernels {

// Per-call VNNI copies of K and V, per sequence and head (see the file comment).
class PackedOperands {
 public:
  struct Which {
    bool k_t, k, v_t, v;
  };

  // k [rows, H, dqk] and v [rows, H, dv] (bf16 bits); head dims and keys padded to `granule`.
  // K^T is stored in blocks of key_block keys (a multiple of granule; 0: one block of n_pad), each
  // block [Dqk / 2, key_block, 2] contiguous, so that a tile of it is one contiguous read.
  PackedOperands(const Sequences& seqs, int64_t heads, int64_t dqk, int64_t dv,
                 const Rows<uint16_t>& k, const Rows<uint16_t>& v, Which which,
                 int64_t granule = kBf16Granule, int64_t key_block = 0)
      : heads_(heads),
        dqk_pad_(round_up(dqk, granule)),
        dv_pad_(round_up(dv, granule)),
        n_pad_(round_up(std::max<int64_t>(seqs.longest, 1), granule)),
        key_block_(key_block > 0 ? key_block : n_pad_) {
    const int64_t per_head_k = dqk_pad_ * n_pad_, per_head_v = dv_pad_ * n_pad_;
    const int64_t units = seqs.count * heads;
    const TileKernels& kernels = tile_kernels(cpu_isa());
    if (which.k_t) k_t_.reset(new uint16_t[units * per_head_k]);
    if (which.k) k_.reset(new uint16_t[units * per_head_k]);
    if (which.v_t) v_t_.reset(new uint16_t[units * per_head_v]);
    if (which.v) v_.reset(new uint16_t[units * per_head_v]);
    parallel_for(0, units, 1, [&](int64_t u0, int64_t u1) {
      for (int64_t u = u0; u < u1; ++u) {
        const int64_t b = u / heads, h = u % heads, len = seqs.keys.length[b];
        // Run by run of key rows (each starting at an even key: VNNI rows pair keys).
        seqs.keys.for_each_run(b, 0, len, [&](int64_t row, int64_t key, int64_t n) {
          const uint16_t* kh = k.at(row, h, dqk);
          const uint16_t* vh = v.at(row, h, dv);
          if (k_) {
            pack_vnni_rows(kh, n, dqk, k.stride, n_pad_ - key, dqk_pad_,
                           k_.get() + u * per_head_k + key * dqk_pad_);
          }
          if (v_t_) {
            pack_vnni_transposed(kernels, vh, n, dv, v.stride, dv_pad_, n_pad_,
                                 v_t_.get() + u * per_head_v, key);
          }
          if (v_) {
            pack_vnni_rows(vh, n, dv, v.stride, n_pad_ - key, dv_pad_,
                           v_.get() + u * per_head_v + key * dv_pad_);
          }
        });
        if (!k_t_) continue;
        for (int64_t block = 0; block < n_pad_; block += key_block_) {
          uint16_t* dst = k_t_.get() + u * per_head_k + block * dqk_pad_;
          const int64_t keys = std::clamp<int64_t>(len - block, 0, key_block_);
          if (keys == 0) {  // blocks past len: zeros
            pack_vnni_transposed(kernels, k.data, 0, dqk, k.stride, dqk_pad_, key_block_, dst);
          }
          seqs.keys.for_each_run(b, block, keys, [&](int64_t row, int64_t key, int64_t n) {
            pack_vnni_transposed(kernels, k.at(row, h, dqk), n, dqk, k.stride, dqk_pad_, key_block_,
                                 dst, key - block);
          });
        }
      }
    });
  }

  // The operands from key key0 (a multiple of kBf16Granule; of key_block, or in the first block,
  // for K^T) of sequence b, head h; the leading dimension of V^T is n_pad(), of K / V dqk_pad() /
  // dv_pad().
  const uint16_t* k_t(int64_t b, int64_t h, int64_t key0) const {
    return k_t_.get() + (b * heads_ + h) * dqk_pad_ * n_pad_ + key0 / key_block_ * k_t_step() +
           key0 % key_block_ * 2;
  }
  // Keys per row of K^T (n_pad, or key_block), and the step from one block of keys to the next.
  int64_t k_t_ld() const { return key_block_; }
  int64_t k_t_step() const { return key_block_ * dqk_pad_; }
  const uint16_t* v_t(int64_t b, int64_t h, int64_t key0) const {
    return v_t_.get() + (b * heads_ + h) * dv_pad_ * n_pad_ + 2 * key0;
  }
  const uint16_t* k(int64_t b, int64_t h, int64_t key0) const {
    return k_.get() + (b * heads_ + h) * dqk_pad_ * n_pad_ + key0 * dqk_pad_;
  }
  const uint16_t* v(int64_t b, int64_t h, int64_t key0) const {
    return v_.get() + (b * heads_ + h) * dv_pad_ * n_pad_ + key0 * dv_pad_;
  }
  int64_t dqk_pad() const { return dqk_pad_; }
  int64_t dv_pad() const { return dv_pad_; }
  int64_t n_pad() const { return n_pad_; }

 private:
  int64_t heads_, dqk_pad_, dv_pad_, n_pad_, key_block_;
  std::unique_ptr<uint16_t[]> k_t_, k_, v_t_, v_;
};

// A query block padded for the bf16 products: its key range starts at a multiple of the granule
// (the keys added in front are outside the mask's key range, so masked out) and its tiles have
// rows of ld = keys rounded up to the granule; rows_pad query rows (the rows past `rows` are
// zero in every tile).
inline PaddedBlock pad_block(const Block& blk, int64_t key_granule = kBf16Granule) {
  Block p = blk;
  p.key0 = blk.key0 / key_granule * key_granule;
  p.keys = blk.key0 + blk.keys - p.key0;
  p.ld = round_up(p.keys, key_granule);
  return {p, round_up(blk.rows, kBf16Granule)};
}

}  // namespace recops::attention::kernels
