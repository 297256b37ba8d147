// ATen adapters of the sparse family (docs/ops.md section 1): validate, allocate, dispatch to
// kernels/.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <tuple>
#include <vector>

namespace recops::sparse {

using PermutedSparse = std::tuple<at::Tensor, at::Tensor, std::optional<at::Tensor>>;

PermutedSparse permute_2D_sparse_data(const at::Tensor& permute, const at::Tensor& lengths,
                                      const at::Tensor& values,
                                      const std::optional<at::Tensor>& weights,
                                      std::optional<int64_t> permuted_lengths_sum);
PermutedSparse permute_1D_sparse_data(const at::Tensor& permute, const at::Tensor& lengths,
                                      const at::Tensor& values,
                                      const std::optional<at::Tensor>& weights,
                                      std::optional<int64_t> permuted_lengths_sum);
at::Tensor invert_permute(const at::Tensor& permute);
// FBGEMM's permute_sparse_features: permute_2D_sparse_data of index-typed lengths and indices
// of one dtype.
PermutedSparse permute_sparse_features(const at::Tensor& permute, const at::Tensor& lengths,
                                       const at::Tensor& indices,
                                       const std::optional<at::Tensor>& weights);
// FBGEMM's permute_2D_sparse_data_input1D: lengths read flat as [-1, stride].
PermutedSparse permute_2D_sparse_data_input1D(const at::Tensor& permute, const at::Tensor& lengths,
                                              const at::Tensor& values, int64_t stride,
                                              const std::optional<at::Tensor>& weights,
                                              std::optional<int64_t> permuted_lengths_sum);
// FBGEMM's permute_2D_sparse_preallocated_out: permute_2D_sparse_data writing into the given
// outputs (each at least as large as the result), allocating the ones not given.
PermutedSparse permute_2D_sparse_preallocated_out(
    const at::Tensor& permute, const at::Tensor& lengths, const at::Tensor& values,
    const std::optional<at::Tensor>& weights, std::optional<int64_t> permuted_lengths_sum,
    const std::optional<at::Tensor>& permuted_lengths_out,
    const std::optional<at::Tensor>& permuted_indices_out,
    const std::optional<at::Tensor>& permuted_weights_out);
// The permutation behind every permute_*_sparse adapter (permute.cpp): segment t is row t of
// lengths [T, B]; outputs not given (nullopt) are allocated.
struct PermuteOutputs {
  std::optional<at::Tensor> lengths, values, weights;
};
PermutedSparse permute_sparse_segments(const at::Tensor& permute, const at::Tensor& lengths_2d,
                                       const at::Tensor& values,
                                       const std::optional<at::Tensor>& weights,
                                       std::optional<int64_t> permuted_lengths_sum,
                                       const PermuteOutputs& out = {});
// FBGEMM's expand_into_jagged_permute: the element permutation of a segment permutation.
at::Tensor expand_into_jagged_permute(const at::Tensor& permute, const at::Tensor& input_offset,
                                      const at::Tensor& output_offset, int64_t output_size);
// FBGEMM's permute_pooled_embs and its _split / _auto_grad / _auto_grad_split twins (one kernel).
at::Tensor permute_pooled_embs(const at::Tensor& pooled_embs, const at::Tensor& offset_dim_list,
                               const at::Tensor& permute_list,
                               const at::Tensor& inv_offset_dim_list,
                               const at::Tensor& inv_permute_list);

// FBGEMM's block_bucketize_sparse_features: (new_lengths, new_indices, new_weights, new_pos,
// unbucketize_permute).
using BucketizedSparse = std::tuple<at::Tensor, at::Tensor, std::optional<at::Tensor>,
                                    std::optional<at::Tensor>, std::optional<at::Tensor>>;
BucketizedSparse block_bucketize_sparse_features(
    const at::Tensor& lengths, const at::Tensor& indices, bool bucketize_pos, bool sequence,
    const at::Tensor& block_sizes, int64_t my_size, const std::optional<at::Tensor>& weights,
    const std::optional<at::Tensor>& batch_size_per_feature, int64_t max_B,
    const std::optional<std::vector<at::Tensor>>& block_bucketize_pos, bool keep_orig_idx,
    const std::optional<at::Tensor>& total_num_blocks,
    const std::optional<at::Tensor>& keep_orig_idx_per_feature);
// FBGEMM's block_bucketize_sparse_features_inference: the same, plus each input id's bucket
// (bucket_mapping) when return_bucket_mapping.
using BucketizedSparseWithMapping =
    std::tuple<at::Tensor, at::Tensor, std::optional<at::Tensor>, std::optional<at::Tensor>,
               std::optional<at::Tensor>, std::optional<at::Tensor>>;
BucketizedSparseWithMapping block_bucketize_sparse_features_inference(
    const at::Tensor& lengths, const at::Tensor& indices, bool bucketize_pos, bool sequence,
    const at::Tensor& block_sizes, int64_t my_size, const std::optional<at::Tensor>& weights,
    const std::optional<at::Tensor>& batch_size_per_feature, int64_t max_B,
    const std::optional<std::vector<at::Tensor>>& block_bucketize_pos, bool return_bucket_mapping,
    bool keep_orig_idx, const std::optional<at::Tensor>& total_num_blocks,
    const std::optional<at::Tensor>& keep_orig_idx_per_feature);

}  // namespace recops::sparse
