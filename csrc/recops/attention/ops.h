// ATen adapters of the attention family (OPS.md sections 4-6).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <tuple>

namespace recops::attention {

// Options shared by the HSTU forward and backward (see the schema in ops.cpp).
struct HstuOptions {
  int64_t max_seq_len;
  double alpha, silu_scale;
  std::string mask_type;
  int64_t contextual_seq_len;
  std::optional<at::Tensor> num_targets;
  int64_t target_group_size, max_attn_len;
  std::optional<at::Tensor> custom_mask, attn_bias, timestamps, ts_w, pos_w;
  bool query_time_shift;
  double bucket_divisor;
};

at::Tensor hstu_dense_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const at::Tensor& seq_offsets,
                              const std::optional<at::Tensor>& seq_lengths,
                              const HstuOptions& options);

std::tuple<at::Tensor, at::Tensor, at::Tensor, std::optional<at::Tensor>,
           std::optional<at::Tensor>, std::optional<at::Tensor>>
hstu_dense_backward(const at::Tensor& grad_output, const at::Tensor& q, const at::Tensor& k,
                    const at::Tensor& v, const at::Tensor& seq_offsets,
                    const std::optional<at::Tensor>& seq_lengths, const HstuOptions& options);

// Options shared by the disentangled-attention forward and backward (schema in ops.cpp).
struct DisentangledOptions {
  std::string pos_att_type;  // "c2p|p2c", any subset, "" for none
  int64_t position_buckets, max_relative_positions;
  std::optional<double> scale;
  double dropout_p;
  int64_t seed;
};

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
