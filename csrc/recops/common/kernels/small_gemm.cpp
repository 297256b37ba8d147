// small_gemm (small_gemm.h), compiled for AVX-512.
#include "recops/common/kernels/small_gemm.h"

#include <algorithm>
#include <cstdint>

#include "recops/common/blas.h"
#include "recops/common/cpu_isa.h"

#if RECOPS_X86_VARIANTS
#include <immintrin.h>
#endif

namespace recops {

// The CPU's instruction set, not RECOPS_CPU_ISA's cap (read from the environment per call, too
// slow for a product called per tile): like oneDNN's brgemm, the product layer picks its own code.
bool small_gemm_available() {
  return static_cast<int>(supported_cpu_isa()) >= static_cast<int>(CpuIsa::kAvx512);
}

}  // namespace recops

#if RECOPS_X86_VARIANTS
RECOPS_TARGET_AVX512_BEGIN
namespace recops {
namespace {

constexpr int kRows = 6;       // rows of C in registers: 12 accumulators of 16 values
constexpr int64_t kCols = 32;  // columns of C per panel: two vectors

// The kRows x 2 accumulators are named variables, not an array: GCC keeps an array of vectors in
// memory, storing every accumulator on every step of k.
#define RECOPS_SMALL_GEMM_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5)

// Rows [0, kR) x columns [0, kVectors * 16) of C (the last vector masked by `tail`) over all of k;
// A's value (r, p) at a[r * lda + p], or a[p * lda + r] when kTransA.
template <int kR, int kVectors, bool kTransA>
void block(int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb, float* c,
           int64_t ldc, __mmask16 tail, bool accumulate) {
  const __mmask16 mask0 = kVectors == 1 ? tail : __mmask16(0xFFFF), mask1 = tail;
  const auto start = [&](int r, int v) {
    return accumulate ? _mm512_maskz_loadu_ps(v == 0 ? mask0 : mask1, c + r * ldc + 16 * v)
                      : _mm512_setzero_ps();
  };
#define RECOPS_DECLARE(r) __m512 acc##r##_0 = _mm512_setzero_ps(), acc##r##_1 = acc##r##_0;
  RECOPS_SMALL_GEMM_ROWS(RECOPS_DECLARE)
#undef RECOPS_DECLARE
#define RECOPS_START(r)                                    \
  if constexpr (r < kR) {                                  \
    acc##r##_0 = start(r, 0);                              \
    if constexpr (kVectors == 2) acc##r##_1 = start(r, 1); \
  }
  RECOPS_SMALL_GEMM_ROWS(RECOPS_START)
#undef RECOPS_START
  for (int64_t p = 0; p < k; ++p) {
    const __m512 b0 = _mm512_maskz_loadu_ps(mask0, b + p * ldb);
    const __m512 b1 = kVectors == 2 ? _mm512_maskz_loadu_ps(mask1, b + p * ldb + 16) : b0;
#define RECOPS_STEP(r)                                                            \
  if constexpr (r < kR) {                                                         \
    const __m512 x = _mm512_set1_ps(kTransA ? a[p * lda + r] : a[r * lda + p]);   \
    acc##r##_0 = _mm512_fmadd_ps(x, b0, acc##r##_0);                              \
    if constexpr (kVectors == 2) acc##r##_1 = _mm512_fmadd_ps(x, b1, acc##r##_1); \
  }
    RECOPS_SMALL_GEMM_ROWS(RECOPS_STEP)
#undef RECOPS_STEP
  }
#define RECOPS_STORE(r)                                                                      \
  if constexpr (r < kR) {                                                                    \
    _mm512_mask_storeu_ps(c + r * ldc, mask0, acc##r##_0);                                   \
    if constexpr (kVectors == 2) _mm512_mask_storeu_ps(c + r * ldc + 16, mask1, acc##r##_1); \
  }
  RECOPS_SMALL_GEMM_ROWS(RECOPS_STORE)
#undef RECOPS_STORE
}

// block<kR> for kR = rows (1 to kRows).
template <int kVectors, bool kTransA>
void rows_block(int rows, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
                float* c, int64_t ldc, __mmask16 tail, bool accumulate) {
  switch (rows) {
    case 6:
      return block<6, kVectors, kTransA>(k, a, lda, b, ldb, c, ldc, tail, accumulate);
    case 5:
      return block<5, kVectors, kTransA>(k, a, lda, b, ldb, c, ldc, tail, accumulate);
    case 4:
      return block<4, kVectors, kTransA>(k, a, lda, b, ldb, c, ldc, tail, accumulate);
    case 3:
      return block<3, kVectors, kTransA>(k, a, lda, b, ldb, c, ldc, tail, accumulate);
    case 2:
      return block<2, kVectors, kTransA>(k, a, lda, b, ldb, c, ldc, tail, accumulate);
    default:
      return block<1, kVectors, kTransA>(k, a, lda, b, ldb, c, ldc, tail, accumulate);
  }
}

// B panels of at most this many rows are copied into a contiguous buffer (32 KB on the stack)
// when B's rows share the L1 cache's sets (common/blas.h's rows_share_cache_sets).
constexpr int64_t kPackedRows = 256;

template <bool kTransA>
void product(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
             int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  // Panel by panel of columns, so that the panel of B (k x 32 values) is read from cache by every
  // block of rows; copied first where its rows would evict each other from L1 (every block of
  // rows reads it: the copy is one more read of it). Only for the transposed product, whose B is
  // an attention tile (rows as many apart as the block has keys): measured, packing made the
  // untransposed product slower where few panels share the cache (64 x 128 x 50, rows 1024 apart:
  // 99 -> 94 GF/s), and its callers lay their operands out with unaliased_ld instead.
  const bool pack = kTransA && m > kRows && k <= kPackedRows && rows_share_cache_sets(ldb);
  alignas(64) float panel[kPackedRows * kCols];
  for (int64_t j = 0; j < n; j += kCols) {
    const int64_t cols = std::min(kCols, n - j);
    const int64_t last = cols - (cols > 16 ? 16 : 0);  // columns in the last vector, 1 to 16
    const __mmask16 tail = static_cast<__mmask16>((1u << last) - 1u);
    const float* bj = b + j;
    int64_t ldbj = ldb;
    if (pack) {
      const __mmask16 mask0 = cols > 16 ? __mmask16(0xFFFF) : tail, mask1 = cols > 16 ? tail : 0;
      for (int64_t p = 0; p < k; ++p) {
        const float* src = b + p * ldb + j;
        _mm512_store_ps(panel + p * kCols, _mm512_maskz_loadu_ps(mask0, src));
        _mm512_store_ps(panel + p * kCols + 16, _mm512_maskz_loadu_ps(mask1, src + 16));
      }
      bj = panel;
      ldbj = kCols;
    }
    for (int64_t i = 0; i < m; i += kRows) {
      const int rows = static_cast<int>(std::min<int64_t>(kRows, m - i));
      const float* ai = kTransA ? a + i : a + i * lda;
      float* ci = c + i * ldc + j;
      if (cols > 16) {
        rows_block<2, kTransA>(rows, k, ai, lda, bj, ldbj, ci, ldc, tail, accumulate);
      } else {
        rows_block<1, kTransA>(rows, k, ai, lda, bj, ldbj, ci, ldc, tail, accumulate);
      }
    }
  }
}

}  // namespace

void small_gemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  product<false>(m, n, k, a, lda, b, ldb, c, ldc, accumulate);
}

void small_gemm_tn(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                   int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  product<true>(m, n, k, a, lda, b, ldb, c, ldc, accumulate);
}

}  // namespace recops
RECOPS_TARGET_END
#else
namespace recops {
void small_gemm(int64_t, int64_t, int64_t, const float*, int64_t, const float*, int64_t, float*,
                int64_t, bool) {}
void small_gemm_tn(int64_t, int64_t, int64_t, const float*, int64_t, const float*, int64_t, float*,
                   int64_t, bool) {}
}  // namespace recops
#endif
