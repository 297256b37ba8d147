// The input projection of an HSTU / FuXi-alpha layer, fused (layer_kernels.h's InputProblem):
//   out = silu(norm(x) W + b)
// written as column pieces (a layer's u, v, q, k, each a matrix of its own), and the gradients
// read from such pieces, so that no split or concatenation copies them.
//
// Per block of kRowBlock rows: the block's rows normalised into a scratch block (their
// statistics kept, row_blocks.h), one product with W, the bias and SiLU on the way out.
// The backward recomputes the normalised block and the pre-activation (one more product per
// block) instead of reading stored ones. Float64 computes in double, every other dtype in fp32.
#pragma once

#include "recops/layer/kernels/row_blocks.h"

namespace recops::layer::kernels::RECOPS_ISA_NS {

// What a thread keeps for its blocks: the normalised block and the pre-activation block, padded
// to granules (row_blocks.h) like the weight they multiply.
template <typename T, typename C = accumulate_t<T>>
struct InputBlock {
  const InputProblem<T>& p;
  const C* weight;  // [granules(dim), granules(width)]
  int64_t ld_normed, ld_z;
  std::vector<C> normed, z;
  std::vector<RowNorm<C>> norms;

  InputBlock(const InputProblem<T>& problem, const C* padded_weight)
      : p(problem),
        weight(padded_weight),
        ld_normed(granules(problem.dim)),
        ld_z(granules(problem.width)),
        normed(static_cast<size_t>(block_rows(problem.rows) * ld_normed), C(0)),
        z(static_cast<size_t>(block_rows(problem.rows) * ld_z), C(0)),
        norms(kRowBlock) {}

  // normed and z = normed W + b for rows [r0, r0 + n), n <= kRowBlock; the rows after them up to
  // granules(n) are zero in both.
  void compute(int64_t r0, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
      const T* x = p.x + (r0 + i) * p.ld_x;
      const RowNorm<C> norm = norms[i] = row_norm(x, p.dim, p.norm, p.eps);
      C* out = normed.data() + i * ld_normed;
      for (int64_t d = 0; d < p.dim; ++d) out[d] = norm(x[d]);
    }
    const int64_t m = granules(n);
    std::fill(normed.begin() + n * ld_normed, normed.begin() + m * ld_normed, C(0));
    gemm_nn_any_shape(m, ld_z, p.dim, normed.data(), ld_normed, weight, ld_z, z.data(), ld_z,
                      false);
    if (p.bias == nullptr) return;
    for (int64_t i = 0; i < n; ++i) {
      C* row = z.data() + i * ld_z;
      for (int64_t j = 0; j < p.width; ++j) row[j] += static_cast<C>(p.bias[j]);
    }
  }
};

// out [rows, width] as column pieces.
template <typename T>
void layer_input_forward(const InputProblem<T>& p, const ColumnPieces<T*>& out) {
  using C = accumulate_t<T>;
  const PaddedRows<C, T> weight(p.weight, p.dim, p.width);
  const int64_t blocks = (p.rows + kRowBlock - 1) / kRowBlock;
  parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    SingleThreadedBlas blas;
    InputBlock<T> block(p, weight.data());
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t r0 = b * kRowBlock, n = std::min(kRowBlock, p.rows - r0);
      block.compute(r0, n);
      for (int64_t i = 0; i < n; ++i) {
        // SiLU over the whole padded row (whole vectors; a piece of 50 would end in scalar
        // lanes), then the pieces copied out.
        C* z = block.z.data() + i * block.ld_z;
        for (int64_t j = 0; j < block.ld_z; ++j) z[j] *= fast_sigmoid(z[j]);
        out.for_each_in_row(r0 + i, [&](T* o, int64_t first, int64_t cols) {
          for (int64_t j = 0; j < cols; ++j) o[j] = T(z[first + j]);
        });
      }
    }
  });
}

// The gradients of x [rows, dim] (contiguous), weight [dim, width] and bias [width] (or null)
// given grad_output [rows, width] as column pieces:
//   dz = g * silu'(z), grad_bias = sum dz, grad_weight = normed^T dz, d normed = dz W^T,
// then the norm's backward.
template <typename T>
void layer_input_backward(const InputProblem<T>& p, const ColumnPieces<const T*>& grad_output,
                          T* grad_x, T* grad_weight, T* grad_bias) {
  using C = accumulate_t<T>;
  const int64_t dim = p.dim, width = p.width;
  const PaddedRows<C, T> weight(p.weight, dim, width);
  const std::vector<C> weight_t = padded_operand<C>(p.weight, dim, width, width, true);
  const int64_t blocks = (p.rows + kRowBlock - 1) / kRowBlock;
  const int64_t chunks = fixed_chunks(blocks);
  ParameterGradPartials<C> partials(chunks, dim, width, width);
  for_each_chunk(blocks, chunks, [&](int64_t chunk, int64_t b0, int64_t b1) {
    SingleThreadedBlas blas;
    InputBlock<T> block(p, weight.data());
    const int64_t ld_normed = block.ld_normed, ld_z = block.ld_z;
    std::vector<C> normed_t(static_cast<size_t>(ld_normed * kRowBlock));
    std::vector<C> d_normed(static_cast<size_t>(kRowBlock * ld_normed));
    std::vector<C> grad_row(static_cast<size_t>(ld_z), C(0));  // a row's pieces, padded
    C* gw = partials.weight(chunk);
    C* gb = partials.bias(chunk);
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t r0 = b * kRowBlock, n = std::min(kRowBlock, p.rows - r0), m = granules(n);
      block.compute(r0, n);
      for (int64_t i = 0; i < n; ++i) {  // z <- dz over the whole padded row, as the forward
        C* z = block.z.data() + i * ld_z;
        grad_output.for_each_in_row(r0 + i, [&](const T* g, int64_t first, int64_t cols) {
          for (int64_t j = 0; j < cols; ++j) grad_row[first + j] = static_cast<C>(g[j]);
        });
        for (int64_t j = 0; j < ld_z; ++j) {  // the padding stays zero: its grad_row is zero
          const C s = fast_sigmoid(z[j]);
          z[j] = grad_row[j] * s * (C(1) + z[j] * (C(1) - s));
        }
        for (int64_t j = 0; j < width; ++j) gb[j] += z[j];
      }
      gemm_nn_any_shape(m, ld_normed, width, block.z.data(), ld_z, weight_t.data(), ld_normed,
                        d_normed.data(), ld_normed, false);
      transpose_tile(block.normed.data(), m, ld_normed, ld_normed, normed_t.data(), kRowBlock);
      gemm_nn_any_shape(dim, ld_z, m, normed_t.data(), kRowBlock, block.z.data(), ld_z, gw,
                        partials.ld(), true);
      for (int64_t i = 0; i < n; ++i) {
        const int64_t r = r0 + i;
        norm_backward_row(p.x + r * p.ld_x, dim, block.norms[i], p.norm,
                          d_normed.data() + i * ld_normed, grad_x + r * dim);
      }
    }
  });
  partials.write(grad_weight, grad_bias);
}

}  // namespace recops::layer::kernels::RECOPS_ISA_NS
