// permute_2D_sparse_data_input1D (FBGEMM's schema and semantics, docs/ops.md section 1):
// permute_2D_sparse_data of lengths given flat, read as [lengths.numel() / stride, stride]; the
// permuted lengths come back flat. Runs permute.cpp's permutation.
#include "recops/common/checks.h"
#include "recops/sparse/ops.h"

namespace recops::sparse {

PermutedSparse permute_2D_sparse_data_input1D(const at::Tensor& permute, const at::Tensor& lengths,
                                              const at::Tensor& values, int64_t stride,
                                              const std::optional<at::Tensor>& weights,
                                              std::optional<int64_t> permuted_lengths_sum) {
  check_cpu(lengths, "lengths");
  check_index_dtype(lengths, "lengths");
  TORCH_CHECK_VALUE(stride >= 1, "stride must be >= 1, got ", stride);
  TORCH_CHECK_VALUE(lengths.numel() % stride == 0, "lengths.numel() = ", lengths.numel(),
                    " must be a multiple of stride = ", stride);
  const at::Tensor lengths_2d = lengths.contiguous().view({-1, stride});
  auto [permuted_lengths, permuted_values, permuted_weights] =
      permute_sparse_segments(permute, lengths_2d, values, weights, permuted_lengths_sum);
  return {permuted_lengths.view({-1}), permuted_values, permuted_weights};
}

}  // namespace recops::sparse
