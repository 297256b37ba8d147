// Torch-free interface of the layer family's kernels (docs/ops.md section 8): each call's problem
// as a plain struct of pointers and sizes, and one table of entry points per instruction-set
// variant. The variants (variant_baseline.cpp, variant_avx2.cpp, variant_avx512.cpp) compile the
// kernels' templates (counter_dropout.h, layer_input.h, layer_output.h, layer_ffn.h) once per
// instruction set
// through kernels/variant.h; layer_kernels<T>() picks the table to call.
//
// This header also includes every external header the variants use, so that a variant includes
// them all before switching the instruction set (see common/cpu_isa.h).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "recops/common/blas.h"
#include "recops/common/counter_rng.h"
#include "recops/common/cpu_isa.h"
#include "recops/common/half_bits.h"
#include "recops/common/kinds.h"
#include "recops/common/parallel.h"
#include "recops/common/vec_math.h"

namespace recops::layer::kernels {

// The norms over a row, without affine weights: layer norm, RMS norm (eps added to the mean
// square), and L2 normalisation x / max(|x|, eps) (recops.l2_normalize).
enum class Norm { kLayer, kRms, kL2 };

// A dropout's key. Element (r, j) of a tensor read as rows of its last dimension is kept iff
// CounterRow::make(stream, r).bits(j) >> 8 >= threshold (common/counter_rng.h): a pure function
// of (seed, offset, row, column), so nothing is stored, a backward regenerates the mask, and no
// decision depends on which thread handles a row. A fused kernel dropping the same [rows, cols]
// values draws the same mask as counter_dropout.
struct DropoutKey {
  uint64_t stream;  // stream_seed(seed, offset)
  uint32_t threshold;
  double scale;  // 1 / (1 - p); 0 when p = 1 (nothing is kept)

  static DropoutKey make(int64_t seed, int64_t offset, double p) {
    return DropoutKey{stream_seed(static_cast<uint64_t>(seed), static_cast<uint64_t>(offset)),
                      keep_threshold(p), p < 1.0 ? 1.0 / (1.0 - p) : 0.0};
  }

  template <typename C>
  RowDropout<C> row(int64_t r) const {
    return RowDropout<C>{CounterRow::make(stream, static_cast<uint64_t>(r)), threshold,
                         static_cast<C>(scale)};
  }
};

// The input projection out = silu(norm(x) W + b): x [rows, dim] (row stride ld_x), W [dim, width]
// (the models' uvqk parameter, applied as x @ W, contiguous), b [width] or null.
template <typename T>
struct InputProblem {
  int64_t rows;   // L
  int64_t dim;    // columns of x, rows of weight
  int64_t width;  // columns of weight and out
  const T* x;
  int64_t ld_x;
  const T* weight;
  const T* bias;
  Norm norm;
  double eps;
};

// A [rows, width] matrix held as column pieces, each a matrix of its own (a layer's u, v, q, k):
// piece k is the cols[k] columns after those of pieces 0..k-1, at data[k] with row stride ld[k].
// P is T* for an output, const T* for an input.
template <typename P>
struct ColumnPieces {
  int64_t count;
  const P* data;
  const int64_t* cols;
  const int64_t* ld;

