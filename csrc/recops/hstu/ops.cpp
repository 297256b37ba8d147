// Schemas and kernel registrations of the HSTU family in torch.ops.recops: the relative attention
// bias, HSTU and FuXi-alpha attention, and their delta steps (serving). The attention ops'
// arguments are declared once, in options.h; their kernels read them by name. The attention ops'
// autograd is bound here (common/backward_op_autograd.h); the relative bias ops' autograd, fake
// kernels and the Python entry points live in recops/operators/relative_bias.py,
// recops/operators/hstu.py and recops/operators/fuxi.py.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <string>

#include "recops/common/backward_op_autograd.h"
#include "recops/hstu/delta.h"
#include "recops/hstu/ops.h"

namespace recops::attention {
namespace {

// The public time-bias ops are composites of relative_attn_bias_time_forward, called through the
// dispatcher so that autograd (which saves its bucket index for the backward) and exported graphs
// see that one op.
std::tuple<at::Tensor, at::Tensor> time_forward(
    const at::Tensor& timestamps, const at::Tensor& ts_w, const std::optional<at::Tensor>& pos_w,
    const std::optional<at::Tensor>& seq_offsets, std::optional<c10::SymInt> max_seq_len,
    double bucket_divisor, bool query_time_shift, at::ScalarType index_dtype) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("recops::relative_attn_bias_time_forward", "")
                             .typed<std::tuple<at::Tensor, at::Tensor>(
                                 const at::Tensor&, const at::Tensor&,
                                 const std::optional<at::Tensor>&, const std::optional<at::Tensor>&,
                                 std::optional<c10::SymInt>, double, bool, at::ScalarType)>();
  return op.call(timestamps, ts_w, pos_w, seq_offsets, std::move(max_seq_len), bucket_divisor,
                 query_time_shift, index_dtype);
}

// Without an index output the bucket index only feeds the backward: the narrowest dtype does.
at::Tensor relative_attn_bias_time(const at::Tensor& timestamps, const at::Tensor& ts_w,
                                   const std::optional<at::Tensor>& pos_w,
                                   const std::optional<at::Tensor>& seq_offsets,
                                   std::optional<c10::SymInt> max_seq_len, double bucket_divisor,
                                   bool query_time_shift) {
  // (A malformed ts_w is reported by the forward op.)
  const int64_t num_buckets =
      ts_w.dim() >= 1 ? ts_w.sym_size(-1).guard_int(__FILE__, __LINE__) - 1 : 0;
  return std::get<0>(time_forward(timestamps, ts_w, pos_w, seq_offsets, std::move(max_seq_len),
                                  bucket_divisor, query_time_shift,
                                  compact_bucket_type(num_buckets)));
}

std::tuple<at::Tensor, at::Tensor> relative_attn_bias_time_with_index(
    const at::Tensor& timestamps, const at::Tensor& ts_w, const std::optional<at::Tensor>& pos_w,
    const std::optional<at::Tensor>& seq_offsets, std::optional<c10::SymInt> max_seq_len,
    double bucket_divisor, bool query_time_shift) {
  return time_forward(timestamps, ts_w, pos_w, seq_offsets, std::move(max_seq_len), bucket_divisor,
                      query_time_shift, at::kLong);
}

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

DeltaKeys delta_keys(const NamedArgs& args) {
  return {args.tensor("delta_offsets"), args.optional_tensor("seq_offsets"),
          args.optional_tensor("page_table"), args.optional_tensor("seq_lengths")};
}

void hstu_delta_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const NamedArgs args(op, *stack);
  at::Tensor out = hstu_delta_attention(args.tensor("q"), args.tensor("k"), args.tensor("v"),
                                        delta_keys(args), read_hstu_options(args));
  return_result(op, stack, std::move(out));
}

