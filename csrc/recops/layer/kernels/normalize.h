// A norm applied to rows on its own, without affine weights (layer_kernels.h's Norm):
// recops.l2_normalize's kernels, the models' unit-norm states. Statistics and the backward's sums
// in the accumulate type, as in the fused layer ops (row_blocks.h); rows split between threads.
#pragma once

#include "recops/layer/kernels/row_blocks.h"

namespace recops::layer::kernels::RECOPS_ISA_NS {

// out = norm(x) row by row: x [rows, cols] (row stride ld_x), out contiguous.
template <typename T>
void normalize_forward(const T* x, int64_t ld_x, int64_t rows, int64_t cols, Norm norm, double eps,
                       T* out) {
  const int64_t grain = grain_for_bytes(2 * cols * static_cast<int64_t>(sizeof(T)));
  parallel_for(0, rows, grain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* a = x + r * ld_x;
      const auto n = row_norm(a, cols, norm, eps);
      T* o = out + r * cols;
      for (int64_t j = 0; j < cols; ++j) o[j] = T(n(a[j]));
    }
  });
}

// grad_x (contiguous) from grad_output (row stride ld_grad), recomputing each row's statistics.
template <typename T>
void normalize_backward(const T* grad_output, int64_t ld_grad, const T* x, int64_t ld_x,
                        int64_t rows, int64_t cols, Norm norm, double eps, T* grad_x) {
  const int64_t grain = grain_for_bytes(3 * cols * static_cast<int64_t>(sizeof(T)));
  using C = accumulate_t<T>;
  parallel_for(0, rows, grain, [&](int64_t r0, int64_t r1) {
    std::vector<C> dy(static_cast<size_t>(cols));  // a row of grad_output in C
    for (int64_t r = r0; r < r1; ++r) {
      const T* a = x + r * ld_x;
      const T* g = grad_output + r * ld_grad;
      for (int64_t j = 0; j < cols; ++j) dy[j] = static_cast<C>(g[j]);
      norm_backward_row(a, cols, row_norm(a, cols, norm, eps), norm, dy.data(), grad_x + r * cols);
    }
  });
}

}  // namespace recops::layer::kernels::RECOPS_ISA_NS
