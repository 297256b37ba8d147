// Schemas and kernel registrations of the layer family in torch.ops.recops: the counter-based
// dropout and the fused input projection and output of an HSTU / FuXi-alpha layer, their
// backwards and the autograd that binds them (common/backward_op_autograd.h). Fake kernels, the
// dropout's autograd and the Python entry points live in recops/operators/layer.py.
#include <torch/library.h>

#include "recops/common/backward_op_autograd.h"
#include "recops/layer/ops.h"

TORCH_LIBRARY_FRAGMENT(recops, m) {
  m.set_python_module("recops.operators.layer");
  const std::vector<at::Tag> pt2 = {at::Tag::pt2_compliant_tag};
  m.def("counter_dropout(Tensor x, float p, Tensor seed, int offset=0) -> Tensor", pt2);
  m.def(
      "hstu_layer_output(Tensor x, Tensor u, Tensor attn, Tensor weight, Tensor? bias, "
      "str norm=\"layer_norm\", float eps=1e-6, float dropout_p=0., Tensor? seed=None, int "
      "offset=0) "
      "-> Tensor",
      pt2);
  m.def(
      "hstu_layer_input(Tensor x, Tensor weight, Tensor? bias, str norm=\"layer_norm\", "
      "float eps=1e-6, int[] split=[]) -> Tensor[]",
      pt2);
  m.def(
      "hstu_layer_input_backward(Tensor[] grad_output, Tensor x, Tensor weight, Tensor? bias, "
      "str norm=\"layer_norm\", float eps=1e-6, int[] split=[]) "
      "-> (Tensor grad_x, Tensor grad_weight, Tensor? grad_bias)",
      pt2);
  // A backward takes grad_output followed by its forward's arguments and names its results
  // grad_<input>; x's gradient is grad_output itself.
  m.def(
      "hstu_layer_output_backward(Tensor grad_output, Tensor x, Tensor u, Tensor attn, "
      "Tensor weight, Tensor? bias, str norm=\"layer_norm\", float eps=1e-6, "
      "float dropout_p=0., Tensor? seed=None, int offset=0) "
      "-> (Tensor grad_u, Tensor grad_attn, Tensor grad_weight, Tensor? grad_bias)",
      pt2);
  m.def(
      "positional_input_features(Tensor x, Tensor positions, Tensor position_weight, float "
      "scale, float dropout_p=0., Tensor? seed=None, int offset=0) -> Tensor",
      pt2);
  m.def(
      "positional_input_features_backward(Tensor grad_output, Tensor x, Tensor positions, "
      "Tensor position_weight, float scale, float dropout_p=0., Tensor? seed=None, int offset=0) "
      "-> (Tensor grad_x, Tensor grad_position_weight)",
      pt2);
  m.def("l2_normalize(Tensor x, float eps=1e-6) -> Tensor", pt2);
  m.def("l2_normalize_backward(Tensor grad_output, Tensor x, float eps=1e-6) -> Tensor grad_x",
        pt2);
  m.def(
      "fuxi_layer_ffn(Tensor x, Tensor gate, Tensor up, Tensor down, str norm=\"rms_norm\", "
      "float eps=1e-6, float dropout_p=0., Tensor? seed=None, int offset=0) -> Tensor",
      pt2);
  m.def(
      "fuxi_layer_ffn_backward(Tensor grad_output, Tensor x, Tensor gate, Tensor up, "
      "Tensor down, str norm=\"rms_norm\", float eps=1e-6, float dropout_p=0., "
      "Tensor? seed=None, int offset=0) "
      "-> (Tensor grad_x, Tensor grad_gate, Tensor grad_up, Tensor grad_down)",
      pt2);
}

TORCH_LIBRARY_IMPL(recops, CPU, m) {
  m.impl("counter_dropout", TORCH_FN(recops::layer::counter_dropout));
  m.impl("hstu_layer_input", TORCH_FN(recops::layer::hstu_layer_input));
  m.impl("hstu_layer_input_backward", TORCH_FN(recops::layer::hstu_layer_input_backward));
  m.impl("hstu_layer_output", TORCH_FN(recops::layer::hstu_layer_output));
  m.impl("hstu_layer_output_backward", TORCH_FN(recops::layer::hstu_layer_output_backward));
  m.impl("positional_input_features", TORCH_FN(recops::layer::positional_input_features));
  m.impl("positional_input_features_backward",
         TORCH_FN(recops::layer::positional_input_features_backward));
  m.impl("l2_normalize", TORCH_FN(recops::layer::l2_normalize));
  m.impl("l2_normalize_backward", TORCH_FN(recops::layer::l2_normalize_backward));
  m.impl("fuxi_layer_ffn", TORCH_FN(recops::layer::fuxi_layer_ffn));
  m.impl("fuxi_layer_ffn_backward", TORCH_FN(recops::layer::fuxi_layer_ffn_backward));
}

TORCH_LIBRARY_IMPL(recops, Autograd, m) {
  using recops::autograd_by_backward_op;
  m.impl("hstu_layer_input", autograd_by_backward_op("recops::hstu_layer_input_backward"));
  // The residual: d out / d x is the identity.
  m.impl("hstu_layer_output", autograd_by_backward_op("recops::hstu_layer_output_backward", {"x"}));
  m.impl("positional_input_features",
         autograd_by_backward_op("recops::positional_input_features_backward"));
  m.impl("l2_normalize", autograd_by_backward_op("recops::l2_normalize_backward"));
  m.impl("fuxi_layer_ffn", autograd_by_backward_op("recops::fuxi_layer_ffn_backward"));
}
