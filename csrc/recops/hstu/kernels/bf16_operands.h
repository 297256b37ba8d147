// bf16 operands of the HSTU-family tile products, laid out once per call: common/blas.h's
// gemm_bf16 (in the extension oneDNN's bf16 batch-reduce GEMM micro-kernel as PyTorch exports it,
// fp32 accumulation into an fp32 C), whose second operand is in VNNI layout: a [K, N] matrix
// stored as [K / 2, N, 2], the two values of each pair of rows side by side (element (k, n) at
// ((k / 2) * ld + n) * 2 + k % 2).
//
// Every dimension and leading dimension of these products is a multiple of kBf16Granule: tiles
// are zero-padded to it (padded query rows and keys are masked out, padded head dims are zero),
// which bounds the set of shapes oneDNN generates kernels for as blas.h's fp32 products do, and
// keeps K even as the layout needs. Values are bf16 bit patterns (uint16_t) in the kernels,
// passed to gemm_bf16 as the layout-identical Bf16 (common/half_bits.h).
//
// PackedOperands holds, per sequence and head, built once per call in parallel: K^T [Dqk, N] and
// (backward) V^T [Dv, N] and K [N, Dqk] in VNNI layout for S = Q K^T, dA = dO V^T, dQ = dS K,
// and (forward) V [N, Dv] for O = A V. Each is about one bf16 copy of K or V. A query block is
// padded to the granule (PaddedBlock) to meet them.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>

#include "recops/common/blas.h"
#include "recops/common/cpu_isa.h"
#include "recops/common/half_bits.h"
#include "recops/common/parallel.h"
#include "recops/hstu/kernels/batch.h"

namespace recops::attention::kernels {

constexpr int64_t kBf16Granule = kBrgemmGranule;

inline int64_t round_up(int64_t x, int64_t granule) {
  return (x + granule - 1) / granule * granule;
}

// Whether bf16 tiles run on the bf16 micro-kernel: gemm_bf16_available() (in the extension: the
// CPU has AVX512_BF16 dot products and oneDNN is enabled) and the ISA cap (RECOPS_CPU_ISA)
// allows AVX-512. Otherwise the adapters compute in fp32.
inline bool bf16_tiles_available() {
  return cpu_isa() == CpuIsa::kAvx512 && gemm_bf16_available();
}

// C[m, n] (+)= A[m, k] B[k, n]: A row-major (lda), B in VNNI layout (ldb), C fp32 (ldc), on bf16
// bit patterns.
inline void gemm_bf16(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda,
                      const uint16_t* b_vnni, int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  recops::gemm_bf16(m, n, k, reinterpret_cast<const Bf16*>(a), lda,
                    reinterpret_cast<const Bf16*>(b_vnni), ldb, c, ldc, accumulate);
}

// The VNNI layout [d_pad / 2, ld, 2] of src^T, for src [n, d] (row stride ld_src): the pair of
// columns (2p, 2p + 1) of row j lands at ((p * ld) + j) * 2 as one 32-bit word, so this is a
// transpose of words (memcpy moves them: no aliasing of the uint16_t buffers), in square blocks
// that keep reads and writes within a few cache lines. Zero past (d, n).
inline void pack_vnni_transposed(const uint16_t* src, int64_t n, int64_t d, int64_t ld_src,
                                 int64_t d_pad, int64_t ld, uint16_t* dst) {
  constexpr int64_t kBlock = 16;
  const int64_t pairs = d / 2;
  for (int64_t p = 0; p < d_pad / 2; ++p) {  // zero what the copies below leave
    uint16_t* row = dst + p * ld * 2;
    std::fill(p < pairs ? row + 2 * n : row, row + 2 * ld, uint16_t(0));
  }
  for (int64_t j0 = 0; j0 < n; j0 += kBlock) {
    const int64_t j1 = std::min(n, j0 + kBlock);
    for (int64_t p0 = 0; p0 < pairs; p0 += kBlock) {
      const int64_t p1 = std::min(pairs, p0 + kBlock);
      for (int64_t p = p0; p < p1; ++p) {
        for (int64_t j = j0; j < j1; ++j) {
          std::memcpy(dst + (p * ld + j) * 2, src + j * ld_src + 2 * p, 2 * sizeof(uint16_t));
        }
      }
    }
  }
  if (d % 2 != 0) {  // the last column pairs with the zero padding
    for (int64_t j = 0; j < n; ++j) dst[(pairs * ld + j) * 2] = src[j * ld_src + d - 1];
  }
}

// The VNNI layout [n_pad / 2, d_pad, 2] of src [n, d] (row stride ld_src): rows 2p and 2p + 1
// interleaved value by value. Zero past (n, d).
inline void pack_vnni_rows(const uint16_t* src, int64_t n, int64_t d, int64_t ld_src, int64_t n_pad,
                           int64_t d_pad, uint16_t* dst) {
  for (int64_t j = 0; j < n; j += 2) {
    const uint16_t* even = src + j * ld_src;
    uint16_t* out = dst + j * d_pad;
    if (j + 1 < n) {
      const uint16_t* odd = even + ld_src;
      for (int64_t c = 0; c < d; ++c) {
        out[2 * c] = even[c];
        out[2 * c + 1] = odd[c];
      }
    } else {
      for (int64_t c = 0; c < d; ++c) {
        out[2 * c] = even[c];
        out[2 * c + 1] = 0;
      }
    }
    std::fill(out + 2 * d, out + 2 * d_pad, uint16_t(0));
  }
  std::fill(dst + round_up(n, 2) * d_pad, dst + n_pad * d_pad, uint16_t(0));
}

// Per-call VNNI copies of K and V, per sequence and head (see the file comment).
class PackedOperands {
 public:
  struct Which {
    bool k_t, k, v_t, v;
  };

