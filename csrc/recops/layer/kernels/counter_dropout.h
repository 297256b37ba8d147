// counter_dropout's kernel: x times its DropoutKey's mask (layer_kernels.h), nothing stored.
#pragma once

#include "recops/layer/kernels/layer_kernels.h"

namespace recops::layer::kernels::RECOPS_ISA_NS {

// out[r, j] = x[r, j] * factor(r, j) for rows x cols values, x and out row-major with leading
// dimensions ld_x and ld_out, computed in accumulate_t<T>.
template <typename T>
void counter_dropout(const T* x, int64_t ld_x, T* out, int64_t ld_out, int64_t rows, int64_t cols,
                     const DropoutKey& key) {
  using C = accumulate_t<T>;
  const int64_t grain = grain_for_bytes(2 * cols * static_cast<int64_t>(sizeof(T)));
  parallel_for(0, rows, grain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const RowDropout<C> drop = key.row<C>(r);
      const T* in = x + r * ld_x;
      T* o = out + r * ld_out;
      for (int64_t j = 0; j < cols; ++j) o[j] = T(static_cast<C>(in[j]) * drop.factor(j));
    }
  });
}

}  // namespace recops::layer::kernels::RECOPS_ISA_NS
