// permute_2D_sparse_preallocated_out (FBGEMM's schema and semantics, docs/ops.md section 1):
// permute_2D_sparse_data writing its results into the outputs the caller passes (the front of
// each; outputs not passed are allocated) and returning them. Runs permute.cpp's permutation,
// which checks every given output (dtype, contiguity, room, no overlap with an input) before
// writing to it.
#include "recops/common/checks.h"
#include "recops/sparse/ops.h"

namespace recops::sparse {

PermutedSparse permute_2D_sparse_preallocated_out(
    const at::Tensor& permute, const at::Tensor& lengths, const at::Tensor& values,
    const std::optional<at::Tensor>& weights, std::optional<int64_t> permuted_lengths_sum,
    const std::optional<at::Tensor>& permuted_lengths_out,
    const std::optional<at::Tensor>& permuted_indices_out,
    const std::optional<at::Tensor>& permuted_weights_out) {
  check_cpu(lengths, "lengths");
  check_dim(lengths, 2, "lengths");
  check_index_dtype(lengths, "lengths");
  PermuteOutputs out;
  out.lengths = permuted_lengths_out;
  out.values = permuted_indices_out;
  // Without weights there are no permuted weights: a weights output is ignored, as FBGEMM does.
  if (weights.has_value()) out.weights = permuted_weights_out;
  return permute_sparse_segments(permute, lengths.contiguous(), values, weights,
                                 permuted_lengths_sum, out);
}

}  // namespace recops::sparse
