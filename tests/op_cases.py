"""A catalogue of recops' ops for the bad-input tests: per op, a valid call drawn at random and an
independent plain-PyTorch reference that computes the op's result and rejects (raises Invalid)
every call its contract rejects (docs/ops.md). test_bad_input.py moves each tensor of a valid call
to another device; test_bad_input_properties.py mutates valid calls and compares op and reference.

References are written from the contract, not from the kernels: they validate with Python
comparisons on the values and compute with torch's own ops in float64 where it helps.
"""

import itertools
import math
import random
from dataclasses import dataclass, field

import quantize_reference
import torch
import torch.nn.functional as F
from accuracy import TOLERANCE
from hstu_reference import fuxi_reference, hstu_reference, reference_pos_bias
from test_deberta import make_log_bucket_position
from test_deberta import reference as deberta_reference
from test_int_nbit_lookup import Invalid as LookupInvalid
from test_int_nbit_lookup import lookup_reference
from test_jagged_index_select import add_reference, keyed_select_reference, select_reference
from test_jagged_unique_indices import unique_indices_reference
from test_layer import composition as layer_output_composition
from test_layer import ffn_composition, reference_keep
from test_layer import input_composition as layer_input_composition
from test_relative_bias import reference_time_buckets
from test_retrieval import integer_rows, jagged_exclusions, reference_topk
from test_segment_sum import segment_sum_reference

from recops.embedding.optimizers import ALL_ROWS as OPTIMIZER_ROWS

ops = torch.ops.recops
I32, I64 = torch.int32, torch.int64
F16, BF16, F32, F64 = torch.float16, torch.bfloat16, torch.float32, torch.float64
INDEX_DTYPES = (I32, I64)
FLOAT_DTYPES = (F32, F64, F16, BF16)
# The dtypes a copy op moves as raw elements of 1, 2, 4 or 8 bytes.
ELEMENT_DTYPES = (torch.bool, torch.uint8, torch.int8, torch.int16, I32, I64, *FLOAT_DTYPES)


class Invalid(Exception):
    """The reference rejects the call: the op must raise."""


class HugeOutput(Exception):
    """The call is valid and asks for an output larger than a test makes (a size read from data,
    as dense_to_jagged's last offset without total_L): memory exhaustion, not a bug, so the op is
    not run. The data-read counterpart of mutations.SIZE_ARGUMENTS."""


MAX_TEST_OUTPUT_ELEMENTS = 2**24


def require(condition, why):
    if not condition:
        raise Invalid(why)


class Draw:
    """The choices a valid call is built from: hypothesis' (``data.draw``) or a seeded RNG's."""

    def __init__(self, pick):
        self._pick = pick  # pick(lo, hi) -> an int in [lo, hi]

    def int(self, lo, hi):
        return self._pick(lo, hi)

    def choice(self, options):
        return options[self.int(0, len(options) - 1)]

    def bool(self):
        return self.int(0, 1) == 1

    def generator(self):
        return torch.Generator().manual_seed(self.int(0, 2**31 - 1))


def seeded_draw(seed):
    rng = random.Random(seed)
    return Draw(rng.randint)


@dataclass
class OpCase:
    """One op: ``make(draw)`` gives a valid call's arguments by schema name, ``reference(args)``
    the expected result (raising Invalid when the contract rejects ``args``); ``tolerance`` maps a
    result dtype to (rtol, atol)."""

    op_name: str
    make: object
    reference: object
    tolerance: dict = field(default_factory=dict)
    unmodelled: tuple = ()  # arguments whose values the reference cannot follow once changed

    @property
    def op(self):
        return getattr(ops, self.op_name)

    def arg_names(self):
        return [a.name for a in self.op.default._schema.arguments]

    def call(self, seed):
        """The op's arguments of the valid call drawn with `seed`, by name (without the notes for
        the reference, named "_...")."""
        return op_arguments(self.make(seeded_draw(seed)))


def op_arguments(args):
    return {n: v for n, v in args.items() if not n.startswith("_")}


# --------------------------------------------------------------------------- argument rules
def tensor(args, name, dtypes=None, ranks=None):
    """args[name], required to be a CPU tensor of one of `dtypes` and `ranks` (None: any)."""
    t = args[name]
    require(isinstance(t, torch.Tensor), f"{name} is a tensor")
    require(t.device.type == "cpu", f"{name} on cpu")
    require(dtypes is None or t.dtype in dtypes, f"{name} dtype")
    require(ranks is None or t.dim() in ranks, f"{name} rank")
    return t


def optional_tensor(args, name, dtypes=None, ranks=None):
    return None if args.get(name) is None else tensor(args, name, dtypes, ranks)


def ints(t):
    return [int(x) for x in t.reshape(-1).tolist()]


def offsets_list(t, name):
    """The values of a 1-D offsets tensor: at least one, starting at >= 0, non-decreasing."""
    values = ints(t)
    require(len(values) >= 1, f"{name} not empty")
    require(values[0] >= 0, f"{name}[0] >= 0")
    require(all(b >= a for a, b in itertools.pairwise(values)), f"{name} non-decreasing")
    return values


def finite(value, name, compute=F64):
    require(isinstance(value, float | int) and math.isfinite(value), f"{name} finite")
    if compute != F64:
        require(abs(value) <= torch.finfo(torch.float32).max, f"{name} in float range")
    return float(value)


def compute_dtype(q):
    return F64 if q.dtype == F64 else F32


def padding_in(value, dtype):
    """padding_value converted as a fill converts it: checked for integers (NaN, inf and values out
    of range are errors), through float32 for half and bfloat16."""
    if dtype == torch.bool:
        return torch.tensor(value != 0)
    if not dtype.is_floating_point:
        info = torch.iinfo(dtype)
        require(math.isfinite(value) and info.min <= value <= info.max, "padding_value in range")
        return torch.tensor(int(value), dtype=dtype)
    if dtype in (F16, BF16):
        return torch.tensor(value, dtype=F64).to(F32).to(dtype)
    if dtype == F32:
        limit = torch.finfo(F32).max
        require(not math.isfinite(value) or abs(value) <= limit, "padding_value in float range")
    return torch.tensor(value, dtype=F64).to(dtype)


# --------------------------------------------------------------------------- cumsum
def make_cumsum(ranks):
    def make(d):
        dtype = d.choice((I32, I64, F32, F64, F16))
        shape = [d.int(0, 6) for _ in range(d.choice(ranks))]
        gen = d.generator()
        if dtype.is_floating_point:
            t_in = torch.randn(shape, generator=gen).to(dtype)
        else:
            t_in = torch.randint(-5, 10, shape, generator=gen, dtype=dtype)
        return {"t_in": t_in}

    return make


CUMSUM_DTYPES = (torch.uint8, torch.int8, torch.int16, I32, I64, *FLOAT_DTYPES)


def wide_cumsum(t, dim):
    """cumsum in int64 / float64, returned in t's dtype (integers wrap, as in the op)."""
    wide = t.long() if not t.dtype.is_floating_point else t.double()
    return wide.cumsum(dim).to(t.dtype)


def ref_complete_cumsum(a):
    t = tensor(a, "t_in", CUMSUM_DTYPES, (1, 2))
    rows = t if t.dim() == 2 else t.reshape(1, -1)
    out = torch.cat([torch.zeros(rows.shape[0], 1, dtype=t.dtype), wide_cumsum(rows, 1)], 1)
    return out if t.dim() == 2 else out.reshape(-1)


def ref_flat_cumsum(inclusive):
    def ref(a):
        t = tensor(a, "t_in", CUMSUM_DTYPES)
        flat = wide_cumsum(t.reshape(-1), 0)
        if not inclusive:
            flat = torch.cat([torch.zeros(1, dtype=t.dtype), flat[:-1]])[: t.numel()]
        return flat.reshape(t.shape)

    return ref


# --------------------------------------------------------------------------- jagged
def random_lengths(d, gen, count, max_length):
    return torch.randint(0, max_length + 1, (count,), generator=gen).tolist()


def make_levels(d, gen, batch, max_lengths, index_dtype, overshoot=1):
    """Offsets of len(max_lengths) jagged levels, rows up to max_length + overshoot long."""
    levels, rows = [], batch
    for max_length in max_lengths:
        lengths = random_lengths(d, gen, rows, max_length + overshoot)
        level = [0, *itertools.accumulate(lengths)]
        levels.append(torch.tensor(level, dtype=index_dtype))
        rows = level[-1]
    return levels, rows


def check_levels(a, name):
    """Validated offsets levels: 1 to 5 int32/int64 1-D tensors of one dtype, level d + 1 with
    offsets[d][-1] + 1 entries; returns their values."""
    levels = a[name]
    require(isinstance(levels, list | tuple) and 1 <= len(levels) <= 5, f"{name} 1 to 5 levels")
    values, previous_last = [], None
    for d, level in enumerate(levels):
        t = tensor({"x": level}, "x", INDEX_DTYPES, (1,))
        require(t.dtype == levels[0].dtype, f"{name} one dtype")
        v = offsets_list(t, f"{name}[{d}]")
        require(previous_last is None or len(v) == previous_last + 1, f"{name}[{d}] size")
        previous_last = v[-1]
        values.append(v)
    return values


def coordinates(levels, max_lengths):
    """(dense index, values row) of every jagged element inside the dense extent."""
    found = []

    def walk(level, row, index):
        start, end = levels[level][row], levels[level][row + 1]
        for i in range(min(end - start, max_lengths[level])):
            if level == len(levels) - 1:
                found.append(((*index, i), start + i))
            else:
                walk(level + 1, start + i, (*index, i))

    for b in range(len(levels[0]) - 1):
        walk(0, b, (b,))
    return found


def jagged_to_dense(values, levels, max_lengths, padding):
    batch = len(levels[0]) - 1
    dense = padding.expand(batch, *max_lengths, *values.shape[1:]).clone()
    for index, row in coordinates(levels, max_lengths):
        dense[index] = values[row]
    return dense


def dense_to_jagged(dense, levels, total_L):
    out = dense.new_zeros((total_L, *dense.shape[1 + len(levels) :]))
    for index, row in coordinates(levels, list(dense.shape[1 : 1 + len(levels)])):
        out[row] = dense[index]
    return out


def make_jagged_to_dense(d):
    gen = d.generator()
    num_levels = d.int(1, 3)
    max_lengths = [d.int(0, 3) for _ in range(num_levels)]
    levels, rows = make_levels(d, gen, d.int(0, 4), max_lengths, d.choice(INDEX_DTYPES))
    dtype = d.choice((F32, F64, I64, F16))
    row = [d.int(1, 3)] if d.bool() else []
    values = torch.randn(rows + d.int(0, 2), *row, generator=gen).to(dtype)
    return {
        "values": values,
        "offsets": levels,
        "max_lengths": max_lengths,
        "padding_value": d.choice((0.0, -1.5, 7.0)),
    }


def ref_jagged_to_dense(a):
    levels = check_levels(a, "offsets")
    values = tensor(a, "values", ELEMENT_DTYPES)
    require(values.dim() >= 1, "values at least 1-D")
    max_lengths = a["max_lengths"]
    require(len(max_lengths) == len(levels), "max_lengths per level")
    require(all(m >= 0 for m in max_lengths), "max_lengths >= 0")
    require(levels[-1][-1] <= values.shape[0], "values rows")
    padding = padding_in(a.get("padding_value", 0.0), values.dtype)
    return jagged_to_dense(values, levels, max_lengths, padding)


def make_dense_to_jagged(grad_name):
    def make(d):
        gen = d.generator()
        num_levels = d.int(1, 3)
        max_lengths = [d.int(0, 3) for _ in range(num_levels)]
        # Rows up to twice max_length, as FBGEMM's tests draw them: jagged_to_padded_dense
        # truncates the longer ones, and dense_to_jagged zero-fills what it cut.
        overshoot = max(max_lengths) if d.bool() else 0
        index_dtype = d.choice(INDEX_DTYPES)
        levels, rows = make_levels(d, gen, d.int(0, 4), max_lengths, index_dtype, overshoot)
        row = [d.int(1, 3)] if d.bool() or grad_name == "dense" else []
        dtype = d.choice((F32, F64, I32))
        dense = torch.randn(len(levels[0]) - 1, *max_lengths, *row, generator=gen).to(dtype)
        args = {grad_name: dense, "offsets" if grad_name != "dense" else "x_offsets": levels}
        total_L = rows + d.int(0, 2)
        if grad_name != "dense" or d.bool():
            args["total_L"] = total_L
        return args

    return make


def ref_dense_to_jagged(grad_name, offsets_name):
    def ref(a):
        levels = check_levels(a, offsets_name)
        dense = tensor(a, grad_name, ELEMENT_DTYPES)
        require(dense.dim() >= len(levels) + 1, f"{grad_name} dims")
        require(dense.shape[0] == len(levels[0]) - 1, f"{grad_name} batch")
        last = levels[-1][-1]
        total_L = a.get("total_L")
        if total_L is None:
            total_L = last
            if last * math.prod(dense.shape[1 + len(levels) :]) > MAX_TEST_OUTPUT_ELEMENTS:
                raise HugeOutput(f"{offsets_name}[-1][-1] = {last} rows")
        require(total_L >= last, "total_L >= last offset")
        values = dense_to_jagged(dense, levels, total_L)
        return (values, list(a[offsets_name])) if a.get("_pair") else values

    return ref


def make_one_level(rank):
    def make(d):
        gen = d.generator()
        levels, rows = make_levels(d, gen, d.int(0, 4), [3], d.choice(INDEX_DTYPES))
        shape = (rows + d.int(0, 2), *([d.int(1, 3)] if rank == 2 else []))
        dtype = d.choice((F32, I64)) if rank == 1 else F32
        values = torch.randn(shape, generator=gen).to(dtype) * 10
        args = {"values": values, "offsets": levels[0], "max_sequence_length": d.int(0, 4)}
        if rank == 1:
            args["padding_value"] = d.choice((0, -1, 2**40))
        return args

    return make


def ref_one_level(rank):
    def ref(a):
        tensor(a, "values", None, (rank,))
        offsets = tensor(a, "offsets", INDEX_DTYPES, (1,))
        b = {
            "values": a["values"],
            "offsets": [offsets],
            "max_lengths": [a["max_sequence_length"]],
            "padding_value": a.get("padding_value", 0),
        }
        return ref_jagged_to_dense(b)

    return ref


def make_offsets_range(d):
    gen = d.generator()
    lengths = random_lengths(d, gen, d.int(0, 6), 4)
    start = d.int(0, 2)
    offsets = [start + x for x in itertools.accumulate([0, *lengths])][:-1]
    last = offsets[-1] if offsets else 0
    return {
        "offsets": torch.tensor(offsets, dtype=d.choice(INDEX_DTYPES)),
        "range_size": last + d.int(0, 4),
    }


def ref_offsets_range(a):
    t = tensor(a, "offsets", INDEX_DTYPES, (1,))
    range_size = a["range_size"]
    require(range_size >= 0, "range_size >= 0")
    starts = offsets_list(t, "offsets") if t.numel() else []
    require(not starts or starts[-1] <= range_size, "offsets[-1] <= range_size")
    return offsets_range(starts, range_size, t.dtype)


def offsets_range(starts, range_size, dtype):
    """Each position's distance from the last start at or before it."""
    out = torch.zeros(range_size, dtype=dtype)
    for s, e in itertools.pairwise([*starts, range_size]):
        out[s:e] = torch.arange(e - s)
    return out


# --------------------------------------------------------------------------- jagged: new ops
def make_segment_sum(d):
    gen = d.generator()
    batch_size = d.int(0, 3)
    lengths = random_lengths(d, gen, d.int(0, 5), 3)
    csr = torch.tensor([0, *itertools.accumulate(lengths)], dtype=d.choice(INDEX_DTYPES))
    dtype = d.choice((I32, I64, F32, F64, F16, BF16))
    values = torch.randint(-4, 5, (int(csr[-1]) * batch_size + d.int(0, 2),), generator=gen)
    return {"batch_size": batch_size, "csr_seg": csr, "values": values.to(dtype)}


def ref_segment_sum(a):
    batch_size = a["batch_size"]
    require(batch_size >= 0, "batch_size >= 0")
    csr = tensor(a, "csr_seg", INDEX_DTYPES)
    values = tensor(a, "values", (I32, I64, *FLOAT_DTYPES))
    bounds = offsets_list(csr.reshape(-1), "csr_seg")
    require(bounds[-1] * batch_size <= values.numel(), "csr_seg[-1] * batch_size within values")
    return segment_sum_reference(batch_size, csr, values)


def make_batched_cumsum(d):
    return {"values": make_cumsum((2,))(d)["t_in"]}


def ref_batched_cumsum(a):
    return ref_complete_cumsum({"t_in": tensor(a, "values", CUMSUM_DTYPES, (2,))})


def make_jagged_selection(d, gen, index_dtype):
    """values [rows, cols], lengths and indices of a valid jagged_index_select."""
    lengths = torch.tensor(random_lengths(d, gen, d.int(0, 5), 3), dtype=index_dtype)
    count = d.int(0, 6) if lengths.numel() else 0
    indices = torch.randint(0, max(lengths.numel(), 1), (count,), generator=gen, dtype=index_dtype)
    values = torch.randn(int(lengths.sum()) + d.int(0, 1), d.int(0, 3), generator=gen)
    return values.to(d.choice(FLOAT_DTYPES)), lengths, indices


