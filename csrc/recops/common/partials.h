// Partial results the kernels leave per chunk or per thread ([parts, ...]) summed by the adapters.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/sum.h>

namespace recops {

// partials summed over dim 0, in `dtype`. One part is the total: a view, not a summed copy.
inline at::Tensor sum_partials(const at::Tensor& partials, at::ScalarType dtype) {
  return (partials.size(0) == 1 ? partials.select(0, 0) : partials.sum(0)).to(dtype);
}

}  // namespace recops
