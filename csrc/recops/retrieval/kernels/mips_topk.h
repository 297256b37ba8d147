// Torch-free interface of the retrieval family's kernel (docs/ops.md section 10): the top-k
// candidates by inner product with each query over the whole candidate table (brute-force
// maximum inner product search), some candidates excluded per query, without the [M, N] scores.
#pragma once

#include <cstdint>

#include "recops/common/cpu_isa.h"

namespace recops::retrieval::kernels {

// For each query row m of queries [M, d]: the k candidate rows of candidates [N, d] with the
// largest scores q_m . c_j, best first, where candidate j scores -inf for row m when it is one of
// excluded[excluded_offsets[m], excluded_offsets[m + 1]) (excluded_offsets null: none is). The
// order is total: NaN before every number, larger before smaller, and among equal scores (NaN
// with NaN) the lower index first. Matrices are row-major with unit column stride; indices in
// [0, N), offsets non-decreasing (the adapter checks both); 0 <= k <= N.
template <typename T>
struct MipsTopkProblem {
  int64_t queries;     // M
  int64_t candidates;  // N
  int64_t dim;         // d
  int64_t k;
  const T* query_rows;
  int64_t ld_queries;
  const T* candidate_rows;
  int64_t ld_candidates;
  const int64_t* excluded_offsets;  // [M + 1], or null
  const int64_t* excluded;
};

// Writes values [M, k] and indices [M, k] (contiguous). float and double; products on the
// attention tiles' instruction-set variant `isa` (float64 on the baseline).
template <typename T>
void mips_topk(const MipsTopkProblem<T>& p, T* values, int64_t* indices, CpuIsa isa = cpu_isa());

}  // namespace recops::retrieval::kernels