def make_index_select_2d(v2):
    def make(d):
        gen = d.generator()
        values, lengths, indices = make_jagged_selection(d, gen, d.choice(INDEX_DTYPES))
        output_offsets = lengths[indices.long()].cumsum(0)
        rows = int(output_offsets[-1]) if output_offsets.numel() else 0
        args = {
            "values": values,
            "indices": indices,
            "input_offsets": lengths.cumsum(0),
            "output_offsets": output_offsets,
        }
        if not v2 or d.bool():
            args["num_dense_output_rows"] = d.int(0, rows)
        return args

    return make


def inclusive_offsets(a, name):
    """A 1-D int32/int64 inclusive offsets tensor (may be empty) and its values."""
    t = tensor(a, name, INDEX_DTYPES, (1,))
    return t, ints(t)


def ref_index_select_2d(a):
    values = tensor(a, "values", None, (2,))
    _, in_ends = inclusive_offsets(a, "input_offsets")
    out_t, out_ends = inclusive_offsets(a, "output_offsets")
    indices = tensor(a, "indices", INDEX_DTYPES, (1,))
    require(indices.numel() >= len(out_ends), "one index per output segment")
    if out_ends:
        offsets_list(out_t, "output_offsets")
    covered = out_ends[-1] if out_ends else 0
    rows = a.get("num_dense_output_rows")
    rows = covered if rows is None else rows
    require(0 <= rows <= covered, "num_dense_output_rows in [0, covered rows]")
    index = ints(indices)
    for k, end in enumerate(out_ends):
        begin = out_ends[k - 1] if k else 0
        count = min(end, rows) - begin
        if count <= 0:
            continue
        require(0 <= index[k] < len(in_ends), "index in range")
        first = in_ends[index[k] - 1] if index[k] else 0
        require(0 <= first and first + count <= values.shape[0], "rows within values")
    return select_reference(values, indices, a["input_offsets"], out_t, rows)


def make_index_add_2d(d):
    gen = d.generator()
    values, lengths, indices = make_jagged_selection(d, gen, d.choice(INDEX_DTYPES))
    values = values.to(d.choice((F32, F64, I32, I64)) if d.bool() else values.dtype)
    grad_lengths = lengths[indices.long()]
    rows = int(grad_lengths.sum())
    grad = torch.randint(-5, 6, (rows, values.shape[1]), generator=gen).to(values.dtype)
    return {
        "values": grad,
        "indices": indices,
        "input_offsets": grad_lengths.cumsum(0),
        "output_offsets": lengths.cumsum(0),
        "num_dense_input_rows": rows,
        "num_output_rows": values.shape[0],
    }


def ref_index_add_2d(a):
    values = tensor(a, "values", (I32, I64, *FLOAT_DTYPES), (2,))
    in_t, in_ends = inclusive_offsets(a, "input_offsets")
    _, out_ends = inclusive_offsets(a, "output_offsets")
    indices = tensor(a, "indices", INDEX_DTYPES, (1,))
    require(indices.numel() >= len(in_ends), "one index per input segment")
    num_output_rows = a["num_output_rows"]
    require(num_output_rows >= 0, "num_output_rows >= 0")
    if in_ends:
        offsets_list(in_t, "input_offsets")
    require(values.shape[0] <= (in_ends[-1] if in_ends else 0), "values rows covered")
    index = ints(indices)
    for k, end in enumerate(in_ends):
        begin = in_ends[k - 1] if k else 0
        count = min(end, values.shape[0]) - begin
        if count <= 0:
            continue
        require(0 <= index[k] < len(out_ends), "index in range")
        first = out_ends[index[k] - 1] if index[k] else 0
        require(0 <= first and first + count <= num_output_rows, "rows within the output")
    return add_reference(values, indices, in_t, a["output_offsets"], num_output_rows)


def make_index_add_2d_v2(d):
    args = make_index_add_2d(d)
    return {**args, "num_output_rows": args.pop("num_output_rows")}


def make_jagged_index_select(d):
    gen = d.generator()
    values, lengths, indices = make_jagged_selection(d, gen, d.choice(INDEX_DTYPES))
    args = {"values": values, "lengths": lengths, "indices": indices}
    if d.bool():
        args["num_dense_output_rows"] = int(lengths[indices.long()].sum())
    return args


def ref_jagged_index_select(a):
    values = tensor(a, "values", None, (2,))
    lengths = tensor(a, "lengths", None, (1,))
    require(not lengths.dtype.is_floating_point and lengths.dtype != torch.bool, "integer lengths")
    indices = tensor(a, "indices", INDEX_DTYPES, (1,))
    require(all(0 <= i < lengths.numel() for i in ints(indices)), "indices in range")
    require(all(x >= 0 for x in ints(lengths)), "lengths >= 0")
    output_lengths = lengths[indices.long()]
    out = ref_index_select_2d(
        {
            "values": values,
            "indices": indices,
            "input_offsets": lengths.long().cumsum(0),
            "output_offsets": output_lengths.long().cumsum(0),
            "num_dense_output_rows": a.get("num_dense_output_rows"),
        }
    )
    return [out, output_lengths]


def make_keyed_select(d):
    gen = d.generator()
    index_dtype = d.choice(INDEX_DTYPES)
    batch_size, keys = d.int(1, 3), d.int(0, 3)
    lengths = torch.randint(0, 3, (keys * batch_size,), generator=gen, dtype=index_dtype)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.long().cumsum(0)])
    total = int(offsets[-1])
    values = torch.randint(0, 100, (total,), generator=gen).to(d.choice((I64, F32, F16)))
    indices = torch.randint(
        0, batch_size, (d.int(0, 4),), generator=gen, dtype=d.choice(INDEX_DTYPES)
    )
    args = {
        "values": values,
        "lengths": lengths,
        "offsets": offsets.to(d.choice(INDEX_DTYPES)),
        "indices": indices,
        "batch_size": batch_size,
        "weights": torch.rand(total, generator=gen) if d.bool() else None,
    }
    if d.bool():
        args["selected_lengths_sum"] = int(
            keyed_select_reference(values, lengths, offsets, indices, batch_size)[0].shape[0]
        )
    return args


def ref_keyed_select(a):
    values = tensor(a, "values", None, (1,))
    lengths = tensor(a, "lengths", INDEX_DTYPES, (1,))
    offsets = tensor(a, "offsets", INDEX_DTYPES, (1,))
    indices = tensor(a, "indices", INDEX_DTYPES, (1,))
    weights = optional_tensor(a, "weights", None, (1,))
    batch_size = a["batch_size"]
    require(weights is None or weights.numel() == values.numel(), "weights per value")
    require(offsets.numel() == lengths.numel() + 1, "offsets size")
    require(batch_size > 0 and lengths.numel() % batch_size == 0, "batch_size divides lengths")
    hint = a.get("selected_lengths_sum")
    require(hint is None or hint >= 0, "selected_lengths_sum >= 0")
    require(all(0 <= i < batch_size for i in ints(indices)), "indices in range")
    lens, offs = ints(lengths), ints(offsets)
    require(all(x >= 0 for x in lens), "lengths >= 0")
    num_batches = lengths.numel() // batch_size
    total = 0
    for key in range(num_batches):
        for i in ints(indices):
            s = key * batch_size + i
            begin = 0 if s == 0 else offs[s]
            require(0 <= begin and begin + lens[s] <= values.numel(), "segment within values")
            total += lens[s]
    require(hint is None or hint == total, "selected_lengths_sum matches")
    return keyed_select_reference(values, lengths, offsets, indices, batch_size, weights)


def make_unique_indices(d):
    gen = d.generator()
    dtype = d.choice(INDEX_DTYPES)
    features, batch = d.int(1, 3), d.int(0, 3)
    sizes = torch.randint(1, 4, (features,), generator=gen)
    hsc = torch.cat([torch.zeros(1, dtype=torch.long), sizes.cumsum(0)])
    lengths = torch.randint(0, 3, (features * batch,), generator=gen)
    bag_feature = torch.arange(features * batch) // max(batch, 1)
    limits = sizes[bag_feature].repeat_interleave(lengths)
    indices = (torch.rand(int(lengths.sum()), generator=gen) * limits).long()
    return {
        "hash_size_cumsum": hsc.to(dtype),
        "hash_size_offsets": torch.arange(features + 1, dtype=dtype),
        "offsets": torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)]).to(dtype),
        "indices": indices.to(dtype),
    }


def ref_unique_indices(a):
    indices = tensor(a, "indices", INDEX_DTYPES, (1,))
    names = ("hash_size_cumsum", "hash_size_offsets", "offsets")
    hsc, hso, offsets = (tensor(a, n, (indices.dtype,), (1,)) for n in names)
    features = hsc.numel() - 1
    require(features >= 1, "at least one feature")
    require(hso.numel() == features + 1, "hash_size_offsets size")
    require(offsets.numel() >= 1 and (offsets.numel() - 1) % features == 0, "offsets size")
    cum = offsets_list(hsc, "hash_size_cumsum")
    groups = offsets_list(hso, "hash_size_offsets")
    require(groups[-1] <= features, "hash_size_offsets entries <= T")
    offs = offsets_list(offsets, "offsets")
    require(offs[0] == 0 and offs[-1] == indices.numel(), "offsets span the indices")
    batch = (offsets.numel() - 1) // features
    index = ints(indices)
    for b in range(offsets.numel() - 1):
        t = b // batch
        size = cum[t + 1] - cum[t]
        bounded = t + 1 < features and size > 0
        for i in range(offs[b], offs[b + 1]):
            require(index[i] >= 0 and (not bounded or index[i] < size), "index within its hash")
            require(cum[t] + index[i] < 2**63, "linearized index within int64")
    return unique_indices_reference(hsc, hso, offsets, indices)


# --------------------------------------------------------------------------- sparse
def make_permute(flat):
    def make(d):
        gen = d.generator()
        features, batch = d.int(0, 5), d.int(1, 3)
        lengths = torch.randint(
            0, 4, (features, batch), generator=gen, dtype=d.choice(INDEX_DTYPES)
        )
        if flat:
            lengths = lengths.flatten()
        segments = lengths.shape[0]
        count = d.int(0, segments + 2) if segments else 0
        permute = torch.randint(0, max(segments, 1), (count,), generator=gen, dtype=I32)
        total = int(lengths.sum())
        values = torch.randint(0, 1000, (total + d.int(0, 2),), generator=gen)
        weights = torch.rand(values.shape[0], generator=gen) if d.bool() else None
        args = {"permute": permute, "lengths": lengths, "values": values, "weights": weights}
        if d.bool():
            per_segment = lengths.reshape(-1, 1) if flat else lengths
            args["permuted_lengths_sum"] = int(per_segment[permute.long()].sum())
        return args

    return make


def ref_permute(flat):
    def ref(a):
        permute = tensor(a, "permute", INDEX_DTYPES, (1,))
        lengths = tensor(a, "lengths", INDEX_DTYPES, None if flat else (2,))
        segments = lengths.reshape(-1, 1) if flat else lengths
        require(all(x >= 0 for x in ints(lengths)), "lengths >= 0")
        order = ints(permute)
        require(all(0 <= p < segments.shape[0] for p in order), "permute in range")
        sizes = ints(segments.sum(1)) if segments.numel() else [0] * segments.shape[0]
        starts = [0, *itertools.accumulate(sizes)]
        hint = a.get("permuted_lengths_sum")
        require(hint is None or hint == sum(sizes[p] for p in order), "permuted_lengths_sum")

        def regroup(name):
            src = optional_tensor(a, name)
            if src is None:
                return None
            require(src.dim() >= 1 and src.shape[0] >= starts[-1], f"{name} rows")
            pieces = [src[starts[p] : starts[p + 1]] for p in order]
            return torch.cat(pieces) if pieces else src[:0].clone()

        out_lengths = segments[order].reshape(-1) if flat else segments[order]
        return out_lengths, regroup("values"), regroup("weights")

    return ref


def make_invert(d):
    return {
        "permute": torch.randperm(d.int(0, 8), generator=d.generator()).to(d.choice(INDEX_DTYPES))
    }


def ref_invert(a):
    permute = tensor(a, "permute", INDEX_DTYPES, (1,))
    p = ints(permute)
    require(sorted(p) == list(range(len(p))), "a permutation")
    out = torch.empty_like(permute)
    out[permute.long()] = torch.arange(len(p), dtype=permute.dtype)
    return out


def make_block_bucketize(d):
    """A row-wise sharding input distribution: T features of B bags (or per-feature batch sizes),
    ids mostly inside the blocks, some beyond them and some negative."""
    gen = d.generator()
    index_dtype = d.choice(INDEX_DTYPES)
    features, my_size = d.int(1, 3), d.int(1, 4)
    variable = d.bool()
    batch = [d.int(0, 3) for _ in range(features)] if variable else [d.int(0, 3)] * features
    lengths = torch.randint(0, 4, (sum(batch),), generator=gen).to(d.choice(INDEX_DTYPES))
    block_sizes = torch.randint(0, 5, (features,), generator=gen).to(index_dtype)
    num_ids = int(lengths.sum())
    ids = torch.randint(-3, 5 * 4 * my_size + 3, (num_ids,), generator=gen).to(index_dtype)
    args = {
        "lengths": lengths,
        "indices": ids,
        "bucketize_pos": d.bool(),
        "sequence": d.bool(),
        "block_sizes": block_sizes,
        "my_size": my_size,
        "weights": torch.rand(num_ids, generator=gen).to(d.choice((F32, F64)))
        if d.bool()
        else None,
        "batch_size_per_feature": torch.tensor(batch, dtype=lengths.dtype) if variable else None,
        "max_B": max(batch),
        "keep_orig_idx": d.bool(),
    }
    rule = d.int(0, 3)
    if rule in (1, 3):  # explicit bounds: my_size + 1 cumulative row counts from 0
        args["block_bucketize_pos"] = [
            torch.tensor([0, *itertools.accumulate(d.int(0, 6) for _ in range(my_size))]).to(
                index_dtype
            )
            for _ in range(features)
        ]
    if rule == 3:  # with bounds, any positive block count (not a multiple of my_size)
        args["total_num_blocks"] = torch.tensor(
            [d.int(1, 3 * my_size + 1) for _ in range(features)], dtype=index_dtype
        )
    elif rule == 2:
        args["total_num_blocks"] = torch.tensor(
            [my_size * d.int(1, 3) for _ in range(features)], dtype=index_dtype
        )
    if d.bool():
        args["keep_orig_idx_per_feature"] = torch.tensor([d.bool() for _ in range(features)])
    return args


