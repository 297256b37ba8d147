// Checks the 8-bit and N-bit adapters share (rowwise.h).
#include "recops/quantize/rowwise.h"

#include <c10/util/Exception.h>

#include "recops/common/checks.h"

namespace recops::quantize {

FloatKind quantize_input_kind(const at::Tensor& input, const char* name, Accepts accepts,
                              const char* op) {
  check_cpu(input, name);
  const at::ScalarType dtype = input.scalar_type();
  const bool is_float = dtype == at::kFloat && accepts != Accepts::kHalf;
  const bool is_half = dtype == at::kHalf && accepts != Accepts::kFloat;
  TORCH_CHECK(is_float || is_half, op, ": ", name, " must be ",
              accepts == Accepts::kFloat  ? "float32"
              : accepts == Accepts::kHalf ? "float16"
                                          : "float32 or float16",
              ", got ", dtype);
  return is_half ? FloatKind::kHalf : FloatKind::kFloat;
}

at::ScalarType output_dtype_of(int64_t output_dtype, bool allow_bf16, const char* op) {
  if (output_dtype == 0) return at::kFloat;
  if (output_dtype == 1) return at::kHalf;
  TORCH_CHECK_VALUE(allow_bf16 && output_dtype == 5, op,
                    ": output_dtype must be 0 (FP32), 1 (FP16)", allow_bf16 ? " or 5 (BF16)" : "",
                    ", got ", output_dtype);
  return at::kBFloat16;
}

void check_quantized_rows(const at::Tensor& input, const char* op) {
  check_cpu(input, "input");
  TORCH_CHECK(input.scalar_type() == at::kByte, op, ": input must be uint8 (quantized rows), got ",
              input.scalar_type());
}

}  // namespace recops::quantize
