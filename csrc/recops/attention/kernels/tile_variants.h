// Run-time choice of the instruction set for the attention tiles' element-wise passes
// (common/cpu_isa.h): tile_ops.h and softmax_tile_ops.h hold the generic bodies; the variants
// (variant_baseline.cpp, variant_avx2.cpp, variant_avx512.cpp) compile them once per instruction
// set through kernels/variant.h, each into a table of entry points. A kernel picks its table once
// per call (tile_ops<T>() / tile_kernels(), which read RECOPS_CPU_ISA) and calls through it for
// every tile. float64 always runs the baseline build (validation, not speed). The AVX-512 variant
// has a second table for CPUs with AVX512_BF16, which swaps in native_bf16.cpp's
// intrinsics for the forward's SiLU pass (tile_kernels()).
//
// This header also includes every external header the variants use, so that a variant includes
// them all before switching the instruction set.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "recops/attention/kernels/native_bf16.h"
#include "recops/attention/kernels/softmax_tile_ops.h"
#include "recops/attention/kernels/tile_ops.h"
#include "recops/common/cpu_isa.h"
#include "recops/common/kernels/small_gemm.h"

#if RECOPS_X86_VARIANTS
#include <immintrin.h>
#endif

namespace recops::attention::kernels {

// The element-wise passes of one variant on T tiles (the *_generic functions of tile_ops.h and
// softmax_tile_ops.h, which document them).
template <typename T>
struct TileOps {
  // HSTU family (tile_ops.h).
  void (*silu_scores)(T* s, const T* bias, const T* mask, int64_t n, T alpha, T scale);
  void (*silu_score_grads)(T* s, T* dp, const T* bias, const T* mask, int64_t n, T alpha, T scale);
  void (*add_time_bias)(const double* key_time, int64_t n, double query_time,
                        const LogBucketizer::View& bucket, const T* ts_w, T* out, int32_t* buckets);
  void (*add_by_bucket)(const T* g, const int32_t* buckets, int64_t n, double* sums);
  int64_t (*time_bucket_runs)(const double* key_time, int64_t n, int64_t key, double query_time,
                              const LogBucketizer::View& bucket, TimeRun* runs);
  void (*time_runs_forward)(const TimeRun* runs, int64_t count, const T* ts_w, const double* sums,
                            int64_t dv, double* acc);
  void (*time_runs_backward)(const TimeRun* runs, int64_t count, const T* ts_w, const double* sums,
                             int64_t dv, const double* g, double* diffs, double* ts_grad);
  void (*key_row_dots)(const T* q, int64_t ld_q, int64_t rows, const T* k, int64_t ld_k, int64_t n,
                       int64_t d, T* s, int64_t ld_s);
  void (*weighted_value_rows)(const T* w, int64_t ld_w, int64_t rows, const T* v, int64_t ld_v,
                              int64_t n, int64_t dv, T* out, int64_t ld_out, bool accumulate);
  // dst[c * ld_dst + r] = src[r * ld_src + c] for r < rows, c < cols.
  void (*transpose)(const T* src, int64_t rows, int64_t cols, int64_t ld_src, T* dst,
                    int64_t ld_dst);
  // dst[c * ld_dst + r] = scale * src[r * ld_src + c], added to dst when accumulating.
  void (*transpose_scaled)(const T* src, int64_t rows, int64_t cols, int64_t ld_src, T* dst,
                           int64_t ld_dst, T scale, bool accumulate);
  // Softmax attention (softmax_tile_ops.h).
  T (*mask_row)(T* s, int64_t n, const uint8_t* keep);
  T (*exp_row)(T* s, int64_t n, T m);
  void (*dropout_row)(T* p, int64_t n, const RowDropout<T>& dropout, int64_t j0);
  void (*softmax_grad_row)(T* s, T* dp, int64_t n, T lse, T d, T scale,
                           const RowDropout<T>* dropout, int64_t j0);
  void (*expand_position_terms)(T* diag, int64_t rows, int64_t n, int64_t lanes,
                                const int32_t* delta, const T* c2p_t, int64_t c2p_ld,
                                const T* p2c_t, int64_t p2c_ld, int64_t first);
  void (*unshear_add)(const T* diag, int64_t rows, int64_t n, int64_t lanes, T* tile);
  void (*shear_tile)(const T* tile, int64_t rows, int64_t n, T* diag, int64_t lanes);
  void (*accumulate_position_grads)(const T* diag, int64_t rows, int64_t n, int64_t lanes,
                                    const int32_t* delta, T* dc2p_t, int64_t dc2p_ld, T* dp2c_t,
                                    int64_t dp2c_ld, int64_t first);
  void (*add_uniform_position_terms)(T* tile, int64_t rows, int64_t n, const T* c2p, const T* p2c);
  void (*accumulate_uniform_position_grads)(const T* ds, int64_t rows, int64_t n, T* dc2p, T* dp2c);
};

// One variant's entry points: the fp32 passes, and the bf16 operands of the bf16 kernels' tile
// products made from fp32 tiles (bf16_bits rounding).
struct TileKernels {
  TileOps<float> fp32;
  // dst[i] = bf16(scale * src[i]).
  void (*to_bf16)(const float* src, uint16_t* dst, int64_t n, float scale);
  // The VNNI layout of a [rows, cols] tile (rows even): dst[((r / 2) * cols + c) * 2 + r % 2].
  void (*to_bf16_vnni)(const float* src, int64_t rows, int64_t cols, uint16_t* dst, float scale);
  // silu_scores with the result rounded to bf16 into out (s is left as it was); a null mask
  // leaves every score visible.
  void (*silu_scores_to_bf16)(const float* s, const float* bias, const float* mask, int64_t n,
                              float alpha, float scale, uint16_t* out);
  // The operands of the backward products from a [rows, cols] tile pair (rows even), in one
  // pass: a in VNNI layout, and alpha * ds both row-major and in VNNI layout.
  void (*backward_operands_to_bf16)(const float* a, const float* ds, int64_t rows, int64_t cols,
                                    float alpha, uint16_t* a_vnni, uint16_t* ds_rows,
                                    uint16_t* ds_vnni);
  // dst[c * ld_dst + r] = src[r * ld_src + c]: a [rows, cols] matrix of bf16 bits transposed.
  void (*transpose_bf16)(const uint16_t* src, int64_t rows, int64_t cols, int64_t ld_src,
                         uint16_t* dst, int64_t ld_dst);
  // The same for pairs of bf16 values moved as one (columns 2c, 2c + 1 of src row r to
  // dst[(c * ld_dst + r) * 2 + {0, 1}]): src^T in VNNI layout, for [rows, 2 * pairs] src.
  void (*transpose_bf16_pairs)(const uint16_t* src, int64_t rows, int64_t pairs, int64_t ld_src,
                               uint16_t* dst, int64_t ld_dst);
};

namespace baseline {
extern const TileKernels kTileKernels;
extern const TileOps<double> kDoubleTileOps;
}  // namespace baseline
#if RECOPS_X86_VARIANTS
namespace avx2 {
extern const TileKernels kTileKernels;
}
namespace avx512 {
extern const TileKernels kTileKernels;
extern const TileKernels kNativeBf16TileKernels;  // kTileKernels with native_bf16's pass
}  // namespace avx512
#endif

// The table of an instruction set. On AVX-512, CPUs with AVX512_BF16 get the one whose forward
// SiLU pass is native_bf16's (native_bf16.cpp); native_bf16 = false picks the portable
// AVX-512 table on any CPU (the tests compare the two).
inline const TileKernels& tile_kernels(CpuIsa isa, bool native_bf16 = cpu_has_avx512_bf16()) {
#if RECOPS_X86_VARIANTS
  if (isa >= CpuIsa::kAvx512) {
    return native_bf16 ? avx512::kNativeBf16TileKernels : avx512::kTileKernels;
  }
  if (isa == CpuIsa::kAvx2) return avx2::kTileKernels;
#else
  (void)native_bf16;
#endif
  return baseline::kTileKernels;
}

// The passes a kernel on T tiles calls: cpu_isa()'s variant for float, the baseline for double.
template <typename T>
const TileOps<T>& tile_ops(CpuIsa isa = cpu_isa()) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "float or double tiles");
  if constexpr (std::is_same_v<T, double>) {
    return baseline::kDoubleTileOps;
  } else {
    return tile_kernels(isa).fp32;
  }
}

}  // namespace recops::attention::kernels
