// Schemas and kernel registrations of the gather family in torch.ops.recops. Fake kernels and
// autograd formulas are registered from Python (recops/operators/gather.py).
#include <torch/library.h>

#include "recops/gather/ops.h"

TORCH_LIBRARY_FRAGMENT(recops, m) {
  // The module where the fake kernels and autograd are registered.
  m.set_python_module("recops.operators.gather");
  const std::vector<at::Tag> pt2 = {at::Tag::pt2_compliant_tag};
  m.def("gather_for_rank1(Tensor x, Tensor index) -> Tensor", pt2);
  m.def("index_select_for_rank1_backward(Tensor grad, Tensor x, Tensor index) -> Tensor", pt2);
  // FBGEMM's index_select_dim0 family, FBGEMM's schemas.
  m.def("group_index_select_dim0(Tensor[] input_group, Tensor[] indices_group) -> Tensor[]", pt2);
  m.def("group_index_select_dim0_gpu_impl(Tensor[] inputs, int group_size) -> Tensor[]", pt2);
  m.def(
      "group_index_select_dim0_gpu_backward(Tensor[] inputs, SymInt[] output_shape_group) -> "
      "Tensor[]",
      pt2);
  m.def(
      "batch_index_select_dim0(Tensor inputs, Tensor indices, SymInt[] input_num_indices, "
      "SymInt[] input_rows, SymInt[] input_columns, bool permute_output_dim_0_1=False) -> Tensor",
      pt2);
  m.def(
      "batch_index_select_dim0_tensor(Tensor inputs, Tensor indices, Tensor input_num_indices, "
      "Tensor input_rows, Tensor input_columns, bool permute_output_dim_0_1=False) -> Tensor",
      pt2);
  m.def(
      "batch_index_select_dim0_backward_cpu_impl(Tensor grad_output, Tensor indices, "
      "Tensor indices_numels, Tensor input_num_indices, Tensor input_rows, Tensor input_columns, "
      "bool permute_output_dim_0_1, Tensor saved_tensor) -> Tensor",
      pt2);
  // recops' own: the backward of batch_index_select_dim0 with the sizes as lists.
  m.def(
      "batch_index_select_dim0_backward(Tensor grad_output, Tensor indices, "
      "SymInt[] input_num_indices, SymInt[] input_rows, SymInt[] input_columns, "
      "bool permute_output_dim_0_1) -> Tensor",
      pt2);
}

TORCH_LIBRARY_IMPL(recops, CPU, m) {
  using namespace recops::gather;
  m.impl("gather_for_rank1", TORCH_FN(gather_for_rank1));
  m.impl("index_select_for_rank1_backward", TORCH_FN(index_select_for_rank1_backward));
  m.impl("group_index_select_dim0", TORCH_FN(group_index_select_dim0));
  m.impl("group_index_select_dim0_gpu_impl", TORCH_FN(group_index_select_dim0_gpu_impl));
  m.impl("group_index_select_dim0_gpu_backward", TORCH_FN(group_index_select_dim0_gpu_backward));
  m.impl("batch_index_select_dim0", TORCH_FN(batch_index_select_dim0));
  m.impl("batch_index_select_dim0_tensor", TORCH_FN(batch_index_select_dim0_tensor));
  m.impl("batch_index_select_dim0_backward_cpu_impl",
         TORCH_FN(batch_index_select_dim0_backward_cpu_impl));
  m.impl("batch_index_select_dim0_backward", TORCH_FN(batch_index_select_dim0_backward));
}
