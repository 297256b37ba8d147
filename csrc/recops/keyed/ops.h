// ATen adapters of the keyed family (pooled embeddings of several features side by side, as
// torchrec's KeyedTensor holds them; docs/keyed.md): validate, allocate, dispatch to kernels/.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <string>
#include <tuple>
#include <vector>

namespace recops::keyed {

// FBGEMM's merge_pooled_embeddings: the tensors concatenated along cat_dim (torch.cat's rules),
// moved to target_device. uncat_dim_size is not read on CPU (as in FBGEMM).
at::Tensor merge_pooled_embeddings(at::TensorList pooled_embeddings, int64_t uncat_dim_size,
                                   at::Device target_device, int64_t cat_dim);

// FBGEMM's permute_multi_embedding_function: the moves of `permutes` applied to pooled_embs,
// or, with reverse, their backward (gradients moved back, duplicates summed).
std::vector<at::Tensor> permute_multi_embedding_function(at::TensorList pooled_embs,
                                                         const at::Tensor& permutes,
                                                         const at::Tensor& in_shapes,
                                                         const at::Tensor& out_shapes,
                                                         at::IntArrayRef out_lengths, bool reverse);

// FBGEMM's permute_multi_embedding: permute_multi_embedding_function without reverse.
std::vector<at::Tensor> permute_multi_embedding(at::TensorList pooled_embs,
                                                const at::Tensor& permutes,
                                                const at::Tensor& in_shapes,
                                                const at::Tensor& out_shapes,
                                                at::IntArrayRef out_lengths);

// FBGEMM's kt_regroup_arguments: permute_multi_embedding's arguments for regrouping keyed
// tensors (keys, lengths) into `groups`.
std::tuple<at::Tensor, at::Tensor, at::Tensor, std::vector<int64_t>> kt_regroup_arguments(
    const at::Tensor& embs, const std::vector<std::vector<std::string>>& keys,
    const std::vector<std::vector<int64_t>>& lengths,
    const std::vector<std::vector<std::string>>& groups);

// FBGEMM's regroup_keyed_tensor: kt_regroup_arguments and permute_multi_embedding in one call.
std::vector<at::Tensor> regroup_keyed_tensor(at::TensorList pooled_embs,
                                             const std::vector<std::vector<std::string>>& keys,
                                             const std::vector<std::vector<int64_t>>& lengths,
                                             const std::vector<std::vector<std::string>>& groups);

}  // namespace recops::keyed
