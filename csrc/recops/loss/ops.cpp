// Schemas and kernel registrations of the loss family in torch.ops.recops, and its autograd
// (common/backward_op_autograd.h). Fake kernels and the Python entry point live in
// recops/operators/loss.py.
#include <torch/library.h>

#include "recops/common/backward_op_autograd.h"
#include "recops/loss/ops.h"

TORCH_LIBRARY_FRAGMENT(recops, m) {
  m.set_python_module("recops.operators.loss");
  const std::vector<at::Tag> pt2 = {at::Tag::pt2_compliant_tag};
  m.def(
      "sampled_softmax_loss(Tensor queries, Tensor positives, Tensor positive_ids, "
      "Tensor negatives, Tensor negative_ids, Tensor weights, float temperature, "
      "float eps=1e-6) -> Tensor",
      pt2);
  m.def(
      "sampled_softmax_loss_backward(Tensor grad_output, Tensor queries, Tensor positives, "
      "Tensor positive_ids, Tensor negatives, Tensor negative_ids, Tensor weights, "
      "float temperature, float eps=1e-6) "
      "-> (Tensor grad_queries, Tensor grad_positives, Tensor grad_negatives)",
      pt2);
}

TORCH_LIBRARY_IMPL(recops, CPU, m) {
  m.impl("sampled_softmax_loss", TORCH_FN(recops::loss::sampled_softmax_loss));
  m.impl("sampled_softmax_loss_backward", TORCH_FN(recops::loss::sampled_softmax_loss_backward));
}

TORCH_LIBRARY_IMPL(recops, Autograd, m) {
  m.impl("sampled_softmax_loss",
         recops::autograd_by_backward_op("recops::sampled_softmax_loss_backward"));
}
