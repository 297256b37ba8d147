// positional_input_features and its backward's adapters (docs/ops.md section 8).
#include <ATen/ops/empty.h>

#include <optional>

#include "recops/common/checks.h"
#include "recops/common/dispatch.h"
#include "recops/layer/kernels/layer_kernels.h"
#include "recops/layer/operands.h"
#include "recops/layer/ops.h"

namespace recops::layer {
namespace {

struct Features {
  at::Tensor x, positions, table;
  kernels::DropoutKey dropout;
};

Features checked_features(const at::Tensor& x, const at::Tensor& positions,
                          const at::Tensor& position_weight, double scale, double dropout_p,
                          const std::optional<at::Tensor>& seed, int64_t offset) {
  float_kind(x.scalar_type(), "x");
  check_matrix(x, "x", x);
  check_matrix(position_weight, "position_weight", x);
  TORCH_CHECK_VALUE(position_weight.size(1) == x.size(1),
                    "position_weight must have x.size(1) = ", x.size(1), " columns, got shape ",
                    position_weight.sizes());
  check_cpu(positions, "positions");
  check_dim(positions, 1, "positions");
  TORCH_CHECK_VALUE(positions.scalar_type() == at::kLong, "positions must be int64, got ",
                    positions.scalar_type());
  TORCH_CHECK_VALUE(positions.size(0) == x.size(0), "positions must have x.size(0) = ", x.size(0),
                    " entries, got ", positions.size(0));
  const at::Tensor index = positions.contiguous();
  const int64_t* p = index.data_ptr<int64_t>();
  const int64_t table_rows = position_weight.size(0);
  for (int64_t r = 0; r < index.size(0); ++r) {
    TORCH_CHECK_VALUE(p[r] >= 0 && p[r] < table_rows, "positions must be in [0, ", table_rows,
                      ") (position_weight's rows), got ", p[r], " at ", r);
  }
  check_finite(scale, "scale", compute_dtype(x));
  return Features{as_rows(x), index, position_weight.contiguous(),
                  checked_dropout(dropout_p, seed, offset)};
}

template <typename T>
kernels::PositionalFeatures<T> problem(const Features& f, double scale) {
  return {f.x.size(0),
          f.x.size(1),
          data_as<T>(f.x),
          f.x.stride(0),
          f.positions.data_ptr<int64_t>(),
          data_as<T>(f.table),
          f.table.size(0),
          scale,
          f.dropout};
}

}  // namespace

at::Tensor positional_input_features(const at::Tensor& x, const at::Tensor& positions,
                                     const at::Tensor& position_weight, double scale,
                                     double dropout_p, const std::optional<at::Tensor>& seed,
                                     int64_t offset) {
  const Features f =
      checked_features(x, positions, position_weight, scale, dropout_p, seed, offset);
  at::Tensor out = at::empty(x.sizes(), x.options());
  dispatch_float_kind(float_kind(x.scalar_type(), "x"), [&](auto tag) {
    using T = typename decltype(tag)::type;
    kernels::layer_kernels<T>().features_forward(problem<T>(f, scale), mutable_data_as<T>(out));
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> positional_input_features_backward(
    const at::Tensor& grad_output, const at::Tensor& x, const at::Tensor& positions,
    const at::Tensor& position_weight, double scale, double dropout_p,
    const std::optional<at::Tensor>& seed, int64_t offset) {
  const Features f =
      checked_features(x, positions, position_weight, scale, dropout_p, seed, offset);
  check_matrix(grad_output, "grad_output", x);
  TORCH_CHECK_VALUE(grad_output.sizes() == x.sizes(), "grad_output must have x's shape ", x.sizes(),
                    ", got ", grad_output.sizes());
  const at::Tensor grad = as_rows(grad_output);
  at::Tensor grad_x = at::empty(x.sizes(), x.options());
  at::Tensor grad_table = at::empty(position_weight.sizes(), position_weight.options());
  dispatch_float_kind(float_kind(x.scalar_type(), "x"), [&](auto tag) {
    using T = typename decltype(tag)::type;
    kernels::layer_kernels<T>().features_backward(problem<T>(f, scale), data_as<T>(grad),
                                                  grad.stride(0), mutable_data_as<T>(grad_x),
                                                  mutable_data_as<T>(grad_table));
  });
  return {grad_x, grad_table};
}

}  // namespace recops::layer
