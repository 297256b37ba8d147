// Schemas (FBGEMM's, verbatim) and kernel registrations of the keyed family in torch.ops.recops.
// Fake kernels and autograd formulas are registered from Python (recops/operators/keyed.py).
#include <torch/library.h>

#include "recops/keyed/ops.h"

TORCH_LIBRARY_FRAGMENT(recops, m) {
  // The module where the fake kernels and autograd are registered.
  m.set_python_module("recops.operators.keyed");
  const std::vector<at::Tag> pt2 = {at::Tag::pt2_compliant_tag};
  m.def(
      "merge_pooled_embeddings(Tensor[] pooled_embeddings, SymInt uncat_dim_size, "
      "Device target_device, SymInt cat_dim=1) -> Tensor",
      pt2);
  m.def(
      "permute_multi_embedding_function(Tensor[] pooled_embs, Tensor permutes, Tensor in_shapes, "
      "Tensor out_shapes, SymInt[] out_lengths, bool reverse=False) -> Tensor[]",
      pt2);
  m.def(
      "permute_multi_embedding(Tensor[] pooled_embs, Tensor permutes, Tensor in_shapes, "
      "Tensor out_shapes, SymInt[] out_lengths) -> Tensor[]",
      pt2);
  m.def(
      "kt_regroup_arguments(Tensor embs, str[][] keys, int[][] lengths, str[][] groups) "
      "-> (Tensor, Tensor, Tensor, int[])",
      pt2);
  m.def(
      "regroup_keyed_tensor(Tensor[] pooled_embs, str[][] keys, int[][] lengths, "
      "str[][] groups) -> Tensor[]",
      pt2);
}

TORCH_LIBRARY_IMPL(recops, CPU, m) {
  using namespace recops::keyed;
  m.impl("merge_pooled_embeddings", TORCH_FN(merge_pooled_embeddings));
  m.impl("permute_multi_embedding_function", TORCH_FN(permute_multi_embedding_function));
  m.impl("permute_multi_embedding", TORCH_FN(permute_multi_embedding));
  m.impl("kt_regroup_arguments", TORCH_FN(kt_regroup_arguments));
  m.impl("regroup_keyed_tensor", TORCH_FN(regroup_keyed_tensor));
}

// The ops whose only tensors come in a list: a call with an empty list has no device to dispatch
// on and lands here, where the CPU kernel's first check names the argument (instead of the
// dispatcher's "no tensor arguments" error).
TORCH_LIBRARY_IMPL(recops, CompositeExplicitAutograd, m) {
  using namespace recops::keyed;
  m.impl("merge_pooled_embeddings", TORCH_FN(merge_pooled_embeddings));
  m.impl("regroup_keyed_tensor", TORCH_FN(regroup_keyed_tensor));
}
