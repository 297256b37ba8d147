// Schemas (FBGEMM's, verbatim) and kernel registrations of the sparse family in torch.ops.recops.
// Fake kernels and autograd formulas are registered from Python (recops/operators/sparse.py).
#include <torch/library.h>

#include <string>

#include "recops/sparse/ops.h"

namespace {
// One schema and kernel; the _auto_grad ones get their autograd formula in
// recops/operators/sparse.py.
constexpr const char* kPermutePooledEmbs[] = {
    "permute_pooled_embs",
    "permute_pooled_embs_split",
    "permute_pooled_embs_auto_grad",
    "permute_pooled_embs_auto_grad_split",
};
}  // namespace

TORCH_LIBRARY_FRAGMENT(recops, m) {
  // The module where the fake kernels and autograd are registered.
  m.set_python_module("recops.operators.sparse");
  const std::vector<at::Tag> pt2 = {at::Tag::pt2_compliant_tag};
  m.def(
      "permute_2D_sparse_data(Tensor permute, Tensor lengths, Tensor values, "
      "Tensor? weights=None, SymInt? permuted_lengths_sum=None) -> (Tensor, Tensor, Tensor?)",
      pt2);
  m.def(
      "permute_1D_sparse_data(Tensor permute, Tensor lengths, Tensor values, "
      "Tensor? weights=None, SymInt? permuted_lengths_sum=None) -> (Tensor, Tensor, Tensor?)",
      pt2);
  m.def("invert_permute(Tensor permute) -> Tensor", pt2);
  m.def(
      "block_bucketize_sparse_features(Tensor lengths, Tensor indices, bool bucketize_pos, "
      "bool sequence, Tensor block_sizes, SymInt my_size, Tensor? weights=None, "
      "Tensor? batch_size_per_feature=None, SymInt max_B=-1, Tensor[]? block_bucketize_pos=None, "
      "bool keep_orig_idx=False, Tensor? total_num_blocks=None, "
      "Tensor? keep_orig_idx_per_feature=None) -> (Tensor, Tensor, Tensor?, Tensor?, Tensor?)",
      pt2);
  m.def(
      "block_bucketize_sparse_features_inference(Tensor lengths, Tensor indices, "
      "bool bucketize_pos, bool sequence, Tensor block_sizes, SymInt my_size, "
      "Tensor? weights=None, Tensor? batch_size_per_feature=None, SymInt max_B=-1, "
      "Tensor[]? block_bucketize_pos=None, bool return_bucket_mapping=False, "
      "bool keep_orig_idx=False, Tensor? total_num_blocks=None, "
      "Tensor? keep_orig_idx_per_feature=None) "
      "-> (Tensor, Tensor, Tensor?, Tensor?, Tensor?, Tensor?)",
      pt2);
  m.def(
      "permute_sparse_features(Tensor permute, Tensor lengths, Tensor indices, "
      "Tensor? weights=None) -> (Tensor, Tensor, Tensor?)",
      pt2);
  m.def(
      "permute_2D_sparse_data_input1D(Tensor permute, Tensor lengths, Tensor values, "
      "SymInt stride, Tensor? weights=None, SymInt? permuted_lengths_sum=None) "
      "-> (Tensor, Tensor, Tensor?)",
      pt2);
  m.def(
      "permute_2D_sparse_preallocated_out(Tensor permute, Tensor lengths, Tensor values, "
      "Tensor? weights=None, SymInt? permuted_lengths_sum=None, "
      "Tensor(a!)? permuted_lengths_out=None, Tensor(b!)? permuted_indices_out=None, "
      "Tensor(c!)? permuted_weights_out=None) -> (Tensor(a!), Tensor(b!), Tensor(c!)?)",
      pt2);
  m.def(
      "expand_into_jagged_permute(Tensor permute, Tensor input_offset, Tensor output_offset, "
      "SymInt output_size) -> Tensor",
      pt2);
  for (const char* name : kPermutePooledEmbs) {
    m.def((std::string(name) + "(Tensor pooled_embs, Tensor offset_dim_list, Tensor permute_list, "
                               "Tensor inv_offset_dim_list, Tensor inv_permute_list) -> Tensor")
              .c_str(),
          pt2);
  }
}

TORCH_LIBRARY_IMPL(recops, CPU, m) {
  using namespace recops::sparse;
  m.impl("permute_2D_sparse_data", TORCH_FN(permute_2D_sparse_data));
  m.impl("permute_1D_sparse_data", TORCH_FN(permute_1D_sparse_data));
  m.impl("invert_permute", TORCH_FN(invert_permute));
  m.impl("block_bucketize_sparse_features", TORCH_FN(block_bucketize_sparse_features));
  m.impl("block_bucketize_sparse_features_inference",
         TORCH_FN(block_bucketize_sparse_features_inference));
  m.impl("permute_sparse_features", TORCH_FN(permute_sparse_features));
  m.impl("permute_2D_sparse_data_input1D", TORCH_FN(permute_2D_sparse_data_input1D));
  m.impl("permute_2D_sparse_preallocated_out", TORCH_FN(permute_2D_sparse_preallocated_out));
  m.impl("expand_into_jagged_permute", TORCH_FN(expand_into_jagged_permute));
  for (const char* name : kPermutePooledEmbs) m.impl(name, TORCH_FN(permute_pooled_embs));
}