def block_bucketize_rules(a):
    """Checks a call against the contract; returns (T, bags of each feature, per-feature rules)."""
    lengths = tensor(a, "lengths", INDEX_DTYPES, (1,))
    ids = tensor(a, "indices", INDEX_DTYPES, (1,))
    block_sizes = tensor(a, "block_sizes", (ids.dtype,), (1,))
    my_size = a["my_size"]
    require(my_size >= 1, "my_size >= 1")
    T = block_sizes.numel()
    require(T >= 1, "a feature")
    require(all(x >= 0 for x in ints(lengths)), "lengths >= 0")
    require(sum(ints(lengths)) == ids.numel(), "lengths sum to the ids")
    sizes = optional_tensor(a, "batch_size_per_feature", INDEX_DTYPES, (1,))
    if sizes is None:
        require(lengths.numel() % T == 0, "lengths a multiple of T")
        batch = [lengths.numel() // T] * T
    else:
        batch = ints(sizes)
        require(len(batch) == T and all(b >= 0 for b in batch), "batch sizes")
        require(sum(batch) == lengths.numel(), "batch sizes sum to lengths")
    bounds = a.get("block_bucketize_pos") or []
    require(len(bounds) in (0, T), "one bounds tensor per feature")
    total = optional_tensor(a, "total_num_blocks", (ids.dtype,), (1,))
    require(total is None or total.numel() == T, "one total per feature")
    keep = optional_tensor(a, "keep_orig_idx_per_feature", (torch.bool,))
    require(keep is None or keep.numel() == T, "one keep flag per feature")
    weights = optional_tensor(a, "weights", (F32, F64), (1,))
    require(weights is None or weights.numel() == ids.numel(), "one weight per id")
    top = torch.iinfo(ids.dtype).max
    rules = []
    for t in range(T):
        block = ints(block_sizes)[t]
        require(block >= 0, "block_sizes >= 0")
        glob = my_size if total is None else ints(total)[t]
        # Without bounds, total_num_blocks cuts the table into runs of blocks per bucket; with
        # bounds it only spreads ids when the block size is 0 (any positive count), else unused.
        if not bounds:
            require(glob > 0 and glob % my_size == 0, "total_num_blocks multiples of my_size")
            require(glob <= top and block * glob <= top, "blocks fit the ids' dtype")
        elif block == 0:
            require(glob > 0, "total_num_blocks > 0 where bounds spread ids")
            require(glob <= top, "blocks fit the ids' dtype")
        b = None
        if bounds:
            bt = tensor({"b": bounds[t]}, "b", (ids.dtype,), (1,))
            b = ints(bt)
            require(len(b) >= 1 and b[0] == 0, "bounds start at 0")
            require(all(y >= x for x, y in itertools.pairwise(b)), "bounds non-decreasing")
        kept = bool(keep[t]) if keep is not None else a.get("keep_orig_idx", False)
        rules.append((block, glob, glob // my_size if total is not None else 1, b, kept))
    return batch, rules


def ref_block_bucketize(a):
    return block_bucketize_reference(a)[0]


def block_bucketize_reference(a):
    """(the five results of block_bucketize_sparse_features, each input id's bucket)."""
    batch, rules = block_bucketize_rules(a)
    ids, lengths, my_size = a["indices"], a["lengths"], a["my_size"]
    bits = torch.iinfo(ids.dtype).bits
    mask = (1 << bits) - 1
    weights = a.get("weights")
    bags = [[[] for _ in range(lengths.numel())] for _ in range(my_size)]
    feature_of = [t for t, n in enumerate(batch) for _ in range(n)]
    buckets = [0] * ids.numel()
    starts = [0, *itertools.accumulate(ints(lengths))]
    for j, t in enumerate(feature_of):
        block, glob, local, b, kept = rules[t]
        for i in range(starts[j], starts[j + 1]):
            u = int(ids[i]) & mask  # ids are read unsigned
            if b is not None:
                probe = (((u % glob) * b[-1]) & mask) // glob if block == 0 else u
                lb = sum(1 for x in b if x <= probe) - 1
                p = lb if lb < my_size else u % my_size
                if kept:
                    new = u
                elif block == 0:
                    new = u // glob
                else:
                    new = u - b[lb] if lb < my_size else u // my_size
            else:
                inside = u < block * glob
                p = u // (block * local) if inside else (u % glob) // local
                new = u if kept else (u % (block * local) if inside else u // glob)
            new = new - (1 << bits) if new >= 1 << (bits - 1) else new
            bags[p][j].append((new, i, i - starts[j]))
            buckets[i] = p
    entries = [e for bucket in bags for bag in bucket for e in bag]
    new_lengths = torch.tensor([len(bag) for bucket in bags for bag in bucket], dtype=lengths.dtype)
    new_ids = torch.tensor([e[0] for e in entries], dtype=ids.dtype)
    source = torch.tensor([e[1] for e in entries], dtype=torch.long)
    unbucketize = torch.empty_like(ids)
    unbucketize[source] = torch.arange(len(entries), dtype=ids.dtype)
    results = (
        new_lengths,
        new_ids,
        None if weights is None else weights[source],
        torch.tensor([e[2] for e in entries], dtype=ids.dtype) if a["bucketize_pos"] else None,
        unbucketize if a["sequence"] else None,
    )
    return results, torch.tensor(buckets, dtype=ids.dtype)


def make_block_bucketize_inference(d):
    return {**make_block_bucketize(d), "return_bucket_mapping": d.bool()}


def ref_block_bucketize_inference(a):
    results, buckets = block_bucketize_reference(a)
    return (*results, buckets if a.get("return_bucket_mapping", False) else None)


def make_permute_sparse_features(d):
    a = make_permute(False)(d)
    lengths = a["lengths"]
    return {
        "permute": a["permute"],
        "lengths": lengths,
        "indices": a["values"].to(lengths.dtype),
        "weights": a["weights"],
    }


def ref_permute_sparse_features(a):
    lengths = tensor(a, "lengths", INDEX_DTYPES, (2,))
    tensor(a, "indices", (lengths.dtype,))
    call = {"permute": a["permute"], "lengths": lengths, "values": a["indices"]}
    return ref_permute(False)({**call, "weights": a.get("weights")})


def make_permute_input1d(d):
    a = make_permute(False)(d)
    stride = a["lengths"].shape[1]
    return {**a, "lengths": a["lengths"].flatten(), "stride": stride}


def ref_permute_input1d(a):
    lengths = tensor(a, "lengths", INDEX_DTYPES)
    stride = a["stride"]
    require(stride >= 1 and lengths.numel() % stride == 0, "lengths.numel() a multiple of stride")
    call = {k: v for k, v in a.items() if k != "stride"}
    out_lengths, values, weights = ref_permute(False)(
        {**call, "lengths": lengths.reshape(-1, stride)}
    )
    return out_lengths.reshape(-1), values, weights


def make_permute_preallocated(d):
    a = make_permute(False)(d)
    lengths_out, values_out, weights_out = ref_permute(False)(a)
    spare = d.int(0, 2)  # outputs may be larger than the result, which fills their front

    def buffer(t):
        return torch.full((t.numel() + spare,), 7, dtype=t.dtype) if d.bool() else None

    a["permuted_lengths_out"] = buffer(lengths_out)
    a["permuted_indices_out"] = buffer(values_out.reshape(-1))
    a["permuted_weights_out"] = None if weights_out is None else buffer(weights_out)
    return a


def ref_permute_preallocated(a):
    results = ref_permute(False)(a)
    outs = ("permuted_lengths_out", "permuted_indices_out", "permuted_weights_out")
    filled = []
    for name, result in zip(outs, results, strict=True):
        out = a.get(name)
        if result is None or out is None:
            filled.append(result)
            continue
        out = tensor(a, name, (result.dtype,))
        require(out.is_contiguous() and out.numel() >= result.numel(), f"{name} room")
        out = out.clone()
        out.view(-1)[: result.numel()] = result.reshape(-1)
        filled.append(out)
    return tuple(filled)


def make_expand_into_jagged_permute(d):
    gen = d.generator()
    segments = d.int(0, 6)
    dtype = d.choice(INDEX_DTYPES)
    lengths = torch.randint(0, 4, (segments,), generator=gen)
    permute = torch.randperm(segments, generator=gen).to(d.choice(INDEX_DTYPES))
    input_offset = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)]).to(dtype)
    out_lengths = lengths[permute.long()]
    # torchrec's offsets cover the output from 0; any start and spare tail are valid too.
    start, tail = d.choice(((0, 0), (d.int(0, 3), d.int(0, 3))))
    output_offset = start + torch.cat([lengths.new_zeros(1), out_lengths.cumsum(0)]).to(dtype)
    return {
        "permute": permute,
        "input_offset": input_offset,
        "output_offset": output_offset,
        "output_size": start + int(out_lengths.sum()) + tail,
    }


def ref_expand_into_jagged_permute(a):
    permute = tensor(a, "permute", INDEX_DTYPES, (1,))
    input_offset = tensor(a, "input_offset", INDEX_DTYPES, (1,))
    output_offset = tensor(a, "output_offset", (input_offset.dtype,), (1,))
    T = permute.numel()
    require(input_offset.numel() == T + 1 and output_offset.numel() == T + 1, "T + 1 offsets")
    order = ints(permute)
    require(all(0 <= p < T for p in order), "permute in range")
    out = offsets_list(output_offset, "output_offset")
    size = a["output_size"]
    require(out[0] >= 0 and out[-1] <= size, "output_offset within the output")
    starts = ints(input_offset)
    top = torch.iinfo(input_offset.dtype).max
    result = [0] * out[0]  # entries output_offset leaves uncovered are zero
    for t, p in enumerate(order):
        n = out[t + 1] - out[t]
        require(n == 0 or starts[p] + n - 1 <= top, "ramp fits the dtype")
        result.extend(range(starts[p], starts[p] + n))
    result.extend([0] * (size - out[-1]))
    return torch.tensor(result, dtype=input_offset.dtype)


def make_permute_pooled(d):
    gen = d.generator()
    features = d.int(0, 4)
    dims = [d.int(0, 3) for _ in range(features)]
    permute = torch.randperm(features, generator=gen)
    inverse = torch.empty_like(permute)
    inverse[permute] = torch.arange(features)
    pooled = torch.randn(d.int(0, 3), sum(dims), generator=gen).to(d.choice((F32, F64, BF16)))
    return {
        "pooled_embs": pooled,
        "offset_dim_list": torch.tensor([0, *itertools.accumulate(dims)]),
        "permute_list": permute,
        "inv_offset_dim_list": torch.tensor(
            [0, *itertools.accumulate(dims[p] for p in permute.tolist())]
        ),
        "inv_permute_list": inverse,
    }


def ref_permute_pooled(a):
    pooled = tensor(a, "pooled_embs", None, (2,))
    permute = tensor(a, "permute_list", (I64,), (1,))
    offsets = tensor(a, "offset_dim_list", (I64,), (1,))
    inv_offsets = tensor(a, "inv_offset_dim_list", (I64,), (1,))
    inverse = tensor(a, "inv_permute_list", (I64,), (1,))
    T = permute.numel()
    require(offsets.numel() == T + 1 and inv_offsets.numel() == T + 1, "T + 1 offsets")
    require(inverse.numel() == T, "T inverse entries")
    for o in (ints(offsets), ints(inv_offsets)):
        require(o[0] == 0 and o[-1] == pooled.shape[1], "column offsets from 0 to the width")
        require(all(x <= y for x, y in zip(o, o[1:], strict=False)), "non-decreasing offsets")
    p, io, oo = ints(permute), ints(offsets), ints(inv_offsets)
    require(all(0 <= x < T for x in p), "features in range")
    require(all(oo[i + 1] - oo[i] == io[x + 1] - io[x] for i, x in enumerate(p)), "widths agree")
    return permute_column_blocks(pooled, io, p)


def permute_column_blocks(pooled, offsets, permute):
    """pooled's column blocks [offsets[f], offsets[f + 1]) in the order of permute."""
    blocks = [pooled[:, offsets[f] : offsets[f + 1]] for f in permute]
    return torch.cat(blocks, dim=1) if blocks else pooled.clone()


# --------------------------------------------------------------------------- gather
def make_gather(d):
    gen = d.generator()
    n = d.int(1, 6)
    x = torch.randn(n, generator=gen).to(d.choice((F32, F64, BF16)))
    index = torch.randint(0, n, (d.int(0, 8),), generator=gen, dtype=d.choice(INDEX_DTYPES))
    return {"x": x, "index": index}


def ref_gather(a):
    x = tensor(a, "x", ELEMENT_DTYPES, (1,))
    index = tensor(a, "index", INDEX_DTYPES, (1,))
    require(all(0 <= i < x.numel() for i in ints(index)), "index in range")
    return x[index.long()]


def make_scatter(d):
    args = make_gather(d)
    args["grad"] = torch.randn(args["index"].shape[0], generator=d.generator()).to(args["x"].dtype)
    return args


def ref_scatter(a):
    x = tensor(a, "x", None, (1,))
    grad = tensor(a, "grad", FLOAT_DTYPES, (1,))
    require(grad.dtype == x.dtype, "grad and x one dtype")
    index = tensor(a, "index", INDEX_DTYPES, (1,))
    require(grad.numel() == index.numel(), "grad per index")
    require(all(0 <= i < x.numel() for i in ints(index)), "index in range")
    out = torch.zeros(x.numel(), dtype=F64).index_add_(0, index.long(), grad.double())
    return out.to(grad.dtype)


# --------------------------------------------------------------------------- relative bias
def make_time_bias(d):
    gen = d.generator()
    batch, n = d.int(0, 3), d.int(1, 5)
    buckets = d.choice((4, 128))
    args = {
        "timestamps": torch.randint(0, 10**6, (batch, n), generator=gen).sort(1).values,
        "ts_w": torch.randn(buckets + 1, generator=gen),
        "pos_w": torch.randn(2 * n - 1, generator=gen) if d.bool() else None,
        "seq_offsets": None,
        "max_seq_len": None,
        "bucket_divisor": d.choice((0.301, 1.0)),
        "query_time_shift": d.bool(),
        "index_dtype": d.choice((torch.uint8, I32, I64)),
    }
    if d.bool():  # jagged timestamps
        lengths = random_lengths(d, gen, batch, n)
        args["seq_offsets"] = torch.tensor([0, *itertools.accumulate(lengths)])
        args["timestamps"] = args["timestamps"].flatten()[: sum(lengths)].contiguous()
        args["max_seq_len"] = n
    return args


def ref_time_bias(a):
    ts = tensor(a, "timestamps", (I32, I64, F32, F64))
    ts_w = tensor(a, "ts_w", FLOAT_DTYPES, (1, 2))  # [entries] or [layers, entries]
    tables = ts_w.reshape(-1, ts_w.shape[-1])
    require(ts_w.shape[-1] >= 1, "ts_w entries")
    divisor = finite(a["bucket_divisor"], "bucket_divisor")
    require(divisor > 0, "bucket_divisor > 0")
    index_dtype = a["index_dtype"]
    require(index_dtype in (torch.uint8, I32, I64), "index_dtype")
    num_buckets = ts_w.shape[-1] - 1
    require(index_dtype != torch.uint8 or num_buckets <= 255, "uint8 holds the buckets")
    offsets = optional_tensor(a, "seq_offsets", INDEX_DTYPES, (1,))
    if offsets is None:
        require(ts.dim() == 2, "dense timestamps [B, N]")
        n = ts.shape[1]
        require(a.get("max_seq_len") in (None, n), "max_seq_len matches")
        sequences = list(ts)
    else:
        require(ts.dim() == 1, "jagged timestamps")
        n = a.get("max_seq_len")
        require(n is not None and n >= 0, "max_seq_len")
        o = offsets_list(offsets, "seq_offsets")
        require(o[-1] <= ts.numel(), "timestamps cover the offsets")
        sequences = [ts[s:e] for s, e in itertools.pairwise(o)]
    pos_w = optional_tensor(a, "pos_w", (ts_w.dtype,), (ts_w.dim(),))
    require(pos_w is None or pos_w.shape == (*ts_w.shape[:-1], 2 * n - 1), "pos_w like ts_w")
    shift = a["query_time_shift"]
    index = reference_time_buckets(sequences, n, shift, divisor, num_buckets)
    valid = torch.zeros(len(sequences), n, n, dtype=torch.bool)
    for b, sequence in enumerate(sequences):
        m = min(sequence.shape[0], n)
        valid[b, :m, :m] = True
    layers = []
    for layer, table in enumerate(tables.double()):
        bias = table[index]
        if pos_w is not None:
            bias = bias + reference_pos_bias(pos_w.reshape(len(tables), -1)[layer].double(), n)
        layers.append(bias * valid)
    bias = torch.stack(layers) if ts_w.dim() == 2 else layers[0]
    return bias.to(ts_w.dtype), index.to(index_dtype)


def make_pos_bias(d):
    n = d.int(1, 5)
    args = {"pos_w": torch.randn(2 * n - 1, generator=d.generator())}
    if d.bool():
        args["max_seq_len"] = n
    return args


def ref_pos_bias(a):
    pos_w = tensor(a, "pos_w", FLOAT_DTYPES, (1, 2))  # [entries] or [layers, entries]
    entries = pos_w.shape[-1]
    require(entries % 2 == 1, "2N - 1 entries")
    n = (entries + 1) // 2
    require(a.get("max_seq_len") in (None, n), "max_seq_len matches")
    if pos_w.dim() == 1:
        return reference_pos_bias(pos_w, n)
    return torch.stack([reference_pos_bias(table, n) for table in pos_w])


def make_bias_backward(d):
    gen = d.generator()
    batch, n = d.int(0, 3), d.int(1, 4)
    num_buckets = d.choice((3, 8))
    args = {
        "grad_bias": torch.randn(batch, n, n, generator=gen),
        "bucket_index": torch.randint(0, num_buckets + 1, (batch, n, n), generator=gen),
        "num_buckets": num_buckets,
        "pos_grad": d.bool(),
    }
    return args


def ref_bias_backward(a):
    grad = tensor(a, "grad_bias", FLOAT_DTYPES, (3, 4))  # [B, N, N] or [layers, B, N, N]
    require(grad.shape[-1] == grad.shape[-2], "[.., N, N]")
    per_layer = grad if grad.dim() == 4 else grad.unsqueeze(0)
    require(a.get("timestamps") is None and a.get("seq_offsets") is None, "only bucket_index")
    num_buckets = a["num_buckets"]
    require(0 <= num_buckets < 2**31 - 1, "num_buckets range")
    index = optional_tensor(a, "bucket_index", (torch.uint8, I32, I64), (3,))
    n = grad.shape[-1]
    grad_ts = None
    if index is not None:
        require(index.shape == grad.shape[-3:], "bucket_index like grad_bias")
        require(all(0 <= x <= num_buckets for x in ints(index)), "bucket_index in range")
        grad_ts = torch.zeros(len(per_layer), num_buckets + 1, dtype=F64)
        for layer, g in enumerate(per_layer):
            grad_ts[layer].index_add_(0, index.reshape(-1).long(), g.reshape(-1).double())
        grad_ts = grad_ts.reshape(*grad.shape[:-3], -1).to(grad.dtype)
    grad_pos = None
    if a.get("pos_grad", False):
        i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
        grad_pos = torch.zeros(len(per_layer), 2 * n - 1, dtype=F64)
        for layer, g in enumerate(per_layer):
            grad_pos[layer].index_add_(0, (n - 1 + j - i).reshape(-1), g.double().sum(0).flatten())
        grad_pos = grad_pos.reshape(*grad.shape[:-3], -1).to(grad.dtype)
    return grad_ts, grad_pos


# --------------------------------------------------------------------------- HSTU / FuXi-alpha
def make_sequences(d, gen, dtype):
    lengths = random_lengths(d, gen, d.int(0, 3), 4)
    n = max([*lengths, 1]) + d.int(0, 1)
    heads, dqk, dv = d.int(1, 2), d.int(1, 3), d.int(1, 3)
    rows = sum(lengths)

    def leaf(*shape):
        return torch.randn(*shape, generator=gen, dtype=F64).to(dtype)

    return {
        "q": leaf(rows, heads, dqk),
        "k": leaf(rows, heads, dqk),
        "v": leaf(rows, heads, dv),
        "seq_offsets": torch.tensor(
            [0, *itertools.accumulate(lengths)], dtype=d.choice(INDEX_DTYPES)
        ),
        "seq_lengths": None,
        "max_seq_len": n,
        "alpha": d.choice((1.0, 0.5)),
        "silu_scale": 1.0 / n,
        "mask_type": d.choice(("causal", "none")),
        "contextual_seq_len": d.int(0, 1),
        "num_targets": None,
        "target_group_size": 1,
        "max_attn_len": d.int(0, 2),
        "custom_mask": None,
    }


def make_hstu(d):
    gen = d.generator()
    args = make_sequences(d, gen, d.choice((F64, F32)))
    batch, n = args["seq_offsets"].numel() - 1, args["max_seq_len"]
    lengths = args["seq_offsets"].diff().long()
    if d.bool():
        args["num_targets"] = (lengths // 2).to(d.choice(INDEX_DTYPES))
        args["target_group_size"] = d.int(1, 2)
    args.update(attn_bias=None, timestamps=None, ts_w=None, pos_w=None)
    bias = d.int(0, 2)
    if bias == 1:
        args["attn_bias"] = torch.randn(batch, 1, n, n, generator=gen).to(args["q"].dtype)
    elif bias == 2:
        rows = args["q"].shape[0]
        args["timestamps"] = torch.randint(0, 10**5, (rows,), generator=gen)
        args["ts_w"] = torch.randn(9, generator=gen).to(args["q"].dtype)
        args["pos_w"] = torch.randn(2 * n - 1, generator=gen).to(args["q"].dtype)
    args.update(query_time_shift=d.bool(), bucket_divisor=0.301)
    return args


def check_sequences(a):
    """The layout rules of the HSTU family; returns (q, k, v, offsets, lengths, n)."""
    q = tensor(a, "q", FLOAT_DTYPES, (3,))
    k = tensor(a, "k", (q.dtype,), (3,))
    v = tensor(a, "v", (q.dtype,), (3,))
    require(k.shape[:2] == q.shape[:2] and v.shape[:2] == q.shape[:2], "rows and heads")
    require(k.shape[2] == q.shape[2], "head dim")
    offsets = offsets_list(tensor(a, "seq_offsets", INDEX_DTYPES, (1,)), "seq_offsets")
    n = a["max_seq_len"]
    require(n >= 0, "max_seq_len >= 0")
    batch = len(offsets) - 1
    seq_lengths = optional_tensor(a, "seq_lengths", INDEX_DTYPES, (1,))
    if seq_lengths is None:
        require(offsets[-1] == q.shape[0], "seq_offsets[-1] == rows")
        lengths = [e - s for s, e in itertools.pairwise(offsets)]
    else:
        lengths = ints(seq_lengths)
        require(len(lengths) == batch and all(x >= 0 for x in lengths), "seq_lengths")
    require(all(x <= n for x in lengths), "lengths <= max_seq_len")
    require(all(s + x <= q.shape[0] for s, x in zip(offsets, lengths, strict=False)), "rows")
    compute = compute_dtype(q)
    finite(a["alpha"], "alpha", compute)
    finite(a["silu_scale"], "silu_scale", compute)
    require(a["mask_type"] in ("causal", "none", "custom"), "mask_type")
    require(a["contextual_seq_len"] >= 0 and a["max_attn_len"] >= 0, "context, window >= 0")
    require(a["target_group_size"] >= 1, "target_group_size >= 1")
    targets = optional_tensor(a, "num_targets", INDEX_DTYPES, (1,))
    if targets is not None:
        t = ints(targets)
        require(len(t) == batch and all(0 <= x <= m for x, m in zip(t, lengths, strict=True)), "t")
    custom = optional_tensor(a, "custom_mask")
    require((a["mask_type"] == "custom") == (custom is not None), "custom_mask iff 'custom'")
    if custom is not None:
        shape = custom.shape
        require(custom.dim() == 4 and shape[0] in (1, batch) and shape[1] in (1, q.shape[1]), "m")
        require(shape[2] == n and shape[3] == n, "custom_mask [.., N, N]")
    return q, k, v, offsets, lengths, n


def check_dense_bias(a, name, batch, heads, n):
    bias = tensor(a, name, FLOAT_DTYPES)
    require(bias.dim() <= 4, f"{name} rank")
    shape = [1] * (4 - bias.dim()) + list(bias.shape)
    require(all(s in (1, f) for s, f in zip(shape, (batch, heads, n, n), strict=True)), name)
    return bias.reshape(shape)


def check_tables(a, rows, batch, lengths, n):
    ts_w = tensor(a, "ts_w", FLOAT_DTYPES, (1,))
    require(ts_w.numel() >= 1, "ts_w entries")
    divisor = finite(a["bucket_divisor"], "bucket_divisor")
    require(divisor > 0, "bucket_divisor > 0")
    ts = tensor(a, "timestamps")
    require(ts.dim() in (1, 2), "timestamps rank")
    if ts.dim() == 1:
        require(ts.numel() == rows, "timestamps per row")
    else:
        require(
            ts.shape[0] == batch and all(x <= ts.shape[1] for x in lengths), "timestamps [B, N]"
        )
    pos_w = tensor(a, "pos_w", FLOAT_DTYPES, (1,))
    require(pos_w.numel() == 2 * n - 1, "pos_w 2N - 1")


def sequence_call(a, leaves, offsets, lengths, n):
    """The arguments an HSTU-family reference call shares: (q, k, v, seq_offsets, max_seq_len) in
    float64 and the lengths, scale and mask options."""
    custom = a.get("custom_mask")
    args = (leaves["q"], leaves["k"], leaves["v"], torch.tensor(offsets), n)
    options = dict(
        lengths=None if a.get("seq_lengths") is None else torch.tensor(lengths),
        alpha=a["alpha"],
        silu_scale=a["silu_scale"],
        mask=custom.double() if custom is not None else a["mask_type"],
        contextual_seq_len=a["contextual_seq_len"],
        num_targets=a.get("num_targets"),
        target_group_size=a["target_group_size"],
        max_attn_len=a["max_attn_len"],
    )
    return args, options


def hstu_expected(a):
    q, k, v, offsets, lengths, n = check_sequences(a)
    batch, heads = len(offsets) - 1, q.shape[1]
    fused = any(a.get(x) is not None for x in ("timestamps", "ts_w", "pos_w"))
    require(not (fused and a.get("attn_bias") is not None), "one bias source")
    bias = None
    if a.get("attn_bias") is not None:
        bias = check_dense_bias(a, "attn_bias", batch, heads, n)
    if fused:
        require(all(a.get(x) is not None for x in ("timestamps", "ts_w", "pos_w")), "all tables")
        check_tables(a, q.shape[0], batch, lengths, n)
    leaves = {
        name: a[name].detach().double().requires_grad_()
        for name in ("q", "k", "v", "attn_bias", "ts_w", "pos_w")
        if a.get(name) is not None
    }
    args, options = sequence_call(a, leaves, offsets, lengths, n)
    out = hstu_reference(
        *args,
        **options,
        attn_bias=None if bias is None else leaves["attn_bias"].reshape(bias.shape),
        timestamps=a.get("timestamps"),
        ts_w=leaves.get("ts_w"),
        pos_w=leaves.get("pos_w"),
        query_time_shift=a["query_time_shift"],
        bucket_divisor=a["bucket_divisor"],
    )
    return out, leaves


def ref_hstu_forward(a):
    out, _ = hstu_expected(a)
    return out.detach().to(a["q"].dtype)


def ref_hstu_backward(a):
    grad = tensor(a, "grad_output", FLOAT_DTYPES)
    out, leaves = hstu_expected(a)
    require(grad.shape == out.shape, "grad_output shape")
    return reference_grads(out, grad, leaves, ("q", "k", "v", "attn_bias", "ts_w", "pos_w"), a)


def reference_grads(out, grad, leaves, names, args):
    """The gradients of the float64 `out` given grad_output, for the named arguments in their own
    dtypes: zero for an input `out` does not depend on, None for an absent argument."""
    present = [x for x in names if x in leaves]
    grads = [None] * len(present)
    if out.requires_grad:
        inputs = [leaves[x] for x in present]
        grads = torch.autograd.grad(out, inputs, grad.double(), allow_unused=True)
    found = dict(zip(present, grads, strict=True))
    return tuple(
        None
        if x not in found
        else (found[x] if found[x] is not None else torch.zeros_like(leaves[x])).to(args[x].dtype)
        for x in names
    )


def references(expected, names):
    """An op's reference and its backward's from ``expected(args) -> (float64 out, leaves)``: the
    output in x's dtype, and the gradients of the inputs ``names`` given a grad_output of the
    output's shape (the one gradient itself when the backward returns one tensor)."""

    def forward(a):
        out, _ = expected(a)
        return out.detach().to(a["x"].dtype)

    def backward(a):
        out, leaves = expected(a)
        grad = tensor(a, "grad_output", (a["x"].dtype,), (2,))
        require(grad.shape == out.shape, "grad_output shape")
        grads = reference_grads(out, grad, leaves, names, a)
        return grads[0] if len(names) == 1 else grads

    return forward, backward


def with_grad_output(make, reference):
    """A backward op's case: the forward's arguments plus a grad_output of the output's shape."""

    def make_backward(d):
        args = make(d)
        out = reference(args)
        return {
            "grad_output": torch.randn(out.shape, generator=d.generator()).to(out.dtype),
            **args,
        }

    return make_backward


def make_fuxi(d):
    gen = d.generator()
    args = make_sequences(d, gen, d.choice((F64, F32)))
    batch, n = args["seq_offsets"].numel() - 1, args["max_seq_len"]
    dtype = args["q"].dtype
    args["ts_bias"] = torch.randn(batch, n, n, generator=gen).to(dtype) if d.bool() else None
    args["pos_bias"] = torch.randn(1, n, n, generator=gen).to(dtype) if d.bool() else None
    args.update(timestamps=None, ts_w=None, pos_w=None, query_time_shift=True)
    args.update(bucket_divisor=0.301, reference_layout=d.bool())
    return args


def fuxi_expected(a):
    q, k, v, offsets, lengths, n = check_sequences(a)
    batch = len(offsets) - 1
    for name in ("timestamps", "ts_w", "pos_w"):
        require(a.get(name) is None, f"{name} (fused tables are compared in test_fuxi_attention)")
    leaves = {x: a[x].detach().double().requires_grad_() for x in ("q", "k", "v")}
    for name, lead in (("ts_bias", (1, batch)), ("pos_bias", (1,))):
        if a.get(name) is not None:
            t = tensor(a, name, FLOAT_DTYPES, (3,))
            require(t.shape[0] in lead and t.shape[1:] == (n, n), f"{name} shape")
            leaves[name] = t.detach().double().requires_grad_()
    args, options = sequence_call(a, leaves, offsets, lengths, n)
    out = fuxi_reference(
        *args,
        **options,
        ts_bias=leaves.get("ts_bias"),
        pos_bias=leaves.get("pos_bias"),
        reference_layout=a["reference_layout"],
    )
    return out, leaves


def ref_fuxi_forward(a):
    out, _ = fuxi_expected(a)
    return out.detach().to(a["q"].dtype)


def ref_fuxi_backward(a):
    grad = tensor(a, "grad_output", FLOAT_DTYPES)
    out, leaves = fuxi_expected(a)
    require(grad.shape == out.shape, "grad_output shape")
    names = ("q", "k", "v", "ts_bias", "pos_bias", "ts_w", "pos_w")
    return reference_grads(out, grad, leaves, names, a)


# --------------------------------------------------------------------------- DeBERTa
def make_deberta(d):
    gen = d.generator()
    dtype = d.choice((F64, F32))
    batch, heads, q_len, dqk = d.int(1, 2), d.int(1, 2), d.int(1, 5), d.int(1, 3)
    k_len = q_len if d.bool() else d.int(1, 5)
    buckets, max_rel = d.choice(((-1, 4), (4, 8), (8, 24)))
    span = buckets if buckets > 0 else max_rel

    def leaf(*shape):
        return torch.randn(*shape, generator=gen, dtype=F64).to(dtype)

    terms = d.choice(("c2p|p2c", "c2p", "p2c", ""))
    mask = None
    if d.bool():
        mask = torch.rand(batch, 1, q_len, k_len, generator=gen) < 0.8
    return {
        "q": leaf(batch, heads, q_len, dqk),
        "k": leaf(batch, heads, k_len, dqk),
        "v": leaf(batch, heads, k_len, d.int(1, 3)),
        "pos_key": leaf(2 * span, heads, dqk) if "c2p" in terms else None,
        "pos_query": leaf(2 * span, heads, dqk) if "p2c" in terms else None,
        "attention_mask": mask,
        "pos_att_type": terms,
        "position_buckets": buckets,
        "max_relative_positions": max_rel,
        "scale": d.choice((None, 0.3)),
        "dropout_p": 0.0,
        "seed": 0,
        "return_probs": d.bool(),
    }


def deberta_expected(a):
    q = tensor(a, "q", FLOAT_DTYPES, (4,))
    k = tensor(a, "k", (q.dtype,), (4,))
    v = tensor(a, "v", (q.dtype,), (4,))
    require(k.shape[:2] == q.shape[:2] and v.shape[:2] == q.shape[:2], "[B, H]")
    require(k.shape[3] == q.shape[3] and v.shape[2] == k.shape[2], "dims")
    spec = a["pos_att_type"]
    terms = [t.strip() for t in spec.split("|") if t.strip()]
    require(all(t in ("c2p", "p2c") for t in terms), "pos_att_type")
    dropout = a["dropout_p"]
    require(isinstance(dropout, float | int) and 0 <= dropout <= 1, "dropout_p in [0, 1]")
    require(dropout == 0, "dropout is compared in test_deberta")
    scale = a["scale"]
    if scale is not None:
        finite(scale, "scale", compute_dtype(q))
    buckets, max_rel = a["position_buckets"], a["max_relative_positions"]
    span = buckets if buckets > 0 else max_rel
    if terms:
        require(span >= 1, "span >= 1")
        if buckets > 0:
            require(buckets >= 2 and max_rel - 1 > buckets // 2, "log buckets defined")
    for term, name in (("c2p", "pos_key"), ("p2c", "pos_query")):
        if term in terms:
            t = tensor(a, name, (q.dtype,), (3,))
            require(t.shape == (2 * span, q.shape[1], q.shape[3]), f"{name} shape")
    mask = optional_tensor(a, "attention_mask")
    batch, q_len, k_len = q.shape[0], q.shape[2], k.shape[2]
    keep = None  # all kept
    if mask is not None:
        require(not mask.is_complex(), "mask dtype")
        if mask.dim() == 2:  # m_i & m_j, compared to 0 per entry (a product could overflow)
            require(mask.shape == (batch, k_len) and q_len == k_len, "padding mask")
            keep = mask.ne(0)[:, None, None, :] & mask.ne(0)[:, None, :, None]
        else:
            require(mask.shape == (batch, 1, q_len, k_len), "mask shape")
            keep = mask.ne(0)
    leaves = {
        x: a[x].detach().double().requires_grad_()
        for x in ("q", "k", "v", "pos_key", "pos_query")
        if a.get(x) is not None
        and (x in ("q", "k", "v") or {"pos_key": "c2p", "pos_query": "p2c"}[x] in terms)
    }
    out, probs = deberta_reference(
        *(leaves.get(x) for x in ("q", "k", "v", "pos_key", "pos_query")),
        keep,
        pos_att_type=terms,
        position_buckets=buckets,
        max_relative_positions=max_rel,
        scale=scale,
    )
    return out, probs, leaves


DEBERTA_BACKWARD_ARGS = {
    a.name for a in ops.disentangled_attention_backward.default._schema.arguments
}


def ref_deberta_forward(a):
    out, probs, _ = deberta_expected(a)
    probs = probs.detach().to(a["q"].dtype) if a.get("return_probs") else None
    return out.detach().to(a["q"].dtype), UNCHECKED, probs


UNCHECKED = object()  # a result the reference does not model (DeBERTa's saved log-sum-exp)


def make_log_buckets(d):
    bucket_size = d.choice((2, 8, 16))
    return {
        "relative_pos": torch.randint(-60, 61, (d.int(0, 4), d.int(0, 5)), generator=d.generator()),
        "bucket_size": bucket_size,
        "max_position": bucket_size // 2 + d.int(2, 40),
    }


def ref_log_buckets(a):
    rel = tensor(a, "relative_pos", INDEX_DTYPES)
    bucket_size, max_position = a["bucket_size"], a["max_position"]
    # HF's bucket divides by log((max_position - 1) / (bucket_size // 2)), which must be > 0.
    require(bucket_size >= 2 and max_position - 1 > bucket_size // 2, "log buckets defined")
    return make_log_bucket_position(rel.long(), bucket_size, max_position).long()


def make_deberta_backward(d):
    args = make_deberta(d)
    args.pop("return_probs")
    out, lse, _ = ops.disentangled_attention(**args)
    gen = d.generator()
    return {
        "grad_output": torch.randn(out.shape, generator=gen).to(out.dtype),
        "grad_probs": None,
        "output": out,
        "softmax_lse": lse,
        "probs": None,
        **args,
    }


def ref_deberta_backward(a):
    grad = tensor(a, "grad_output", FLOAT_DTYPES)
    out, _, leaves = deberta_expected(a)
    require(grad.shape == out.shape, "grad_output shape")
    output = tensor(a, "output", FLOAT_DTYPES)
    require(output.shape == out.shape, "output shape")
    lse = tensor(a, "softmax_lse", (compute_dtype(a["q"]),))
    require(lse.shape == out.shape[:3], "softmax_lse shape")
    require(a.get("grad_probs") is None and a.get("probs") is None, "no probs")
    return reference_grads(out, grad, leaves, ("q", "k", "v", "pos_key", "pos_query"), a)


# --------------------------------------------------------------------------- layer ops
def make_counter_dropout(d):
    gen = d.generator()
    shape = [d.int(0, 5) for _ in range(d.int(0, 3))]
    return {
        "x": torch.randn(shape, generator=gen, dtype=F64).to(d.choice(FLOAT_DTYPES)),
        "p": d.choice((0.0, 0.3, 0.5, 1.0)),
        "seed": torch.tensor(d.int(-(2**40), 2**40)),
        "offset": d.int(0, 3),
    }


def dropout_seed(a):
    seed = tensor(a, "seed", (I64,))
    require(seed.numel() == 1, "seed has one element")
    return int(seed.item())


def ref_counter_dropout(a):
    x = tensor(a, "x", FLOAT_DTYPES)
    p = a["p"]
    require(isinstance(p, float | int) and 0 <= p <= 1, "p in [0, 1]")
    keep = reference_keep(tuple(x.shape), p, dropout_seed(a), a["offset"])
    scale = 1 / (1 - p) if p < 1 else 0.0
    return (x.double() * keep * scale).to(x.dtype)


def make_positional_features(d):
    gen = d.generator()
    rows, cols, table_rows = d.int(0, 40), d.int(1, 9), d.int(1, 12)
    dtype = d.choice((F64, F32, BF16))
    return {
        "x": torch.randn(rows, cols, generator=gen, dtype=F64).to(dtype),
        "positions": torch.randint(0, table_rows, (rows,), generator=gen),
        "position_weight": torch.randn(table_rows, cols, generator=gen, dtype=F64).to(dtype),
        "scale": d.choice((1.0, 7.07)),
        "dropout_p": d.choice((0.0, 0.3)),
        "seed": torch.tensor(d.int(0, 2**40)),
        "offset": d.int(0, 3),
    }


def positional_features_expected(a):
    x = tensor(a, "x", FLOAT_DTYPES, (2,))
    positions = tensor(a, "positions", (I64,), (1,))
    table = tensor(a, "position_weight", (x.dtype,), (2,))
    require(positions.shape[0] == x.shape[0], "positions length")
    require(table.shape[1] == x.shape[1], "position_weight columns")
    require(bool(((positions >= 0) & (positions < table.shape[0])).all()), "positions in range")
    scale = finite(a["scale"], "scale", compute_dtype(x))
    p = a["dropout_p"]
    require(isinstance(p, float | int) and 0 <= p <= 1, "dropout_p in [0, 1]")
    seed = 0 if a["seed"] is None and p == 0 else dropout_seed(a)
    leaves = {n: a[n].detach().double().requires_grad_() for n in ("x", "position_weight")}
    out = leaves["x"] * scale + F.embedding(positions, leaves["position_weight"])
    if p > 0:
        keep = reference_keep(tuple(out.shape), p, seed, a["offset"])
        out = out * keep.double() * (1 / (1 - p) if p < 1 else 0.0)
    return out, leaves


ref_positional_features, ref_positional_features_backward = references(
    positional_features_expected, ("x", "position_weight")
)


def make_l2_normalize(d):
    gen = d.generator()
    x = torch.randn(d.int(0, 40), d.int(1, 9), generator=gen, dtype=F64)
    x[: d.int(0, 2)] *= 1e-9  # rows shorter than eps
    return {"x": x.to(d.choice((F64, F32, BF16))), "eps": d.choice((1e-6, 1e-3, 0.5))}


def l2_normalize_expected(a):
    x = tensor(a, "x", FLOAT_DTYPES, (2,))
    eps = finite(a["eps"], "eps", compute_dtype(x))
    require(eps >= 0, "eps >= 0")
    leaf = x.detach().double().requires_grad_()
    return leaf / leaf.norm(dim=-1, keepdim=True).clamp(min=eps), {"x": leaf}


ref_l2_normalize, ref_l2_normalize_backward = references(l2_normalize_expected, ("x",))


def make_layer_output(d):
    gen = d.generator()
    rows, width, dim = d.int(0, 70), d.int(1, 6), d.int(1, 5)
    dtype = d.choice((F64, F32, BF16))

    def leaf(*shape):
        return torch.randn(*shape, generator=gen, dtype=F64).to(dtype)

    return {
        "x": leaf(rows, dim),
        "u": leaf(rows, width),
        "attn": leaf(rows, width),
        "weight": leaf(dim, width),
        "bias": leaf(dim) if d.bool() else None,
        "norm": d.choice(("layer_norm", "rms_norm")),
        "eps": d.choice((1e-6, 1e-3)),
        "dropout_p": d.choice((0.0, 0.4)),
        "seed": torch.tensor(d.int(0, 2**40)),
        "offset": d.int(0, 3),
    }


LAYER_OUTPUT_INPUTS = ("x", "u", "attn", "weight", "bias")


def layer_output_expected(a):
    x = tensor(a, "x", FLOAT_DTYPES, (2,))
    u = tensor(a, "u", (x.dtype,), (2,))
    attn = tensor(a, "attn", (x.dtype,), (2,))
    weight = tensor(a, "weight", (x.dtype,), (2,))
    bias = optional_tensor(a, "bias", (x.dtype,), (1,))
    require(u.shape[0] == x.shape[0] and attn.shape == u.shape, "u, attn shape")
    require(weight.shape == (x.shape[1], u.shape[1]), "weight shape")
    require(bias is None or bias.shape == (x.shape[1],), "bias shape")
    require(a["norm"] in ("layer_norm", "rms_norm"), "norm")
    eps = finite(a["eps"], "eps", compute_dtype(x))
    p = a["dropout_p"]
    require(isinstance(p, float | int) and 0 <= p <= 1, "dropout_p in [0, 1]")
    seed = 0 if a["seed"] is None and p == 0 else dropout_seed(a)
    leaves = {
        n: a[n].detach().double().requires_grad_() for n in LAYER_OUTPUT_INPUTS if a[n] is not None
    }
    out = layer_output_composition(
        *(leaves.get(n) for n in LAYER_OUTPUT_INPUTS),
        a["norm"],
        p,
        seed,
        a["offset"],
        eps,
    )
    return out, leaves


ref_layer_output, ref_layer_output_backward = references(
    layer_output_expected, ("u", "attn", "weight", "bias")
)


# The norms' backward subtracts terms of the size of rstd * |dy| to leave a gradient that may be
# far smaller, so float64 results differing only in the order of their sums differ by about
# rstd * 1e-16 (rstd <= 1 / sqrt(eps)): the float64 tolerance of these cases allows for it.
LAYER_TOLERANCE = {**TOLERANCE, F64: (1e-10, 1e-10)}


def make_layer_input(d):
    gen = d.generator()
    rows, dim, width = d.int(0, 70), d.int(1, 6), d.int(1, 8)
    dtype = d.choice((F64, F32, BF16))

    def leaf(*shape):
        return torch.randn(*shape, generator=gen, dtype=F64).to(dtype)

    cuts = sorted(d.int(0, width) for _ in range(d.int(0, 3)))
    return {
        "x": leaf(rows, dim),
        "weight": leaf(dim, width),
        "bias": leaf(width) if d.bool() else None,
        "norm": d.choice(("layer_norm", "rms_norm")),
        "eps": d.choice((1e-6, 1e-3)),
        # The output's column pieces (zero-width ones too), or [] for one piece.
        "split": [b - a for a, b in zip([0, *cuts], [*cuts, width], strict=True)] if cuts else [],
    }


LAYER_INPUT_INPUTS = ("x", "weight", "bias")


def layer_input_widths(a, width):
    """The widths of the op's output pieces: split's (sizes >= 0 summing to the width), or one."""
    split = list(a["split"])
    require(all(isinstance(s, int) and s >= 0 for s in split), "split sizes")
    require(not split or sum(split) == width, "split sum")
    return split or [width]


def layer_input_expected(a):
    x = tensor(a, "x", FLOAT_DTYPES, (2,))
    weight = tensor(a, "weight", (x.dtype,), (2,))
    bias = optional_tensor(a, "bias", (x.dtype,), (1,))
    require(weight.shape[0] == x.shape[1], "weight rows")
    require(bias is None or bias.shape == (weight.shape[1],), "bias shape")
    require(a["norm"] in ("layer_norm", "rms_norm"), "norm")
    eps = finite(a["eps"], "eps", compute_dtype(x))
    leaves = {
        n: a[n].detach().double().requires_grad_() for n in LAYER_INPUT_INPUTS if a[n] is not None
    }
    out = layer_input_composition(*(leaves.get(n) for n in LAYER_INPUT_INPUTS), a["norm"], eps)
    return out, leaves


def ref_layer_input(a):
    out, _ = layer_input_expected(a)
    pieces = torch.split(out.detach(), layer_input_widths(a, out.shape[1]), dim=1)
    return [p.to(a["x"].dtype) for p in pieces]


def make_layer_input_backward(d):
    """The forward's arguments plus one gradient per output piece."""
    args = make_layer_input(d)
    gen = d.generator()
    grads = [torch.randn(p.shape, generator=gen).to(p.dtype) for p in ref_layer_input(args)]
    return {"grad_output": grads, **args}


def ref_layer_input_backward(a):
    out, leaves = layer_input_expected(a)
    widths = layer_input_widths(a, out.shape[1])
    pieces = a["grad_output"]
    require(isinstance(pieces, list | tuple) and len(pieces) == len(widths), "grad_output count")
    grads = []
    for g, cols in zip(pieces, widths, strict=True):
        g = tensor({"grad_output": g}, "grad_output", (a["x"].dtype,), (2,))
        require(g.shape == (out.shape[0], cols), "grad_output shape")
        grads.append(g)
    grad = torch.cat(grads, dim=1)
    return reference_grads(out, grad, leaves, LAYER_INPUT_INPUTS, a)


def make_layer_ffn(d):
    gen = d.generator()
    rows, dim, hidden = d.int(0, 70), d.int(1, 5), d.int(1, 6)
    dtype = d.choice((F64, F32, BF16))

    def leaf(*shape):
        return torch.randn(*shape, generator=gen, dtype=F64).to(dtype)

    return {
        "x": leaf(rows, dim),
        "gate": leaf(hidden, dim),
        "up": leaf(hidden, dim),
        "down": leaf(dim, hidden),
        "norm": d.choice(("layer_norm", "rms_norm")),
        "eps": d.choice((1e-6, 1e-3)),
        "dropout_p": d.choice((0.0, 0.4)),
        "seed": torch.tensor(d.int(0, 2**40)),
        "offset": d.int(0, 3),
    }


LAYER_FFN_INPUTS = ("x", "gate", "up", "down")


def layer_ffn_expected(a):
    x = tensor(a, "x", FLOAT_DTYPES, (2,))
    gate = tensor(a, "gate", (x.dtype,), (2,))
    up = tensor(a, "up", (x.dtype,), (2,))
    down = tensor(a, "down", (x.dtype,), (2,))
    require(gate.shape[1] == x.shape[1] and up.shape == gate.shape, "gate, up shape")
    require(down.shape == (x.shape[1], gate.shape[0]), "down shape")
    require(a["norm"] in ("layer_norm", "rms_norm"), "norm")
    eps = finite(a["eps"], "eps", compute_dtype(x))
    p = a["dropout_p"]
    require(isinstance(p, float | int) and 0 <= p <= 1, "dropout_p in [0, 1]")
    seed = 0 if a["seed"] is None and p == 0 else dropout_seed(a)
    leaves = {n: a[n].detach().double().requires_grad_() for n in LAYER_FFN_INPUTS}
    out = ffn_composition(
        *(leaves[n] for n in LAYER_FFN_INPUTS), a["norm"], p, seed, a["offset"], eps
    )
    return out, leaves


ref_layer_ffn, ref_layer_ffn_backward = references(layer_ffn_expected, LAYER_FFN_INPUTS)


# --------------------------------------------------------------------------- loss
def make_sampled_softmax(d):
    gen = d.generator()
    rows, dim, count = d.int(1, 40), d.int(1, 6), d.int(0, 7)
    dtype = d.choice((F64, F32, BF16))
    distinct = d.int(1, 5)  # few ids, so that some negatives are a row's positive

    def leaf(*shape):
        return torch.randn(*shape, generator=gen, dtype=F64).to(dtype)

    def ids(n):
        return torch.randint(1, distinct + 1, (n,), generator=gen).to(d.choice(INDEX_DTYPES))

    weights = torch.rand(rows, generator=gen) > 0.3 if d.bool() else torch.rand(rows, generator=gen)
    weights[0] = 1  # a nonzero total weight
    return {
        "queries": leaf(rows, dim),
        "positives": leaf(rows, dim),
        "positive_ids": ids(rows),
        "negatives": leaf(count, dim),
        "negative_ids": ids(count),
        "weights": weights,
        "temperature": d.choice((0.25, 1.0)),
        "eps": d.choice((1e-6, 1e-2)),
        # Query i against positive i + s; row 0 (weight 1) keeps its pair for any s < rows.
        "positive_shift": d.choice((0, 0, 1, rows - 1)),
    }


SOFTMAX_INPUTS = ("queries", "positives", "negatives")


def positive_number(a, name):
    value = a[name]
    require(isinstance(value, float | int) and math.isfinite(value) and value > 0, name)
    return value


def sampled_softmax_expected(a):
    """The loss from its definition, in float64: a softmax over [q.p^, q.n^_1, ...] / T per row,
    a negative equal to the row's positive masked to -5e4, the weighted mean of -log p(positive)."""
    q = tensor(a, "queries", FLOAT_DTYPES, (2,))
    p = tensor(a, "positives", (q.dtype,), (2,))
    n = tensor(a, "negatives", (q.dtype,), (2,))
    require(p.shape == q.shape, "positives shape")
    require(n.shape[1] == q.shape[1], "negatives columns")
    positive_ids = tensor(a, "positive_ids", INDEX_DTYPES, (1,))
    negative_ids = tensor(a, "negative_ids", INDEX_DTYPES, (1,))
    require(positive_ids.shape[0] == q.shape[0], "positive_ids length")
    require(negative_ids.shape[0] == n.shape[0], "negative_ids length")
    weights = tensor(a, "weights", (*FLOAT_DTYPES, torch.bool), (1,))
    require(weights.shape[0] == q.shape[0], "weights length")
    temperature, eps = positive_number(a, "temperature"), positive_number(a, "eps")
    shift = a.get("positive_shift", 0)
    require(isinstance(shift, int) and 0 <= shift <= q.shape[0], "positive_shift must be in")
    leaves = {name: a[name].detach().double().requires_grad_() for name in SOFTMAX_INPUTS}

    def unit(x):
        return x / x.norm(dim=-1, keepdim=True).clamp(min=eps)

    pairs = q.shape[0] - shift  # query i against positive i + shift
    queries = leaves["queries"][:pairs]
    positive = (queries * unit(leaves["positives"][shift:])).sum(-1, keepdim=True) / temperature
    negative = queries @ unit(leaves["negatives"]).T / temperature
    same = positive_ids.long()[shift:, None] == negative_ids.long()[None, :]
    logits = torch.cat([positive, negative.masked_fill(same, -5e4)], dim=1)
    losses = torch.logsumexp(logits, dim=1) - positive[:, 0]
    w = weights[:pairs].double()
    return (losses * w).sum() / w.sum(), leaves


def ref_sampled_softmax(a):
    out, _ = sampled_softmax_expected(a)
    return out.detach().to(a["queries"].dtype)


def ref_sampled_softmax_and_grads(a):
    """The loss and its gradients for a grad_output of 1."""
    out, leaves = sampled_softmax_expected(a)
    grads = reference_grads(out, torch.ones((), dtype=F64), leaves, SOFTMAX_INPUTS, a)
    return (out.detach().to(a["queries"].dtype), *grads)


# --------------------------------------------------------------------------- retrieval
def make_mips_topk(d):
    gen = d.generator()
    rows, count, dim = d.int(0, 6), d.int(0, 40), d.int(0, 5)
    dtype = d.choice((F32, F64))
    args = {
        "queries": integer_rows(gen, rows, dim, dtype),
        "candidates": integer_rows(gen, count, dim, dtype),
        "k": d.int(0, count),
        "excluded_offsets": None,
        "excluded": None,
    }
    if d.bool():
        offsets, excluded = jagged_exclusions(gen, rows, count, d.choice(INDEX_DTYPES), d.int(0, 2))
        args.update(excluded_offsets=offsets, excluded=excluded)
    return args


def ref_mips_topk(a):
    queries = tensor(a, "queries", (F32, F64), (2,))
    candidates = tensor(a, "candidates", (queries.dtype,), (2,))
    require(candidates.shape[1] == queries.shape[1], "candidates columns")
    k = a["k"]
    require(0 <= k <= candidates.shape[0], "k in [0, N]")
    offsets = optional_tensor(a, "excluded_offsets", INDEX_DTYPES, (1,))
    excluded = optional_tensor(a, "excluded", INDEX_DTYPES, (1,))
    require((offsets is None) == (excluded is None), "exclusions given together")
    if offsets is not None:
        values = offsets_list(offsets, "excluded_offsets")
        require(len(values) == queries.shape[0] + 1, "excluded_offsets length")
        require(values[-1] <= excluded.numel(), "excluded_offsets[-1] within excluded")
        named = ints(excluded[values[0] : values[-1]])
        require(all(0 <= j < candidates.shape[0] for j in named), "excluded in [0, N)")
    return reference_topk(queries, candidates, k, offsets, excluded)


# --------------------------------------------------------------------------- TBE ops
def make_tbe_layout(d):
    """Two features on tables of 6 x 4 and 5 x 2 rows (shared by a third feature)."""
    gen = d.generator()
    batch = d.int(1, 3)
    rows, dims, ftm = [6, 5], [4, 2], [0, 1, 0]
    table_offsets = [0, 24]
    lengths = torch.randint(0, 3, (len(ftm) * batch,), generator=gen)
    indices = (
        torch.cat(
            [
                torch.randint(0, rows[t], (int(n),), generator=gen)
                for t, n in zip(
                    (ftm[i // batch] for i in range(len(lengths))), lengths, strict=True
                )
            ]
        )
        if lengths.sum()
        else torch.zeros(0, dtype=I64)
    )
    index_dtype = d.choice(INDEX_DTYPES)
    return {
        "weights": torch.randn(34, generator=gen),
        "weights_offsets": torch.tensor([table_offsets[t] for t in ftm]),
        "D_offsets": torch.tensor([0, *itertools.accumulate(dims[t] for t in ftm)], dtype=I32),
        "rows_per_table": torch.tensor([rows[t] for t in ftm]),
        "indices": indices.to(index_dtype),
        "offsets": torch.cat([torch.zeros(1, dtype=I64), lengths.cumsum(0)]).to(index_dtype),
        "pooling_mode": 0,
        "_batch": batch,
    }


def make_tbe_forward(d):
    args = make_tbe_layout(d)
    args.pop("_batch")
    args.update(total_D=10, max_D=4, indice_weights=None, output_dtype=0)
    return args


def make_int_nbit_lookup(d):
    """The quantized inference lookup: an INT8 table (3 rows of dim 4: an fp16 scale and bias,
    then 4 codes) and an FP16 table (4 rows of dim 2) at FBGEMM's 128-byte table offsets, bags
    with a pruned (-1) index now and then."""
    gen = d.generator()
    batch = d.int(0, 3)
    weights = torch.zeros(256, dtype=torch.uint8)
    int8_rows = weights[:24].view(3, 8)
    int8_rows[:, 4:] = torch.randint(0, 256, (3, 4), generator=gen, dtype=torch.uint8)
    scale_bias = torch.cat(
        [torch.rand(3, 1, generator=gen) * 0.1, torch.randn(3, 1, generator=gen)], 1
    )
    int8_rows[:, :4] = scale_bias.half().view(torch.uint8)
    weights[128:144] = torch.randn(4, 2, generator=gen).half().view(torch.uint8).flatten()
    lengths = torch.randint(0, 3, (2 * batch,), generator=gen)
    indices = torch.cat(
        [
            torch.randint(-1, (3, 4)[i // max(batch, 1)], (int(n),), generator=gen)
            for i, n in enumerate(lengths)
        ]
        + [torch.zeros(0, dtype=I64)]
    )
    index_dtype = d.choice(INDEX_DTYPES)
    return {
        "dev_weights": weights,
        "uvm_weights": torch.zeros(0, dtype=torch.uint8),
        "weights_placements": torch.tensor([3, 3], dtype=I32),
        "weights_offsets": torch.tensor([0, 128]),
        "weights_tys": torch.tensor([2, 1], dtype=torch.uint8),
        "D_offsets": torch.tensor([0, 4, 6], dtype=I32),
        "total_D": 6,
        "max_int2_D": 0,
        "max_int4_D": 0,
        "max_int8_D": 4,
        "max_float16_D": 2,
        "max_float32_D": 0,
        "indices": indices.to(index_dtype),
        "offsets": torch.cat([torch.zeros(1, dtype=I64), lengths.cumsum(0)]).to(index_dtype),
        "pooling_mode": d.choice([0, 1]),
        "indice_weights": d.choice([None, torch.rand(indices.numel(), generator=gen)]),
        "output_dtype": d.choice([0, 1, 5]),
    }


INT_NBIT_SIZES = ("total_D", "max_int2_D", "max_int4_D", "max_int8_D", "max_float16_D")


def ref_int_nbit_lookup(a):
    # total_D and max(max_*_D) are output widths (FBGEMM pads the pooled output to total_D).
    sizes = [a.get(n) for n in (*INT_NBIT_SIZES, "max_float32_D", "max_float8_D")]
    if any(isinstance(v, int) and v > 2**16 for v in sizes):
        raise HugeOutput
    try:
        return lookup_reference(a)
    except LookupInvalid as e:
        raise Invalid(str(e)) from e


# The optimizer table's rows by op suffix, and values of their hyper-parameters but the step
# (passed explicitly, so that the property run mutates them).
TBE_OPTIMIZERS = {spec.name: spec for spec in OPTIMIZER_ROWS}
TBE_HYPER_PARAMETERS = {
    "eps": 0.01,
    "beta1": 0.8,
    "beta2": 0.9,
    "ar_alpha": 2.0,
    "ema_beta": 0.7,
    "min_shrinkage": 0.3,
    # rowwise Adagrad with counter: a decaying count, the learning rate lowered for counts above 1
    "counter_halflife": 3,
    "adjustment_iter": -1,
    "adjustment_ub": 0.5,
    "learning_rate_mode": 1,
    "max_counter": 4.0,
    "tail_id_threshold": 1.0,
    "is_tail_id_thresh_ratio": 0,
    "regularization_mode": 3,
    "weight_norm_coefficient": 0.0,
    "lower_bound": 0.0,
}


def make_tbe_backward(optimizer, weighted):
    def make(d):
        args = make_tbe_layout(d)
        batch = args.pop("_batch")
        args["grad_output"] = torch.randn(batch, 10, generator=d.generator())
        if weighted:
            args["indice_weights"] = torch.rand(args["indices"].numel(), generator=d.generator())
        # Elements per row of each state buffer, for the two tables (dims 4 and 2).
        spec = TBE_OPTIMIZERS[optimizer]
        for name, layout in zip(spec.state_buffers, spec.state_layouts, strict=True):
            first, second = (4, 2) if layout == "elementwise" else (1, 1)
            args[name] = torch.zeros(6 * first + 5 * second)
            args[f"{name}_offsets"] = torch.tensor([0, 6 * first, 0])
        args["learning_rate_tensor"] = torch.tensor(0.1)
        for name in spec.hyper_parameters:
            args[name] = d.int(1, 5) if name == "iter" else TBE_HYPER_PARAMETERS[name]
        return args

    return make


def make_tbe_lookup(optimizer):
    def make(d):
        args = make_tbe_backward(optimizer, False)(d)
        args.pop("grad_output")
        args.update(total_D=10, max_D=4, indice_weights=None, feature_requires_grad=None)
        return args

    return make


def make_bounds_check(d):
    args = make_tbe_layout(d)
    indices, offsets, rows = args["indices"], args["offsets"], args["rows_per_table"]
    call = {
        "rows_per_table": rows,
        "indices": indices,
        "offsets": offsets,
        "bounds_check_mode": d.int(0, 2),
        "warning": torch.zeros(1, dtype=I64),
        "weights": torch.rand(indices.numel(), generator=d.generator()),
    }
    if d.int(0, 1):  # FBGEMM's variable batch size, here every feature's B bags
        B = (offsets.numel() - 1) // rows.numel()
        call["B_offsets"] = torch.arange(rows.numel() + 1, dtype=I32) * B
        call["max_B"] = B
    return call


def make_grad_indice_weights(d):
    args = make_tbe_layout(d)
    batch = args.pop("_batch")
    args["grad_output"] = torch.randn(batch, 10, generator=d.generator())
    args["feature_requires_grad"] = torch.tensor([1, 0, 1])
    return args


# --------------------------------------------------------------------------- zero-collision hash
MASK64 = (1 << 64) - 1


def _rotl(v, bits):
    return ((v << bits) | (v >> (64 - bits))) & MASK64


def _fmix64(h):
    h ^= h >> 33
    h = (h * 0xFF51AFD7ED558CCD) & MASK64
    h ^= h >> 33
    h = (h * 0xC4CEB9FE1A85EC53) & MASK64
    return h ^ (h >> 33)


def murmur_hash3_2x64(x, y=0, seed=0):
    """MurmurHash3_x64_128 of the 16 bytes (x, y) (64-bit words, two's complement), its halves
    folded as FBGEMM's faster_hash ops fold them."""
    c1, c2 = 0x87C37B91114253D5, 0x4CF5AD432745937F
    h1 = h2 = seed & MASK64
    h1 ^= (_rotl((x & MASK64) * c1 & MASK64, 31) * c2) & MASK64
    h1 = (_rotl(h1, 27) + h2) & MASK64
    h1 = (h1 * 5 + 0x52DCE729) & MASK64
    h2 ^= (_rotl((y & MASK64) * c2 & MASK64, 33) * c1) & MASK64
    h2 = (_rotl(h2, 31) + h1) & MASK64
    h2 = (h2 * 5 + 0x38495AB5) & MASK64
    h1 ^= 16
    h2 ^= 16
    h1 = (h1 + h2) & MASK64
    h2 = (h2 + h1) & MASK64
    h1, h2 = _fmix64(h1), _fmix64(h2)
    h1 = (h1 + h2) & MASK64
    h2 = (h2 + h1) & MASK64
    return h1 ^ h2


def make_create_zch_buffer(d):
    return {
        "size": d.int(0, 40),
        "support_evict": d.bool(),
        "device": None,
        "long_type": d.bool(),
    }


def ref_create_zch_buffer(a):
    size = a["size"]
    require(isinstance(size, int) and size >= 0, "size >= 0")
    identities = torch.full((size, 1), -1, dtype=I64 if a["long_type"] else I32)
    metadata = torch.full((size, 1), -1, dtype=I32) if a["support_evict"] else None
    return identities, metadata


def make_zero_collision_hash(d):
    """A read-only lookup (the CPU kernel's mode) in a table where some ids were inserted."""
    gen = d.generator()
    rows = d.int(1, 24)
    identity_dtype = d.choice((I32, I64))
    input_dtype = I64 if identity_dtype == I64 else d.choice((I32, I64))
    identities = torch.full((rows, 1), -1, dtype=identity_dtype)
    stored = torch.randint(0, 50, (rows,), generator=gen, dtype=identity_dtype)
    keep = torch.rand(rows, generator=gen) < 0.6
    identities[keep, 0] = stored[keep]
    n = d.int(0, 16)
    ids = torch.randint(-5, 50, (n,), generator=gen, dtype=input_dtype)
    args = {
        "input": ids,
        "identities": identities,
        "max_probe": d.int(0, 6),
        "circular_probe": True,
        "readonly": True,
        "disable_fallback": d.bool(),
    }
    size = rows
    if d.bool():  # per-id blocks, as torchrec's TrainInputMapper gives them
        blocks = d.int(1, rows)
        size = rows // blocks
        which = torch.randint(0, blocks, (n,), generator=gen)
        args["local_sizes"] = torch.full((n,), size, dtype=I64)
        args["offsets"] = which * size
    if d.bool() and size > 2:
        args["opt_in_prob"] = d.int(1, 100)
        args["num_reserved_slots"] = 1
    return args


def ref_zero_collision_hash(a):
    require(a.get("readonly") is True, "readonly")
    ids = tensor(a, "input")
    require(ids.dim() >= 1, "input has a batch dimension")
    if ids.shape[0] == 0:  # FBGEMM returns before checking anything else
        return torch.empty(0, dtype=I64), None
    ids = tensor(a, "input", (I32, I64), (1,))
    identities = tensor(a, "identities", (I32, I64), (2,))
    require(a.get("circular_probe") is True, "circular_probe")
    require(identities.shape[1] >= 1, "identities has a column")
    require(not (ids.dtype == I32 and identities.dtype == I64), "int32 ids, int32 identities")
    opt_in, reserved = a.get("opt_in_prob", -1), a.get("num_reserved_slots", -1)
    if opt_in != -1:
        require(0 < opt_in <= 100 and reserved > 0, "opt-in")
    require(reserved == -1 or opt_in != -1, "reserved slots need opt-in")
    reserved = max(reserved, 0)
    rows = identities.shape[0]
    n = ids.numel()
    local_sizes = optional_tensor(a, "local_sizes", (I64,))
    offsets = optional_tensor(a, "offsets", (I64,))
    if offsets is not None:
        require(offsets.numel() == n, "one offset per id")
    if local_sizes is not None:
        require(local_sizes.numel() == n and offsets is not None, "blocks per id")
        sizes, starts = ints(local_sizes), ints(offsets)
        for size, start in zip(sizes, starts, strict=True):
            require(size > reserved and 0 <= start <= rows - size, "block in table")
    else:
        require(rows > reserved, "table holds the reserved slots")
        sizes, starts = [rows] * n, [0] * n
    fold = ids.dtype != identities.dtype
    column = ints(identities[:, 0])
    out = []
    for i, item in enumerate(ints(ids)):
        h = murmur_hash3_2x64(item)
        block, start = sizes[i], starts[i]
        probe_rows = block - reserved
        identity = int(math.fmod(item, 2**31 - 1)) if fold else item
        slot, found = h % probe_rows, False
        for _ in range(max(min(a["max_probe"], probe_rows), 0)):  # then every slot was seen
            if column[start + slot] == identity:
                found = True
                break
            slot = (slot + 1) % probe_rows
        if not found:
            if a.get("disable_fallback", False):
                out.append(-1)
                continue
            slot = probe_rows + h % reserved if reserved else h % block
        out.append(start + slot)
    return torch.tensor(out, dtype=I64), None


# --------------------------------------------------------------------------- keyed
def make_keyed(d):
    """Keyed tensors (keys, per-key widths, values) and groups of their keys, repeats included."""
    gen = d.generator()
    tensors = d.int(1, 3)
    keys = [[f"k{i}_{k}" for k in range(d.int(0, 3))] for i in range(tensors)]
    lengths = [[d.int(0, 3) for _ in tensor_keys] for tensor_keys in keys]
    batch, dtype = d.int(0, 3), d.choice(FLOAT_DTYPES)
    values = [torch.randn(batch, sum(w), generator=gen).to(dtype) for w in lengths]
    flat = [k for tensor_keys in keys for k in tensor_keys]
    groups = [
        [d.choice(flat) for _ in range(d.int(0, 3) if flat else 0)] for _ in range(d.int(0, 3))
    ]
    return keys, lengths, values, groups


def keyed_plan(a):
    """The checked regroup plan of a["keys"], a["lengths"], a["groups"]: (moves as lists
    (input, output, input column, output column, width, next), input widths, output widths); a key
    listed twice resolves to its first place."""
    keys, lengths, groups = a["keys"], a["lengths"], a["groups"]
    require(len(keys) == len(lengths), "keys and lengths: one entry per keyed tensor")
    place, in_widths = {}, []
    for i, (tensor_keys, widths) in enumerate(zip(keys, lengths, strict=True)):
        require(len(tensor_keys) == len(widths), "keys[i] and lengths[i]: one entry per key")
        offset = 0
        for key, width in zip(tensor_keys, widths, strict=True):
            require(width >= 0, "lengths >= 0")
            place.setdefault(key, (i, offset, width))
            offset += width
            require(offset < 2**31, "lengths sum within int32")
        in_widths.append(offset)
    total = sum(len(g) for g in groups)
    moves, out_widths, uses = [], [], {}
    for j, group in enumerate(groups):
        offset = 0
        for key in group:
            require(key in place, "group keys are keys")
            i, column, width = place[key]
            m = len(moves)
            moves.append([i, j, column, offset, width, 0])
            if key in uses:
                moves[uses[key][-1]][5] = m if len(uses[key]) == 1 else -m
                moves[m][5] = -total
            uses.setdefault(key, []).append(m)
            offset += width
        require(offset < 2**31, "group widths within int32")
        out_widths.append(offset)
    return moves, in_widths, out_widths


def pooled_list(a, name="pooled_embs"):
    tensors = a[name]
    require(len(tensors) >= 1, f"{name} not empty")
    for i, t in enumerate(tensors):
        require(isinstance(t, torch.Tensor) and t.device.type == "cpu", f"{name}[{i}] on cpu")
        require(t.dim() == 2 and t.dtype in FLOAT_DTYPES, f"{name}[{i}] floating 2-D")
        require(t.dtype == tensors[0].dtype and t.shape[0] == tensors[0].shape[0], "one dtype/rows")
    return tensors


def apply_moves(inputs, moves, out_lengths, reverse):
    """Each move in order: columns copied (or, reversed with next < 0, added) between tensors."""
    for length in out_lengths:
        require(length >= 0, "out_lengths >= 0")
    rows = inputs[0].shape[0]
    outputs = [inputs[0].new_zeros((rows, length)) for length in out_lengths]
    for move in moves:
        source, target, source_column, target_column, width, following = move
        if reverse:
            source, target, source_column, target_column = move[1], move[0], move[3], move[2]
        require(0 <= source < len(inputs) and 0 <= target < len(outputs), "moves in range")
        require(width >= 0 and source_column >= 0 and target_column >= 0, "moves >= 0")
        require(source_column + width <= inputs[source].shape[1], "reads inside the input")
        require(target_column + width <= out_lengths[target], "writes inside the output")
        piece = inputs[source][:, source_column : source_column + width]
        window = outputs[target][:, target_column : target_column + width]
        if reverse and following < 0:
            window += piece
        else:
            window.copy_(piece)
    return outputs


def make_regroup(d):
    keys, lengths, values, groups = make_keyed(d)
    return {"pooled_embs": values, "keys": keys, "lengths": lengths, "groups": groups}


def ref_regroup(a):
    inputs = pooled_list(a)
    moves, _, out_widths = keyed_plan(a)
    require(len(a["keys"]) == len(inputs), "one keys entry per tensor")
    return apply_moves(inputs, moves, out_widths, False)


def make_kt_regroup(d):
    keys, lengths, values, groups = make_keyed(d)
    return {"embs": values[0], "keys": keys, "lengths": lengths, "groups": groups}


def ref_kt_regroup(a):
    tensor(a, "embs")
    moves, in_widths, out_widths = keyed_plan(a)
    return (
        torch.tensor(moves, dtype=I32).view(-1, 6),
        torch.tensor(in_widths, dtype=I32),
        torch.tensor(out_widths, dtype=I32),
        UNCHECKED,
    )


def make_permute_multi(reverse_choices):
    def make(d):
        keys, lengths, values, groups = make_keyed(d)
        a = {"keys": keys, "lengths": lengths, "groups": groups}
        moves, in_widths, out_widths = keyed_plan(a)
        args = {
            "pooled_embs": values,
            "permutes": torch.tensor(moves, dtype=I32).view(-1, 6),
            "in_shapes": torch.tensor(in_widths, dtype=I32),
            "out_shapes": torch.tensor(out_widths, dtype=I32),
            "out_lengths": out_widths,
        }
        if d.choice(reverse_choices):  # the backward: output gradients in, input gradients out
            gen = d.generator()
            rows, dtype = values[0].shape[0], values[0].dtype
            args["pooled_embs"] = [
                torch.randn(rows, w, generator=gen).to(dtype) for w in out_widths
            ]
            args["in_shapes"], args["out_shapes"] = args["out_shapes"], args["in_shapes"]
            args["out_lengths"] = in_widths
            args["reverse"] = True
        return args

    return make


def ref_permute_multi(a):
    inputs = pooled_list(a)
    for name in ("in_shapes", "out_shapes"):
        tensor(a, name)  # not read on CPU
    permutes = tensor(a, "permutes", (I32,), (2,))
    require(permutes.shape[1] == 6, "permutes [moves, 6]")
    return apply_moves(inputs, permutes.tolist(), list(a["out_lengths"]), a.get("reverse", False))


def make_merge(d):
    gen = d.generator()
    rank = d.int(1, 3)
    shape = [d.int(0, 3) for _ in range(rank)]
    cat_dim = d.int(-rank, rank - 1)
    dtype = d.choice(ELEMENT_DTYPES)
    tensors = []
    for _ in range(d.int(1, 3)):
        shape[cat_dim] = d.int(0, 3)
        tensors.append((torch.randn(shape, generator=gen) * 3).to(dtype))
    return {
        "pooled_embeddings": tensors,
        "uncat_dim_size": d.int(0, 3),
        "target_device": torch.device("cpu"),
        "cat_dim": cat_dim,
    }


def ref_merge(a):
    """torch.cat along cat_dim (its rules: sizes, legacy 1-D empty tensors), in the first
    tensor's dtype; uncat_dim_size is not read."""
    tensors = a["pooled_embeddings"]
    require(len(tensors) >= 1, "pooled_embeddings not empty")
    for i in range(len(tensors)):
        require(tensors[i].device.type == "cpu", f"pooled_embeddings[{i}] on cpu")
    first = tensors[0]
    try:
        joined = torch.cat(tensors, a["cat_dim"])
    except (RuntimeError, IndexError) as e:
        raise Invalid(f"torch.cat rejects: {e}") from e
    require(torch.can_cast(joined.dtype, first.dtype), "the result casts to the first dtype")
    return joined.to(first.dtype)


# --------------------------------------------------------------------------- index select
def make_group_select(d):
    """2 to 3 groups of tables (any element dtype, rows of 0 to 2 dims) and row indices."""
    gen = d.generator()
    dtype = d.choice(ELEMENT_DTYPES)
    row_shape = [d.int(0, 3) for _ in range(d.int(0, 2))]
    inputs, indices = [], []
    for _ in range(d.int(2, 3)):
        rows = d.int(1, 6)
        inputs.append((torch.randn(rows, *row_shape, generator=gen) * 5).to(dtype))
        index = torch.randint(0, rows, (d.int(0, 6),), generator=gen, dtype=d.choice(INDEX_DTYPES))
        indices.append(index)
    return {"input_group": inputs, "indices_group": indices}


def selected_groups(inputs, indices, inputs_name, indices_name):
    """index_select(0) of each group (as many as index tensors; extra inputs are ignored)."""
    require(isinstance(inputs, list | tuple) and isinstance(indices, list | tuple), "lists")
    require(len(inputs) >= len(indices), f"{inputs_name} as long as {indices_name}")
    out = []
    for x, index in zip(inputs[: len(indices)], indices, strict=True):
        require(x.device.type == "cpu" and x.dim() >= 1, f"{inputs_name} on cpu, with rows")
        require(index.device.type == "cpu", f"{indices_name} on cpu")
        require(index.dtype in INDEX_DTYPES and index.dim() <= 1, f"{indices_name} int, 1-D")
        require(all(0 <= i < x.shape[0] for i in ints(index)), f"{indices_name} in range")
        out.append(x.index_select(0, index.reshape(-1).long()))
    return out


def ref_group_select(a):
    return selected_groups(a["input_group"], a["indices_group"], "input_group", "indices_group")


def make_group_gpu_impl(d):
    args = make_group_select(d)
    indices = args["indices_group"]
    return {"inputs": [*indices, *args["input_group"]], "group_size": len(indices)}


def ref_group_gpu_impl(a):
    inputs, group_size = a["inputs"], a["group_size"]
    require(0 <= group_size <= len(inputs) // 2, "group_size in range")
    out = selected_groups(
        inputs[group_size : 2 * group_size], inputs[:group_size], "inputs", "inputs"
    )
    return [*out, torch.empty(0, dtype=I64), torch.empty(0, dtype=I64)]


def make_group_gpu_backward(d):
    """FBGEMM's packing: output gradients, indices, two saved tensors, the first input."""
    gen = d.generator()
    dtype = d.choice(FLOAT_DTYPES)
    row_shape = [d.int(0, 3) for _ in range(d.int(0, 2))]
    grads, indices, shapes = [], [], []
    for _ in range(d.int(2, 3)):
        rows = d.int(1, 6)
        index = torch.randint(0, rows, (d.int(0, 6),), generator=gen, dtype=d.choice(INDEX_DTYPES))
        grads.append(torch.randn(index.numel(), *row_shape, generator=gen).to(dtype))
        indices.append(index)
        shapes += [rows, *row_shape]
    first = torch.randn(shapes[0], *row_shape, generator=gen).to(dtype)
    saved = [torch.empty(0, dtype=I64), torch.empty(0, dtype=I64)]
    return {"inputs": [*grads, *indices, *saved, first], "output_shape_group": shapes}


def ref_group_gpu_backward(a):
    inputs, shapes = a["inputs"], a["output_shape_group"]
    require(len(inputs) >= 3, "inputs has at least 3 tensors")
    group_size = (len(inputs) - 3) // 2
    first = inputs[2 * group_size + 2]
    require(first.device.type == "cpu" and first.dim() >= 1, "first input on cpu, with rows")
    require(first.dtype in FLOAT_DTYPES, "first input floating")
    dim = first.dim()
    require(len(shapes) == group_size * dim, "output_shape_group: dim sizes per group")
    require(all(s >= 0 for s in shapes), "output_shape_group >= 0")
    out = []
    for g in range(group_size):
        grad, index = inputs[g], inputs[group_size + g]
        shape = shapes[g * dim : (g + 1) * dim]
        require(grad.device.type == "cpu" and index.device.type == "cpu", "inputs on cpu")
        require(index.dtype in INDEX_DTYPES and index.dim() <= 1, "indices int, 1-D")
        require(list(grad.shape) == [index.numel(), *shape[1:]], "grad shape")
        require(grad.dtype in FLOAT_DTYPES, "grad floating")
        require(all(0 <= i < shape[0] for i in ints(index)), "indices in range")
        acc = torch.zeros(shape, dtype=F64)
        acc.index_add_(0, index.reshape(-1).long(), grad.to(first.dtype).double())
        out.append(acc.to(first.dtype))
    return [*(torch.empty(0, dtype=I64) for _ in range(group_size)), *out]


def make_batch_select(tensor_form):
    """2 to 3 tables of rows x columns elements packed in `inputs`, row indices per table."""

    def make(d):
        gen = d.generator()
        permute = d.bool()
        tables = d.int(2, 3)
        rows = [d.int(1, 5) for _ in range(tables)]
        cols = [d.int(1, 4) for _ in range(tables)]
        num = [d.int(1, 5)] * tables if permute else [d.int(1, 5) for _ in range(tables)]
        dtype = d.choice(ELEMENT_DTYPES)
        index_dtype = d.choice(INDEX_DTYPES)
        inputs = (
            torch.randn(sum(r * c for r, c in zip(rows, cols, strict=True)), generator=gen) * 5
        ).to(dtype)
        indices = torch.cat(
            [
                torch.randint(0, r, (n,), generator=gen, dtype=index_dtype)
                for r, n in zip(rows, num, strict=True)
            ]
        )
        sizes = [num, rows, cols]
        if tensor_form:
            sizes = [torch.tensor(v, dtype=I64) for v in sizes]
        names = ("input_num_indices", "input_rows", "input_columns")
        return {
            "inputs": inputs,
            "indices": indices,
            **dict(zip(names, sizes, strict=True)),
            "permute_output_dim_0_1": permute,
        }

    return make


def batch_sizes(a, tensor_form):
    names = ("input_num_indices", "input_rows", "input_columns")
    if tensor_form:
        lists = [ints(tensor(a, n, (I64,), (1,))) for n in names]
    else:
        lists = [list(a[n]) for n in names]
    require(len(lists[1]) == len(lists[0]) and len(lists[2]) == len(lists[0]), "one size each")
    return lists


def batch_layout(num, rows, cols, permute, strict):
    """Validates the sizes; returns (input numel, index numel, output numel)."""
    low = 1 if strict else 0
    require(all(r >= low for r in rows) and all(c >= low for c in cols), "rows, columns")
    if permute:
        require(len(num) > 0 and num[0] >= low, "input_num_indices[0]")
        require(all(n == num[0] for n in num), "input_num_indices equal")
    else:
        require(all(n >= low for n in num), "input_num_indices")
    products = [r * c for r, c in zip(rows, cols, strict=True)]
    products += [n * c for n, c in zip(num, cols, strict=True)]
    require(all(p < 2**63 for p in products), "products in int64")
    sums = (
        sum(r * c for r, c in zip(rows, cols, strict=True)),
        sum(num),
        sum(n * c for n, c in zip(num, cols, strict=True)),
        sum(cols),
    )
    require(all(t < 2**63 for t in sums), "sums in int64")
    return sums[:3]


def batch_indices(a, num, rows):
    indices = tensor(a, "indices", INDEX_DTYPES, (1,))
    require(indices.numel() == sum(num), "indices: sum(input_num_indices)")
    parts = torch.split(indices.long(), num)
    for part, r in zip(parts, rows, strict=True):
        require(all(0 <= i < r for i in ints(part)), "indices in range")
    return parts


def ref_batch_select(tensor_form):
    def ref(a):
        num, rows, cols = batch_sizes(a, tensor_form)
        inputs = tensor(a, "inputs")
        if inputs.numel() == 0:
            return inputs.new_empty(0)
        require(inputs.dim() == 1, "inputs 1-D")
        permute = a.get("permute_output_dim_0_1", False)
        input_numel, _, _ = batch_layout(num, rows, cols, permute, True)
        require(inputs.numel() == input_numel, "inputs: sum(rows * columns)")
        parts = batch_indices(a, num, rows)
        tables = torch.split(inputs, [r * c for r, c in zip(rows, cols, strict=True)])
        outs = [t.view(r, c)[i] for t, i, r, c in zip(tables, parts, rows, cols, strict=True)]
        if permute:
            return torch.cat(outs, dim=1).flatten()
        return torch.cat([o.flatten() for o in outs])

    return ref


def make_batch_backward(tensor_form):
    def make(d):
        args = make_batch_select(tensor_form)(d)
        out = ref_batch_select(tensor_form)(args)
        grad = torch.randn(out.shape, generator=d.generator()).to(d.choice(FLOAT_DTYPES))
        del args["inputs"]
        if tensor_form:
            numel = sum(
                r * c
                for r, c in zip(ints(args["input_rows"]), ints(args["input_columns"]), strict=True)
            )
            args["indices_numels"] = args["input_num_indices"].clone()
            args["saved_tensor"] = torch.tensor([numel])
        return {"grad_output": grad, **args}

    return make


def ref_batch_backward(tensor_form):
    def ref(a):
        if tensor_form:
            saved = tensor(a, "saved_tensor", (I64,))
            require(saved.numel() >= 1, "saved_tensor not empty")
            if ints(saved)[0] == 0:
                return torch.empty(0, dtype=a["grad_output"].dtype)
        num, rows, cols = batch_sizes(a, tensor_form)
        if tensor_form:
            numels = ints(tensor(a, "indices_numels", (I64,), (1,)))
            require(numels == num, "indices_numels == input_num_indices")
        permute = a["permute_output_dim_0_1"]
        input_numel, _, output_numel = batch_layout(num, rows, cols, permute, False)
        if tensor_form:
            require(ints(a["saved_tensor"])[0] == input_numel, "saved_tensor: the input numel")
        grad = tensor(a, "grad_output", FLOAT_DTYPES, (1,))
        require(grad.numel() == output_numel, "grad_output: the output's numel")
        parts = batch_indices(a, num, rows)
        if permute:
            grads = torch.split(grad.view(num[0], sum(cols)), cols, dim=1)
        else:
            sizes = [n * c for n, c in zip(num, cols, strict=True)]
            grads = [
                g.reshape(n, c) for g, n, c in zip(torch.split(grad, sizes), num, cols, strict=True)
            ]
        out = [
            torch.zeros(r, c, dtype=F64).index_add_(0, i, g.double()).flatten()
            for g, i, r, c in zip(grads, parts, rows, cols, strict=True)
        ]
        return torch.cat([*out, torch.empty(0, dtype=F64)]).to(grad.dtype)

    return ref


# --------------------------------------------------------------------------- quantize
QUANTIZE_INPUTS = {"Float": (F32,), "Half": (F16,), "FloatOrHalf": (F32, F16)}
DEQUANTIZED = {0: F32, 1: F16, 5: BF16}


def make_quantize_8bit(dtypes):
    def make(d):
        gen = d.generator()
        shape = [d.int(0, 5) for _ in range(d.int(1, 2))] + [d.int(0, 19)]
        return {"t": (torch.randn(shape, generator=gen) * 4).to(d.choice(dtypes))}

    return make


def ref_quantize_8bit(dtypes):
    def ref(a):
        t = tensor(a, "t", dtypes)
        require(t.dim() >= 2, "t has rows")
        return quantize_reference.quantize_8bit(t)

    return ref


def fused_rows(d, gen, lead, codes, scale_bias_dtype):
    """Random quantized rows: `codes` bytes, then a random scale and bias of scale_bias_dtype."""
    scale_bias = (torch.randn((*lead, 2), generator=gen) * 3).to(scale_bias_dtype)
    code_bytes = torch.randint(0, 256, (*lead, codes), generator=gen, dtype=torch.uint8)
    return torch.cat([code_bytes, scale_bias.view(torch.uint8)], -1)


def make_dequantize_8bit(options):
    def make(d):
        gen = d.generator()
        lead = [d.int(0, 5) for _ in range(d.int(1, 2))]
        args = {"input": fused_rows(d, gen, lead, d.int(0, 19), F32)}
        if options:
            args["output_dtype"] = d.choice(list(DEQUANTIZED))
            if d.bool():  # fp16 scale and bias in front
                args["input"] = fused_rows(d, gen, lead, d.int(0, 19), F16)
                args["scale_bias_last"] = False
                args["quant_padding_float_type"] = False
        return args

    return make


def ref_dequantize_8bit(dtype):
    def ref(a):
        q = tensor(a, "input", (torch.uint8,))
        require(q.dim() >= 2, "input has rows")
        out = DEQUANTIZED.get(a.get("output_dtype", 0)) if dtype is None else dtype
        require(out is not None, "output_dtype is 0, 1 or 5")
        last, float_padding = (
            a.get("scale_bias_last", True),
            a.get("quant_padding_float_type", True),
        )
        require(float_padding or not last, "2-byte padding in front")
        require(q.shape[-1] >= (8 if float_padding else 4), "rows hold the scale and bias")
        return quantize_reference.dequantize_8bit(q, out, last, float_padding)

    return ref


def make_quantize_nbit(dtypes):
    def make(d):
        gen = d.generator()
        bit_rate = d.choice((1, 2, 3, 4, 5, 8))
        cols = 2 * (8 // bit_rate) * d.int(0, 4)
        x = torch.randn(d.int(0, 5), cols, generator=gen) * 4
        return {"input": x.to(d.choice(dtypes)), "bit_rate": bit_rate}

    return make


def ref_quantize_nbit(dtypes):
    def ref(a):
        x = tensor(a, "input", dtypes, (2,))
        bit_rate = a["bit_rate"]
        require(1 <= bit_rate <= 8, "bit_rate in 1..8")
        require(x.shape[1] % (2 * (8 // bit_rate)) == 0, "whole fp16-aligned rows")
        return quantize_reference.quantize_nbit(x, bit_rate)

    return ref


def make_dequantize_nbit(options):
    def make(d):
        gen = d.generator()
        args = {
            "input": fused_rows(d, gen, [d.int(0, 5)], d.int(0, 12), F16),
            "bit_rate": d.choice((1, 2, 3, 4, 6, 8)),
        }
        if options:
            args["output_dtype"] = d.choice((0, 1))
            args["scale_bias_last"] = d.bool()  # FBGEMM's CPU kernel ignores it
        return args

    return make


def ref_dequantize_nbit(dtype):
    def ref(a):
        q = tensor(a, "input", (torch.uint8,), (2,))
        bit_rate = a["bit_rate"]
        require(1 <= bit_rate <= 8, "bit_rate in 1..8")
        out = {0: F32, 1: F16}.get(a.get("output_dtype", 0)) if dtype is None else dtype
        require(out is not None, "output_dtype is 0 or 1")
        require(q.shape[1] >= 4, "rows hold the scale and bias")
        return quantize_reference.dequantize_nbit(q, bit_rate, out)

    return ref


def make_pruned_bags(d, gen, index_dtype, num_tables):
    batch = d.int(1, 3)
    lengths = torch.randint(0, 4, (num_tables * batch,), generator=gen)
    offsets = torch.cat([torch.zeros(1, dtype=I64), lengths.cumsum(0)]).to(index_dtype)
    indices = torch.randint(-2, 40, (int(offsets[-1]),), generator=gen, dtype=index_dtype)
    return indices, offsets


def slices(d, gen, num_tables, at_least):
    sizes = torch.tensor([d.choice((0, at_least + d.int(1, 9))) for _ in range(num_tables)])
    return torch.cat([torch.zeros(1, dtype=I64), sizes.cumsum(0)])


def make_pruned_hashmap(insert):
    def make(d):
        gen = d.generator()
        index_dtype = d.choice((I32, I64))
        num_tables = d.int(1, 3)
        keys, key_offsets = make_pruned_bags(d, gen, index_dtype, num_tables)
        table_offsets = slices(d, gen, num_tables, keys.numel())
        table = torch.full((int(table_offsets[-1]), 2), -1, dtype=d.choice((I32, I64)))
        dense = torch.randint(-1, 100, keys.shape, generator=gen, dtype=index_dtype)
        if insert:
            return {
                "indices": keys,
                "dense_indices": dense,
                "offsets": key_offsets,
                "hash_table": table,
                "hash_table_offsets": table_offsets,
            }
        quantize_reference.hashmap_insert(keys, dense, key_offsets, table, table_offsets)
        indices, offsets = make_pruned_bags(d, gen, index_dtype, num_tables)
        return {
            "indices": indices,
            "offsets": offsets,
            "hash_table": table,
            "hash_table_offsets": table_offsets,
        }

    return make


def pruned_bags(a, table_offsets_name, table_rows):
    """Validated (indices, offsets, table offsets) of a pruned remap."""
    indices = tensor(a, "indices", (I32, I64), (1,))
    offsets = tensor(a, "offsets", (indices.dtype,), (1,))
    table_offsets = tensor(a, table_offsets_name, (I64,), (1,))
    num_tables = table_offsets.numel() - 1
    require(num_tables >= 1, "one slice per table")
    batch = (offsets.numel() - 1) // num_tables
    require(batch >= 1, "B >= 1 bags per table")
    offsets = offsets[: num_tables * batch + 1]  # FBGEMM reads the first T * B bags only
    require(offsets_list(offsets, "offsets")[-1] <= indices.numel(), "offsets within indices")
    require(offsets_list(table_offsets, "table")[-1] <= table_rows, "slices within the table")
    return indices, offsets, table_offsets


def narrow_to(values, dtype):
    info = torch.iinfo(dtype)
    require(all(info.min <= v <= info.max for v in ints(values)), "values fit the dtype")
    return values.to(dtype)


def uncovered_to_minus_one(out, offsets):
    bounds = ints(offsets)
    out[: bounds[0]] = -1
    out[bounds[-1] :] = -1
    return out


def pruned_hash_table(a):
    table = tensor(a, "hash_table", (I32, I64), (2,))
    require(table.shape[1] == 2, "rows of [index, dense index]")
    return table


def ref_pruned_hashmap_lookup(a):
    table = pruned_hash_table(a)
    indices, offsets, table_offsets = pruned_bags(a, "hash_table_offsets", table.shape[0])
    out = quantize_reference.hashmap_lookup(indices, offsets, table, table_offsets)
    return uncovered_to_minus_one(narrow_to(out, indices.dtype), offsets)


def ref_pruned_hashmap_insert(a):
    table = pruned_hash_table(a)
    require(table.is_contiguous(), "hash_table filled in place")
    indices, offsets, table_offsets = pruned_bags(a, "hash_table_offsets", table.shape[0])
    dense = tensor(a, "dense_indices", (indices.dtype,), (1,))
    require(dense.numel() == indices.numel(), "one dense index per index")
    bounds, starts = ints(offsets), ints(table_offsets)
    batch = (len(bounds) - 1) // (len(starts) - 1)
    kept = [  # the pairs stored: not pruned, in a table with a slice
        i
        for t in range(len(starts) - 1)
        if starts[t + 1] > starts[t]
        for i in range(bounds[t * batch], bounds[(t + 1) * batch])
        if int(dense[i]) != -1
    ]
    narrow_to(indices[kept], table.dtype)
    narrow_to(dense[kept], table.dtype)
    try:
        quantize_reference.hashmap_insert(indices, dense, offsets, table.clone(), table_offsets)
    except ValueError as e:
        raise Invalid("a slice fills up") from e


def make_pruned_array_lookup(d):
    gen = d.generator()
    index_dtype = d.choice((I32, I64))
    num_tables = d.int(1, 3)
    indices, offsets = make_pruned_bags(d, gen, index_dtype, num_tables)
    indices = indices.abs()
    remap_offsets = slices(d, gen, num_tables, 40)
    remap = torch.randint(-1, 1000, (int(remap_offsets[-1]),), generator=gen)
    return {
        "indices": indices,
        "offsets": offsets,
        "index_remappings": remap.to(d.choice((I32, I64))),
        "index_remappings_offsets": remap_offsets,
    }


def ref_pruned_array_lookup(a):
    remap = tensor(a, "index_remappings", (I32, I64), (1,))
    indices, offsets, remap_offsets = pruned_bags(a, "index_remappings_offsets", remap.numel())
    try:
        out = quantize_reference.array_lookup(indices.long(), offsets, remap.long(), remap_offsets)
    except IndexError as e:
        raise Invalid("index within its slice") from e
    return uncovered_to_minus_one(narrow_to(out, indices.dtype), offsets)


# --------------------------------------------------------------------------- the catalogue
def case(op_name, make, reference=None, unmodelled=()):
    return OpCase(op_name, make, reference, TOLERANCE, unmodelled)


def pair_reference(ref):
    return lambda a: ref({**a, "_pair": True})


CASES = [
    case("asynchronous_complete_cumsum", make_cumsum((1, 2)), ref_complete_cumsum),
    case("asynchronous_exclusive_cumsum", make_cumsum((0, 1, 2, 3)), ref_flat_cumsum(False)),
    case("asynchronous_inclusive_cumsum", make_cumsum((0, 1, 2, 3)), ref_flat_cumsum(True)),
    case("jagged_to_padded_dense_forward", make_jagged_to_dense, ref_jagged_to_dense),
    case("jagged_to_padded_dense", make_jagged_to_dense, ref_jagged_to_dense),
    case(
        "jagged_to_padded_dense_backward",
        make_dense_to_jagged("grad_output"),
        ref_dense_to_jagged("grad_output", "offsets"),
    ),
    case(
        "dense_to_jagged_forward",
        make_dense_to_jagged("dense"),
        ref_dense_to_jagged("dense", "x_offsets"),
    ),
    case(
        "dense_to_jagged",
        make_dense_to_jagged("dense"),
        pair_reference(ref_dense_to_jagged("dense", "x_offsets")),
    ),
    case("jagged_2d_to_dense", make_one_level(2), ref_one_level(2)),
    case("jagged_1d_to_dense", make_one_level(1), ref_one_level(1)),
    case("offsets_range", make_offsets_range, ref_offsets_range),
    case("permute_1D_sparse_data", make_permute(True), ref_permute(True)),
    case("permute_2D_sparse_data", make_permute(False), ref_permute(False)),
    case("invert_permute", make_invert, ref_invert),
    case("block_bucketize_sparse_features", make_block_bucketize, ref_block_bucketize),
    *(
        case(name, make_permute_pooled, ref_permute_pooled)
        for name in (
            "permute_pooled_embs",
            "permute_pooled_embs_split",
            "permute_pooled_embs_auto_grad",
            "permute_pooled_embs_auto_grad_split",
        )
    ),
    case("gather_for_rank1", make_gather, ref_gather),
    case("index_select_for_rank1_backward", make_scatter, ref_scatter),
    case("relative_attn_bias_time_forward", make_time_bias, ref_time_bias),
    case("relative_attn_bias_pos", make_pos_bias, ref_pos_bias),
    case("relative_attn_bias_backward", make_bias_backward, ref_bias_backward),
    case("hstu_dense_forward", make_hstu, ref_hstu_forward),
    case("hstu_dense_backward", with_grad_output(make_hstu, ref_hstu_forward), ref_hstu_backward),
    case("hstu_dense_forward_fuxi", make_fuxi, ref_fuxi_forward),
    case(
        "hstu_dense_backward_fuxi",
        with_grad_output(make_fuxi, ref_fuxi_forward),
        ref_fuxi_backward,
    ),
    case("disentangled_attention", make_deberta, ref_deberta_forward),
    case("deberta_log_bucket_position", make_log_buckets, ref_log_buckets),
    # The backward reads the forward's output and log-sum-exp as given, computed from the other
    # arguments; the reference recomputes them, so it follows a change of grad_output only.
    case(
        "disentangled_attention_backward",
        make_deberta_backward,
        ref_deberta_backward,
        unmodelled=tuple(DEBERTA_BACKWARD_ARGS - {"grad_output"}),
    ),
    case("counter_dropout", make_counter_dropout, ref_counter_dropout),
    OpCase("hstu_layer_input", make_layer_input, ref_layer_input, LAYER_TOLERANCE),
    OpCase(
        "hstu_layer_input_backward",
        make_layer_input_backward,
        ref_layer_input_backward,
        LAYER_TOLERANCE,
    ),
    OpCase(
        "positional_input_features",
        make_positional_features,
        ref_positional_features,
        LAYER_TOLERANCE,
    ),
    OpCase(
        "positional_input_features_backward",
        with_grad_output(make_positional_features, ref_positional_features),
        ref_positional_features_backward,
        LAYER_TOLERANCE,
    ),
    OpCase("l2_normalize", make_l2_normalize, ref_l2_normalize, LAYER_TOLERANCE),
    OpCase(
        "l2_normalize_backward",
        with_grad_output(make_l2_normalize, ref_l2_normalize),
        ref_l2_normalize_backward,
        LAYER_TOLERANCE,
    ),
    OpCase("hstu_layer_output", make_layer_output, ref_layer_output, LAYER_TOLERANCE),
    OpCase(
        "hstu_layer_output_backward",
        with_grad_output(make_layer_output, ref_layer_output),
        ref_layer_output_backward,
        LAYER_TOLERANCE,
    ),
    OpCase("fuxi_layer_ffn", make_layer_ffn, ref_layer_ffn, LAYER_TOLERANCE),
    OpCase(
        "fuxi_layer_ffn_backward",
        with_grad_output(make_layer_ffn, ref_layer_ffn),
        ref_layer_ffn_backward,
        LAYER_TOLERANCE,
    ),
    case("sampled_softmax_loss", make_sampled_softmax, ref_sampled_softmax),
    case("sampled_softmax_loss_and_grads", make_sampled_softmax, ref_sampled_softmax_and_grads),
    case("mips_topk", make_mips_topk, ref_mips_topk),
    # The TBE ops' results and state are checked through the module (TBE property).
    case("split_embedding_codegen_forward", make_tbe_forward),
    case("split_embedding_codegen_grad_indice_weights", make_grad_indice_weights),
    case(
        "int_nbit_split_embedding_codegen_lookup_function",
        make_int_nbit_lookup,
        ref_int_nbit_lookup,
    ),
    case("bounds_check_indices", make_bounds_check),
    case("index_to_int32", lambda d: {"t": torch.tensor([1, -2, 2**31 - 1]), "name": "t"}),
    *(
        case(f"split_embedding_codegen_lookup_{opt}_function", make_tbe_lookup(opt))
        for opt in TBE_OPTIMIZERS
    ),
    *(
        case(f"backward_codegen_{opt}_{kind}_exact", make_tbe_backward(opt, kind == "weighted"))
        for opt in TBE_OPTIMIZERS
        for kind in ("unweighted", "weighted")
    ),
    # torchrec utilities: new ops
    case("create_zch_buffer", make_create_zch_buffer, ref_create_zch_buffer),
    case("zero_collision_hash", make_zero_collision_hash, ref_zero_collision_hash),
    # sparse: new ops
    case(
        "block_bucketize_sparse_features_inference",
        make_block_bucketize_inference,
        ref_block_bucketize_inference,
    ),
    case("permute_sparse_features", make_permute_sparse_features, ref_permute_sparse_features),
    case("permute_2D_sparse_data_input1D", make_permute_input1d, ref_permute_input1d),
    case("permute_2D_sparse_preallocated_out", make_permute_preallocated, ref_permute_preallocated),
    case(
        "expand_into_jagged_permute",
        make_expand_into_jagged_permute,
        ref_expand_into_jagged_permute,
    ),
    # keyed: new ops
    case("merge_pooled_embeddings", make_merge, ref_merge),
    case("kt_regroup_arguments", make_kt_regroup, ref_kt_regroup),
    case("regroup_keyed_tensor", make_regroup, ref_regroup),
    case("permute_multi_embedding", make_permute_multi((False,)), ref_permute_multi),
    case("permute_multi_embedding_function", make_permute_multi((False, True)), ref_permute_multi),
    # jagged: new ops
    case("segment_sum_csr", make_segment_sum, ref_segment_sum),
    case("asynchronous_batched_complete_cumsum", make_batched_cumsum, ref_batched_cumsum),
    case("jagged_index_select_2d_forward", make_index_select_2d(False), ref_index_select_2d),
    case("jagged_index_select_2d_forward_v2", make_index_select_2d(True), ref_index_select_2d),
    case("jagged_index_add_2d_forward", make_index_add_2d, ref_index_add_2d),
    case("jagged_index_add_2d_forward_v2", make_index_add_2d_v2, ref_index_add_2d),
    case("jagged_index_select", make_jagged_index_select, ref_jagged_index_select),
    case("keyed_jagged_index_select_dim1", make_keyed_select, ref_keyed_select),
    case("jagged_unique_indices", make_unique_indices, ref_unique_indices),
    # index select: new ops
    case("group_index_select_dim0", make_group_select, ref_group_select),
    case("group_index_select_dim0_gpu_impl", make_group_gpu_impl, ref_group_gpu_impl),
    case("group_index_select_dim0_gpu_backward", make_group_gpu_backward, ref_group_gpu_backward),
    case("batch_index_select_dim0", make_batch_select(False), ref_batch_select(False)),
    case("batch_index_select_dim0_tensor", make_batch_select(True), ref_batch_select(True)),
    case("batch_index_select_dim0_backward", make_batch_backward(False), ref_batch_backward(False)),
    case(
        "batch_index_select_dim0_backward_cpu_impl",
        make_batch_backward(True),
        ref_batch_backward(True),
    ),
    # quantize: row-wise quantized tables and pruned-index remaps (inference)
    *(
        case(
            f"{kind}ToFused8BitRowwiseQuantized",
            make_quantize_8bit(dtypes),
            ref_quantize_8bit(dtypes),
        )
        for kind, dtypes in QUANTIZE_INPUTS.items()
    ),
    *(
        case(
            f"{kind}ToFusedNBitRowwiseQuantizedSBHalf",
            make_quantize_nbit(dtypes),
            ref_quantize_nbit(dtypes),
        )
        for kind, dtypes in QUANTIZE_INPUTS.items()
    ),
    case("Fused8BitRowwiseQuantizedToFloat", make_dequantize_8bit(False), ref_dequantize_8bit(F32)),
    case("Fused8BitRowwiseQuantizedToHalf", make_dequantize_8bit(False), ref_dequantize_8bit(F16)),
    case(
        "Fused8BitRowwiseQuantizedToFloatOrHalf",
        make_dequantize_8bit(True),
        ref_dequantize_8bit(None),
    ),
    case(
        "FusedNBitRowwiseQuantizedSBHalfToFloat",
        make_dequantize_nbit(False),
        ref_dequantize_nbit(F32),
    ),
    case(
        "FusedNBitRowwiseQuantizedSBHalfToHalf",
        make_dequantize_nbit(False),
        ref_dequantize_nbit(F16),
    ),
    case(
        "FusedNBitRowwiseQuantizedSBHalfToFloatOrHalf",
        make_dequantize_nbit(True),
        ref_dequantize_nbit(None),
    ),
    case("pruned_hashmap_lookup", make_pruned_hashmap(False), ref_pruned_hashmap_lookup),
    case("pruned_hashmap_insert", make_pruned_hashmap(True), ref_pruned_hashmap_insert),
    case("pruned_array_lookup", make_pruned_array_lookup, ref_pruned_array_lookup),
]
