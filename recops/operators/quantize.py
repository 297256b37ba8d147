"""Fake kernels of the quantize family (kernels live in csrc/recops/quantize): FBGEMM's row-wise
quantization of embedding tables (fused 8-bit rows with a float scale and bias, N-bit rows with
an fp16 scale and bias) and the index remapping of pruned tables (docs/quantize.md)."""

import torch

from recops._fake import register_fake

# FBGEMM's SparseType codes of the dequantized dtypes.
_OUTPUT_DTYPES = {0: torch.float32, 1: torch.float16, 5: torch.bfloat16}


def _check_dtype(tensor, name, dtypes):
    torch._check(
        tensor.dtype in dtypes,
        lambda: f"{name} must be one of {list(dtypes)}, got {tensor.dtype}",
    )


def _output_dtype(output_dtype, allowed):
    torch._check(
        output_dtype in allowed,
        lambda: f"output_dtype must be one of {sorted(allowed)}, got {output_dtype}",
    )
    return _OUTPUT_DTYPES[output_dtype]


def _check_bit_rate(bit_rate):
    torch._check(1 <= bit_rate <= 8, lambda: f"bit_rate must be between 1 and 8, got {bit_rate}")


def _quantize_8bit(t, dtypes):
    _check_dtype(t, "t", dtypes)
    torch._check(t.dim() >= 2, lambda: f"t must have at least 2 dimensions, got {t.dim()}")
    return t.new_empty((*t.shape[:-1], t.shape[-1] + 8), dtype=torch.uint8)


def _dequantize_8bit(input, dtype, scale_bias_bytes=8):
    _check_dtype(input, "input", (torch.uint8,))
    torch._check(
        input.dim() >= 2, lambda: f"input must have at least 2 dimensions, got {input.dim()}"
    )
    torch._check(
        input.shape[-1] >= scale_bias_bytes,
        lambda: f"input's rows must hold their scale and bias ({scale_bias_bytes} bytes)",
    )
    return input.new_empty((*input.shape[:-1], input.shape[-1] - scale_bias_bytes), dtype=dtype)


@register_fake("recops::FloatToFused8BitRowwiseQuantized")
def _float_to_8bit_fake(t):
    return _quantize_8bit(t, (torch.float32,))


@register_fake("recops::HalfToFused8BitRowwiseQuantized")
def _half_to_8bit_fake(t):
    return _quantize_8bit(t, (torch.float16,))


@register_fake("recops::FloatOrHalfToFused8BitRowwiseQuantized")
def _float_or_half_to_8bit_fake(t):
    return _quantize_8bit(t, (torch.float32, torch.float16))


@register_fake("recops::Fused8BitRowwiseQuantizedToFloat")
def _8bit_to_float_fake(input):
    return _dequantize_8bit(input, torch.float32)


@register_fake("recops::Fused8BitRowwiseQuantizedToHalf")
def _8bit_to_half_fake(input):
    return _dequantize_8bit(input, torch.float16)


@register_fake("recops::Fused8BitRowwiseQuantizedToFloatOrHalf")
def _8bit_to_float_or_half_fake(
    input, output_dtype=0, scale_bias_last=True, quant_padding_float_type=True
):
    dtype = _output_dtype(output_dtype, (0, 1, 5))
    torch._check(
        quant_padding_float_type or not scale_bias_last,
        lambda: "2-byte padding (quant_padding_float_type=False) needs scale_bias_last=False",
    )
    return _dequantize_8bit(input, dtype, 8 if quant_padding_float_type else 4)


def _quantize_nbit(input, bit_rate, dtypes):
    _check_dtype(input, "input", dtypes)
    _check_bit_rate(bit_rate)
    torch._check(input.dim() == 2, lambda: f"input must be 2-D, got {input.dim()}-D")
    per_byte = 8 // bit_rate
    cols = input.shape[1]
    torch._check(
        cols % (2 * per_byte) == 0,
        lambda: f"input's columns ({cols}) must be a multiple of 2 * (8 / bit_rate)",
    )
    return input.new_empty((input.shape[0], cols // per_byte + 4), dtype=torch.uint8)


def _dequantize_nbit(input, bit_rate, dtype):
    _check_dtype(input, "input", (torch.uint8,))
    _check_bit_rate(bit_rate)
    torch._check(input.dim() == 2, lambda: f"input must be 2-D, got {input.dim()}-D")
    torch._check(input.shape[1] >= 4, lambda: "input's rows must hold their fp16 scale and bias")
    per_byte = 8 // bit_rate
    return input.new_empty((input.shape[0], (input.shape[1] - 4) * per_byte), dtype=dtype)


@register_fake("recops::FloatToFusedNBitRowwiseQuantizedSBHalf")
def _float_to_nbit_fake(input, bit_rate):
    return _quantize_nbit(input, bit_rate, (torch.float32,))


@register_fake("recops::HalfToFusedNBitRowwiseQuantizedSBHalf")
def _half_to_nbit_fake(input, bit_rate):
    return _quantize_nbit(input, bit_rate, (torch.float16,))


@register_fake("recops::FloatOrHalfToFusedNBitRowwiseQuantizedSBHalf")
def _float_or_half_to_nbit_fake(input, bit_rate):
    return _quantize_nbit(input, bit_rate, (torch.float32, torch.float16))


@register_fake("recops::FusedNBitRowwiseQuantizedSBHalfToFloat")
def _nbit_to_float_fake(input, bit_rate):
    return _dequantize_nbit(input, bit_rate, torch.float32)


@register_fake("recops::FusedNBitRowwiseQuantizedSBHalfToHalf")
def _nbit_to_half_fake(input, bit_rate):
    return _dequantize_nbit(input, bit_rate, torch.float16)


@register_fake("recops::FusedNBitRowwiseQuantizedSBHalfToFloatOrHalf")
def _nbit_to_float_or_half_fake(input, bit_rate, output_dtype=0, scale_bias_last=True):
    return _dequantize_nbit(input, bit_rate, _output_dtype(output_dtype, (0, 1)))


def _lookup_fake(indices, offsets):
    _check_dtype(indices, "indices", (torch.int32, torch.int64))
    torch._check(offsets.dtype == indices.dtype, lambda: "indices and offsets share one dtype")
    return torch.empty_like(indices)


@register_fake("recops::pruned_hashmap_lookup")
def _pruned_hashmap_lookup_fake(indices, offsets, hash_table, hash_table_offsets):
    return _lookup_fake(indices, offsets)


@register_fake("recops::pruned_array_lookup")
def _pruned_array_lookup_fake(indices, offsets, index_remappings, index_remappings_offsets):
    return _lookup_fake(indices, offsets)


@register_fake("recops::pruned_hashmap_insert")
def _pruned_hashmap_insert_fake(indices, dense_indices, offsets, hash_table, hash_table_offsets):
    return None
