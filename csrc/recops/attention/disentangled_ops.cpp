// Schemas and kernel registrations of DeBERTa disentangled attention in torch.ops.recops.
// Fake kernels, autograd, the Python entry and the module live in recops/deberta.py.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include "recops/attention/ops.h"

namespace recops::attention {
namespace {

#define RECOPS_DISENTANGLED_OPTION_ARGS                                                      \
  "str pos_att_type=\"c2p|p2c\", int position_buckets=256, int max_relative_positions=512, " \
  "float? scale=None, float dropout_p=0.0, int seed=0"

#define RECOPS_DISENTANGLED_SIGNATURE                                   \
  "(Tensor q, Tensor k, Tensor v, Tensor? pos_key, Tensor? pos_query, " \
  "Tensor? attention_mask=None, " RECOPS_DISENTANGLED_OPTION_ARGS       \
  ", bool return_probs=False) -> (Tensor, Tensor, Tensor?)"

using DisentangledResult = std::tuple<at::Tensor, at::Tensor, std::optional<at::Tensor>>;

DisentangledResult disentangled_forward_op(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const std::optional<at::Tensor>& pos_key, const std::optional<at::Tensor>& pos_query,
    const std::optional<at::Tensor>& attention_mask, c10::string_view pos_att_type,
    int64_t position_buckets, int64_t max_relative_positions, std::optional<double> scale,
    double dropout_p, int64_t seed, bool return_probs) {
  return disentangled_attention_forward(
      q, k, v, pos_key, pos_query, attention_mask,
      DisentangledOptions{std::string(pos_att_type), position_buckets, max_relative_positions,
                          scale, dropout_p, seed},
      return_probs);
}

// The seed's spelling: the same op through the dispatcher (so autograd, fake and compile see
// disentangled_attention).
DisentangledResult disetangle_alias_op(const at::Tensor& q, const at::Tensor& k,
                                       const at::Tensor& v,
                                       const std::optional<at::Tensor>& pos_key,
                                       const std::optional<at::Tensor>& pos_query,
                                       const std::optional<at::Tensor>& attention_mask,
                                       c10::string_view pos_att_type, int64_t position_buckets,
                                       int64_t max_relative_positions, std::optional<double> scale,
                                       double dropout_p, int64_t seed, bool return_probs) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("recops::disentangled_attention", "")
                             .typed<decltype(disentangled_forward_op)>();
  return op.call(q, k, v, pos_key, pos_query, attention_mask, pos_att_type, position_buckets,
                 max_relative_positions, scale, dropout_p, seed, return_probs);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, std::optional<at::Tensor>, std::optional<at::Tensor>>
disentangled_backward_op(const at::Tensor& grad_output, const std::optional<at::Tensor>& grad_probs,
                         const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const std::optional<at::Tensor>& pos_key,
                         const std::optional<at::Tensor>& pos_query,
                         const std::optional<at::Tensor>& attention_mask, const at::Tensor& output,
                         const at::Tensor& softmax_lse, const std::optional<at::Tensor>& probs,
                         c10::string_view pos_att_type, int64_t position_buckets,
                         int64_t max_relative_positions, std::optional<double> scale,
                         double dropout_p, int64_t seed) {
  return disentangled_attention_backward(
      grad_output, grad_probs, q, k, v, pos_key, pos_query, attention_mask, output, softmax_lse,
      probs,
      DisentangledOptions{std::string(pos_att_type), position_buckets, max_relative_positions,
                          scale, dropout_p, seed});
}

}  // namespace
}  // namespace recops::attention

TORCH_LIBRARY_FRAGMENT(recops, m) {
  const std::vector<at::Tag> pt2 = {at::Tag::pt2_compliant_tag};
  m.def("disentangled_attention" RECOPS_DISENTANGLED_SIGNATURE, pt2);
  m.def("disetangle_attention" RECOPS_DISENTANGLED_SIGNATURE, pt2);
  m.def(
      "disentangled_attention_backward(Tensor grad_output, Tensor? grad_probs, Tensor q, "
      "Tensor k, Tensor v, Tensor? pos_key, Tensor? pos_query, Tensor? attention_mask, "
      "Tensor output, Tensor softmax_lse, Tensor? probs, " RECOPS_DISENTANGLED_OPTION_ARGS
      ") -> (Tensor, Tensor, Tensor, Tensor?, Tensor?)",
      pt2);
}

TORCH_LIBRARY_IMPL(recops, CompositeImplicitAutograd, m) {
  m.impl("disetangle_attention", TORCH_FN(recops::attention::disetangle_alias_op));
}

TORCH_LIBRARY_IMPL(recops, CPU, m) {
  m.impl("disentangled_attention", TORCH_FN(recops::attention::disentangled_forward_op));
  m.impl("disentangled_attention_backward", TORCH_FN(recops::attention::disentangled_backward_op));
}
