// What the fused layer kernels (layer_input.h, layer_output.h) share: rows taken in blocks of
// kRowBlock, the row norm (layer norm or RMS norm without affine weights) and its backward, the
// block products' operands padded to whole brgemm granules, and the per-chunk parameter-gradient
// partials of a backward.
//
// The norm runs in the rows' accumulate type (fp32 for fp32, bf16 and fp16 rows; double for
// double) about each row's first value, so a row whose spread is small beside its mean (where an
// fp32 a - mean would lose most of its digits) is normalised as accurately as any other (RowNorm,
// row_norm say why); the sums run in lanes (lane_sum), so they vectorise.
#pragma once

#include "recops/common/kernels/transpose_tile.h"
#include "recops/layer/kernels/layer_kernels.h"

namespace recops::layer::kernels::RECOPS_ISA_NS {

using ::recops::RECOPS_ISA_NS::transpose_tile;

constexpr int64_t kRowBlock = 64;

// A rows x cols operand of T (row stride ld), or its transpose when `transposed`, in C at the top
// left of a zero matrix of granules(rows) x granules(cols) (transposed: of the swapped sizes),
// row stride granules(its columns).
template <typename C, typename T>
std::vector<C> padded_operand(const T* values, int64_t rows, int64_t cols, int64_t ld,
                              bool transposed) {
  const int64_t out_rows = transposed ? cols : rows, out_cols = transposed ? rows : cols;
  const int64_t out_ld = granules(out_cols);
  std::vector<C> out(static_cast<size_t>(granules(out_rows) * out_ld), C(0));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const C v = static_cast<C>(static_cast<accumulate_t<T>>(values[r * ld + c]));
      out[transposed ? c * out_ld + r : r * out_ld + c] = v;
    }
  }
  return out;
}

// Rows in a block's scratch: kRowBlock, or for fewer rows in all (a serving step's few new
// rows) their granules, so that a call does not clear scratch no row uses.
inline int64_t block_rows(int64_t rows) {
  return granules(std::min(kRowBlock, rows));
}

// padded_operand(values, rows, cols, cols, false) of a contiguous operand, or the operand in
// place where the copy would equal it (C is T and both sizes are whole granules): a serving
// step's few rows cost less than copying the weight they multiply.
template <typename C, typename T>
class PaddedRows {
 public:
  PaddedRows(const T* values, int64_t rows, int64_t cols) {
    if constexpr (std::is_same_v<C, T>) {
      if (rows % kBrgemmGranule == 0 && cols % kBrgemmGranule == 0) {
        data_ = values;
        return;
      }
    }
    copy_ = padded_operand<C>(values, rows, cols, cols, false);
    data_ = copy_.data();
  }
  const C* data() const { return data_; }

 private:
  std::vector<C> copy_;
  const C* data_ = nullptr;
};

// A row's normalisation y = ((a - shift) - offset) * rstd in C, the accumulate type of its values:
// shift the row's first value (a layer norm's; 0 for the RMS and L2 norms) and offset the mean of
// the shifted values, so that shift + offset is the mean. a - shift is exact where a lies within a
// factor of two of the first value (Sterbenz), as the values of a row whose spread is small beside
// its mean do, and the normalised value keeps its digits; clamped: an L2 norm below eps, which
// the row was divided by instead (its gradient stops there).
template <typename C>
struct RowNorm {
  C shift = C(0), offset = C(0), rstd = C(1);
  bool clamped = false;

  template <typename T>
  RECOPS_ALWAYS_INLINE C operator()(T a) const {
    return (static_cast<C>(a) - shift - offset) * rstd;
  }
};

