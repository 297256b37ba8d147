// A sequence model's input features, fused (layer_kernels.h's PositionalFeatures): the item
// embeddings scaled, the position embedding of each row added and the dropout applied in one pass;
// the backward regenerates the mask and sums the position table's gradient per chunk of rows.
#pragma once

#include "recops/layer/kernels/row_blocks.h"

namespace recops::layer::kernels::RECOPS_ISA_NS {

// out [rows, cols] (contiguous), computed in accumulate_t<T>.
template <typename T>
void features_forward(const PositionalFeatures<T>& p, T* out) {
  using C = accumulate_t<T>;
  const C scale = static_cast<C>(p.scale);
  const int64_t grain = grain_for_bytes(3 * p.cols * static_cast<int64_t>(sizeof(T)));
  parallel_for(0, p.rows, grain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const RowDropout<C> drop = p.dropout.template row<C>(r);
      const T* x = p.x + r * p.ld_x;
      const T* position = p.table + p.positions[r] * p.cols;
      T* o = out + r * p.cols;
      for (int64_t j = 0; j < p.cols; ++j) {
        o[j] = T(drop.factor(j) * (scale * static_cast<C>(x[j]) + static_cast<C>(position[j])));
      }
    }
  });
}

// The table's gradient is summed over rows in fixed_chunks chunks added in chunk order (the same
// bits for any thread count); a table past this many values takes one chunk, so that the
// partials never hold more than a few copies of a small table.
constexpr int64_t kChunkedTableValues = int64_t{1} << 20;

// grad_x [rows, cols] and grad_table [table_rows, cols] (contiguous) from grad_output (row
// stride ld_grad).
template <typename T>
void features_backward(const PositionalFeatures<T>& p, const T* grad_output, int64_t ld_grad,
                       T* grad_x, T* grad_table) {
  using C = accumulate_t<T>;
  const C scale = static_cast<C>(p.scale);
  const int64_t chunks =
      p.table_rows * p.cols <= kChunkedTableValues ? fixed_chunks(p.rows) : int64_t{1};
  ParameterGradPartials<C> partials(std::max<int64_t>(chunks, 1), p.table_rows, p.cols, 0);
  for_each_chunk(p.rows, chunks, [&](int64_t chunk, int64_t r0, int64_t r1) {
    C* table = partials.weight(chunk);
    for (int64_t r = r0; r < r1; ++r) {
      const RowDropout<C> drop = p.dropout.template row<C>(r);
      const T* g = grad_output + r * ld_grad;
      C* position = table + p.positions[r] * partials.ld();
      T* dx = grad_x + r * p.cols;
      for (int64_t j = 0; j < p.cols; ++j) {
        const C d = drop.factor(j) * static_cast<C>(g[j]);
        dx[j] = T(scale * d);
        position[j] += d;
      }
    }
  });
  partials.write(grad_table, static_cast<T*>(nullptr));
}

}  // namespace recops::layer::kernels::RECOPS_ISA_NS
