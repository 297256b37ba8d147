// Schemas and kernel registrations of HSTU and FuXi-alpha attention in torch.ops.recops.
// Fake kernels, autograd and the Python entry points live in recops/hstu.py and recops/fuxi.py.
#include <torch/library.h>

#include "recops/attention/ops.h"

namespace recops::attention {
namespace {

#define RECOPS_HSTU_OPTION_ARGS                                                                 \
  "SymInt max_seq_len, float alpha, float silu_scale, str mask_type, int contextual_seq_len, "  \
  "Tensor? num_targets, int target_group_size, int max_attn_len, Tensor? custom_mask, "         \
  "Tensor? attn_bias, Tensor? timestamps, Tensor? ts_w, Tensor? pos_w, bool query_time_shift, " \
  "float bucket_divisor"

HstuOptions make_options(int64_t max_seq_len, double alpha, double silu_scale,
                         c10::string_view mask_type, int64_t contextual_seq_len,
                         const std::optional<at::Tensor>& num_targets, int64_t target_group_size,
                         int64_t max_attn_len, const std::optional<at::Tensor>& custom_mask,
                         const std::optional<at::Tensor>& attn_bias,
                         const std::optional<at::Tensor>& timestamps,
                         const std::optional<at::Tensor>& ts_w,
                         const std::optional<at::Tensor>& pos_w, bool query_time_shift,
                         double bucket_divisor) {
  return HstuOptions{max_seq_len,
                     alpha,
                     silu_scale,
                     std::string(mask_type),
                     contextual_seq_len,
                     num_targets,
                     target_group_size,
                     max_attn_len,
                     custom_mask,
                     attn_bias,
                     timestamps,
                     ts_w,
                     pos_w,
                     query_time_shift,
                     bucket_divisor};
}

at::Tensor hstu_forward_op(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& seq_offsets,
    const std::optional<at::Tensor>& seq_lengths, int64_t max_seq_len, double alpha,
    double silu_scale, c10::string_view mask_type, int64_t contextual_seq_len,
    const std::optional<at::Tensor>& num_targets, int64_t target_group_size, int64_t max_attn_len,
    const std::optional<at::Tensor>& custom_mask, const std::optional<at::Tensor>& attn_bias,
    const std::optional<at::Tensor>& timestamps, const std::optional<at::Tensor>& ts_w,
    const std::optional<at::Tensor>& pos_w, bool query_time_shift, double bucket_divisor) {
  return hstu_dense_forward(
      q, k, v, seq_offsets, seq_lengths,
      make_options(max_seq_len, alpha, silu_scale, mask_type, contextual_seq_len, num_targets,
                   target_group_size, max_attn_len, custom_mask, attn_bias, timestamps, ts_w, pos_w,
                   query_time_shift, bucket_divisor));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, std::optional<at::Tensor>, std::optional<at::Tensor>,
           std::optional<at::Tensor>>
hstu_backward_op(const at::Tensor& grad_output, const at::Tensor& q, const at::Tensor& k,
                 const at::Tensor& v, const at::Tensor& seq_offsets,
                 const std::optional<at::Tensor>& seq_lengths, int64_t max_seq_len, double alpha,
                 double silu_scale, c10::string_view mask_type, int64_t contextual_seq_len,
                 const std::optional<at::Tensor>& num_targets, int64_t target_group_size,
                 int64_t max_attn_len, const std::optional<at::Tensor>& custom_mask,
                 const std::optional<at::Tensor>& attn_bias,
                 const std::optional<at::Tensor>& timestamps, const std::optional<at::Tensor>& ts_w,
                 const std::optional<at::Tensor>& pos_w, bool query_time_shift,
                 double bucket_divisor) {
  return hstu_dense_backward(
      grad_output, q, k, v, seq_offsets, seq_lengths,
      make_options(max_seq_len, alpha, silu_scale, mask_type, contextual_seq_len, num_targets,
                   target_group_size, max_attn_len, custom_mask, attn_bias, timestamps, ts_w, pos_w,
                   query_time_shift, bucket_divisor));
}

#define RECOPS_FUXI_OPTION_ARGS                                                                \
  "SymInt max_seq_len, float alpha, float silu_scale, str mask_type, int contextual_seq_len, " \
  "Tensor? num_targets, int target_group_size, int max_attn_len, Tensor? custom_mask, "        \
  "Tensor? ts_bias, Tensor? pos_bias, Tensor? timestamps, Tensor? ts_w, Tensor? pos_w, "       \
  "bool query_time_shift, float bucket_divisor, bool reference_layout"

FuxiOptions make_fuxi_options(
    int64_t max_seq_len, double alpha, double silu_scale, c10::string_view mask_type,
    int64_t contextual_seq_len, const std::optional<at::Tensor>& num_targets,
    int64_t target_group_size, int64_t max_attn_len, const std::optional<at::Tensor>& custom_mask,
    const std::optional<at::Tensor>& ts_bias, const std::optional<at::Tensor>& pos_bias,
    const std::optional<at::Tensor>& timestamps, const std::optional<at::Tensor>& ts_w,
    const std::optional<at::Tensor>& pos_w, bool query_time_shift, double bucket_divisor,
    bool reference_layout) {
  return FuxiOptions{
      make_options(max_seq_len, alpha, silu_scale, mask_type, contextual_seq_len, num_targets,
                   target_group_size, max_attn_len, custom_mask, std::nullopt, timestamps, ts_w,
                   pos_w, query_time_shift, bucket_divisor),
      ts_bias, pos_bias, reference_layout};
}

at::Tensor fuxi_forward_op(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& seq_offsets,
    const std::optional<at::Tensor>& seq_lengths, int64_t max_seq_len, double alpha,
    double silu_scale, c10::string_view mask_type, int64_t contextual_seq_len,
    const std::optional<at::Tensor>& num_targets, int64_t target_group_size, int64_t max_attn_len,
    const std::optional<at::Tensor>& custom_mask, const std::optional<at::Tensor>& ts_bias,
    const std::optional<at::Tensor>& pos_bias, const std::optional<at::Tensor>& timestamps,
    const std::optional<at::Tensor>& ts_w, const std::optional<at::Tensor>& pos_w,
    bool query_time_shift, double bucket_divisor, bool reference_layout) {
  return hstu_dense_forward_fuxi(
      q, k, v, seq_offsets, seq_lengths,
      make_fuxi_options(max_seq_len, alpha, silu_scale, mask_type, contextual_seq_len, num_targets,
                        target_group_size, max_attn_len, custom_mask, ts_bias, pos_bias, timestamps,
                        ts_w, pos_w, query_time_shift, bucket_divisor, reference_layout));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, std::optional<at::Tensor>, std::optional<at::Tensor>,
           std::optional<at::Tensor>, std::optional<at::Tensor>>
fuxi_backward_op(const at::Tensor& grad_output, const at::Tensor& q, const at::Tensor& k,
                 const at::Tensor& v, const at::Tensor& seq_offsets,
                 const std::optional<at::Tensor>& seq_lengths, int64_t max_seq_len, double alpha,
                 double silu_scale, c10::string_view mask_type, int64_t contextual_seq_len,
                 const std::optional<at::Tensor>& num_targets, int64_t target_group_size,
                 int64_t max_attn_len, const std::optional<at::Tensor>& custom_mask,
                 const std::optional<at::Tensor>& ts_bias,
                 const std::optional<at::Tensor>& pos_bias,
                 const std::optional<at::Tensor>& timestamps, const std::optional<at::Tensor>& ts_w,
                 const std::optional<at::Tensor>& pos_w, bool query_time_shift,
                 double bucket_divisor, bool reference_layout) {
  return hstu_dense_backward_fuxi(
      grad_output, q, k, v, seq_offsets, seq_lengths,
      make_fuxi_options(max_seq_len, alpha, silu_scale, mask_type, contextual_seq_len, num_targets,
                        target_group_size, max_attn_len, custom_mask, ts_bias, pos_bias, timestamps,
                        ts_w, pos_w, query_time_shift, bucket_divisor, reference_layout));
}

}  // namespace
}  // namespace recops::attention

TORCH_LIBRARY_FRAGMENT(recops, m) {
  const std::vector<at::Tag> pt2 = {at::Tag::pt2_compliant_tag};
  m.def(
      "hstu_dense_forward(Tensor q, Tensor k, Tensor v, Tensor seq_offsets, "
      "Tensor? seq_lengths, " RECOPS_HSTU_OPTION_ARGS ") -> Tensor",
      pt2);
  m.def(
      "hstu_dense_backward(Tensor grad_output, Tensor q, Tensor k, Tensor v, "
      "Tensor seq_offsets, Tensor? seq_lengths, " RECOPS_HSTU_OPTION_ARGS
      ") -> (Tensor, Tensor, Tensor, Tensor?, Tensor?, Tensor?)",
      pt2);
  m.def(
      "hstu_dense_forward_fuxi(Tensor q, Tensor k, Tensor v, Tensor seq_offsets, "
      "Tensor? seq_lengths, " RECOPS_FUXI_OPTION_ARGS ") -> Tensor",
      pt2);
  m.def(
      "hstu_dense_backward_fuxi(Tensor grad_output, Tensor q, Tensor k, Tensor v, "
      "Tensor seq_offsets, Tensor? seq_lengths, " RECOPS_FUXI_OPTION_ARGS
      ") -> (Tensor, Tensor, Tensor, Tensor?, Tensor?, Tensor?, Tensor?)",
      pt2);
}

TORCH_LIBRARY_IMPL(recops, CPU, m) {
  m.impl("hstu_dense_forward_fuxi", TORCH_FN(recops::attention::fuxi_forward_op));
  m.impl("hstu_dense_backward_fuxi", TORCH_FN(recops::attention::fuxi_backward_op));
  m.impl("hstu_dense_forward", TORCH_FN(recops::attention::hstu_forward_op));
  m.impl("hstu_dense_backward", TORCH_FN(recops::attention::hstu_backward_op));
}
