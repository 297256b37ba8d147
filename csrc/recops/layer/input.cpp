// hstu_layer_input and its backward's adapters (docs/ops.md section 8).
#include <ATen/ops/empty.h>

#include <optional>
#include <string_view>

#include "recops/common/checks.h"
#include "recops/common/dispatch.h"
#include "recops/layer/kernels/layer_kernels.h"
#include "recops/layer/operands.h"
#include "recops/layer/ops.h"

namespace recops::layer {
namespace {

struct Inputs {
  at::Tensor x, weight;
  std::optional<at::Tensor> bias;
  kernels::Norm norm;
};

Inputs checked_inputs(const at::Tensor& x, const at::Tensor& weight,
                      const std::optional<at::Tensor>& bias, std::string_view norm, double eps) {
  float_kind(x.scalar_type(), "x");
  check_matrix(x, "x", x);
  check_matrix(weight, "weight", x);
  TORCH_CHECK_VALUE(weight.size(0) == x.size(1), "weight must have x.size(1) = ", x.size(1),
                    " rows, got shape ", weight.sizes());
  if (bias.has_value()) {
    check_cpu(*bias, "bias");
    check_dim(*bias, 1, "bias");
    check_same_dtype(*bias, "bias", x, "x");
    TORCH_CHECK_VALUE(bias->size(0) == weight.size(1), "bias must be [weight.size(1)] = [",
                      weight.size(1), "], got ", bias->sizes());
  }
  const kernels::Norm kind = parse_norm(norm);
  check_finite(eps, "eps", compute_dtype(x));
  return Inputs{as_rows(x), weight.contiguous(),
                bias.has_value() ? std::optional<at::Tensor>(bias->contiguous()) : std::nullopt,
                kind};
}

template <typename T>
kernels::InputProblem<T> problem(const Inputs& in, double eps) {
  return kernels::InputProblem<T>{in.x.size(0),
                                  in.x.size(1),
                                  in.weight.size(1),
                                  data_as<T>(in.x),
                                  in.x.stride(0),
                                  data_as<T>(in.weight),
                                  in.bias.has_value() ? data_as<T>(*in.bias) : nullptr,
                                  in.norm,
                                  eps};
}

}  // namespace

at::Tensor hstu_layer_input(const at::Tensor& x, const at::Tensor& weight,
                            const std::optional<at::Tensor>& bias, std::string_view norm,
                            double eps) {
  const Inputs in = checked_inputs(x, weight, bias, norm, eps);
  at::Tensor out = at::empty({x.size(0), weight.size(1)}, x.options());
  dispatch_float_kind(float_kind(x.scalar_type(), "x"), [&](auto tag) {
    using T = typename decltype(tag)::type;
    kernels::layer_kernels<T>().input_forward(problem<T>(in, eps), mutable_data_as<T>(out),
                                              out.size(1));
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor, std::optional<at::Tensor>> hstu_layer_input_backward(
    const at::Tensor& grad_output, const at::Tensor& x, const at::Tensor& weight,
    const std::optional<at::Tensor>& bias, std::string_view norm, double eps) {
  const Inputs in = checked_inputs(x, weight, bias, norm, eps);
  check_matrix(grad_output, "grad_output", x);
  TORCH_CHECK_VALUE(grad_output.size(0) == x.size(0) && grad_output.size(1) == weight.size(1),
                    "grad_output must be [x.size(0), weight.size(1)] = [", x.size(0), ", ",
                    weight.size(1), "], got ", grad_output.sizes());
  const at::Tensor grad = as_rows(grad_output);
  at::Tensor grad_x = at::empty(x.sizes(), x.options());
  at::Tensor grad_weight = at::empty(weight.sizes(), weight.options());
  std::optional<at::Tensor> grad_bias;
  if (bias.has_value()) grad_bias = at::empty(bias->sizes(), bias->options());
  dispatch_float_kind(float_kind(x.scalar_type(), "x"), [&](auto tag) {
    using T = typename decltype(tag)::type;
    kernels::layer_kernels<T>().input_backward(
        problem<T>(in, eps), data_as<T>(grad), grad.stride(0), mutable_data_as<T>(grad_x),
        mutable_data_as<T>(grad_weight),
        grad_bias.has_value() ? mutable_data_as<T>(*grad_bias) : nullptr);
  });
  return {grad_x, grad_weight, grad_bias};
}

}  // namespace recops::layer
