// ATen adapters of the gather family (docs/ops.md section 2): validate, allocate, dispatch to
// kernels/.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace recops::gather {

at::Tensor gather_for_rank1(const at::Tensor& x, const at::Tensor& index);
at::Tensor index_select_for_rank1_backward(const at::Tensor& grad, const at::Tensor& x,
                                           const at::Tensor& index);

// FBGEMM's index_select_dim0 family (group_index_select.cpp, batch_index_select.cpp).
std::vector<at::Tensor> group_index_select_dim0(at::TensorList input_group,
                                                at::TensorList indices_group);
std::vector<at::Tensor> group_index_select_dim0_gpu_impl(at::TensorList inputs, int64_t group_size);
// What FBGEMM's CPU path returns for its CUDA kernel's two extra tensors (its arguments and saved
// data): two empty int64 tensors.
std::vector<at::Tensor> empty_saved_data();
std::vector<at::Tensor> group_index_select_dim0_gpu_backward(at::TensorList inputs,
                                                             at::IntArrayRef output_shape_group);
at::Tensor batch_index_select_dim0(const at::Tensor& inputs, const at::Tensor& indices,
                                   at::IntArrayRef input_num_indices, at::IntArrayRef input_rows,
                                   at::IntArrayRef input_columns, bool permute_output_dim_0_1);
at::Tensor batch_index_select_dim0_tensor(const at::Tensor& inputs, const at::Tensor& indices,
                                          const at::Tensor& input_num_indices,
                                          const at::Tensor& input_rows,
                                          const at::Tensor& input_columns,
                                          bool permute_output_dim_0_1);
at::Tensor batch_index_select_dim0_backward(
    const at::Tensor& grad_output, const at::Tensor& indices, at::IntArrayRef input_num_indices,
    at::IntArrayRef input_rows, at::IntArrayRef input_columns, bool permute_output_dim_0_1);
at::Tensor batch_index_select_dim0_backward_cpu_impl(
    const at::Tensor& grad_output, const at::Tensor& indices, const at::Tensor& indices_numels,
    const at::Tensor& input_num_indices, const at::Tensor& input_rows,
    const at::Tensor& input_columns, bool permute_output_dim_0_1, const at::Tensor& saved_tensor);

}  // namespace recops::gather
