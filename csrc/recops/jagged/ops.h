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
at::Tensor asynchronous_batched_complete_cumsum(const at::Tensor& values);

at::Tensor segment_sum_csr(int64_t batch_size, const at::Tensor& csr_seg, const at::Tensor& values);

at::Tensor jagged_index_select_2d_forward(const at::Tensor& values, const at::Tensor& indices,
                                          const at::Tensor& input_offsets,
                                          const at::Tensor& output_offsets,
                                          int64_t num_dense_output_rows);
at::Tensor jagged_index_select_2d_forward_v2(const at::Tensor& values, const at::Tensor& indices,
                                             const at::Tensor& input_offsets,
                                             const at::Tensor& output_offsets,
                                             std::optional<int64_t> num_dense_output_rows);
at::Tensor jagged_index_add_2d_forward(const at::Tensor& values, const at::Tensor& indices,
                                       const at::Tensor& input_offsets,
                                       const at::Tensor& output_offsets,
                                       int64_t num_dense_input_rows, int64_t num_output_rows);
at::Tensor jagged_index_add_2d_forward_v2(const at::Tensor& values, const at::Tensor& indices,
                                          const at::Tensor& input_offsets,
                                          const at::Tensor& output_offsets, int64_t num_output_rows,
                                          int64_t num_dense_input_rows);

std::vector<at::Tensor> keyed_jagged_index_select_dim1(
    const at::Tensor& values, const at::Tensor& lengths, const at::Tensor& offsets,
    const at::Tensor& indices, int64_t batch_size, const std::optional<at::Tensor>& weights,
    std::optional<int64_t> selected_lengths_sum);

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> jagged_unique_indices(
    const at::Tensor& hash_size_cumsum, const at::Tensor& hash_size_offsets,
    const at::Tensor& offsets, const at::Tensor& indices);

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
template <const char* Namespace>
std::vector<at::Tensor> jagged_index_select(const at::Tensor& values, const at::Tensor& lengths,
                                            const at::Tensor& indices,
                                            std::optional<int64_t> num_dense_output_rows);

}  // namespace recops::jagged
