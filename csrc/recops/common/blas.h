// The matrix products kernels use, torch-free. The backend is linked in once per binary:
// blas_aten.cpp in the extension (oneDNN's batch-reduce GEMM micro-kernel as PyTorch exports it,
// and the BLAS PyTorch ships) and tests/cpp's plain loops (C++ tests). Products are called from
// inside parallel tasks, where the BLAS runs single-threaded (SingleThreadedBlas).
//
// Layouts: row-major, with leading dimensions (elements between consecutive rows). gemm_bf16's B
// is in VNNI layout: a [K, N] matrix stored as [K / 2, N, 2], the two values of each pair of rows
// side by side (element (k, n) at ((k / 2) * ldb + n) * 2 + k % 2).
#pragma once

#include <algorithm>
#include <cstdint>

#include "recops/common/half_bits.h"

namespace recops {

// Keeps the BLAS single-threaded on this thread while alive: recops calls it from inside its own
// parallel regions, where BLAS threads would only oversubscribe the cores.
class SingleThreadedBlas {
 public:
  SingleThreadedBlas();
  ~SingleThreadedBlas();
  SingleThreadedBlas(const SingleThreadedBlas&) = delete;
  SingleThreadedBlas& operator=(const SingleThreadedBlas&) = delete;

 private:
  int previous_;  // the thread's BLAS thread count before, restored on destruction
};

// Dimensions and leading dimensions of the products that go to the brgemm micro-kernel are
// multiples of this (see gemm_nn).
constexpr int64_t kBrgemmGranule = 16;

// n rounded up to whole brgemm granules. Operands a kernel lays out itself (the fused layer and
// loss kernels' blocks) are padded with zeros to these sizes, so that every product takes the
// brgemm micro-kernel (the models' widths, 50 or 200, are not multiples of the granule; the BLAS's
// small products ran at a fraction of its speed) and the padding adds nothing to the parts that
// are read. The products whose depth (k) or output rows (m) is a width take its true size
// (gemm_nn_any_shape): the padding's zeros would be multiplied for nothing, 14 of every 64
// multiply-adds at a width of 50.
constexpr int64_t granules(int64_t n) {
  return (n + kBrgemmGranule - 1) / kBrgemmGranule * kBrgemmGranule;
}

// Whether rows `ld` floats apart share the L1 cache's sets: the cache (32 KB, 8 ways, 64 sets of
// 64-byte lines on the CPUs these kernels run on) maps addresses 4 KB apart to one set, so rows
// 1 KB apart, or a multiple of it, meet in at most four sets per line. A product's panel of B (k
// rows of 32 values, read by every block of rows of C) then cannot stay in L1 and is read from L2
// again for every block: a 64 x 1024 x 50 product ran at 84 GF/s with B's rows 1024 apart, 100
// with 1040 (one core of an AMD EPYC, Zen 4).
constexpr bool rows_share_cache_sets(int64_t ld) {
  return ld * int64_t{sizeof(float)} % 1024 == 0;
}

// A leading dimension of at least `ld` for operands laid out to be multiplied: `ld` itself unless
// its rows would share the cache's sets, then one granule (64 bytes) more, so that consecutive
// rows start one set apart. A multiple of kBrgemmGranule stays one.
constexpr int64_t unaliased_ld(int64_t ld) {
  return rows_share_cache_sets(ld) ? ld + kBrgemmGranule : ld;
}

// C[m, n] = A[m, k] B[k, n] (+ C when accumulate). k == 0 sets C to zero (leaves it when
// accumulating). In the extension, float goes through oneDNN's brgemm micro-kernel (code
// generated for the running CPU: AVX-512 where present; PyTorch falls back to sgemm where oneDNN
// has no kernel). On AMD Zen 5, MKL's sgemm takes its AVX2 path and reaches about 100 GFLOP/s a
// core at attention tile sizes; brgemm reaches 230-260. The micro-kernel has no transposes and no
// alpha: callers lay out transposed (and pre-scaled) operands themselves. oneDNN generates
// (about 60 us) and keeps (about 24 KB) one kernel per shape, leading dimensions included, and
// thread; only products whose sizes and leading dimensions are all multiples of kBrgemmGranule
// take it, which bounds that set by the lengths a model sees divided by the granule. The rest
// (ragged tails, head dims like 50) go to kernels/small_gemm.h's register-blocked AVX-512 kernel
// when k is at most kSmallGemmMaxK (at tile sizes MKL's sgemm spends as long packing as
// multiplying), else, and double, to the BLAS.
void gemm_nn(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
             int64_t ldb, float* c, int64_t ldc, bool accumulate);
void gemm_nn(int64_t m, int64_t n, int64_t k, const double* a, int64_t lda, const double* b,
             int64_t ldb, double* c, int64_t ldc, bool accumulate);

// C[m, n] = A^T B (+ C when accumulate) for A stored [k, m] (lda), B [k, n]: a product with a
// transposed left operand, without its transposed copy (dK^T += Q^T dS in the attention's
// backward, from Q's rows as they lie). Float takes kernels/small_gemm.h's kernel (small_gemm_tn)
// where gemm_nn would take it, else the BLAS; double, the BLAS.
void gemm_tn(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
             int64_t ldb, float* c, int64_t ldc, bool accumulate);
void gemm_tn(int64_t m, int64_t n, int64_t k, const double* a, int64_t lda, const double* b,
             int64_t ldb, double* c, int64_t ldc, bool accumulate);

// gemm_nn for callers whose products come in a few shapes fixed by a model (the fused layer
// kernels: a layer's widths and a block of at most 64 rows): a float product whose leading
// dimensions are whole granules takes the brgemm micro-kernel whatever m, n and k are, since the
// kernels it generates are bounded by those shapes, not by the data's lengths. A layer's width of
// 50 then multiplies 50 deep instead of 64 (14 of every 64 multiply-adds were zeros). Otherwise,
// and for double, gemm_nn.
void gemm_nn_any_shape(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                       int64_t ldb, float* c, int64_t ldc, bool accumulate);
void gemm_nn_any_shape(int64_t m, int64_t n, int64_t k, const double* a, int64_t lda,
                       const double* b, int64_t ldb, double* c, int64_t ldc, bool accumulate);

// Whether gemm_bf16 may be called. In the extension: the CPU has AVX512_BF16 dot products and
// oneDNN is enabled (torch.backends.mkldnn; PyTorch's kernel needs both); the C++ tests' loops
// always run.
bool gemm_bf16_available();

// C[m, n] (+)= A[m, k] B[k, n] accumulated in fp32: A bf16 row-major (lda), B bf16 in VNNI layout
// (ldb), C fp32 (ldc). Every dimension and leading dimension is a multiple of kBrgemmGranule.
void gemm_bf16(int64_t m, int64_t n, int64_t k, const Bf16* a, int64_t lda, const Bf16* b_vnni,
               int64_t ldb, float* c, int64_t ldc, bool accumulate);

// Releases what gemm_bf16 set up on this thread (oneDNN's tile configuration); a thread calls it
// once it is done with a series of bf16 products.
void gemm_bf16_release();

// dst[c * ld_dst + r] = scale * src[r * ld_src + c] for r < rows, c < cols (an operand laid out
// once per block or item; the kernels' transposed adds of gradients go through
// TileOps::transpose_scaled's register blocks). Square blocks keep both the reads and the writes
// within a few cache lines at a time.
template <typename T>
void transpose(int64_t rows, int64_t cols, const T* src, int64_t ld_src, T* dst, int64_t ld_dst,
               T scale = T(1)) {
  constexpr int64_t kBlock = 16;
  for (int64_t r0 = 0; r0 < rows; r0 += kBlock) {
    const int64_t r1 = std::min(rows, r0 + kBlock);
    for (int64_t c0 = 0; c0 < cols; c0 += kBlock) {
      const int64_t c1 = std::min(cols, c0 + kBlock);
      for (int64_t c = c0; c < c1; ++c) {
        T* out = dst + c * ld_dst;
        for (int64_t r = r0; r < r1; ++r) {
          out[r] = scale * src[r * ld_src + c];
        }
      }
    }
  }
}

}  // namespace recops
