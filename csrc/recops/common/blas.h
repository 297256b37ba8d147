// Row-major float / double tile products (gemm_nn) on oneDNN's batch-reduce GEMM micro-kernel
// that PyTorch exports, or on the BLAS that PyTorch ships (MKL or OpenBLAS export the Fortran
// `sgemm_` symbol from libtorch_cpu). Called from inside at::parallel_for tasks, where the BLAS
// runs single-threaded.
#pragma once

#include <ATen/native/CPUBlas.h>

#include <algorithm>
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

// C[m, n] = A[m, k] B[k, n] (+ C when accumulate) on the Fortran BLAS, row-major with leading
// dimensions lda / ldb / ldc.
template <typename T>
void blas_gemm_nn(int64_t m, int64_t n, int64_t k, const T* a, int64_t lda, const T* b, int64_t ldb,
                  T* c, int64_t ldc, bool accumulate) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "gemm: float or double");
  if (m == 0 || n == 0) return;
  if (k == 0) {
    if (accumulate) return;
    for (int64_t r = 0; r < m; ++r) std::fill(c + r * ldc, c + r * ldc + n, T(0));
    return;
  }
  // Row-major C = A B is column-major C^T = B^T A^T: pass the operands swapped.
  const char no_transpose = 'N';
  const int im = static_cast<int>(n), in = static_cast<int>(m), ik = static_cast<int>(k);
  const int ilda = static_cast<int>(ldb), ildb = static_cast<int>(lda),
            ildc = static_cast<int>(ldc);
  const T one = 1, beta = accumulate ? 1 : 0;
  if constexpr (std::is_same_v<T, float>) {
    sgemm_(&no_transpose, &no_transpose, &im, &in, &ik, &one, b, &ilda, a, &ildb, &beta, c, &ildc);
  } else {
    dgemm_(&no_transpose, &no_transpose, &im, &in, &ik, &one, b, &ilda, a, &ildb, &beta, c, &ildc);
  }
}

// Dimensions and leading dimensions of the products that go to the brgemm micro-kernel are
// multiples of this (see gemm_nn).
constexpr int64_t kBrgemmGranule = 16;

// C[m, n] = A[m, k] B[k, n] (+ C when accumulate), row-major with leading dimensions. float goes
// through oneDNN's brgemm micro-kernel (code generated for the running CPU: AVX-512 where present;
// PyTorch falls back to sgemm where oneDNN has no kernel). On AMD Zen 5, MKL's sgemm takes its AVX2
// path and reaches about 100 GFLOP/s a core at attention tile sizes; brgemm reaches 230-260. The
// micro-kernel has no transposes and no alpha: callers lay out transposed (and pre-scaled)
// operands themselves. oneDNN generates (about 60 us) and keeps (about 24 KB) one kernel per
// shape, leading dimensions included, and thread; only products whose sizes and leading
// dimensions are all multiples of kBrgemmGranule take it, which bounds that set by the lengths
// a model sees divided by the granule. The rest (ragged tails) go to sgemm.
template <typename T>
void gemm_nn(int64_t m, int64_t n, int64_t k, const T* a, int64_t lda, const T* b, int64_t ldb,
             T* c, int64_t ldc, bool accumulate) {
  if (m == 0 || n == 0) return;
  if constexpr (std::is_same_v<T, float>) {
    const bool regular = (m | n | k | lda | ldb | ldc) % kBrgemmGranule == 0;
    if (k > 0 && regular) {
      at::native::cpublas::brgemm(m, n, k, lda, ldb, ldc, accumulate, a, b, c);
      return;
    }
  }
  blas_gemm_nn(m, n, k, a, lda, b, ldb, c, ldc, accumulate);
}

// dst[c * ld_dst + r] = scale * src[r * ld_src + c] (+= when accumulate) for r < rows, c < cols.
// Square blocks keep both the reads and the writes within a few cache lines at a time.
template <typename T>
void transpose(int64_t rows, int64_t cols, const T* src, int64_t ld_src, T* dst, int64_t ld_dst,
               T scale = T(1), bool accumulate = false) {
  constexpr int64_t kBlock = 16;
  for (int64_t r0 = 0; r0 < rows; r0 += kBlock) {
    const int64_t r1 = std::min(rows, r0 + kBlock);
    for (int64_t c0 = 0; c0 < cols; c0 += kBlock) {
      const int64_t c1 = std::min(cols, c0 + kBlock);
      for (int64_t c = c0; c < c1; ++c) {
        T* out = dst + c * ld_dst;
        for (int64_t r = r0; r < r1; ++r) {
          const T x = scale * src[r * ld_src + c];
          out[r] = accumulate ? out[r] + x : x;
        }
      }
    }
  }
}

}  // namespace recops
