// fp32 products of the small, ragged shapes the kernels' tiles have (a block of query rows times a
// sequence's keys, a head dim of 50), where the brgemm does not apply (common/blas.h: it takes
// whole granules only) and the BLAS spends more time packing its operands than multiplying them
// (MKL's sgemm runs a generic path on AMD CPUs). The operands are read where they lie: a block of
// kRows rows of C in registers, kCols columns at a time, one row of B and one value of each row
// of A per step of k. Torch-free; AVX-512 only (the CPUs the kernels run on have it), the caller
// falling back to its BLAS elsewhere (small_gemm_available).
#pragma once

#include <cstdint>

namespace recops {

// Whether small_gemm runs on this CPU (AVX-512; RECOPS_CPU_ISA does not cap it).
bool small_gemm_available();

// The largest k small_gemm is meant for: its B panel (k rows of 32 values) stays in the L2 cache.
constexpr int64_t kSmallGemmMaxK = 1024;

// C[m, n] = A[m, k] B[k, n] (+ C when accumulate), row-major with leading dimensions; any sizes.
// Call only where small_gemm_available().
void small_gemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                int64_t ldb, float* c, int64_t ldc, bool accumulate);

// small_gemm with A given transposed: C[m, n] = A^T B (+ C) for A stored [k, m] (lda). The kernel
// broadcasts one value of A per row of C and step of k, from anywhere, so reading A down its
// columns costs what reading it along its rows does: no transposed copy is made.
void small_gemm_tn(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                   int64_t ldb, float* c, int64_t ldc, bool accumulate);

}  // namespace recops
