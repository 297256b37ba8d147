// hstu_layer_output and its backward's adapters (docs/ops.md section 8).
#include <ATen/ops/empty.h>

#include <cstdint>
#include <limits>
#include <string_view>

#include "recops/common/checks.h"
#include "recops/common/dispatch.h"
#include "recops/layer/kernels/layer_kernels.h"
#include "recops/layer/operands.h"
#include "recops/layer/ops.h"

namespace recops::layer {
namespace {

// The validated inputs of a call, operands laid out for the kernels.
struct Inputs {
  at::Tensor x, u, attn, weight;
  std::optional<at::Tensor> bias;
  kernels::Norm norm;
  kernels::DropoutKey dropout;
};

Inputs checked_inputs(const at::Tensor& x, const at::Tensor& u, const at::Tensor& attn,
                      const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                      std::string_view norm, double eps, double dropout_p,
                      const std::optional<at::Tensor>& seed, int64_t offset) {
  float_kind(x.scalar_type(), "x");
  check_matrix(x, "x", x);
  check_matrix(u, "u", x);
  check_matrix(attn, "attn", x);
  check_matrix(weight, "weight", x);
  TORCH_CHECK_VALUE(u.size(0) == x.size(0), "u must have x's rows (", x.size(0), "), got shape ",
                    u.sizes());
  TORCH_CHECK_VALUE(attn.sizes() == u.sizes(), "attn must have u's shape ", u.sizes(), ", got ",
                    attn.sizes());
  TORCH_CHECK_VALUE(weight.size(0) == x.size(1) && weight.size(1) == u.size(1),
                    "weight must be [x.size(1), u.size(1)] = [", x.size(1), ", ", u.size(1),
                    "], got ", weight.sizes());
  if (bias.has_value()) {
    check_cpu(*bias, "bias");
    check_dim(*bias, 1, "bias");
    check_same_dtype(*bias, "bias", x, "x");
    TORCH_CHECK_VALUE(bias->size(0) == x.size(1), "bias must be [x.size(1)] = [", x.size(1),
                      "], got ", bias->sizes());
  }
  const kernels::Norm kind = parse_norm(norm);
  check_finite(eps, "eps", compute_dtype(x));
  const kernels::DropoutKey dropout = checked_dropout(dropout_p, seed, offset);
  return Inputs{as_rows(x),
                as_rows(u),
                as_rows(attn),
                weight.contiguous(),
                bias.has_value() ? std::optional<at::Tensor>(bias->contiguous()) : std::nullopt,
                kind,
                dropout};
}

template <typename T>
kernels::OutputProblem<T> problem(const Inputs& in, double eps) {
  return kernels::OutputProblem<T>{in.x.size(0),
                                   in.u.size(1),
                                   in.x.size(1),
                                   data_as<T>(in.x),
                                   in.x.stride(0),
                                   data_as<T>(in.u),
                                   in.u.stride(0),
                                   data_as<T>(in.attn),
                                   in.attn.stride(0),
                                   data_as<T>(in.weight),
                                   in.bias.has_value() ? data_as<T>(*in.bias) : nullptr,
                                   in.norm,
                                   eps,
                                   in.dropout};
}

}  // namespace

at::Tensor hstu_layer_output(const at::Tensor& x, const at::Tensor& u, const at::Tensor& attn,
                             const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                             std::string_view norm, double eps, double dropout_p,
                             const std::optional<at::Tensor>& seed, int64_t offset) {
  const Inputs in = checked_inputs(x, u, attn, weight, bias, norm, eps, dropout_p, seed, offset);
  at::Tensor out = at::empty(x.sizes(), x.options());
  dispatch_float_kind(float_kind(x.scalar_type(), "x"), [&](auto tag) {
    using T = typename decltype(tag)::type;
    kernels::layer_kernels<T>().output_forward(problem<T>(in, eps), mutable_data_as<T>(out),
                                               out.size(1));
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, std::optional<at::Tensor>>
hstu_layer_output_backward(const at::Tensor& grad_output, const at::Tensor& x, const at::Tensor& u,
                           const at::Tensor& attn, const at::Tensor& weight,
                           const std::optional<at::Tensor>& bias, std::string_view norm, double eps,
                           double dropout_p, const std::optional<at::Tensor>& seed,
                           int64_t offset) {
  const Inputs in = checked_inputs(x, u, attn, weight, bias, norm, eps, dropout_p, seed, offset);
  check_matrix(grad_output, "grad_output", x);
  TORCH_CHECK_VALUE(grad_output.sizes() == x.sizes(), "grad_output must have x's shape ", x.sizes(),
                    ", got ", grad_output.sizes());
  const at::Tensor grad = as_rows(grad_output);
  at::Tensor grad_u = at::empty(u.sizes(), u.options());
  at::Tensor grad_attn = at::empty(attn.sizes(), attn.options());
  at::Tensor grad_weight = at::empty(weight.sizes(), weight.options());
  std::optional<at::Tensor> grad_bias;
  if (bias.has_value()) grad_bias = at::empty(bias->sizes(), bias->options());
  dispatch_float_kind(float_kind(x.scalar_type(), "x"), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const kernels::OutputGrads<T> grads{
        mutable_data_as<T>(grad_u), mutable_data_as<T>(grad_attn), mutable_data_as<T>(grad_weight),
        grad_bias.has_value() ? mutable_data_as<T>(*grad_bias) : nullptr};
    kernels::layer_kernels<T>().output_backward(problem<T>(in, eps), data_as<T>(grad),
                                                grad.stride(0), grads);
  });
  return {grad_u, grad_attn, grad_weight, grad_bias};
}

}  // namespace recops::layer
