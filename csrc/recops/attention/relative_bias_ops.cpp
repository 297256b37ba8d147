// Schemas and kernel registrations of the relative attention bias in torch.ops.recops.
// Fake kernels, autograd and the module are registered from Python (recops/relative_bias.py).
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include "recops/attention/ops.h"

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

}  // namespace
}  // namespace recops::attention

TORCH_LIBRARY_FRAGMENT(recops, m) {
  m.set_python_module(
      "recops.relative_bias");  // where the fake kernels and autograd are registered
  const std::vector<at::Tag> pt2 = {at::Tag::pt2_compliant_tag};
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
}

TORCH_LIBRARY_IMPL(recops, CPU, m) {
  using namespace recops::attention;
  m.impl("relative_attn_bias_time_forward", TORCH_FN(relative_attn_bias_time_forward));
  m.impl("relative_attn_bias_pos", TORCH_FN(relative_attn_bias_pos));
  m.impl("relative_attn_bias_backward", TORCH_FN(relative_attn_bias_backward));
}
