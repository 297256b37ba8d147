// Schema and kernel registration of the retrieval family in torch.ops.recops. The fake kernel and
// the Python entry point live in recops/operators/retrieval.py.
#include <torch/library.h>

#include "recops/retrieval/ops.h"

TORCH_LIBRARY_FRAGMENT(recops, m) {
  m.set_python_module("recops.operators.retrieval");
  const std::vector<at::Tag> pt2 = {at::Tag::pt2_compliant_tag};
  m.def(
      "mips_topk(Tensor queries, Tensor candidates, int k, Tensor? excluded_offsets=None, "
      "Tensor? excluded=None) -> (Tensor values, Tensor indices)",
      pt2);
}

TORCH_LIBRARY_IMPL(recops, CPU, m) {
  m.impl("mips_topk", TORCH_FN(recops::retrieval::mips_topk));
}
