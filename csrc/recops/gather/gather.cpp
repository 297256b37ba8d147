#include <ATen/ops/empty.h>

#include "recops/common/checks.h"
#include "recops/common/dispatch.h"
#include "recops/gather/kernels/gather.h"
#include "recops/gather/ops.h"

namespace recops::gather {
namespace {

at::Tensor checked_index(const at::Tensor& index) {
  check_cpu(index, "index");
  check_dim(index, 1, "index");
  check_index_dtype(index, "index");
  return index.contiguous();
}

// Kernels report the first position whose index is outside [0, n); name it in the error.
void check_kernel_result(int64_t bad, const at::Tensor& index, int64_t n) {
  TORCH_CHECK_INDEX(bad < 0, "index entries must be in [0, ", n, ") (the size of x), got index[",
                    bad, "] = ", bad < 0 ? 0 : index_at(index, bad));
}

}  // namespace

at::Tensor gather_for_rank1(const at::Tensor& x, const at::Tensor& index) {
  check_cpu(x, "x");
  check_dim(x, 1, "x");
  const at::Tensor index_c = checked_index(index);
  const at::Tensor x_c = x.contiguous();
  at::Tensor y = at::empty({index_c.numel()}, x_c.options());
  const int64_t bad = dispatch_element_width(x_c.element_size(), [&](auto value_tag) {
    using value_t = typename decltype(value_tag)::type;
    return dispatch_index_kind(index_kind(index_c.scalar_type()), [&](auto index_tag) {
      using index_t = typename decltype(index_tag)::type;
      return kernels::gather(static_cast<const value_t*>(x_c.const_data_ptr()), x_c.numel(),
                             index_c.const_data_ptr<index_t>(), index_c.numel(),
                             static_cast<value_t*>(y.mutable_data_ptr()));
    });
  });
  check_kernel_result(bad, index_c, x_c.numel());
  return y;
}

at::Tensor index_select_for_rank1_backward(const at::Tensor& grad, const at::Tensor& x,
                                           const at::Tensor& index) {
  check_cpu(grad, "grad");
  check_dim(grad, 1, "grad");
  check_cpu(x, "x");
  check_dim(x, 1, "x");
  check_same_dtype(grad, "grad", x, "x");
  const at::Tensor index_c = checked_index(index);
  TORCH_CHECK(grad.numel() == index_c.numel(), "grad must have one entry per index entry (",
              index_c.numel(), "), got ", grad.numel());
  const at::Tensor grad_c = grad.contiguous();
  const FloatKind kind = float_kind(grad_c.scalar_type(), "grad");
  at::Tensor out = at::empty({x.numel()}, grad_c.options());
  const int64_t bad = dispatch_float_kind(kind, [&](auto scalar_tag) {
    using scalar_t = typename decltype(scalar_tag)::type;
    return dispatch_index_kind(index_kind(index_c.scalar_type()), [&](auto index_tag) {
      using index_t = typename decltype(index_tag)::type;
      return kernels::scatter_add<accumulate_t<scalar_t>>(
          data_as<scalar_t>(grad_c), index_c.const_data_ptr<index_t>(), index_c.numel(), x.numel(),
          mutable_data_as<scalar_t>(out));
    });
  });
  check_kernel_result(bad, index_c, x.numel());
  return out;
}

}  // namespace recops::gather
