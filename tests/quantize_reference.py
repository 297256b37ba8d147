"""Plain-PyTorch references of the quantize family: FBGEMM's fused 8-bit and N-bit row-wise
layouts, computed with the same float32 steps (round half to even, saturation, fp16 scale and
bias for N-bit), and the pruned-index remaps with MurmurHash3's finalisers. Used by
tests/test_quantize.py and tests/op_cases.py; rows with NaN are compared with FBGEMM only."""

import math

import torch


def _row_min_max(x):
    """Row minimum and maximum of [rows, cols] float32 as FBGEMM picks them (std::min_element /
    max_element): NaN after the first column skipped, a row starting with NaN gets NaN, of +0
    and -0 the first in the row; 0 and 0 for rows without columns."""
    if x.shape[1] == 0:
        return torch.zeros(x.shape[0], 1), torch.zeros(x.shape[0], 1)
    nan = torch.isnan(x)
    inf = torch.tensor(float("inf"))
    lo = torch.where(nan, inf, x).amin(1, keepdim=True)
    hi = torch.where(nan, -inf, x).amax(1, keepdim=True)
    first_zero = x.gather(1, (x == 0).float().argmax(1, keepdim=True))
    lo = torch.where(lo == 0, first_zero, lo)
    hi = torch.where(hi == 0, first_zero, hi)
    first_nan = nan[:, :1]
    return torch.where(first_nan, x[:, :1], lo), torch.where(first_nan, x[:, :1], hi)


def _codes(x, lo, inverse_scale, max_code):
    v = torch.nan_to_num((x - lo) * inverse_scale, nan=0.0, posinf=0.0, neginf=0.0)
    return torch.round(v.clamp(0, max_code)).to(torch.uint8)


def quantize_8bit(t):
    """FloatOrHalfToFused8BitRowwiseQuantized: [..., cols] -> [..., cols + 8] uint8."""
    x = t.float().reshape(math.prod(t.shape[:-1]), t.shape[-1])
    lo, hi = _row_min_max(x)
    value_range = hi - lo
    inverse_scale = 255.0 / (value_range + torch.tensor(1e-8, dtype=torch.float32))
    codes = _codes(x, lo, inverse_scale, 255)
    scale_bias = (
        torch.cat([value_range / 255.0, lo], 1)
        .clone(memory_format=torch.contiguous_format)
        .view(torch.uint8)
    )
    return torch.cat([codes, scale_bias], 1).reshape(*t.shape[:-1], t.shape[-1] + 8)


def _dequantized(codes, scale, bias, dtype):
    """scale * codes + bias in float64 (the product is exact), rounded to float32, then to dtype."""
    value = (codes.double() * scale.double() + bias.double()).float()
    if dtype == torch.bfloat16:  # FBGEMM rounds half a step away from zero, on the bits
        bits = (value.view(torch.int32).long() + 0x8000) >> 16
        return bits.to(torch.int16).view(torch.bfloat16)
    return value.to(dtype)


def dequantize_8bit(q, dtype=torch.float32, scale_bias_last=True, float_scale_bias=True):
    padding = 4 if float_scale_bias else 2
    rows = q.reshape(math.prod(q.shape[:-1]), q.shape[-1])
    out_cols = rows.shape[1] - 2 * padding
    if scale_bias_last:
        codes, scale_bias = rows[:, :out_cols], rows[:, out_cols:]
    else:
        scale_bias, codes = rows[:, : 2 * padding], rows[:, 2 * padding :]
    scale_bias = scale_bias.clone(memory_format=torch.contiguous_format).view(
        torch.float32 if float_scale_bias else torch.float16
    )
    scale, bias = scale_bias[:, :1].float(), scale_bias[:, 1:].float()
    out = _dequantized(codes, scale, bias, dtype)
    return out.reshape(*q.shape[:-1], out_cols)


