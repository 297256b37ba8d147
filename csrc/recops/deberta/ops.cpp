// Schemas and kernel registrations of DeBERTa in torch.ops.recops: disentangled attention (its
// options declared once, in options.h; the kernels read arguments by name) and the one copy of
// HF's make_log_bucket_position (kernels/deberta_positions.h). Fake kernels, autograd, the Python
// entry and the module live in recops/operators/deberta.py.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <string>

#include "recops/deberta/ops.h"

namespace recops::attention {
namespace {

std::string forward_schema(const char* name) {
  return std::string(name) +
         "(Tensor q, Tensor k, Tensor v, Tensor? pos_key, Tensor? pos_query, "
         "Tensor? attention_mask=None, " +
         kDisentangledOptionArguments +
         ", bool return_probs=False) -> (Tensor output, Tensor softmax_lse, Tensor? probs)";
}

void disentangled_forward_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const NamedArgs args(op, *stack);
  auto results = disentangled_attention_forward(
      args.tensor("q"), args.tensor("k"), args.tensor("v"), args.optional_tensor("pos_key"),
      args.optional_tensor("pos_query"), args.optional_tensor("attention_mask"),
      read_disentangled_options(args), args.flag("return_probs"));
  return_result(op, stack, std::move(results));
}

// The seed's spelling: the same op through the dispatcher (so autograd, fake and compile see
// disentangled_attention), with the same arguments on the stack.
void disetangle_alias_kernel(const c10::OperatorHandle& /*alias*/, torch::jit::Stack* stack) {
  static const c10::OperatorHandle op =
      c10::Dispatcher::singleton().findSchemaOrThrow("recops::disentangled_attention", "");
  op.callBoxed(stack);
}

void disentangled_backward_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const NamedArgs args(op, *stack);
  auto grads = disentangled_attention_backward(
      args.tensor("grad_output"), args.optional_tensor("grad_probs"), args.tensor("q"),
      args.tensor("k"), args.tensor("v"), args.optional_tensor("pos_key"),
      args.optional_tensor("pos_query"), args.optional_tensor("attention_mask"),
      args.tensor("output"), args.tensor("softmax_lse"), args.optional_tensor("probs"),
      read_disentangled_options(args));
  return_result(op, stack, std::move(grads));
}

}  // namespace
}  // namespace recops::attention

TORCH_LIBRARY_FRAGMENT(recops, m) {
  // The module where the fake kernels and autograd are registered.
  m.set_python_module("recops.operators.deberta");
  using namespace recops::attention;
  const std::vector<at::Tag> pt2 = {at::Tag::pt2_compliant_tag};
  m.def(forward_schema("disentangled_attention").c_str(), pt2);
  m.def(forward_schema("disetangle_attention").c_str(), pt2);
  m.def((std::string("disentangled_attention_backward(Tensor grad_output, Tensor? grad_probs, "
                     "Tensor q, Tensor k, Tensor v, Tensor? pos_key, Tensor? pos_query, "
                     "Tensor? attention_mask, Tensor output, Tensor softmax_lse, Tensor? probs, ") +
         kDisentangledOptionArguments +
         ") -> (Tensor grad_q, Tensor grad_k, Tensor grad_v, Tensor? grad_pos_key, "
         "Tensor? grad_pos_query)")
            .c_str(),
        pt2);
  m.def(
      "deberta_log_bucket_position(Tensor relative_pos, int bucket_size, int max_position) -> "
      "Tensor",
      pt2);
}

TORCH_LIBRARY_IMPL(recops, CompositeImplicitAutograd, m) {
  m.impl("disetangle_attention", recops::boxed<&recops::attention::disetangle_alias_kernel>());
}

TORCH_LIBRARY_IMPL(recops, CPU, m) {
  using namespace recops::attention;
  m.impl("disentangled_attention", recops::boxed<&disentangled_forward_kernel>());
  m.impl("disentangled_attention_backward", recops::boxed<&disentangled_backward_kernel>());
  m.impl("deberta_log_bucket_position", TORCH_FN(deberta_log_bucket_position));
}
