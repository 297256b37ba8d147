// Schemas and kernel registrations of the gather family in torch.ops.recops. Fake kernels and
// autograd formulas are registered from Python (recops/gather.py).
#include <torch/library.h>

#include "recops/gather/ops.h"

TORCH_LIBRARY_FRAGMENT(recops, m) {
  m.set_python_module("recops.gather");  // where the fake kernels and autograd are registered
  const std::vector<at::Tag> pt2 = {at::Tag::pt2_compliant_tag};
  m.def("gather_for_rank1(Tensor x, Tensor index) -> Tensor", pt2);
  m.def("index_select_for_rank1_backward(Tensor grad, Tensor x, Tensor index) -> Tensor", pt2);
}

TORCH_LIBRARY_IMPL(recops, CPU, m) {
  using namespace recops::gather;
  m.impl("gather_for_rank1", TORCH_FN(gather_for_rank1));
  m.impl("index_select_for_rank1_backward", TORCH_FN(index_select_for_rank1_backward));
}
