// What the 8-bit and N-bit adapters share: the input dtype rule of the quantize ops, FBGEMM's
// output_dtype codes (SparseType), and the call into the row-wise kernels.
#pragma once

#include <ATen/core/Tensor.h>

#include "recops/quantize/kernels/rowwise.h"
#include "recops/quantize/ops.h"

namespace recops::quantize {

// The kernel kind of a quantize op's input, checked against what the op accepts.
FloatKind quantize_input_kind(const at::Tensor& input, const char* name, Accepts accepts,
                              const char* op);

// FBGEMM's SparseType code of a dequantized dtype: 0 FP32, 1 FP16, 5 BF16 (`allow_bf16`).
at::ScalarType output_dtype_of(int64_t output_dtype, bool allow_bf16, const char* op);

void check_quantized_rows(const at::Tensor& input, const char* op);

}  // namespace recops::quantize
