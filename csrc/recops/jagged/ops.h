// ATen adapters of the jagged family (OPS.md section 1): validate, allocate, dispatch to kernels/.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

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

}  // namespace recops::jagged
