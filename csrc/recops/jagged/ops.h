// ATen adapters of the jagged family (docs/ops.md section 1): validate, allocate, dispatch to
// kernels/.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <tuple>
#include <vector>

namespace recops::jagged {

at::Tensor asynchronous_complete_cumsum(const at::Tensor& t_in);
at::Tensor asynchronous_exclusive_cumsum(const at::Tensor& t_in);
at::Tensor asynchronous_inclusive_cumsum(const at::Tensor& t_in);

at::Tensor jagged_to_padded_dense_forward(const at::Tensor& values, at::TensorList offsets,
                                          at::IntArrayRef max_lengths, double padding_value);
at::Tensor jagged_to_padded_dense_backward(const at::Tensor& grad_output, at::TensorList offsets,
                                           int64_t total_L);
at::Tensor dense_to_jagged_forward(const at::Tensor& dense, at::TensorList x_offsets,
                                   std::optional<int64_t> total_L);
at::Tensor jagged_2d_to_dense(const at::Tensor& values, const at::Tensor& offsets,
                              int64_t max_sequence_length);
at::Tensor jagged_1d_to_dense(const at::Tensor& values, const at::Tensor& offsets,
                              int64_t max_sequence_length, int64_t padding_value);

at::Tensor offsets_range(const at::Tensor& offsets, int64_t range_size);

// The composite ops, for the namespace whose `_forward` op they call: recops' own, and fbgemm's
// when recops defines torch.ops.fbgemm (recops/_fbgemm.py registers those through
// csrc/recops/binding/fbgemm_route.cpp).
inline constexpr char kRecopsNamespace[] = "recops";
inline constexpr char kFbgemmNamespace[] = "fbgemm";

template <const char* Namespace>
at::Tensor jagged_to_padded_dense(const at::Tensor& values, at::TensorList offsets,
                                  c10::SymIntArrayRef max_lengths, double padding_value);
template <const char* Namespace>
std::tuple<at::Tensor, std::vector<at::Tensor>> dense_to_jagged(const at::Tensor& dense,
                                                                at::TensorList x_offsets,
                                                                std::optional<c10::SymInt> total_L);

}  // namespace recops::jagged
