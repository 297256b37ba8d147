// ATen adapter of the retrieval family (docs/ops.md section 10): the top-k candidates by inner
// product over a whole candidate table. Validate, allocate, dispatch to kernels/.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <tuple>

namespace recops::retrieval {

// (values [M, k], indices [M, k] int64): for each row of queries [M, d], the k rows of
// candidates [N, d] with the largest inner products, best first, candidate j scoring -inf for
// row m when it is among excluded[excluded_offsets[m], excluded_offsets[m + 1]); ties go to the
// lower index, NaN ranks first (kernels/mips_topk.h).
std::tuple<at::Tensor, at::Tensor> mips_topk(const at::Tensor& queries,
                                             const at::Tensor& candidates, int64_t k,
                                             const std::optional<at::Tensor>& excluded_offsets,
                                             const std::optional<at::Tensor>& excluded);

}  // namespace recops::retrieval
