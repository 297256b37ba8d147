// ATen adapters of the quantize family (docs/ops.md section 1): FBGEMM's row-wise quantization of
// embedding tables (fused 8-bit and N-bit layouts) and the index remapping of pruned tables that
// quantized inference uses.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace recops::quantize {

// Which input dtypes a quantize op takes: FloatTo* fp32, HalfTo* fp16, FloatOrHalfTo* both.
enum class Accepts { kFloat, kHalf, kFloatOrHalf };

at::Tensor float_to_fused8bit(const at::Tensor& t);
at::Tensor half_to_fused8bit(const at::Tensor& t);
at::Tensor float_or_half_to_fused8bit(const at::Tensor& t);
at::Tensor fused8bit_to_float(const at::Tensor& input);
at::Tensor fused8bit_to_half(const at::Tensor& input);
at::Tensor fused8bit_to_float_or_half(const at::Tensor& input, int64_t output_dtype,
                                      bool scale_bias_last, bool quant_padding_float_type);

at::Tensor float_to_fused_nbit(const at::Tensor& input, int64_t bit_rate);
at::Tensor half_to_fused_nbit(const at::Tensor& input, int64_t bit_rate);
at::Tensor float_or_half_to_fused_nbit(const at::Tensor& input, int64_t bit_rate);
at::Tensor fused_nbit_to_float(const at::Tensor& input, int64_t bit_rate);
at::Tensor fused_nbit_to_half(const at::Tensor& input, int64_t bit_rate);
at::Tensor fused_nbit_to_float_or_half(const at::Tensor& input, int64_t bit_rate,
                                       int64_t output_dtype, bool scale_bias_last);

at::Tensor pruned_hashmap_lookup(const at::Tensor& indices, const at::Tensor& offsets,
                                 const at::Tensor& hash_table,
                                 const at::Tensor& hash_table_offsets);
void pruned_hashmap_insert(const at::Tensor& indices, const at::Tensor& dense_indices,
                           const at::Tensor& offsets, const at::Tensor& hash_table,
                           const at::Tensor& hash_table_offsets);
at::Tensor pruned_array_lookup(const at::Tensor& indices, const at::Tensor& offsets,
                               const at::Tensor& index_remappings,
                               const at::Tensor& index_remappings_offsets);

}  // namespace recops::quantize
