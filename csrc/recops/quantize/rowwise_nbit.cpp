// Adapters of FBGEMM's fused N-bit row-wise quantization: every row of a 2-D tensor becomes its
// codes packed 8 / bit_rate to a byte, an fp16 scale and an fp16 bias (kernels/rowwise.h).
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include "recops/common/checks.h"
#include "recops/common/cpu_isa.h"
#include "recops/common/dispatch.h"
#include "recops/quantize/rowwise.h"

namespace recops::quantize {
namespace {

// FBGEMM packs 8 / bit_rate codes to a byte: bit rates 1 to 8.
void check_bit_rate(int64_t bit_rate, const char* op) {
  TORCH_CHECK_VALUE(bit_rate >= 1 && bit_rate <= 8, op,
                    ": bit_rate must be between 1 and 8 (8 / bit_rate codes per byte), got ",
                    bit_rate);
}

at::Tensor quantize(const at::Tensor& input, int64_t bit_rate, Accepts accepts, const char* op) {
  const FloatKind kind = quantize_input_kind(input, "input", accepts, op);
  check_dim(input, 2, "input");
  check_bit_rate(bit_rate, op);
  const int64_t per_byte = kernels::values_per_byte(static_cast<int>(bit_rate));
  const int64_t cols = input.size(1);
  TORCH_CHECK_VALUE(cols % (2 * per_byte) == 0, op, ": input's columns (", cols,
                    ") must be a multiple of 2 * (8 / bit_rate) = ", 2 * per_byte,
                    ", so that each row's packed codes end on the 2-byte boundary of its fp16 "
                    "scale and bias");
  at::Tensor output = at::empty({input.size(0), cols / per_byte + kernels::kScaleBiasNBit},
                                input.options().dtype(at::kByte));
  const at::Tensor rows = input.contiguous();
  kernels::rowwise_kernels(cpu_isa()).quantize_nbit({rows.const_data_ptr(), kind, input.size(0),
                                                     cols, static_cast<int>(bit_rate),
                                                     output.mutable_data_ptr<uint8_t>()});
  return output;
}

at::Tensor dequantize(const at::Tensor& input, int64_t bit_rate, at::ScalarType dtype,
                      const char* op) {
  check_quantized_rows(input, op);
  check_dim(input, 2, "input");
  check_bit_rate(bit_rate, op);
  const int64_t in_cols = input.size(1);
  TORCH_CHECK_VALUE(in_cols >= kernels::kScaleBiasNBit, op,
                    ": input's rows must hold their fp16 scale and bias (at least ",
                    kernels::kScaleBiasNBit, " bytes), got ", in_cols);
  const int64_t per_byte = kernels::values_per_byte(static_cast<int>(bit_rate));
  at::Tensor output = at::empty({input.size(0), (in_cols - kernels::kScaleBiasNBit) * per_byte},
                                input.options().dtype(dtype));
  const at::Tensor rows = input.contiguous();
  kernels::rowwise_kernels(cpu_isa()).dequantize_nbit(
      {rows.const_data_ptr<uint8_t>(), input.size(0), in_cols, static_cast<int>(bit_rate), true,
       true, output.mutable_data_ptr(), float_kind(dtype, "output")});
  return output;
}

}  // namespace

at::Tensor float_to_fused_nbit(const at::Tensor& input, int64_t bit_rate) {
  return quantize(input, bit_rate, Accepts::kFloat, "FloatToFusedNBitRowwiseQuantizedSBHalf");
}

at::Tensor half_to_fused_nbit(const at::Tensor& input, int64_t bit_rate) {
  return quantize(input, bit_rate, Accepts::kHalf, "HalfToFusedNBitRowwiseQuantizedSBHalf");
}

at::Tensor float_or_half_to_fused_nbit(const at::Tensor& input, int64_t bit_rate) {
  return quantize(input, bit_rate, Accepts::kFloatOrHalf,
                  "FloatOrHalfToFusedNBitRowwiseQuantizedSBHalf");
}

at::Tensor fused_nbit_to_float(const at::Tensor& input, int64_t bit_rate) {
  return dequantize(input, bit_rate, at::kFloat, "FusedNBitRowwiseQuantizedSBHalfToFloat");
}

at::Tensor fused_nbit_to_half(const at::Tensor& input, int64_t bit_rate) {
  return dequantize(input, bit_rate, at::kHalf, "FusedNBitRowwiseQuantizedSBHalfToHalf");
}

// FBGEMM's CPU kernel reads the scale and bias behind the codes whatever scale_bias_last says.
at::Tensor fused_nbit_to_float_or_half(const at::Tensor& input, int64_t bit_rate,
                                       int64_t output_dtype, bool /*scale_bias_last*/) {
  const char* op = "FusedNBitRowwiseQuantizedSBHalfToFloatOrHalf";
  return dequantize(input, bit_rate, output_dtype_of(output_dtype, false, op), op);
}

}  // namespace recops::quantize
