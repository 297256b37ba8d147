// Row-major float / double GEMM on the BLAS that PyTorch ships (MKL or OpenBLAS export the
// Fortran `sgemm_` symbol from libtorch_cpu). Called from inside at::parallel_for tasks, where
// the BLAS runs single-threaded.
#pragma once

#include <cstdint>
#include <type_traits>

extern "C" void sgemm_(const char* transa, const char* transb, const int* m, const int* n,
                       const int* k, const float* alpha, const float* a, const int* lda,
                       const float* b, const int* ldb, const float* beta, float* c, const int* ldc);
extern "C" void dgemm_(const char* transa, const char* transb, const int* m, const int* n,
                       const int* k, const double* alpha, const double* a, const int* lda,
                       const double* b, const int* ldb, const double* beta, double* c,
                       const int* ldc);

// MKL's per-thread thread count, when the BLAS is MKL (weak: absent from other BLAS builds).
extern "C" int MKL_Set_Num_Threads_Local(int) __attribute__((weak));

namespace recops {

// Keeps the BLAS single-threaded on this thread while alive: recops calls it from inside its own
// parallel regions, where BLAS threads would only oversubscribe the cores.
class SingleThreadedBlas {
 public:
  SingleThreadedBlas()
      : previous_(MKL_Set_Num_Threads_Local != nullptr ? MKL_Set_Num_Threads_Local(1) : 0) {}
  ~SingleThreadedBlas() {
    if (MKL_Set_Num_Threads_Local != nullptr) MKL_Set_Num_Threads_Local(previous_);
  }
  SingleThreadedBlas(const SingleThreadedBlas&) = delete;
  SingleThreadedBlas& operator=(const SingleThreadedBlas&) = delete;

 private:
  int previous_;
};

// C[m, n] = alpha * op(A)[m, k] * op(B)[k, n] + beta * C, all row-major with leading dimensions
// lda / ldb / ldc; op(X) = X^T when trans_x.
template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
          int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "gemm: float or double");
  if (m == 0 || n == 0) return;
  // Row-major C = A B is column-major C^T = B^T A^T: swap the operands, keep each one's flag.
  const char ta = trans_b ? 'T' : 'N';
  const char tb = trans_a ? 'T' : 'N';
  const int im = static_cast<int>(n), in = static_cast<int>(m), ik = static_cast<int>(k);
  const int ilda = static_cast<int>(ldb), ildb = static_cast<int>(lda),
            ildc = static_cast<int>(ldc);
  if (k == 0) {
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t col = 0; col < n; ++col)
        c[r * ldc + col] = beta == T(0) ? T(0) : beta * c[r * ldc + col];
    }
    return;
  }
  if constexpr (std::is_same_v<T, float>) {
    sgemm_(&ta, &tb, &im, &in, &ik, &alpha, b, &ilda, a, &ildb, &beta, c, &ildc);
  } else {
    dgemm_(&ta, &tb, &im, &in, &ik, &alpha, b, &ilda, a, &ildb, &beta, c, &ildc);
  }
}

}  // namespace recops
