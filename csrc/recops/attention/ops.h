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

std::tuple<at::Tensor, at::Tensor, at::Tensor, std::optional<at::Tensor>, std::optional<at::Tensor>,
           std::optional<at::Tensor>>
hstu_dense_backward(const at::Tensor& grad_output, const at::Tensor& q, const at::Tensor& k,
                    const at::Tensor& v, const at::Tensor& seq_offsets,
                    const std::optional<at::Tensor>& seq_lengths, const HstuOptions& options);

// FuXi-alpha: HSTU's options (attn_bias unused) plus the two bias channels and the layout.
struct FuxiOptions {
  HstuOptions base;
  std::optional<at::Tensor> ts_bias, pos_bias;  // dense [B, N, N] / [1, N, N]
  bool reference_layout;  // per head [position, time, semantic] instead of channel-major
};

at::Tensor hstu_dense_forward_fuxi(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const at::Tensor& seq_offsets,
                                   const std::optional<at::Tensor>& seq_lengths,
                                   const FuxiOptions& options);

std::tuple<at::Tensor, at::Tensor, at::Tensor, std::optional<at::Tensor>, std::optional<at::Tensor>,
           std::optional<at::Tensor>, std::optional<at::Tensor>>
hstu_dense_backward_fuxi(const at::Tensor& grad_output, const at::Tensor& q, const at::Tensor& k,
                         const at::Tensor& v, const at::Tensor& seq_offsets,
                         const std::optional<at::Tensor>& seq_lengths, const FuxiOptions& options);

}  // namespace recops::attention
