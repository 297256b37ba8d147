// The extension's matrix products (common/blas.h): oneDNN's brgemm micro-kernel as PyTorch
// exports it (at::native::cpublas::brgemm), and the BLAS PyTorch ships (MKL or OpenBLAS export
// the Fortran `sgemm_` / `dgemm_` symbols from libtorch_cpu).
#include <ATen/Context.h>
#include <ATen/native/CPUBlas.h>

#include <algorithm>
#include <type_traits>

#include "recops/common/blas.h"
#include "recops/common/cpu_isa.h"
#include "recops/common/kernels/small_gemm.h"

extern "C" void sgemm_(const char* transa, const char* transb, const int* m, const int* n,
                       const int* k, const float* alpha, const float* a, const int* lda,
                       const float* b, const int* ldb, const float* beta, float* c, const int* ldc);
extern "C" void dgemm_(const char* transa, const char* transb, const int* m, const int* n,
                       const int* k, const double* alpha, const double* a, const int* lda,
                       const double* b, const int* ldb, const double* beta, double* c,
                       const int* ldc);

// MKL's per-thread thread count, when the BLAS is MKL (weak: absent from other BLAS builds).
extern "C" int MKL_Set_Num_Threads_Local(int) __attribute__((weak));

static_assert(sizeof(recops::Bf16) == sizeof(at::BFloat16) &&
                  alignof(recops::Bf16) == alignof(at::BFloat16),
              "Bf16 is passed to PyTorch as at::BFloat16: one uint16_t of bits each");

namespace recops {
namespace {

// C[m, n] = A[m, k] B[k, n] (+ C when accumulate) on the Fortran BLAS, row-major with leading
// dimensions lda / ldb / ldc; A^T B with A stored [k, m] when a_transposed.
template <typename T>
void blas_gemm(int64_t m, int64_t n, int64_t k, const T* a, int64_t lda, bool a_transposed,
               const T* b, int64_t ldb, T* c, int64_t ldc, bool accumulate) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    if (accumulate) return;
    for (int64_t r = 0; r < m; ++r) std::fill(c + r * ldc, c + r * ldc + n, T(0));
    return;
  }
  // Row-major C = op(A) B is column-major C^T = B^T op(A)^T: pass the operands swapped (a
  // row-major [k, m] array read column-major is A^T, so A itself is that array transposed).
  const char no_transpose = 'N', transpose = 'T';
  const char* op_a = a_transposed ? &transpose : &no_transpose;
  const int im = static_cast<int>(n), in = static_cast<int>(m), ik = static_cast<int>(k);
  const int ilda = static_cast<int>(ldb), ildb = static_cast<int>(lda),
            ildc = static_cast<int>(ldc);
  const T one = 1, beta = accumulate ? 1 : 0;
  if constexpr (std::is_same_v<T, float>) {
    sgemm_(&no_transpose, op_a, &im, &in, &ik, &one, b, &ilda, a, &ildb, &beta, c, &ildc);
  } else {
    dgemm_(&no_transpose, op_a, &im, &in, &ik, &one, b, &ilda, a, &ildb, &beta, c, &ildc);
  }
}

// A float product off the brgemm: kernels/small_gemm.h's kernel where it runs and k fits it, else
// the BLAS.
void small_gemm_or_blas(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                        bool a_transposed, const float* b, int64_t ldb, float* c, int64_t ldc,
                        bool accumulate) {
  if (k <= kSmallGemmMaxK && small_gemm_available()) {
    (a_transposed ? small_gemm_tn : small_gemm)(m, n, k, a, lda, b, ldb, c, ldc, accumulate);
    return;
  }
  blas_gemm(m, n, k, a, lda, a_transposed, b, ldb, c, ldc, accumulate);
}

}  // namespace

SingleThreadedBlas::SingleThreadedBlas()
    : previous_(MKL_Set_Num_Threads_Local != nullptr ? MKL_Set_Num_Threads_Local(1) : 0) {}

SingleThreadedBlas::~SingleThreadedBlas() {
  if (MKL_Set_Num_Threads_Local != nullptr) MKL_Set_Num_Threads_Local(previous_);
}

void gemm_nn(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
             int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  if (m == 0 || n == 0) return;
  const bool regular = (m | n | k | lda | ldb | ldc) % kBrgemmGranule == 0;
  if (k > 0 && regular) {
    at::native::cpublas::brgemm(m, n, k, lda, ldb, ldc, accumulate, a, b, c);
    return;
  }
  small_gemm_or_blas(m, n, k, a, lda, false, b, ldb, c, ldc, accumulate);
}

void gemm_nn(int64_t m, int64_t n, int64_t k, const double* a, int64_t lda, const double* b,
             int64_t ldb, double* c, int64_t ldc, bool accumulate) {
  blas_gemm(m, n, k, a, lda, false, b, ldb, c, ldc, accumulate);
}

void gemm_tn(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
             int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  if (m == 0 || n == 0) return;
  small_gemm_or_blas(m, n, k, a, lda, true, b, ldb, c, ldc, accumulate);
}

void gemm_tn(int64_t m, int64_t n, int64_t k, const double* a, int64_t lda, const double* b,
             int64_t ldb, double* c, int64_t ldc, bool accumulate) {
  blas_gemm(m, n, k, a, lda, true, b, ldb, c, ldc, accumulate);
}

void gemm_nn_any_shape(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                       int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  if (m > 0 && n > 0 && k > 0 && (lda | ldb | ldc) % kBrgemmGranule == 0) {
    at::native::cpublas::brgemm(m, n, k, lda, ldb, ldc, accumulate, a, b, c);
    return;
  }
  gemm_nn(m, n, k, a, lda, b, ldb, c, ldc, accumulate);
}

void gemm_nn_any_shape(int64_t m, int64_t n, int64_t k, const double* a, int64_t lda,
                       const double* b, int64_t ldb, double* c, int64_t ldc, bool accumulate) {
  gemm_nn(m, n, k, a, lda, b, ldb, c, ldc, accumulate);
}

bool gemm_bf16_available() {
  return cpu_has_avx512_bf16() && at::globalContext().userEnabledMkldnn();
}

void gemm_bf16(int64_t m, int64_t n, int64_t k, const Bf16* a, int64_t lda, const Bf16* b_vnni,
               int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  TORCH_INTERNAL_ASSERT((m | n | k | lda | ldb | ldc) % kBrgemmGranule == 0);
  at::native::cpublas::brgemm(m, n, k, lda, ldb, ldc, accumulate,
                              reinterpret_cast<const at::BFloat16*>(a),
                              reinterpret_cast<const at::BFloat16*>(b_vnni), c, /*is_vnni=*/true);
}

void gemm_bf16_release() {
  at::native::cpublas::brgemm_release();
}

}  // namespace recops
