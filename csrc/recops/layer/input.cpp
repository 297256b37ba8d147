// hstu_layer_input and its backward's adapters (docs/ops.md section 8).
#include <ATen/ops/empty.h>

#include <optional>
#include <string_view>
#include <vector>

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

// The widths of the output's column pieces: split's, or the whole width as one piece.
std::vector<int64_t> piece_widths(c10::IntArrayRef split, int64_t width) {
  if (split.empty()) return {width};
  int64_t total = 0;
  for (const int64_t cols : split) {
    TORCH_CHECK_VALUE(cols >= 0 && cols <= width - total,
                      "split must be sizes >= 0 that sum to weight.size(1) = ", width, ", got ",
                      split);
    total += cols;
  }
  TORCH_CHECK_VALUE(total == width, "split must be sizes >= 0 that sum to weight.size(1) = ", width,
                    ", got ", split);
  return {split.begin(), split.end()};
}

// The kernels' view of column pieces (P: T* or const T*), over storage this object keeps.
template <typename P>
struct PiecesView {
  std::vector<P> data;
  std::vector<int64_t> ld;
  const std::vector<int64_t>& cols;

  PiecesView(const std::vector<at::Tensor>& pieces, const std::vector<int64_t>& widths)
      : cols(widths) {
    for (const at::Tensor& piece : pieces) {
      data.push_back(static_cast<P>(piece.data_ptr()));
      ld.push_back(piece.stride(0));
    }
  }
  kernels::ColumnPieces<P> view() const {
    return {static_cast<int64_t>(data.size()), data.data(), cols.data(), ld.data()};
  }
};

}  // namespace

std::vector<at::Tensor> hstu_layer_input(const at::Tensor& x, const at::Tensor& weight,
                                         const std::optional<at::Tensor>& bias,
                                         std::string_view norm, double eps,
                                         c10::IntArrayRef split) {
  const Inputs in = checked_inputs(x, weight, bias, norm, eps);
  const std::vector<int64_t> widths = piece_widths(split, weight.size(1));
  std::vector<at::Tensor> pieces;
  for (const int64_t cols : widths) pieces.push_back(at::empty({x.size(0), cols}, x.options()));
  dispatch_float_kind(float_kind(x.scalar_type(), "x"), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const PiecesView<T*> out(pieces, widths);
    kernels::layer_kernels<T>().input_forward(problem<T>(in, eps), out.view());
  });
  return pieces;
}

std::tuple<at::Tensor, at::Tensor, std::optional<at::Tensor>> hstu_layer_input_backward(
    at::TensorList grad_output, const at::Tensor& x, const at::Tensor& weight,
    const std::optional<at::Tensor>& bias, std::string_view norm, double eps,
    c10::IntArrayRef split) {
  const Inputs in = checked_inputs(x, weight, bias, norm, eps);
  const std::vector<int64_t> widths = piece_widths(split, weight.size(1));
  TORCH_CHECK_VALUE(grad_output.size() == widths.size(),
                    "grad_output must hold one gradient per piece of the output (", widths.size(),
                    "), got ", grad_output.size());
  std::vector<at::Tensor> grads;
  for (size_t k = 0; k < widths.size(); ++k) {
    check_matrix(grad_output[k], "grad_output", x);
    TORCH_CHECK_VALUE(grad_output[k].size(0) == x.size(0) && grad_output[k].size(1) == widths[k],
                      "grad_output[", k, "] must be [x.size(0), ", widths[k], "] = [", x.size(0),
                      ", ", widths[k], "], got ", grad_output[k].sizes());
    grads.push_back(as_rows(grad_output[k]));
  }
  at::Tensor grad_x = at::empty(x.sizes(), x.options());
  at::Tensor grad_weight = at::empty(weight.sizes(), weight.options());
  std::optional<at::Tensor> grad_bias;
  if (bias.has_value()) grad_bias = at::empty(bias->sizes(), bias->options());
  dispatch_float_kind(float_kind(x.scalar_type(), "x"), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const PiecesView<const T*> grad(grads, widths);
    kernels::layer_kernels<T>().input_backward(
        problem<T>(in, eps), grad.view(), mutable_data_as<T>(grad_x),
        mutable_data_as<T>(grad_weight),
        grad_bias.has_value() ? mutable_data_as<T>(*grad_bias) : nullptr);
  });
  return {grad_x, grad_weight, grad_bias};
}

}  // namespace recops::layer
