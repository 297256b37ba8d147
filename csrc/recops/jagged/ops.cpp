// Schemas (FBGEMM's, verbatim) and kernel registrations of the jagged family in torch.ops.recops.
// Fake kernels and autograd formulas are registered from Python (recops/operators/jagged.py).
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include "recops/jagged/ops.h"

namespace recops::jagged {

// The composite entry points call their `_forward` op in the same namespace through the
// dispatcher, so autograd and exported graphs see exactly one `<namespace>::..._forward` node.
template <const char* Namespace>
at::Tensor jagged_to_padded_dense(const at::Tensor& values, at::TensorList offsets,
                                  c10::SymIntArrayRef max_lengths, double padding_value) {
  static const auto forward =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow((std::string(Namespace) + "::jagged_to_padded_dense_forward").c_str(),
                             "")
          .typed<at::Tensor(const at::Tensor&, at::TensorList, c10::SymIntArrayRef, double)>();
  return forward.call(values, offsets, max_lengths, padding_value);
}

template <const char* Namespace>
std::tuple<at::Tensor, std::vector<at::Tensor>> dense_to_jagged(
    const at::Tensor& dense, at::TensorList x_offsets, std::optional<c10::SymInt> total_L) {
  static const auto forward =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow((std::string(Namespace) + "::dense_to_jagged_forward").c_str(), "")
          .typed<at::Tensor(const at::Tensor&, at::TensorList, std::optional<c10::SymInt>)>();
  return {forward.call(dense, x_offsets, std::move(total_L)), x_offsets.vec()};
}

template at::Tensor jagged_to_padded_dense<kFbgemmNamespace>(const at::Tensor&, at::TensorList,
                                                             c10::SymIntArrayRef, double);
template std::tuple<at::Tensor, std::vector<at::Tensor>> dense_to_jagged<kFbgemmNamespace>(
    const at::Tensor&, at::TensorList, std::optional<c10::SymInt>);

}  // namespace recops::jagged

