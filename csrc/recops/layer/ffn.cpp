// fuxi_layer_ffn and its backward's adapters (docs/ops.md section 8).
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
  at::Tensor x, gate, up, down;
  kernels::Norm norm;
  kernels::DropoutKey dropout;
};

Inputs checked_inputs(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& up,
                      const at::Tensor& down, std::string_view norm, double eps, double dropout_p,
                      const std::optional<at::Tensor>& seed, int64_t offset) {
  float_kind(x.scalar_type(), "x");
  check_matrix(x, "x", x);
  check_matrix(gate, "gate", x);
  check_matrix(up, "up", x);
  check_matrix(down, "down", x);
  TORCH_CHECK_VALUE(gate.size(1) == x.size(1), "gate must be [hidden, x.size(1) = ", x.size(1),
                    "], got ", gate.sizes());
  TORCH_CHECK_VALUE(up.sizes() == gate.sizes(), "up must have gate's shape ", gate.sizes(),
                    ", got ", up.sizes());
  TORCH_CHECK_VALUE(down.size(0) == x.size(1) && down.size(1) == gate.size(0),
                    "down must be [x.size(1), gate.size(0)] = [", x.size(1), ", ", gate.size(0),
                    "], got ", down.sizes());
  const kernels::Norm kind = parse_norm(norm);
  check_finite(eps, "eps", compute_dtype(x));
  const kernels::DropoutKey dropout = checked_dropout(dropout_p, seed, offset);
  return Inputs{as_rows(x), gate.contiguous(), up.contiguous(), down.contiguous(), kind, dropout};
}

template <typename T>
kernels::FfnProblem<T> problem(const Inputs& in, double eps) {
  return kernels::FfnProblem<T>{
      in.x.size(0),        in.x.size(1),      in.gate.size(0),     data_as<T>(in.x), in.x.stride(0),
      data_as<T>(in.gate), data_as<T>(in.up), data_as<T>(in.down), in.norm,          eps,
      in.dropout};
}

}  // namespace

at::Tensor fuxi_layer_ffn(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& up,
                          const at::Tensor& down, std::string_view norm, double eps,
                          double dropout_p, const std::optional<at::Tensor>& seed, int64_t offset) {
  const Inputs in = checked_inputs(x, gate, up, down, norm, eps, dropout_p, seed, offset);
  at::Tensor out = at::empty(x.sizes(), x.options());
  dispatch_float_kind(float_kind(x.scalar_type(), "x"), [&](auto tag) {
    using T = typename decltype(tag)::type;
    kernels::layer_kernels<T>().ffn_forward(problem<T>(in, eps), mutable_data_as<T>(out),
                                            out.size(1));
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> fuxi_layer_ffn_backward(
    const at::Tensor& grad_output, const at::Tensor& x, const at::Tensor& gate,
    const at::Tensor& up, const at::Tensor& down, std::string_view norm, double eps,
    double dropout_p, const std::optional<at::Tensor>& seed, int64_t offset) {
  const Inputs in = checked_inputs(x, gate, up, down, norm, eps, dropout_p, seed, offset);
  check_matrix(grad_output, "grad_output", x);
  TORCH_CHECK_VALUE(grad_output.sizes() == x.sizes(), "grad_output must have x's shape ", x.sizes(),
                    ", got ", grad_output.sizes());
  const at::Tensor grad = as_rows(grad_output);
  at::Tensor grad_x = at::empty(x.sizes(), x.options());
  at::Tensor grad_gate = at::empty(gate.sizes(), gate.options());
  at::Tensor grad_up = at::empty(up.sizes(), up.options());
  at::Tensor grad_down = at::empty(down.sizes(), down.options());
  dispatch_float_kind(float_kind(x.scalar_type(), "x"), [&](auto tag) {
    using T = typename decltype(tag)::type;
    kernels::layer_kernels<T>().ffn_backward(
        problem<T>(in, eps), data_as<T>(grad), grad.stride(0),
        kernels::FfnGrads<T>{mutable_data_as<T>(grad_x), mutable_data_as<T>(grad_gate),
                             mutable_data_as<T>(grad_up), mutable_data_as<T>(grad_down)});
  });
  return {grad_x, grad_gate, grad_up, grad_down};
}

}  // namespace recops::layer
