// Torch-free interface of the loss family's kernels (docs/ops.md section 9): the sampled softmax
// loss over shared negatives as a plain struct of pointers and sizes, and one table of entry
// points per instruction-set variant (variant_<isa>.cpp compile sampled_softmax.h through
// kernels/variant.h; loss_kernels<T>() picks one).
//
// This header also includes every external header the variants use (common/cpu_isa.h).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "recops/common/blas.h"
#include "recops/common/cpu_isa.h"
#include "recops/common/half_bits.h"
#include "recops/common/kinds.h"
#include "recops/common/parallel.h"
#include "recops/common/vec_math.h"

namespace recops::loss::kernels {

// The logit of a sampled negative that is the query's positive (generative-recommenders' value):
// it drops out of the softmax and passes no gradient.
constexpr double kNotANegative = -5e4;

// Mean over the rows, weighted by weights[i], of
//   -log softmax([q_i . p^_i, q_i . n^_1, ..., q_i . n^_R] / temperature)[0]
// with p^ and n^ the L2-normalised positives and negatives (x / max(|x|, eps)), the negatives
// shared by every row; n_j's logit is kNotANegative where negative_ids[j] == positive_ids[i].
// Matrices are row-major with unit column stride and leading dimensions ld_*.
template <typename T>
struct SampledSoftmaxProblem {
  int64_t rows;       // M
  int64_t dim;        // d
  int64_t negatives;  // R
  const T* queries;
  int64_t ld_queries;
  const T* positives;
  int64_t ld_positives;
  const int64_t* positive_ids;  // [M]
  const T* negative_rows;       // [R, d]
  int64_t ld_negatives;
  const int64_t* negative_ids;  // [R]
  const double* weights;        // [M]
  double temperature;
  double eps;
};

// The forward's sums: the loss is weighted_loss / weight.
struct LossSums {
  double weighted_loss, weight;
};

// The gradients of weighted_loss / weight (a grad_output of 1), contiguous: queries [M, d],
// positives [M, d], negatives [R, d].
template <typename T>
struct SampledSoftmaxGrads {
  T* queries;
  T* positives;
  T* negatives;
};

template <typename T>
struct LossKernels {
  // The loss's sums, and its gradients into *grads unless grads is null.
  LossSums (*loss)(const SampledSoftmaxProblem<T>& p, const SampledSoftmaxGrads<T>* grads);
};

// One variant's tables; float64 has the baseline's only (it serves validation, not speed).
RECOPS_DECLARE_VARIANT_TABLE(FloatTables<LossKernels>, kLossKernels)
namespace baseline {
extern const LossKernels<double> kDoubleLossKernels;
}

// The entry points for T on instruction set `isa` (by default the CPU's, capped by
// RECOPS_CPU_ISA).
template <typename T>
const LossKernels<T>& loss_kernels(CpuIsa isa = cpu_isa()) {
  if constexpr (std::is_same_v<T, double>) {
    return baseline::kDoubleLossKernels;
  } else {
    return RECOPS_VARIANT_TABLE(isa, kLossKernels).template of<T>();
  }
}

}  // namespace recops::loss::kernels
