// The exact optimizers as policies: one step on one row given the row's summed gradient g (fp32).
// Weight decay is shared: L2 folds wd * w into g first; DECOUPLE scales w by keep = 1 - lr * wd in
// the step (keep = 1 otherwise, which leaves w exactly unscaled). Compiled per instruction set.
#pragma once

#ifndef RECOPS_ISA_NS
#error "compiled once per instruction set: include through recops/embedding/kernels/variant.h"
#endif

#include "recops/embedding/kernels/convert.h"

namespace recops::embedding::kernels::RECOPS_ISA_NS {

// w = keep * w - lr * g
struct ExactSgd {
  static constexpr int64_t state_size(int64_t /*D*/) { return 0; }
  static void step(float* __restrict w, float* /*state*/, const float* __restrict g, int64_t D,
                   const OptimizerParams& p, float keep) {
    for (int64_t d = 0; d < D; ++d) w[d] = keep * w[d] - p.learning_rate * g[d];
  }
};

// m += g^2; w = keep * w - lr * g / (sqrt(m) + eps), elementwise.
struct ExactAdagrad {
  static constexpr int64_t state_size(int64_t D) { return D; }
  static void step(float* __restrict w, float* __restrict m, const float* __restrict g, int64_t D,
                   const OptimizerParams& p, float keep) {
    for (int64_t d = 0; d < D; ++d) {
      const float sum = m[d] + g[d] * g[d];
      m[d] = sum;
      w[d] = keep * w[d] - p.learning_rate * g[d] / (std::sqrt(sum) + p.eps);
    }
  }
};

// m += mean_d(g^2); w = keep * w - lr / (sqrt(m) + eps) * g, one m per row.
struct ExactRowwiseAdagrad {
  static constexpr int64_t state_size(int64_t /*D*/) { return 1; }
  static void step(float* __restrict w, float* __restrict m, const float* __restrict g, int64_t D,
                   const OptimizerParams& p, float keep) {
    float square_sum = 0;
#pragma omp simd reduction(+ : square_sum)
    for (int64_t d = 0; d < D; ++d) square_sum += g[d] * g[d];
    const float sum = m[0] + square_sum / static_cast<float>(D);
    m[0] = sum;
    const float multiplier = p.learning_rate / (std::sqrt(sum) + p.eps);
    for (int64_t d = 0; d < D; ++d) w[d] = keep * w[d] - multiplier * g[d];
  }
};

// Applies Opt to one stored row, computing in fp32 and rounding once on the store. `g` is
// clobbered (L2 decay); `scratch` holds D floats for rows stored in fp16 / bf16.
template <typename Opt, typename weight_t>
void update_row(weight_t* row, float* state, float* g, int64_t D, const OptimizerParams& p,
                float* scratch) {
  float* w;
  if constexpr (std::is_same_v<weight_t, float>) {
    w = row;
  } else {
    to_float(row, scratch, D);
    w = scratch;
  }
  if (p.weight_decay_mode == WeightDecay::kL2) {
    for (int64_t d = 0; d < D; ++d) g[d] += p.weight_decay * w[d];
  }
  const float keep = p.weight_decay_mode == WeightDecay::kDecouple
                         ? 1.0f - p.learning_rate * p.weight_decay
                         : 1.0f;
  Opt::step(w, state, g, D, p, keep);
  if constexpr (!std::is_same_v<weight_t, float>) from_float(w, row, D);
}

}  // namespace recops::embedding::kernels::RECOPS_ISA_NS