// The statistics about the row's first value (RowNorm), the variance the second pass's sum of
// squares about the shifted values' mean (no cancellation). The means multiply by 1 / n (a
// division per row sat on each row's critical path), the scale is a square root and a division
// in C.
template <typename T, typename C = accumulate_t<T>>
RowNorm<C> row_norm(const T* a, int64_t n, Norm norm, double eps) {
  const C inv_count = static_cast<C>(1.0 / static_cast<double>(n));
  const C shift = norm == Norm::kLayer && n > 0 ? static_cast<C>(a[0]) : C(0);
  const auto centred = [a, shift](int64_t j) { return static_cast<C>(a[j]) - shift; };
  const C offset = norm == Norm::kLayer ? lane_sum<C>(n, centred) * inv_count : C(0);
  const C squares = lane_sum<C>(n, [&](int64_t j) {
    const C d = centred(j) - offset;
    return d * d;
  });
  if (norm == Norm::kL2) {
    const C length = std::sqrt(squares);
    return length >= static_cast<C>(eps) ? RowNorm<C>{C(0), C(0), C(1) / length}
                                         : RowNorm<C>{C(0), C(0), C(1) / static_cast<C>(eps), true};
  }
  const C variance = squares * inv_count + static_cast<C>(eps);
  return RowNorm<C>{shift, offset, C(1) / std::sqrt(variance)};
}

// The norm's backward for one row, from dy = d(loss) / dy:
//   da = rstd * (dy - [layer norm] mean(dy) - y * mean(dy * y)),
// with the sum in place of the mean for the L2 norm, and da = rstd * dy where it was clamped.
template <typename T, typename C, typename Out>
void norm_backward_row(const T* a, int64_t n, const RowNorm<C>& norm, Norm kind, const C* dy,
                       Out* da) {
  const C inv_count = static_cast<C>(1.0 / static_cast<double>(n));
  const C sum_dy = lane_sum<C>(n, [dy](int64_t j) { return dy[j]; });
  const C sum_dyy = lane_sum<C>(n, [&](int64_t j) { return dy[j] * norm(a[j]); });
  const C mean_dy = kind == Norm::kLayer ? sum_dy * inv_count : C(0);
  const C mean_dyy = kind != Norm::kL2 ? sum_dyy * inv_count : norm.clamped ? C(0) : sum_dyy;
  for (int64_t j = 0; j < n; ++j) {
    da[j] = Out(norm.rstd * (dy[j] - mean_dy - norm(a[j]) * mean_dyy));
  }
}

// A backward's weight [rows, cols] and bias gradients, one partial per chunk of rows, the weight's
// padded to granules (padded_operand's layout, the products' output); added in chunk order at the
// end so the result depends on the chunking only.
template <typename C>
class ParameterGradPartials {
 public:
  ParameterGradPartials(int64_t chunks, int64_t rows, int64_t cols, int64_t bias_size)
      : chunks_(chunks),
        rows_(rows),
        cols_(cols),
        ld_(granules(cols)),
        weight_size_(granules(rows) * ld_),
        size_(weight_size_ + bias_size),
        values_(static_cast<size_t>(chunks * size_), C(0)) {}

  C* weight(int64_t chunk) { return values_.data() + chunk * size_; }
  C* bias(int64_t chunk) { return weight(chunk) + weight_size_; }
  int64_t ld() const { return ld_; }

  // weight [rows, cols] (contiguous) and bias (unless null) = the sums over the chunks.
  template <typename T>
  void write(T* weight_out, T* bias_out) const {
    write_rows(0, rows_, weight_out);
    if (bias_out == nullptr) return;
    for (int64_t i = 0; i < size_ - weight_size_; ++i) bias_out[i] = T(sum(weight_size_ + i));
  }

  // Rows [first, first + count) of the weight's sums, contiguous, into out.
  template <typename T>
  void write_rows(int64_t first, int64_t count, T* out) const {
    for (int64_t r = 0; r < count; ++r) {
      for (int64_t c = 0; c < cols_; ++c) out[r * cols_ + c] = T(sum((first + r) * ld_ + c));
    }
  }

 private:
  C sum(int64_t i) const {
    C s = C(0);
    for (int64_t c = 0; c < chunks_; ++c) s += values_[c * size_ + i];
    return s;
  }

  int64_t chunks_, rows_, cols_, ld_, weight_size_, size_;
  std::vector<C> values_;
};

}  // namespace recops::layer::kernels::RECOPS_ISA_NS
