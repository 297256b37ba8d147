// FuXi-alpha's feed-forward stage (MFFN stage 2), fused (layer_kernels.h's FfnProblem):
//   h = dropout(norm(x)),  out = x + (silu(h W_gate^T) * (h W_up^T)) W_down^T
// Per block of kRowBlock rows: the normalised, dropped rows, one product with W_gate^T and W_up^T
// side by side, the SwiGLU gate, one product with W_down^T, the residual. Nothing is stored: the
// backward recomputes the block (its mask regenerated) and runs dg = dy W_down,
// dW_down += dy^T g, the gate's backward into dz, dh = dz [W_gate; W_up], [dW_gate; dW_up] +=
// dz^T h, then the dropout's and the norm's backwards. The block products' operands are padded
// to granules (row_blocks.h); everything, the norm included, in accumulate_t.
#pragma once

#include "recops/layer/kernels/row_blocks.h"

namespace recops::layer::kernels::RECOPS_ISA_NS {

// The weights as the block products take them, padded, in C: W_gate^T and W_up^T side by side
// [granules(dim), ld_z] (up's columns from hidden on, one padding after both: ld_z =
// granules(2 hidden), 112 columns where a padding per half took 128 at a hidden width of 50) and
// W_down^T [granules(hidden), granules(dim)]; for the backward also their transposes.
template <typename T, typename C = accumulate_t<T>>
struct FfnWeights {
  int64_t dim_p, hidden_p, ld_z;
  std::vector<C> gate_up_t, down_t, gate_up, down;

  FfnWeights(const FfnProblem<T>& p, bool backward)
      : dim_p(granules(p.dim)),
        hidden_p(granules(p.hidden)),
        ld_z(granules(2 * p.hidden)),
        gate_up_t(static_cast<size_t>(dim_p * ld_z), C(0)),
        down_t(padded_operand<C>(p.down, p.dim, p.hidden, p.hidden, true)) {
    for (int64_t d = 0; d < p.dim; ++d) {
      for (int64_t j = 0; j < p.hidden; ++j) {
        gate_up_t[d * ld_z + j] =
            static_cast<C>(static_cast<accumulate_t<T>>(p.gate[j * p.dim + d]));
        gate_up_t[d * ld_z + p.hidden + j] =
            static_cast<C>(static_cast<accumulate_t<T>>(p.up[j * p.dim + d]));
      }
    }
    if (!backward) return;
    gate_up.resize(static_cast<size_t>(ld_z * dim_p));
    transpose_tile(gate_up_t.data(), dim_p, ld_z, ld_z, gate_up.data(), dim_p);
    down = padded_operand<C>(p.down, p.dim, p.hidden, p.hidden, false);
  }
};

// What a thread keeps for its blocks: the block's h [rows, dim_p], z = h [W_gate^T W_up^T]
// [rows, ld_z], the gate's output g [rows, hidden_p], padded with zeros.
template <typename T, typename C = accumulate_t<T>>
struct FfnBlock {
  const FfnProblem<T>& p;
  const FfnWeights<T>& w;
  std::vector<C> h, z, g;
  std::vector<RowNorm<C>> norms;

  FfnBlock(const FfnProblem<T>& problem, const FfnWeights<T>& weights)
      : p(problem),
        w(weights),
        h(static_cast<size_t>(kRowBlock * weights.dim_p), C(0)),
        z(static_cast<size_t>(kRowBlock * weights.ld_z), C(0)),
        g(static_cast<size_t>(kRowBlock * weights.hidden_p), C(0)),
        norms(kRowBlock) {}

  // h, z and g of rows [r0, r0 + n); h's rows after them up to granules(n) are zero.
  void compute(int64_t r0, int64_t n) {
    const int64_t dim_p = w.dim_p, hidden_p = w.hidden_p, ld_z = w.ld_z, up0 = p.hidden;
    for (int64_t i = 0; i < n; ++i) {
      const T* x = p.x + (r0 + i) * p.ld_x;
      const RowNorm<C> norm = norms[i] = row_norm(x, p.dim, p.norm, p.eps);
      const RowDropout<C> drop = p.dropout.template row<C>(r0 + i);
      C* out = h.data() + i * dim_p;
      for (int64_t d = 0; d < p.dim; ++d) out[d] = norm(x[d]) * drop.factor(d);
    }
    const int64_t m = granules(n);
    std::fill(h.begin() + n * dim_p, h.begin() + m * dim_p, C(0));
    gemm_nn_any_shape(m, ld_z, p.dim, h.data(), dim_p, w.gate_up_t.data(), ld_z, z.data(), ld_z,
                      false);
    for (int64_t i = 0; i < n; ++i) {
      const C* zi = z.data() + i * ld_z;
      C* gi = g.data() + i * hidden_p;
      for (int64_t j = 0; j < p.hidden; ++j) gi[j] = zi[j] * fast_sigmoid(zi[j]) * zi[up0 + j];
    }
  }
};

// out [rows, dim] (leading dimension ld_out).
template <typename T>
void layer_ffn_forward(const FfnProblem<T>& p, T* out, int64_t ld_out) {
  using C = accumulate_t<T>;
  const FfnWeights<T> weights(p, false);
  const int64_t dim_p = weights.dim_p, hidden_p = weights.hidden_p;
  const int64_t blocks = (p.rows + kRowBlock - 1) / kRowBlock;
  parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    SingleThreadedBlas blas;
    FfnBlock<T> block(p, weights);
    std::vector<C> y(static_cast<size_t>(kRowBlock * dim_p));
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t r0 = b * kRowBlock, n = std::min(kRowBlock, p.rows - r0);
      block.compute(r0, n);
      // g's rows past n hold an earlier block's values (finite); their products are not read.
      gemm_nn_any_shape(granules(n), dim_p, p.hidden, block.g.data(), hidden_p,
                        weights.down_t.data(), dim_p, y.data(), dim_p, false);
      for (int64_t i = 0; i < n; ++i) {
        const T* x = p.x + (r0 + i) * p.ld_x;
        const C* yi = y.data() + i * dim_p;
        T* o = out + (r0 + i) * ld_out;
        for (int64_t d = 0; d < p.dim; ++d) o[d] = T(yi[d] + static_cast<C>(x[d]));
      }
    }
  });
}

