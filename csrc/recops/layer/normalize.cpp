// l2_normalize and its backward's adapters (docs/ops.md section 8).
#include <ATen/ops/empty.h>

#include "recops/common/checks.h"
#include "recops/common/dispatch.h"
#include "recops/layer/kernels/layer_kernels.h"
#include "recops/layer/operands.h"
#include "recops/layer/ops.h"

namespace recops::layer {
namespace {

// x's rows as the kernels read them, after the checks both directions share.
at::Tensor checked_rows(const at::Tensor& x, double eps) {
  float_kind(x.scalar_type(), "x");
  check_matrix(x, "x", x);
  check_finite(eps, "eps", compute_dtype(x));
  TORCH_CHECK_VALUE(eps >= 0, "eps must be >= 0, got ", eps);
  return as_rows(x);
}

}  // namespace

at::Tensor l2_normalize(const at::Tensor& x, double eps) {
  const at::Tensor rows = checked_rows(x, eps);
  at::Tensor out = at::empty(x.sizes(), x.options());
  dispatch_float_kind(float_kind(x.scalar_type(), "x"), [&](auto tag) {
    using T = typename decltype(tag)::type;
    kernels::layer_kernels<T>().normalize_forward(data_as<T>(rows), rows.stride(0), x.size(0),
                                                  x.size(1), kernels::Norm::kL2, eps,
                                                  mutable_data_as<T>(out));
  });
  return out;
}

at::Tensor l2_normalize_backward(const at::Tensor& grad_output, const at::Tensor& x, double eps) {
  const at::Tensor rows = checked_rows(x, eps);
  check_matrix(grad_output, "grad_output", x);
  TORCH_CHECK_VALUE(grad_output.sizes() == x.sizes(), "grad_output must have x's shape ", x.sizes(),
                    ", got ", grad_output.sizes());
  const at::Tensor grad = as_rows(grad_output);
  at::Tensor grad_x = at::empty(x.sizes(), x.options());
  dispatch_float_kind(float_kind(x.scalar_type(), "x"), [&](auto tag) {
    using T = typename decltype(tag)::type;
    kernels::layer_kernels<T>().normalize_backward(
        data_as<T>(grad), grad.stride(0), data_as<T>(rows), rows.stride(0), x.size(0), x.size(1),
        kernels::Norm::kL2, eps, mutable_data_as<T>(grad_x));
  });
  return grad_x;
}

}  // namespace recops::layer
