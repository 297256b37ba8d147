// ATen adapters of the gather family (docs/ops.md section 2): validate, allocate, dispatch to
// kernels/.
#pragma once

#include <ATen/core/Tensor.h>

namespace recops::gather {

at::Tensor gather_for_rank1(const at::Tensor& x, const at::Tensor& index);
at::Tensor index_select_for_rank1_backward(const at::Tensor& grad, const at::Tensor& x,
                                           const at::Tensor& index);

}  // namespace recops::gather
