// The bf16 operand layouts of the attention kernels' tile products (HSTU, FuXi-alpha, DeBERTa):
// common/blas.h's gemm_bf16 (in the extension oneDNN's bf16 batch-reduce GEMM micro-kernel as
// PyTorch exports it, fp32 accumulation into an fp32 C) takes its second operand in VNNI layout:
// a [K, N] matrix stored as [K / 2, N, 2], the two values of each pair of rows side by side
// (element (k, n) at ((k / 2) * ld + n) * 2 + k % 2).
//
// Every dimension and leading dimension of these products is a multiple of kBf16Granule: tiles
// are zero-padded to it, which bounds the set of shapes oneDNN generates kernels for as blas.h's
// fp32 products do, and keeps K even as the layout needs. Values are bf16 bit patterns (uint16_t)
// in the kernels, passed to gemm_bf16 as the layout-identical Bf16 (common/half_bits.h).
// Transposes run on the variant's in-register 16 x 16 blocks: callers pass the variant's table
// (tile_kernels(cpu_isa()), looked up once per call or per thread, not per block).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "recops/attention/kernels/tile_variants.h"
#include "recops/common/blas.h"
#include "recops/common/cpu_isa.h"
#include "recops/common/half_bits.h"

namespace recops::attention::kernels {

constexpr int64_t kBf16Granule = kBrgemmGranule;

inline int64_t round_up(int64_t x, int64_t granule) {
  return (x + granule - 1) / granule * granule;
}

// Whether bf16 tiles run on the bf16 micro-kernel: gemm_bf16_available() (in the extension: the
// CPU has AVX512_BF16 dot products and oneDNN is enabled) and the ISA cap (RECOPS_CPU_ISA)
// allows AVX-512. Otherwise the adapters compute in fp32.
inline bool bf16_tiles_available() {
  return cpu_isa() >= CpuIsa::kAvx512 && gemm_bf16_available();
}

// C[m, n] (+)= A[m, k] B[k, n]: A row-major (lda), B in VNNI layout (ldb), C fp32 (ldc), on bf16
// bit patterns.
inline void gemm_bf16(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda,
                      const uint16_t* b_vnni, int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  recops::gemm_bf16(m, n, k, reinterpret_cast<const Bf16*>(a), lda,
                    reinterpret_cast<const Bf16*>(b_vnni), ldb, c, ldc, accumulate);
}

// The VNNI layout [d_pad / 2, ld, 2] of src^T, for src [n, d] (row stride ld_src), from column
// `first` on: the pair of columns (2p, 2p + 1) of row j lands at ((p * ld) + first + j) * 2, so
// this is a transpose of pairs. Zero past (d, first + n); columns before `first` are left as
// they are, so runs of rows packed in column order leave the whole layout written.
inline void pack_vnni_transposed(const TileKernels& kernels, const uint16_t* src, int64_t n,
                                 int64_t d, int64_t ld_src, int64_t d_pad, int64_t ld,
                                 uint16_t* dst, int64_t first = 0) {
  const int64_t pairs = d / 2;
  for (int64_t p = 0; p < d_pad / 2; ++p) {  // zero what the transpose below leaves
    uint16_t* row = dst + p * ld * 2;
    std::fill(row + 2 * (p < pairs ? first + n : first), row + 2 * ld, uint16_t(0));
  }
  kernels.transpose_bf16_pairs(src, n, pairs, ld_src, dst + 2 * first, ld);
  if (d % 2 != 0) {  // the last column pairs with the zero padding
    for (int64_t j = 0; j < n; ++j) dst[(pairs * ld + first + j) * 2] = src[j * ld_src + d - 1];
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

// dst [rows_pad, cols_pad] (row stride cols_pad) = src [rows, cols] (row stride ld_src), zero
// padded.
inline void copy_padded(const uint16_t* src, int64_t rows, int64_t cols, int64_t ld_src,
                        uint16_t* dst, int64_t rows_pad, int64_t cols_pad) {
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(dst + r * cols_pad, src + r * ld_src, cols * sizeof(uint16_t));
    std::fill(dst + r * cols_pad + cols, dst + (r + 1) * cols_pad, uint16_t(0));
  }
  std::fill(dst + rows * cols_pad, dst + rows_pad * cols_pad, uint16_t(0));
}

// dst [cols_pad, rows_pad] = src [rows_pad, cols_pad] transposed (both padded).
inline void transpose_padded(const TileKernels& kernels, const uint16_t* src, int64_t rows_pad,
                             int64_t cols_pad, uint16_t* dst) {
  kernels.transpose_bf16(src, rows_pad, cols_pad, cols_pad, dst, rows_pad);
}

}  // namespace recops::attention::kernels