def quantize_nbit(t, bit_rate):
    """FloatOrHalfToFusedNBitRowwiseQuantizedSBHalf: [rows, cols] -> packed codes + fp16 scale
    and bias."""
    per_byte = 8 // bit_rate
    max_code = (1 << bit_rate) - 1
    x = t.float()
    lo, hi = _row_min_max(x)
    bias = lo.half()
    lo = bias.float()
    value_range = hi - lo
    scale = torch.where(value_range == 0, torch.ones_like(value_range), value_range / max_code)
    scale = scale.half().float()
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    inverse_scale = 1.0 / scale
    overflow = torch.isinf(inverse_scale)
    scale = torch.where(overflow, torch.ones_like(scale), scale)
    inverse_scale = torch.where(overflow, torch.ones_like(scale), inverse_scale)
    codes = _codes(x, lo, inverse_scale, max_code).long()
    shifts = torch.arange(per_byte) * bit_rate
    packed = (
        (codes.reshape(x.shape[0], x.shape[1] // per_byte, per_byte) << shifts)
        .sum(-1)
        .to(torch.uint8)
    )
    # FBGEMM stores a NaN scale (a row starting with NaN) as 0x7FFF.
    scale_bits = torch.where(scale.isnan(), 0x7FFF, scale.half().view(torch.int16))
    scale_bias = (
        torch.cat([scale_bits.view(torch.float16), bias], 1)
        .clone(memory_format=torch.contiguous_format)
        .view(torch.uint8)
    )
    return torch.cat([packed, scale_bias], 1)


def dequantize_nbit(q, bit_rate, dtype=torch.float32):
    per_byte = 8 // bit_rate
    codes = q[:, :-4].long()
    shifts = torch.arange(per_byte) * bit_rate
    codes = (codes.unsqueeze(-1) >> shifts) & ((1 << bit_rate) - 1)
    codes = codes.reshape(q.shape[0], codes.shape[1] * per_byte)
    scale_bias = q[:, -4:].clone(memory_format=torch.contiguous_format).view(torch.float16).float()
    return _dequantized(codes, scale_bias[:, :1], scale_bias[:, 1:], dtype)


# --------------------------------------------------------------------------- pruned tables
M32, M64 = (1 << 32) - 1, (1 << 64) - 1


def mix32(h):
    h &= M32
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & M32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & M32
    return h ^ (h >> 16)


def mix64(k):
    k &= M64
    k ^= k >> 33
    k = (k * 0xFF51AFD7ED558CCD) & M64
    k ^= k >> 33
    k = (k * 0xC4CEB9FE1A85EC53) & M64
    return k ^ (k >> 33)


def home_slot(key, capacity, index_dtype):
    return (mix32(key) if index_dtype == torch.int32 else mix64(key)) % capacity


def _table_of_each_index(offsets, num_tables):
    """(position, table) of every index the bags cover."""
    values = [int(v) for v in offsets.tolist()]
    batch = (len(values) - 1) // num_tables
    for t in range(num_tables):
        for i in range(values[t * batch], values[(t + 1) * batch]):
            yield i, t


def hashmap_insert(indices, dense_indices, offsets, hash_table, hash_table_offsets):
    """Fills hash_table in place (linear probing, in index order); raises when a slice is full."""
    starts = [int(v) for v in hash_table_offsets.tolist()]
    for i, t in _table_of_each_index(offsets, len(starts) - 1):
        key, dense = int(indices[i]), int(dense_indices[i])
        capacity = starts[t + 1] - starts[t]
        if capacity == 0 or dense == -1:
            continue
        slot = home_slot(key, capacity, indices.dtype)
        for _ in range(capacity):
            row = starts[t] + slot
            if int(hash_table[row, 0]) in (-1, key):
                hash_table[row, 0], hash_table[row, 1] = key, dense
                break
            slot = (slot + 1) % capacity
        else:
            raise ValueError("full")


def hashmap_lookup(indices, offsets, hash_table, hash_table_offsets):
    """The dense index of every index (int64; -1 where no bag covers it), hashed as its dtype."""
    starts = [int(v) for v in hash_table_offsets.tolist()]
    out = torch.full(indices.shape, -1, dtype=torch.int64)
    for i, t in _table_of_each_index(offsets, len(starts) - 1):
        key = int(indices[i])
        capacity = starts[t + 1] - starts[t]
        if capacity == 0:
            out[i] = key
            continue
        slot = home_slot(key, capacity, indices.dtype)
        for _ in range(capacity):
            stored = int(hash_table[starts[t] + slot, 0])
            if stored == -1:
                break
            if stored == key:
                out[i] = int(hash_table[starts[t] + slot, 1])
                break
            slot = (slot + 1) % capacity
    return out


def array_lookup(indices, offsets, remappings, remappings_offsets):
    starts = [int(v) for v in remappings_offsets.tolist()]
    out = torch.full_like(indices, -1)
    for i, t in _table_of_each_index(offsets, len(starts) - 1):
        capacity = starts[t + 1] - starts[t]
        index = int(indices[i])
        if capacity == 0:
            out[i] = index
        else:
            if not 0 <= index < capacity:
                raise IndexError(i)
            out[i] = int(remappings[starts[t] + index])
    return out
