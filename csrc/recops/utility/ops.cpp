// Schemas (FBGEMM's, verbatim) and kernel registrations of the utility family in torch.ops.recops.
// Fake kernels are registered from Python (recops/operators/utility.py).
#include <torch/library.h>

#include "recops/utility/ops.h"

TORCH_LIBRARY_FRAGMENT(recops, m) {
  // The module where the fake kernels are registered.
  m.set_python_module("recops.operators.utility");
  const std::vector<at::Tag> pt2 = {at::Tag::pt2_compliant_tag};
  m.def("check_feature_gate_key(str key) -> bool", pt2);
  m.def("is_uvm_tensor(Tensor t) -> bool", pt2);
}

// No tensor argument to dispatch on: one kernel for every backend, as FBGEMM registers it.
TORCH_LIBRARY_IMPL(recops, CompositeImplicitAutograd, m) {
  m.impl("check_feature_gate_key", TORCH_FN(recops::utility::check_feature_gate_key));
}

TORCH_LIBRARY_IMPL(recops, CPU, m) {
  m.impl("is_uvm_tensor", TORCH_FN(recops::utility::is_uvm_tensor));
}
