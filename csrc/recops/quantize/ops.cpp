// Schemas (FBGEMM's, verbatim) and kernel registrations of the quantize family in
// torch.ops.recops: row-wise quantization of embedding tables and the index remapping of pruned
// tables, as quantized inference uses them. Fake kernels are registered from Python
// (recops/operators/quantize.py).
#include <torch/library.h>

#include "recops/quantize/ops.h"

TORCH_LIBRARY_FRAGMENT(recops, m) {
  // The module where the fake kernels are registered.
  m.set_python_module("recops.operators.quantize");
  const std::vector<at::Tag> pt2 = {at::Tag::pt2_compliant_tag};
  m.def("FloatToFused8BitRowwiseQuantized(Tensor t) -> Tensor", pt2);
  m.def("HalfToFused8BitRowwiseQuantized(Tensor t) -> Tensor", pt2);
  m.def("FloatOrHalfToFused8BitRowwiseQuantized(Tensor t) -> Tensor", pt2);
  m.def("Fused8BitRowwiseQuantizedToFloat(Tensor input) -> Tensor", pt2);
  m.def("Fused8BitRowwiseQuantizedToHalf(Tensor input) -> Tensor", pt2);
  m.def(
      "Fused8BitRowwiseQuantizedToFloatOrHalf(Tensor input, int output_dtype=0, "
      "bool scale_bias_last=True, bool quant_padding_float_type=True) -> Tensor",
      pt2);
  m.def("FloatToFusedNBitRowwiseQuantizedSBHalf(Tensor input, int bit_rate) -> Tensor", pt2);
  m.def("HalfToFusedNBitRowwiseQuantizedSBHalf(Tensor input, int bit_rate) -> Tensor", pt2);
  m.def("FloatOrHalfToFusedNBitRowwiseQuantizedSBHalf(Tensor input, int bit_rate) -> Tensor", pt2);
  m.def("FusedNBitRowwiseQuantizedSBHalfToFloat(Tensor input, int bit_rate) -> Tensor", pt2);
  m.def("FusedNBitRowwiseQuantizedSBHalfToHalf(Tensor input, int bit_rate) -> Tensor", pt2);
  m.def(
      "FusedNBitRowwiseQuantizedSBHalfToFloatOrHalf(Tensor input, int bit_rate, "
      "int output_dtype=0, bool scale_bias_last=True) -> Tensor",
      pt2);
  m.def(
      "pruned_hashmap_lookup(Tensor indices, Tensor offsets, Tensor hash_table, "
      "Tensor hash_table_offsets) -> Tensor",
      pt2);
  m.def(
      "pruned_hashmap_insert(Tensor indices, Tensor dense_indices, Tensor offsets, "
      "Tensor(a!) hash_table, Tensor hash_table_offsets) -> ()",
      pt2);
  m.def(
      "pruned_array_lookup(Tensor indices, Tensor offsets, Tensor index_remappings, "
      "Tensor index_remappings_offsets) -> Tensor",
      pt2);
}

TORCH_LIBRARY_IMPL(recops, CPU, m) {
  using namespace recops::quantize;
  m.impl("FloatToFused8BitRowwiseQuantized", TORCH_FN(float_to_fused8bit));
  m.impl("HalfToFused8BitRowwiseQuantized", TORCH_FN(half_to_fused8bit));
  m.impl("FloatOrHalfToFused8BitRowwiseQuantized", TORCH_FN(float_or_half_to_fused8bit));
  m.impl("Fused8BitRowwiseQuantizedToFloat", TORCH_FN(fused8bit_to_float));
  m.impl("Fused8BitRowwiseQuantizedToHalf", TORCH_FN(fused8bit_to_half));
  m.impl("Fused8BitRowwiseQuantizedToFloatOrHalf", TORCH_FN(fused8bit_to_float_or_half));
  m.impl("FloatToFusedNBitRowwiseQuantizedSBHalf", TORCH_FN(float_to_fused_nbit));
  m.impl("HalfToFusedNBitRowwiseQuantizedSBHalf", TORCH_FN(half_to_fused_nbit));
  m.impl("FloatOrHalfToFusedNBitRowwiseQuantizedSBHalf", TORCH_FN(float_or_half_to_fused_nbit));
  m.impl("FusedNBitRowwiseQuantizedSBHalfToFloat", TORCH_FN(fused_nbit_to_float));
  m.impl("FusedNBitRowwiseQuantizedSBHalfToHalf", TORCH_FN(fused_nbit_to_half));
  m.impl("FusedNBitRowwiseQuantizedSBHalfToFloatOrHalf", TORCH_FN(fused_nbit_to_float_or_half));
  m.impl("pruned_hashmap_lookup", TORCH_FN(pruned_hashmap_lookup));
  m.impl("pruned_hashmap_insert", TORCH_FN(pruned_hashmap_insert));
  m.impl("pruned_array_lookup", TORCH_FN(pruned_array_lookup));
}