  // fn(row r of piece k, its first column in the whole, its columns) for each nonempty piece.
  template <typename Fn>
  void for_each_in_row(int64_t r, Fn&& fn) const {
    int64_t first = 0;
    for (int64_t k = 0; k < count; first += cols[k++]) {
      if (cols[k] > 0) fn(data[k] + r * ld[k], first, cols[k]);
    }
  }
};

// The output out = x + dropout(u * norm(attn)) W^T + b: x [rows, dim], u and attn [rows, width]
// (row strides ld_*), W [dim, width] (nn.Linear's weight, contiguous), b [dim] or null.
template <typename T>
struct OutputProblem {
  int64_t rows;   // L
  int64_t width;  // columns of u and attn
  int64_t dim;    // columns of x, out and rows of weight
  const T* x;
  int64_t ld_x;
  const T* u;
  int64_t ld_u;
  const T* attn;
  int64_t ld_attn;
  const T* weight;
  const T* bias;
  Norm norm;
  double eps;
  DropoutKey dropout;
};

// The output's backward results: grad_u, grad_attn [rows, width] (contiguous), grad_weight
// [dim, width], grad_bias [dim] or null.
template <typename T>
struct OutputGrads {
  T* u;
  T* attn;
  T* weight;
  T* bias;
};

// FuXi-alpha's feed-forward stage: out = x + (silu(h W_gate^T) * (h W_up^T)) W_down^T with
// h = dropout(norm(x)): x [rows, dim] (row stride ld_x), W_gate and W_up [hidden, dim], W_down
// [dim, hidden] (nn.Linear's weights, contiguous), no biases.
template <typename T>
struct FfnProblem {
  int64_t rows;    // L
  int64_t dim;     // columns of x and out
  int64_t hidden;  // rows of W_gate and W_up
  const T* x;
  int64_t ld_x;
  const T* gate;
  const T* up;
  const T* down;
  Norm norm;
  double eps;
  DropoutKey dropout;
};

// The feed-forward stage's backward results, contiguous: grad_x [rows, dim] (the residual's
// included), grad_gate and grad_up [hidden, dim], grad_down [dim, hidden].
template <typename T>
struct FfnGrads {
  T* x;
  T* gate;
  T* up;
  T* down;
};

// A sequence model's input features out = dropout(scale * x + table[positions]): x [rows, cols]
// (row stride ld_x), positions [rows] in [0, table_rows), table [table_rows, cols] (a learned
// position embedding, contiguous).
template <typename T>
struct PositionalFeatures {
  int64_t rows, cols;
  const T* x;
  int64_t ld_x;
  const int64_t* positions;
  const T* table;
  int64_t table_rows;
  double scale;
  DropoutKey dropout;
};

// One variant's entry points for element type T (documented at their templates).
template <typename T>
struct LayerKernels {
  void (*dropout)(const T* x, int64_t ld_x, T* out, int64_t ld_out, int64_t rows, int64_t cols,
                  const DropoutKey& key);
  void (*input_forward)(const InputProblem<T>& p, const ColumnPieces<T*>& out);
  void (*input_backward)(const InputProblem<T>& p, const ColumnPieces<const T*>& grad_output,
                         T* grad_x, T* grad_weight, T* grad_bias);
  void (*output_forward)(const OutputProblem<T>& p, T* out, int64_t ld_out);
  void (*output_backward)(const OutputProblem<T>& p, const T* grad_output, int64_t ld_grad,
                          const OutputGrads<T>& grads);
  void (*ffn_forward)(const FfnProblem<T>& p, T* out, int64_t ld_out);
  void (*ffn_backward)(const FfnProblem<T>& p, const T* grad_output, int64_t ld_grad,
                       const FfnGrads<T>& grads);
  void (*normalize_forward)(const T* x, int64_t ld_x, int64_t rows, int64_t cols, Norm norm,
                            double eps, T* out);
  void (*normalize_backward)(const T* grad_output, int64_t ld_grad, const T* x, int64_t ld_x,
                             int64_t rows, int64_t cols, Norm norm, double eps, T* grad_x);
  void (*features_forward)(const PositionalFeatures<T>& p, T* out);
  void (*features_backward)(const PositionalFeatures<T>& p, const T* grad_output, int64_t ld_grad,
                            T* grad_x, T* grad_table);
};

// One variant's tables; float64 has the baseline's only (it serves validation, not speed).
RECOPS_DECLARE_VARIANT_TABLE(FloatTables<LayerKernels>, kLayerKernels)
namespace baseline {
extern const LayerKernels<double> kDoubleLayerKernels;
}

// The entry points for T on instruction set `isa` (by default the CPU's, capped by
// RECOPS_CPU_ISA).
template <typename T>
const LayerKernels<T>& layer_kernels(CpuIsa isa = cpu_isa()) {
  if constexpr (std::is_same_v<T, double>) {
    return baseline::kDoubleLayerKernels;
  } else {
    return RECOPS_VARIANT_TABLE(isa, kLayerKernels).template of<T>();
  }
}

}  // namespace recops::layer::kernels
