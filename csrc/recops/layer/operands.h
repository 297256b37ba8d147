// The layer family's adapters' shared rules: the norm argument, and 2-D operands as the kernels
// read them.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <limits>
#include <optional>
#include <string_view>

#include "recops/common/checks.h"
#include "recops/common/dispatch.h"
#include "recops/layer/kernels/layer_kernels.h"

namespace recops::layer {

inline kernels::Norm parse_norm(std::string_view norm) {
  if (norm == "layer_norm") return kernels::Norm::kLayer;
  TORCH_CHECK_VALUE(norm == "rms_norm", "norm must be \"layer_norm\" or \"rms_norm\", got \"", norm,
                    "\"");
  return kernels::Norm::kRms;
}

// A 2-D operand as the kernels read it: rows with unit column stride and a row stride the
// products can count in int (BLAS).
inline at::Tensor as_rows(const at::Tensor& t) {
  const at::Tensor rows = with_unit_columns(t);
  return rows.stride(0) < std::numeric_limits<int32_t>::max() ? rows : rows.contiguous();
}

inline void check_matrix(const at::Tensor& t, const char* name, const at::Tensor& x) {
  check_cpu(t, name);
  check_dim(t, 2, name);
  check_same_dtype(t, name, x, "x");
  // The products count dimensions in int (BLAS).
  TORCH_CHECK_VALUE(t.size(1) < std::numeric_limits<int32_t>::max(), name,
                    " must have fewer than 2^31 - 1 columns, got shape ", t.sizes());
}

// A dropout seed: a one-element int64 CPU tensor, read once per call.
inline int64_t read_seed(const at::Tensor& seed) {
  check_cpu(seed, "seed");
  TORCH_CHECK_VALUE(seed.scalar_type() == at::kLong && seed.numel() == 1,
                    "seed must be an int64 tensor of one element, got ", seed.scalar_type(),
                    " of shape ", seed.sizes());
  return seed.item<int64_t>();
}

// The dropout of a fused op's call: dropout_p in [0, 1], a seed given when dropout_p > 0.
inline kernels::DropoutKey checked_dropout(double dropout_p, const std::optional<at::Tensor>& seed,
                                           int64_t offset) {
  check_probability(dropout_p, "dropout_p");
  TORCH_CHECK_VALUE(seed.has_value() || dropout_p == 0.0,
                    "seed must be given when dropout_p > 0, got dropout_p = ", dropout_p);
  return kernels::DropoutKey::make(seed.has_value() ? read_seed(*seed) : 0, offset, dropout_p);
}

}  // namespace recops::layer