void fuxi_delta_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const NamedArgs args(op, *stack);
  at::Tensor out = fuxi_delta_attention(args.tensor("q"), args.tensor("k"), args.tensor("v"),
                                        delta_keys(args), read_fuxi_options(args));
  return_result(op, stack, std::move(out));
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
  // Each group names the Python module that registers its fake kernels and autograd.
  m.set_python_module("recops.operators.relative_bias");
  m.def(
      "relative_attn_bias_time(Tensor timestamps, Tensor ts_w, Tensor? pos_w=None, "
      "Tensor? seq_offsets=None, SymInt? max_seq_len=None, float bucket_divisor=0.301, "
      "bool query_time_shift=True) -> Tensor",
      pt2);
  m.def(
      "relative_attn_bias_time_with_index(Tensor timestamps, Tensor ts_w, Tensor? pos_w=None, "
      "Tensor? seq_offsets=None, SymInt? max_seq_len=None, float bucket_divisor=0.301, "
      "bool query_time_shift=True) -> (Tensor, Tensor)",
      pt2);
  m.def(
      "relative_attn_bias_time_forward(Tensor timestamps, Tensor ts_w, Tensor? pos_w, "
      "Tensor? seq_offsets, SymInt? max_seq_len, float bucket_divisor, bool query_time_shift, "
      "ScalarType index_dtype) -> (Tensor, Tensor)",
      pt2);
  m.def("relative_attn_bias_pos(Tensor pos_w, SymInt? max_seq_len=None) -> Tensor", pt2);
  m.def(
      "relative_attn_bias_backward(Tensor grad_bias, Tensor? timestamps=None, "
      "Tensor? bucket_index=None, Tensor? seq_offsets=None, int num_buckets=128, "
      "float bucket_divisor=0.301, bool query_time_shift=True, bool pos_grad=False) "
      "-> (Tensor?, Tensor?)",
      pt2);

  m.impl("relative_attn_bias_time", c10::DispatchKey::CompositeImplicitAutograd,
         TORCH_FN(recops::attention::relative_attn_bias_time));
  m.impl("relative_attn_bias_time_with_index", c10::DispatchKey::CompositeImplicitAutograd,
         TORCH_FN(recops::attention::relative_attn_bias_time_with_index));

  m.set_python_module("recops.operators.hstu");
  m.def((std::string("hstu_dense_forward(") + kHstuArguments + ") -> Tensor").c_str(), pt2);
  m.def(backward_schema("hstu_dense_backward", kHstuArguments,
                        "(Tensor grad_q, Tensor grad_k, Tensor grad_v, Tensor? grad_attn_bias, "
                        "Tensor? grad_ts_w, Tensor? grad_pos_w)")
            .c_str(),
        pt2);
  m.def((std::string("hstu_delta_attention(") + kDeltaArguments + ") -> Tensor").c_str(), pt2);
  m.set_python_module("recops.operators.fuxi");
  m.def((std::string("fuxi_delta_attention(") + kDeltaArguments +
         ", bool reference_layout=False) -> Tensor")
            .c_str(),
        pt2);
  m.def((std::string("hstu_dense_forward_fuxi(") + kFuxiArguments + ") -> Tensor").c_str(), pt2);
  m.def(backward_schema("hstu_dense_backward_fuxi", kFuxiArguments,
                        "(Tensor grad_q, Tensor grad_k, Tensor grad_v, Tensor? grad_ts_bias, "
                        "Tensor? grad_pos_bias, Tensor? grad_ts_w, Tensor? grad_pos_w)")
            .c_str(),
        pt2);
}

TORCH_LIBRARY_IMPL(recops, CPU, m) {
  using namespace recops::attention;
  m.impl("relative_attn_bias_time_forward", TORCH_FN(relative_attn_bias_time_forward));
  m.impl("relative_attn_bias_pos", TORCH_FN(relative_attn_bias_pos));
  m.impl("relative_attn_bias_backward", TORCH_FN(relative_attn_bias_backward));
  m.impl("hstu_dense_forward", recops::boxed<&hstu_forward_kernel>());
  m.impl("hstu_dense_backward", recops::boxed<&hstu_backward_kernel>());
  m.impl("hstu_dense_forward_fuxi", recops::boxed<&fuxi_forward_kernel>());
  m.impl("hstu_dense_backward_fuxi", recops::boxed<&fuxi_backward_kernel>());
  m.impl("hstu_delta_attention", recops::boxed<&hstu_delta_kernel>());
  m.impl("fuxi_delta_attention", recops::boxed<&fuxi_delta_kernel>());
}

TORCH_LIBRARY_IMPL(recops, Autograd, m) {
  m.impl("hstu_dense_forward", recops::autograd_by_backward_op("recops::hstu_dense_backward"));
  m.impl("hstu_dense_forward_fuxi",
         recops::autograd_by_backward_op("recops::hstu_dense_backward_fuxi"));
}
