"""FBGEMM's byte layout of quantized inference tables (IntNBitTableBatchedEmbeddingBagsCodegen) as
plain arithmetic. A table is ``rows`` rows of a fixed number of bytes, back to back, each table's
block padded to a 128-byte cache line in one uint8 buffer. A row holds, by type:

- FP32 / FP16: the values (4 / 2 bytes each); FP8: one byte each;
- INT8 / INT4 / INT2: a float16 scale and a float16 bias (``scale_bias_bytes``, 4), then the codes,
  packed low bits first (element d of an INT4 row is in the low nibble of byte d / 2 when d is
  even); element d is ``scale * code[d] + bias``;

then zero padding up to a multiple of ``row_alignment`` bytes."""

from recops.embedding.layout import running_offsets

# FBGEMM's DEFAULT_SCALE_BIAS_SIZE_IN_BYTES: a float16 scale and a float16 bias.
SCALE_BIAS_BYTES = 4
CACHE_LINE = 128


def round_up(value, multiple):
    return (value + multiple - 1) // multiple * multiple


def unpadded_row_bytes(dim, ty, scale_bias_bytes=SCALE_BIAS_BYTES):
    """Bytes of a row's values, and its scale and bias for the integer types."""
    value_bytes = dim * ty.bit_rate() // 8
    return value_bytes if ty.is_float() else value_bytes + scale_bias_bytes


def row_bytes(dim, ty, row_alignment, scale_bias_bytes=SCALE_BIAS_BYTES):
    """Bytes of a stored row: ``unpadded_row_bytes`` rounded up to ``row_alignment``."""
    return round_up(unpadded_row_bytes(dim, ty, scale_bias_bytes), row_alignment)


def table_offsets(specs, row_alignment, cacheline_alignment=True):
    """Where each table of ``specs`` ((rows, dim, SparseType) each) starts in the buffer, then the
    buffer's size: blocks padded to 128 bytes unless ``cacheline_alignment`` is False."""
    sizes = []
    for rows, dim, ty in specs:
        size = rows * row_bytes(dim, ty, row_alignment)
        sizes.append(round_up(size, CACHE_LINE) if cacheline_alignment else size)
    return running_offsets(sizes)
