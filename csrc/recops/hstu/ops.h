// ATen adapters of the HSTU family: relative attention bias (docs/ops.md section 3), HSTU and
// FuXi-alpha attention (sections 4-5). Validate, allocate, dispatch to kernels/.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <tuple>

#include "recops/hstu/options.h"

namespace recops::attention {
// The narrowest bucket-index dtype that holds num_buckets: uint8, else int32.
at::ScalarType compact_bucket_type(int64_t num_buckets);

// The time bias's argument rules, shared by every op that buckets timestamps: num_buckets in
// [0, 2^31 - 1) (the bucketizer counts in int32), bucket_divisor positive and finite.
int32_t checked_num_buckets(int64_t num_buckets);
void check_bucket_divisor(double bucket_divisor);

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

at::Tensor hstu_dense_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const at::Tensor& seq_offsets,
                              const std::optional<at::Tensor>& seq_lengths,
                              const HstuOptions& options);

std::tuple<at::Tensor, at::Tensor, at::Tensor, std::optional<at::Tensor>, std::optional<at::Tensor>,
           std::optional<at::Tensor>>
hstu_dense_backward(const at::Tensor& grad_output, const at::Tensor& q, const at::Tensor& k,
                    const at::Tensor& v, const at::Tensor& seq_offsets,
                    const std::optional<at::Tensor>& seq_lengths, const HstuOptions& options);

at::Tensor hstu_dense_forward_fuxi(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const at::Tensor& seq_offsets,
                                   const std::optional<at::Tensor>& seq_lengths,
                                   const FuxiOptions& options);

std::tuple<at::Tensor, at::Tensor, at::Tensor, std::optional<at::Tensor>, std::optional<at::Tensor>,
           std::optional<at::Tensor>, std::optional<at::Tensor>>
hstu_dense_backward_fuxi(const at::Tensor& grad_output, const at::Tensor& q, const at::Tensor& k,
                         const at::Tensor& v, const at::Tensor& seq_offsets,
                         const std::optional<at::Tensor>& seq_lengths, const FuxiOptions& options);

struct DeltaKeys;  // delta.h

// A delta step (forward only): [R, H, Dv] (HSTU), [R, channels * H * Dv] (FuXi-alpha).
at::Tensor hstu_delta_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const DeltaKeys& keys, const HstuOptions& options);
at::Tensor fuxi_delta_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const DeltaKeys& keys, const FuxiOptions& options);

}  // namespace recops::attention
