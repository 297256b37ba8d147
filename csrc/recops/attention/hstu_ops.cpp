// Schemas and kernel registrations of HSTU and FuXi-alpha attention in torch.ops.recops. The
// arguments are declared once, in hstu_options.h; the kernels read them by name. Fake kernels,
// autograd and the Python entry points live in recops/hstu.py and recops/fuxi.py.
#include <torch/library.h>

#include <string>

#include "recops/attention/ops.h"

namespace recops::attention {
namespace {

void hstu_forward_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const NamedArgs args(op, *stack);
  at::Tensor out = hstu_dense_forward(args.tensor("q"), args.tensor("k"), args.tensor("v"),
                                      args.tensor("seq_offsets"),
                                      args.optional_tensor("seq_lengths"), read_hstu_options(args));
  return_result(op, stack, std::move(out));
}

void hstu_backward_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const NamedArgs args(op, *stack);
  auto grads = hstu_dense_backward(args.tensor("grad_output"), args.tensor("q"), args.tensor("k"),
                                   args.tensor("v"), args.tensor("seq_offsets"),
                                   args.optional_tensor("seq_lengths"), read_hstu_options(args));
  return_result(op, stack, std::move(grads));
}

void fuxi_forward_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const NamedArgs args(op, *stack);
  at::Tensor out = hstu_dense_forward_fuxi(
      args.tensor("q"), args.tensor("k"), args.tensor("v"), args.tensor("seq_offsets"),
      args.optional_tensor("seq_lengths"), read_fuxi_options(args));
  return_result(op, stack, std::move(out));
}

void fuxi_backward_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const NamedArgs args(op, *stack);
  auto grads = hstu_dense_backward_fuxi(
      args.tensor("grad_output"), args.tensor("q"), args.tensor("k"), args.tensor("v"),
      args.tensor("seq_offsets"), args.optional_tensor("seq_lengths"), read_fuxi_options(args));
  return_result(op, stack, std::move(grads));
}

// A backward takes grad_output followed by its forward's arguments; it returns grad_<name> for
// each differentiable input <name> (recops/_autograd.py maps them back by name).
std::string backward_schema(const char* name, const char* forward_arguments, const char* returns) {
  return std::string(name) + "(Tensor grad_output, " + forward_arguments + ") -> " + returns;
}

}  // namespace
}  // namespace recops::attention

TORCH_LIBRARY_FRAGMENT(recops, m) {
  using namespace recops::attention;
  const std::vector<at::Tag> pt2 = {at::Tag::pt2_compliant_tag};
  m.set_python_module("recops.hstu");  // where the fake kernels and autograd are registered
  m.def((std::string("hstu_dense_forward(") + kHstuArguments + ") -> Tensor").c_str(), pt2);
  m.def(backward_schema("hstu_dense_backward", kHstuArguments,
                        "(Tensor grad_q, Tensor grad_k, Tensor grad_v, Tensor? grad_attn_bias, "
                        "Tensor? grad_ts_w, Tensor? grad_pos_w)")
            .c_str(),
        pt2);
  m.set_python_module("recops.fuxi");
  m.def((std::string("hstu_dense_forward_fuxi(") + kFuxiArguments + ") -> Tensor").c_str(), pt2);
  m.def(backward_schema("hstu_dense_backward_fuxi", kFuxiArguments,
                        "(Tensor grad_q, Tensor grad_k, Tensor grad_v, Tensor? grad_ts_bias, "
                        "Tensor? grad_pos_bias, Tensor? grad_ts_w, Tensor? grad_pos_w)")
            .c_str(),
        pt2);
}

TORCH_LIBRARY_IMPL(recops, CPU, m) {
  using namespace recops::attention;
  m.impl("hstu_dense_forward", recops::boxed<&hstu_forward_kernel>());
  m.impl("hstu_dense_backward", recops::boxed<&hstu_backward_kernel>());
  m.impl("hstu_dense_forward_fuxi", recops::boxed<&fuxi_forward_kernel>());
  m.impl("hstu_dense_backward_fuxi", recops::boxed<&fuxi_backward_kernel>());
}
