// ATen adapters of DeBERTa's disentangled attention (docs/ops.md section 6) and its
// relative-position buckets. Validate, allocate, dispatch to kernels/.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <tuple>

#include "recops/deberta/options.h"

namespace recops::attention {

// HF's make_log_bucket_position of integer relative positions, int64 (kernels/deberta_positions.h).
at::Tensor deberta_log_bucket_position(const at::Tensor& relative_pos, int64_t bucket_size,
                                       int64_t max_position);

// Returns (output [B, H, Sq, Dv], softmax log-sum-exp [B, H, Sq] in the compute type,
// probabilities [B, H, Sq, Sk] after dropout when return_probs).
std::tuple<at::Tensor, at::Tensor, std::optional<at::Tensor>> disentangled_attention_forward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const std::optional<at::Tensor>& pos_key, const std::optional<at::Tensor>& pos_query,
    const std::optional<at::Tensor>& attention_mask, const DisentangledOptions& options,
    bool return_probs);

// Returns (dq, dk, dv, d pos_key, d pos_query); a table's gradient is absent when its term is
// not in pos_att_type.
std::tuple<at::Tensor, at::Tensor, at::Tensor, std::optional<at::Tensor>, std::optional<at::Tensor>>
disentangled_attention_backward(
    const at::Tensor& grad_output, const std::optional<at::Tensor>& grad_probs, const at::Tensor& q,
    const at::Tensor& k, const at::Tensor& v, const std::optional<at::Tensor>& pos_key,
    const std::optional<at::Tensor>& pos_query, const std::optional<at::Tensor>& attention_mask,
    const at::Tensor& output, const at::Tensor& softmax_lse, const std::optional<at::Tensor>& probs,
    const DisentangledOptions& options);

}  // namespace recops::attention
