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

}  // namespace recops::sparse
