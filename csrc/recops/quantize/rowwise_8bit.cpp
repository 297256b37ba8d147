// Adapters of FBGEMM's fused 8-bit row-wise quantization: every row of the last dimension becomes
// its bytes, a float scale and a float bias (kernels/rowwise.h).
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include "recops/common/cpu_isa.h"
#include "recops/common/dispatch.h"
#include "recops/quantize/rowwise.h"

namespace recops::quantize {
namespace {

void check_rows_dim(const at::Tensor& t, const char* name, const char* op) {
  TORCH_CHECK(t.dim() >= 2, op, ": ", name,
              " must have at least 2 dimensions (rows, then the quantized last dimension), "
              "got shape ",
              t.sizes());
}

at::Tensor quantize(const at::Tensor& t, Accepts accepts, const char* op) {
  const FloatKind kind = quantize_input_kind(t, "t", accepts, op);
  check_rows_dim(t, "t", op);
  const int64_t cols = t.size(-1);
  std::vector<int64_t> sizes = t.sizes().vec();
  sizes.back() = cols + kernels::kScaleBias8Bit;
  at::Tensor output = at::empty(sizes, t.options().dtype(at::kByte));
  const at::Tensor input = t.contiguous();
  const int64_t rows = cols == 0 ? output.numel() / sizes.back() : input.numel() / cols;
  kernels::rowwise_kernels(cpu_isa()).quantize_8bit(
      {input.const_data_ptr(), kind, rows, cols, 8, output.mutable_data_ptr<uint8_t>()});
  return output;
}

at::Tensor dequantize(const at::Tensor& input, at::ScalarType dtype, bool scale_bias_last,
                      bool quant_padding_float_type, const char* op) {
  check_quantized_rows(input, op);
  check_rows_dim(input, "input", op);
  TORCH_CHECK_VALUE(quant_padding_float_type || !scale_bias_last, op,
                    ": 2-byte padding (quant_padding_float_type=False) needs "
                    "scale_bias_last=False");
  const int64_t scale_bias = quant_padding_float_type ? kernels::kScaleBias8Bit : 2 * 2;
  const int64_t in_cols = input.size(-1);
  TORCH_CHECK_VALUE(in_cols >= scale_bias, op, ": input's last dimension must hold each row's ",
                    quant_padding_float_type ? "float" : "fp16", " scale and bias (at least ",
                    scale_bias, " bytes), got ", in_cols);
  std::vector<int64_t> sizes = input.sizes().vec();
  sizes.back() = in_cols - scale_bias;
  at::Tensor output = at::empty(sizes, input.options().dtype(dtype));
  const at::Tensor rows_in = input.contiguous();
  const int64_t rows = rows_in.numel() / in_cols;
  kernels::rowwise_kernels(cpu_isa()).dequantize_8bit(
      {rows_in.const_data_ptr<uint8_t>(), rows, in_cols, 8, scale_bias_last,
       quant_padding_float_type, output.mutable_data_ptr(), float_kind(dtype, "output")});
  return output;
}

}  // namespace

at::Tensor float_to_fused8bit(const at::Tensor& t) {
  return quantize(t, Accepts::kFloat, "FloatToFused8BitRowwiseQuantized");
}

at::Tensor half_to_fused8bit(const at::Tensor& t) {
  return quantize(t, Accepts::kHalf, "HalfToFused8BitRowwiseQuantized");
}

at::Tensor float_or_half_to_fused8bit(const at::Tensor& t) {
  return quantize(t, Accepts::kFloatOrHalf, "FloatOrHalfToFused8BitRowwiseQuantized");
}

at::Tensor fused8bit_to_float(const at::Tensor& input) {
  return dequantize(input, at::kFloat, true, true, "Fused8BitRowwiseQuantizedToFloat");
}

at::Tensor fused8bit_to_half(const at::Tensor& input) {
  return dequantize(input, at::kHalf, true, true, "Fused8BitRowwiseQuantizedToHalf");
}

at::Tensor fused8bit_to_float_or_half(const at::Tensor& input, int64_t output_dtype,
                                      bool scale_bias_last, bool quant_padding_float_type) {
  const char* op = "Fused8BitRowwiseQuantizedToFloatOrHalf";
  return dequantize(input, output_dtype_of(output_dtype, true, op), scale_bias_last,
                    quant_padding_float_type, op);
}

}  // namespace recops::quantize
