// The C++ tests' matrix products (csrc/recops/common/blas.h): plain loops with the extension's
// semantics (row-major operands with leading dimensions, the accumulate flag, k == 0, bf16 B in
// VNNI layout, the granule precondition of gemm_bf16), accumulating in the output type (fp32 for
// bf16). The sums are formed in k order, so results may differ from oneDNN's in the last bits.
#include <cstdio>
#include <cstdlib>

#include "recops/common/blas.h"

namespace recops {
namespace {

// A's value (i, p) at a[i * lda + p], or a[p * lda + i] when a_transposed (gemm_tn).
template <typename T>
void reference_gemm(int64_t m, int64_t n, int64_t k, const T* a, int64_t lda, bool a_transposed,
                    const T* b, int64_t ldb, T* c, int64_t ldc, bool accumulate) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      T sum = accumulate ? c[i * ldc + j] : T(0);
      for (int64_t p = 0; p < k; ++p) {
        sum += (a_transposed ? a[p * lda + i] : a[i * lda + p]) * b[p * ldb + j];
      }
      c[i * ldc + j] = sum;
    }
  }
}

}  // namespace

SingleThreadedBlas::SingleThreadedBlas() : previous_(1) {}

SingleThreadedBlas::~SingleThreadedBlas() = default;

void gemm_nn(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
             int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  reference_gemm(m, n, k, a, lda, false, b, ldb, c, ldc, accumulate);
}

void gemm_nn(int64_t m, int64_t n, int64_t k, const double* a, int64_t lda, const double* b,
             int64_t ldb, double* c, int64_t ldc, bool accumulate) {
  reference_gemm(m, n, k, a, lda, false, b, ldb, c, ldc, accumulate);
}

void gemm_tn(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
             int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  reference_gemm(m, n, k, a, lda, true, b, ldb, c, ldc, accumulate);
}

void gemm_tn(int64_t m, int64_t n, int64_t k, const double* a, int64_t lda, const double* b,
             int64_t ldb, double* c, int64_t ldc, bool accumulate) {
  reference_gemm(m, n, k, a, lda, true, b, ldb, c, ldc, accumulate);
}

void gemm_nn_any_shape(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                       int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  gemm_nn(m, n, k, a, lda, b, ldb, c, ldc, accumulate);
}

void gemm_nn_any_shape(int64_t m, int64_t n, int64_t k, const double* a, int64_t lda,
                       const double* b, int64_t ldb, double* c, int64_t ldc, bool accumulate) {
  gemm_nn(m, n, k, a, lda, b, ldb, c, ldc, accumulate);
}

bool gemm_bf16_available() {
  return true;
}

void gemm_bf16(int64_t m, int64_t n, int64_t k, const Bf16* a, int64_t lda, const Bf16* b_vnni,
               int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  if ((m | n | k | lda | ldb | ldc) % kBrgemmGranule != 0) {
    std::fprintf(stderr, "gemm_bf16: sizes and leading dimensions must be multiples of %lld\n",
                 static_cast<long long>(kBrgemmGranule));
    std::abort();
  }
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      float sum = accumulate ? c[i * ldc + j] : 0.0f;
      for (int64_t p = 0; p < k; ++p) {
        sum += static_cast<float>(a[i * lda + p]) *
               static_cast<float>(b_vnni[((p / 2) * ldb + j) * 2 + p % 2]);
      }
      c[i * ldc + j] = sum;
    }
  }
}

void gemm_bf16_release() {}

}  // namespace recops