// The gradients of x (the residual's included), W_gate, W_up and W_down given grad_output
// [rows, dim] (ld_grad). Rows are cut into fixed_chunks chunks (the same for any thread count);
// each sums its weight gradients into partials, added in chunk order at the end.
template <typename T>
void layer_ffn_backward(const FfnProblem<T>& p, const T* grad_output, int64_t ld_grad,
                        const FfnGrads<T>& grads) {
  using C = accumulate_t<T>;
  const FfnWeights<T> weights(p, true);
  const int64_t dim = p.dim, hidden = p.hidden;
  const int64_t dim_p = weights.dim_p, hidden_p = weights.hidden_p, ld_z = weights.ld_z;
  const int64_t blocks = (p.rows + kRowBlock - 1) / kRowBlock;
  const int64_t chunks = fixed_chunks(blocks);
  ParameterGradPartials<C> gate_up(chunks, ld_z, dim, 0), down(chunks, dim, hidden, 0);
  for_each_chunk(blocks, chunks, [&](int64_t chunk, int64_t b0, int64_t b1) {
    SingleThreadedBlas blas;
    FfnBlock<T> block(p, weights);
    // Zero past the rows and columns read: the products' padding.
    std::vector<C> go(static_cast<size_t>(kRowBlock * dim_p), C(0));
    std::vector<C> go_t(static_cast<size_t>(dim_p * kRowBlock));
    std::vector<C> dg(static_cast<size_t>(kRowBlock * hidden_p));
    std::vector<C> dz(static_cast<size_t>(kRowBlock * ld_z), C(0));
    std::vector<C> dz_t(static_cast<size_t>(ld_z * kRowBlock));
    std::vector<C> dh(static_cast<size_t>(kRowBlock * dim_p)), dx(static_cast<size_t>(dim));
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t r0 = b * kRowBlock, n = std::min(kRowBlock, p.rows - r0), m = granules(n);
      block.compute(r0, n);
      for (int64_t i = 0; i < n; ++i) {
        const T* gi = grad_output + (r0 + i) * ld_grad;
        for (int64_t d = 0; d < dim; ++d) go[i * dim_p + d] = static_cast<C>(gi[d]);
      }
      std::fill(go.begin() + n * dim_p, go.begin() + m * dim_p, C(0));
      // dW_down += dy^T g (go_t's columns past n are zero), dg = dy W_down.
      transpose_tile(go.data(), m, dim_p, dim_p, go_t.data(), kRowBlock);
      gemm_nn_any_shape(dim, hidden_p, m, go_t.data(), kRowBlock, block.g.data(), hidden_p,
                        down.weight(chunk), down.ld(), true);
      gemm_nn_any_shape(m, hidden_p, dim, go.data(), dim_p, weights.down.data(), hidden_p,
                        dg.data(), hidden_p, false);
      // The gate's backward: dz_gate = dg * up * silu'(z_gate), dz_up = dg * silu(z_gate).
      for (int64_t i = 0; i < n; ++i) {
        const C* zi = block.z.data() + i * ld_z;
        C* dzi = dz.data() + i * ld_z;
        for (int64_t j = 0; j < hidden; ++j) {
          const C s = fast_sigmoid(zi[j]), d = dg[i * hidden_p + j];
          dzi[j] = d * zi[hidden + j] * s * (C(1) + zi[j] * (C(1) - s));
          dzi[hidden + j] = d * zi[j] * s;
        }
      }
      std::fill(dz.begin() + n * ld_z, dz.begin() + m * ld_z, C(0));
      // [dW_gate; dW_up] += dz^T h, dh = dz [W_gate; W_up].
      transpose_tile(dz.data(), m, ld_z, ld_z, dz_t.data(), kRowBlock);
      gemm_nn_any_shape(2 * hidden, dim_p, m, dz_t.data(), kRowBlock, block.h.data(), dim_p,
                        gate_up.weight(chunk), gate_up.ld(), true);
      gemm_nn_any_shape(m, dim_p, 2 * hidden, dz.data(), ld_z, weights.gate_up.data(), dim_p,
                        dh.data(), dim_p, false);
      for (int64_t i = 0; i < n; ++i) {
        const int64_t r = r0 + i;
        const RowDropout<C> drop = p.dropout.template row<C>(r);
        C* dhi = dh.data() + i * dim_p;
        for (int64_t d = 0; d < dim; ++d) dhi[d] *= drop.factor(d);
        const T* x = p.x + r * p.ld_x;
        norm_backward_row(x, dim, block.norms[i], p.norm, dhi, dx.data());
        T* gx = grads.x + r * dim;
        for (int64_t d = 0; d < dim; ++d) gx[d] = T(dx[d] + go[i * dim_p + d]);
      }
    }
  });
  gate_up.write_rows(0, hidden, grads.gate);
  gate_up.write_rows(hidden, hidden, grads.up);
  down.write(grads.down, static_cast<T*>(nullptr));
}

}  // namespace recops::layer::kernels::RECOPS_ISA_NS
