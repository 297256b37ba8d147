// ATen adapters of the attention family: the relative attention bias (OPS.md section 3) so far.
// Validate, allocate, dispatch to kernels/.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <tuple>

namespace recops::attention {

// The narrowest bucket-index dtype that holds num_buckets: uint8, else int32.
at::ScalarType compact_bucket_type(int64_t num_buckets);

// Bias [B, N, N] (or [layers, B, N, N]) and bucket index [B, N, N] of index_dtype (uint8, int32,
// int64). relative_attn_bias_time and relative_attn_bias_time_with_index are composites of it.
std::tuple<at::Tensor, at::Tensor> relative_attn_bias_time_forward(
    const at::Tensor& timestamps, const at::Tensor& ts_w, const std::optional<at::Tensor>& pos_w,
    const std::optional<at::Tensor>& seq_offsets, std::optional<int64_t> max_seq_len,
    double bucket_divisor, bool query_time_shift, at::ScalarType index_dtype);
at::Tensor relative_attn_bias_pos(const at::Tensor& pos_w, std::optional<int64_t> max_seq_len);
std::tuple<std::optional<at::Tensor>, std::optional<at::Tensor>> relative_attn_bias_backward(
    const at::Tensor& grad_bias, const std::optional<at::Tensor>& timestamps,
    const std::optional<at::Tensor>& bucket_index, const std::optional<at::Tensor>& seq_offsets,
    int64_t num_buckets, double bucket_divisor, bool query_time_shift, bool pos_grad);

}  // namespace recops::attention