TORCH_LIBRARY_FRAGMENT(recops, m) {
  // The module where the fake kernels and autograd are registered.
  m.set_python_module("recops.operators.jagged");
  const std::vector<at::Tag> pt2 = {at::Tag::pt2_compliant_tag};
  m.def("asynchronous_complete_cumsum(Tensor t_in) -> Tensor", pt2);
  m.def("asynchronous_exclusive_cumsum(Tensor t_in) -> Tensor", pt2);
  m.def("asynchronous_inclusive_cumsum(Tensor t_in) -> Tensor", pt2);
  m.def(
      "jagged_to_padded_dense(Tensor values, Tensor[] offsets, SymInt[] max_lengths, "
      "float padding_value = 0) -> Tensor",
      pt2);
  m.def(
      "jagged_to_padded_dense_forward(Tensor values, Tensor[] offsets, SymInt[] max_lengths, "
      "float padding_value = 0) -> Tensor",
      pt2);
  m.def(
      "jagged_to_padded_dense_backward(Tensor grad_output, Tensor[] offsets, SymInt total_L) "
      "-> Tensor",
      pt2);
  m.def(
      "dense_to_jagged(Tensor dense, Tensor[] x_offsets, SymInt? total_L=None) "
      "-> (Tensor, Tensor[])",
      pt2);
  m.def("dense_to_jagged_forward(Tensor dense, Tensor[] x_offsets, SymInt? total_L=None) -> Tensor",
        pt2);
  m.def("jagged_2d_to_dense(Tensor values, Tensor offsets, SymInt max_sequence_length) -> Tensor",
        pt2);
  m.def(
      "jagged_1d_to_dense(Tensor values, Tensor offsets, SymInt max_sequence_length, "
      "int padding_value) -> Tensor",
      pt2);
  m.def("offsets_range(Tensor offsets, SymInt range_size) -> Tensor", pt2);
  m.def("asynchronous_batched_complete_cumsum(Tensor values) -> Tensor", pt2);
  m.def("segment_sum_csr(SymInt batch_size, Tensor csr_seg, Tensor values) -> Tensor", pt2);
  m.def(
      "jagged_index_select(Tensor values, Tensor lengths, Tensor indices, "
      "int? num_dense_output_rows=None) -> Tensor[]",
      pt2);
  m.def(
      "jagged_index_select_2d_forward(Tensor values, Tensor indices, Tensor input_offsets, "
      "Tensor output_offsets, int num_dense_output_rows) -> Tensor",
      pt2);
  m.def(
      "jagged_index_select_2d_forward_v2(Tensor values, Tensor indices, Tensor input_offsets, "
      "Tensor output_offsets, int? num_dense_output_rows=None) -> Tensor",
      pt2);
  m.def(
      "jagged_index_add_2d_forward(Tensor values, Tensor indices, Tensor input_offsets, "
      "Tensor output_offsets, int num_dense_input_rows, int num_output_rows) -> Tensor",
      pt2);
  m.def(
      "jagged_index_add_2d_forward_v2(Tensor values, Tensor indices, Tensor input_offsets, "
      "Tensor output_offsets, SymInt num_output_rows, SymInt num_dense_input_rows) -> Tensor",
      pt2);
  m.def(
      "keyed_jagged_index_select_dim1(Tensor values, Tensor lengths, Tensor offsets, "
      "Tensor indices, SymInt batch_size, Tensor? weights=None, "
      "SymInt? selected_lengths_sum=None) -> Tensor[]",
      pt2);
  m.def(
      "jagged_unique_indices(Tensor hash_size_cumsum, Tensor hash_size_offsets, Tensor offsets, "
      "Tensor indices) -> (Tensor, Tensor, Tensor, Tensor)",
      pt2);

  m.impl("jagged_to_padded_dense", c10::DispatchKey::CompositeImplicitAutograd,
         TORCH_FN(recops::jagged::jagged_to_padded_dense<recops::jagged::kRecopsNamespace>));
  m.impl("dense_to_jagged", c10::DispatchKey::CompositeImplicitAutograd,
         TORCH_FN(recops::jagged::dense_to_jagged<recops::jagged::kRecopsNamespace>));
  m.impl("jagged_index_select", c10::DispatchKey::CompositeImplicitAutograd,
         TORCH_FN(recops::jagged::jagged_index_select<recops::jagged::kRecopsNamespace>));
}

TORCH_LIBRARY_IMPL(recops, CPU, m) {
  using namespace recops::jagged;
  m.impl("asynchronous_complete_cumsum", TORCH_FN(asynchronous_complete_cumsum));
  m.impl("asynchronous_exclusive_cumsum", TORCH_FN(asynchronous_exclusive_cumsum));
  m.impl("asynchronous_inclusive_cumsum", TORCH_FN(asynchronous_inclusive_cumsum));
  m.impl("jagged_to_padded_dense_forward", TORCH_FN(jagged_to_padded_dense_forward));
  m.impl("jagged_to_padded_dense_backward", TORCH_FN(jagged_to_padded_dense_backward));
  m.impl("dense_to_jagged_forward", TORCH_FN(dense_to_jagged_forward));
  m.impl("jagged_2d_to_dense", TORCH_FN(jagged_2d_to_dense));
  m.impl("jagged_1d_to_dense", TORCH_FN(jagged_1d_to_dense));
  m.impl("offsets_range", TORCH_FN(offsets_range));
  m.impl("asynchronous_batched_complete_cumsum", TORCH_FN(asynchronous_batched_complete_cumsum));
  m.impl("segment_sum_csr", TORCH_FN(segment_sum_csr));
  m.impl("jagged_index_select_2d_forward", TORCH_FN(jagged_index_select_2d_forward));
  m.impl("jagged_index_select_2d_forward_v2", TORCH_FN(jagged_index_select_2d_forward_v2));
  m.impl("jagged_index_add_2d_forward", TORCH_FN(jagged_index_add_2d_forward));
  m.impl("jagged_index_add_2d_forward_v2", TORCH_FN(jagged_index_add_2d_forward_v2));
  m.impl("keyed_jagged_index_select_dim1", TORCH_FN(keyed_jagged_index_select_dim1));
  m.impl("jagged_unique_indices", TORCH_FN(jagged_unique_indices));
}