  // k [rows, H, dqk] and v [rows, H, dv] (bf16 bits).
  PackedOperands(const Sequences& seqs, int64_t heads, int64_t dqk, int64_t dv, const uint16_t* k,
                 const uint16_t* v, Which which)
      : heads_(heads),
        dqk_pad_(round_up(dqk, kBf16Granule)),
        dv_pad_(round_up(dv, kBf16Granule)),
        n_pad_(round_up(std::max<int64_t>(seqs.max_len, 1), kBf16Granule)) {
    const int64_t per_head_k = dqk_pad_ * n_pad_, per_head_v = dv_pad_ * n_pad_;
    const int64_t units = seqs.count * heads;
    if (which.k_t) k_t_.reset(new uint16_t[units * per_head_k]);
    if (which.k) k_.reset(new uint16_t[units * per_head_k]);
    if (which.v_t) v_t_.reset(new uint16_t[units * per_head_v]);
    if (which.v) v_.reset(new uint16_t[units * per_head_v]);
    parallel_for(0, units, 1, [&](int64_t u0, int64_t u1) {
      for (int64_t u = u0; u < u1; ++u) {
        const int64_t b = u / heads, h = u % heads, len = seqs.length[b];
        const uint16_t* kh = k + (seqs.row_begin[b] * heads + h) * dqk;
        const uint16_t* vh = v + (seqs.row_begin[b] * heads + h) * dv;
        const int64_t ldk = heads * dqk, ldv = heads * dv;
        if (k_t_)
          pack_vnni_transposed(kh, len, dqk, ldk, dqk_pad_, n_pad_, k_t_.get() + u * per_head_k);
        if (k_) pack_vnni_rows(kh, len, dqk, ldk, n_pad_, dqk_pad_, k_.get() + u * per_head_k);
        if (v_t_)
          pack_vnni_transposed(vh, len, dv, ldv, dv_pad_, n_pad_, v_t_.get() + u * per_head_v);
        if (v_) pack_vnni_rows(vh, len, dv, ldv, n_pad_, dv_pad_, v_.get() + u * per_head_v);
      }
    });
  }

  // The operands from key key0 (a multiple of kBf16Granule) of sequence b, head h; the leading
  // dimension of K^T / V^T is n_pad(), of K / V dqk_pad() / dv_pad().
  const uint16_t* k_t(int64_t b, int64_t h, int64_t key0) const {
    return k_t_.get() + (b * heads_ + h) * dqk_pad_ * n_pad_ + 2 * key0;
  }
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
  int64_t heads_, dqk_pad_, dv_pad_, n_pad_;
  std::unique_ptr<uint16_t[]> k_t_, k_, v_t_, v_;
};

// A query block padded for the bf16 products: its key range starts at a multiple of the granule
// (the keys added in front are outside the mask's key range, so masked out) and its tiles have
// rows of ld = keys rounded up to the granule; rows_pad query rows (the rows past `rows` are
// zero in every tile).
struct PaddedBlock {
  Block blk;
  int64_t rows_pad;
};

inline PaddedBlock pad_block(const Block& blk) {
  Block p = blk;
  p.key0 = blk.key0 / kBf16Granule * kBf16Granule;
  p.keys = blk.key0 + blk.keys - p.key0;
  p.ld = round_up(p.keys, kBf16Granule);
  return {p, round_up(blk.rows, kBf16Granule)};
}

}  // namespace recops::attention::kernels
