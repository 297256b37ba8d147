// The output of an HSTU / FuXi-alpha layer, fused (layer_kernels.h's OutputProblem):
//   out = x + dropout(u * norm(attn)) W^T + b
// with the dropout drawn from a DropoutKey.
//
// The forward runs per block of kRowBlock rows: one element-wise pass (the row's statistics,
// normalise, gate, drop) into a block of the gated values, one product of that block with W^T,
// and the residual. Neither the normalised nor the gated tensor is stored: the backward
// recomputes both from attn and u, and regenerates the mask. Float64 computes in double, every
// other dtype in fp32 (accumulate_t), the norm included (row_blocks.h). The blocks' operands are
// padded to granules (row_blocks.h).
#pragma once

#include "recops/layer/kernels/row_blocks.h"

namespace recops::layer::kernels::RECOPS_ISA_NS {

// gated[j] = u[j] * y[j] * factor(j) of one row.
template <typename T, typename C>
void gate_row(const T* u, const T* a, int64_t n, const RowNorm<C>& norm, const RowDropout<C>& drop,
              C* gated) {
  for (int64_t j = 0; j < n; ++j) {
    gated[j] = static_cast<C>(u[j]) * norm(a[j]) * drop.factor(j);
  }
}

// out [rows, dim] (leading dimension ld_out).
template <typename T>
void layer_output_forward(const OutputProblem<T>& p, T* out, int64_t ld_out) {
  using C = accumulate_t<T>;
  const int64_t ld_gated = granules(p.width), ld_projected = granules(p.dim);
  const std::vector<C> weight_t = padded_operand<C>(p.weight, p.dim, p.width, p.width, true);
  const int64_t blocks = (p.rows + kRowBlock - 1) / kRowBlock;
  parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    SingleThreadedBlas blas;
    std::vector<C> gated(static_cast<size_t>(block_rows(p.rows) * ld_gated), C(0));
    std::vector<C> projected(static_cast<size_t>(block_rows(p.rows) * ld_projected));
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t r0 = b * kRowBlock, n = std::min(kRowBlock, p.rows - r0);
      for (int64_t i = 0; i < n; ++i) {
        const int64_t r = r0 + i;
        const T* a = p.attn + r * p.ld_attn;
        gate_row(p.u + r * p.ld_u, a, p.width, row_norm(a, p.width, p.norm, p.eps),
                 p.dropout.template row<C>(r), gated.data() + i * ld_gated);
      }
      // Rows past n hold an earlier block's values (finite); their products are not read.
      gemm_nn_any_shape(granules(n), ld_projected, p.width, gated.data(), ld_gated, weight_t.data(),
                        ld_projected, projected.data(), ld_projected, false);
      for (int64_t i = 0; i < n; ++i) {
        const T* x = p.x + (r0 + i) * p.ld_x;
        const C* y = projected.data() + i * ld_projected;
        T* o = out + (r0 + i) * ld_out;
        if (p.bias != nullptr) {
          for (int64_t d = 0; d < p.dim; ++d) {
            o[d] = T(y[d] + static_cast<C>(p.bias[d]) + static_cast<C>(x[d]));
          }
        } else {
          for (int64_t d = 0; d < p.dim; ++d) o[d] = T(y[d] + static_cast<C>(x[d]));
        }
      }
    }
  });
}

// One row of the backward, from dgated = d(loss) / d(dropped gated values): writes grad_u and
// grad_attn and leaves the dropped gated values (for grad_weight) in gated.
//   dg = dgated * f, du = dg * y, dy = dg * u, then the norm's backward of dy.
template <typename T, typename C>
void backward_row(const T* u, const T* a, int64_t n, const RowNorm<C>& norm, Norm kind,
                  const RowDropout<C>& drop, C* dgated, C* gated, T* du, T* da) {
  for (int64_t j = 0; j < n; ++j) {
    const C y = norm(a[j]);
    const C f = drop.factor(j), uj = static_cast<C>(u[j]), dg = dgated[j] * f;
    du[j] = T(dg * y);
    gated[j] = uj * y * f;
    dgated[j] = dg * uj;
  }
  norm_backward_row(a, n, norm, kind, dgated, da);
}

// The gradients of u, attn, weight and bias given grad_output [rows, dim] (ld_grad); x's is
// grad_output itself. Rows are cut into fixed_chunks chunks (the same for any thread count); each
// sums its weight and bias gradients into partials, added in chunk order at the end.
template <typename T>
void layer_output_backward(const OutputProblem<T>& p, const T* grad_output, int64_t ld_grad,
                           const OutputGrads<T>& grads) {
  using C = accumulate_t<T>;
  const int64_t width = p.width, dim = p.dim;
  const int64_t ld_gated = granules(width), ld_go = granules(dim);
  // dgated = grad_output W
  const PaddedRows<C, T> weight(p.weight, dim, width);
  const int64_t blocks = (p.rows + kRowBlock - 1) / kRowBlock;
  const int64_t chunks = fixed_chunks(blocks);
  ParameterGradPartials<C> partials(chunks, dim, width, dim);
  for_each_chunk(blocks, chunks, [&](int64_t chunk, int64_t b0, int64_t b1) {
    SingleThreadedBlas blas;
    C* grad_weight = partials.weight(chunk);
    C* grad_bias = partials.bias(chunk);
    // Zero past the rows and columns read: the products' padding.
    std::vector<C> go(static_cast<size_t>(kRowBlock * ld_go), C(0));
    std::vector<C> go_t(static_cast<size_t>(ld_go * kRowBlock));
    std::vector<C> dgated(static_cast<size_t>(kRowBlock * ld_gated));
    std::vector<C> gated(dgated.size(), C(0));
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t r0 = b * kRowBlock, n = std::min(kRowBlock, p.rows - r0), m = granules(n);
      for (int64_t i = 0; i < n; ++i) {
        const T* g = grad_output + (r0 + i) * ld_grad;
        C* row = go.data() + i * ld_go;
        for (int64_t d = 0; d < dim; ++d) {
          row[d] = static_cast<C>(g[d]);
          grad_bias[d] += row[d];
        }
      }
      std::fill(go.begin() + n * ld_go, go.begin() + m * ld_go, C(0));
      gemm_nn_any_shape(m, ld_gated, dim, go.data(), ld_go, weight.data(), ld_gated, dgated.data(),
                        ld_gated, false);
      for (int64_t i = 0; i < n; ++i) {
        const int64_t r = r0 + i;
        const T* a = p.attn + r * p.ld_attn;
        backward_row(p.u + r * p.ld_u, a, width, row_norm(a, width, p.norm, p.eps), p.norm,
                     p.dropout.template row<C>(r), dgated.data() + i * ld_gated,
                     gated.data() + i * ld_gated, grads.u + r * width, grads.attn + r * width);
      }
      // grad_weight += grad_output^T gated over the block's rows (go_t's columns past n are zero).
      transpose_tile(go.data(), m, ld_go, ld_go, go_t.data(), kRowBlock);
      gemm_nn_any_shape(dim, ld_gated, m, go_t.data(), kRowBlock, gated.data(), ld_gated,
                        grad_weight, partials.ld(), true);
    }
  });
  partials.write(grads.weight, grads.bias);
}

}  // namespace recops::layer::kernels::RECOPS_ISA_NS
