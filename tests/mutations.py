"""Mutations of valid op calls and the checks of what an op does with them, for the bad-input
property (op_properties.py, tbe_property.py): wrong dtype, rank, size and device; negative, huge
and 2^31-crossing entries; non-monotonic offsets; non-contiguous and stride-0 views; NaN, inf and
out-of-range scalars."""

import math
import os
import re

import torch
from op_cases import UNCHECKED, HugeOutput, Invalid, op_arguments

CLEAN_ERRORS = (RuntimeError, ValueError, IndexError, TypeError, NotImplementedError)
MUTATION_DTYPES = (
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
)
SPECIAL_INTS = (-1, -2, 2**31 - 1, 2**31, 2**32, -(2**31) - 1, 2**40, 2**62, -(2**63))
SPECIAL_FLOATS = (math.nan, math.inf, -math.inf, 1e39, -1e-300, 0.0, -1.0)
# Arguments that size an output (the SymInt ones): a huge value there is a valid request for a
# huge tensor (memory exhaustion, not a bug), so they get negative and nearby values only; and not
# below -2^62, where c10::SymInt keeps its symbolic values (the dispatcher rejects those before
# any kernel runs, with a message of its own).
SIZE_ARGUMENTS = (
    "range_size",
    "total_L",
    "max_lengths",
    "max_sequence_length",
    "max_seq_len",
    "permuted_lengths_sum",
    "num_buckets",
    "my_size",
    "size",  # create_zch_buffer
    "out_lengths",
    "num_output_rows",
    "num_dense_output_rows",
    "output_shape_group",  # the index select backwards' table shapes
    "input_rows",
    "input_columns",
    "output_size",  # expand_into_jagged_permute's output, which offsets may cover only in part
)
SIZE_INTS = (-1, -2, -(2**31) - 1, -(2**62), 0)


class Failure(AssertionError):
    pass


# --------------------------------------------------------------------------- mutations
def tensor_mutations(t):
    """(label, function of a Draw giving the mutated tensor) for tensor t (on CPU: a tensor moved
    to meta by an earlier mutation stays as it is)."""
    if t.device.type != "cpu":
        return []
    found = [
        ("dtype", lambda d: t.to(d.choice([x for x in MUTATION_DTYPES if x != t.dtype]))),
        ("unsqueeze", lambda d: t.unsqueeze(0)),
        ("meta device", lambda d: t.to("meta")),
        (VALUE_PRESERVING, lambda d: torch.stack([t, t], -1).select(-1, 0)),
    ]
    if t.dim() >= 1:
        found.append(("drop a dim", lambda d: t.reshape(-1) if t.dim() > 1 else t.sum()))
        found.append(
            (
                "one more row",
                lambda d: torch.cat([t, t[-1:] if t.shape[0] else t.new_zeros(1, *t.shape[1:])]),
            )
        )
    if t.dim() >= 1 and t.shape[0] > 0:
        found.append(("one row fewer", lambda d: t[:-1]))
        found.append(("stride-0 rows", lambda d: t[:1].expand(t.shape)))
    if t.numel() > 0 and t.dtype != torch.bool:
        found.append(("special entry", lambda d: with_special_entry(t, d)))
    if t.dim() == 1 and t.numel() >= 2 and not t.dtype.is_floating_point:
        found.append(("swap neighbours", lambda d: swap_neighbours(t, d)))
    return found


def with_special_entry(t, d):
    flat = t.clone().reshape(-1)
    position = d.int(0, flat.numel() - 1)
    if t.dtype.is_floating_point:  # through float64: 1e39 becomes inf in float32, as a cast does
        flat[position] = torch.tensor(d.choice(SPECIAL_FLOATS), dtype=torch.float64).to(t.dtype)
        return flat.reshape(t.shape)
    value = d.choice((*SPECIAL_INTS, int(flat[position]) + 1, int(flat[position]) - 1))
    info = torch.iinfo(t.dtype)
    if not info.min <= value <= info.max:
        flat = flat.long()  # the value crosses the dtype's range: an int64 tensor carries it
        if not -(2**63) <= value < 2**63:
            value = 2**62
    flat[position] = value
    return flat.reshape(t.shape)


def swap_neighbours(t, d):
    i = d.int(0, t.numel() - 2)
    out = t.clone()
    out[i], out[i + 1] = t[i + 1].clone(), t[i].clone()
    return out


def value_mutations(value, size=False):
    """(label, function of a Draw giving the mutated value) for an argument's value; `size`: the
    argument sizes an output (SIZE_ARGUMENTS)."""
    if isinstance(value, torch.Tensor):
        return tensor_mutations(value)
    if isinstance(value, bool):
        return [("flip", lambda d: not value)]
    if isinstance(value, int):
        special = SIZE_INTS if size else (*SPECIAL_INTS, 0)
        return [("special int", lambda d: d.choice((*special, value + 1, value - 1)))]
    if isinstance(value, float):
        return [("special float", lambda d: d.choice(SPECIAL_FLOATS))]
    if isinstance(value, str):
        return [("other string", lambda d: d.choice(("bogus", value.upper() or "x", value + "|")))]
    if isinstance(value, torch.dtype):
        return [("other dtype", lambda d: d.choice(MUTATION_DTYPES))]
    if isinstance(value, list | tuple) and value:
        found = [
            ("drop an entry", lambda d: list(value[:-1])),
            ("repeat an entry", lambda d: [*value, value[-1]]),
        ]
        for i, item in enumerate(value):
            for label, fn in value_mutations(item, size):
                found.append(
                    (f"[{i}] {label}", lambda d, i=i, fn=fn: [*value[:i], fn(d), *value[i + 1 :]])
                )
        return found
    return []


VALUE_PRESERVING = "non-contiguous"  # the one mutation that keeps every value


def mutate(args, d, count):
    """args with `count` mutations applied; returns (args, [labels], names of the arguments whose
    values changed)."""
    args = dict(args)
    labels, touched = [], set()
    for _ in range(count):
        names = [n for n in args if not n.startswith("_") and value_mutations(args[n])]
        if not names:
            break
        name = d.choice(names)
        label, fn = d.choice(value_mutations(args[name], name in SIZE_ARGUMENTS))
        args[name] = fn(d)
        labels.append(f"{name}: {label}")
        if label != VALUE_PRESERVING:
            touched.add(name)
    return args, labels, touched


# --------------------------------------------------------------------------- the property
def describe(value):
    if isinstance(value, torch.Tensor):
        shown = value.tolist() if value.device.type == "cpu" and value.numel() <= 12 else "..."
        layout = f"{tuple(value.shape)}, stride {value.stride()}, {value.device}"
        return f"tensor({shown}, {value.dtype}, {layout})"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(describe(v) for v in value) + "]"
    return repr(value)


def names_an_argument(message, case):
    return any(re.search(rf"(?<![\w]){re.escape(n)}(?![\w])", message) for n in case.arg_names())


def assert_matches(actual, expected, tolerance, where="result"):
    if expected is UNCHECKED:
        return
    if expected is None or actual is None:
        if (expected is None) != (actual is None):
            raise Failure(f"{where}: got {describe(actual)}, expected {describe(expected)}")
        return
    if isinstance(expected, list | tuple):
        if not isinstance(actual, list | tuple) or len(actual) != len(expected):
            raise Failure(f"{where}: got {describe(actual)}, expected {describe(expected)}")
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            assert_matches(a, e, tolerance, f"{where}[{i}]")
        return
    if actual.dtype != expected.dtype or actual.shape != expected.shape:
        raise Failure(f"{where}: got {describe(actual)}, expected {describe(expected)}")
    if not close(actual, expected, *tolerance.get(expected.dtype, (0, 0))):
        raise Failure(f"{where}: got {describe(actual)}, expected {describe(expected)}")


def close(actual, expected, rtol, atol):
    """Equal integers; floats within tolerance where the reference is finite, and non-finite where
    it is not (a fused kernel and the reference order their operations differently, so an inf
    input may come out as NaN on one side and -inf on the other)."""
    if not actual.dtype.is_floating_point:
        return torch.equal(actual, expected)
    a, e = actual.double(), expected.double()
    finite = e.isfinite()
    if not torch.allclose(a[finite], e[finite], rtol, atol):
        return False
    return bool((~a[~finite].isfinite()).all())


def tensors_of(value):
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, list | tuple | dict):
        items = value.values() if isinstance(value, dict) else value
        return [t for item in items for t in tensors_of(item)]
    return []


def check_call(case, args, touched):
    """The property for one call: a clean exception naming an argument, or the reference's result
    (`touched`: the mutated arguments). A call with every tensor on the meta device is a valid
    one for the fake kernel, whose results must be on meta too."""
    try:
        expected = case.reference(dict(args))
    except Invalid as e:
        expected, why = Invalid, str(e)
    except HugeOutput:
        return
    inputs = tensors_of(args)
    on_meta = bool(inputs) and all(t.device.type == "meta" for t in inputs)
    try:
        actual = case.op(**op_arguments(args))
    except CLEAN_ERRORS as e:
        message = str(e).split("\n")[0]
        if not names_an_argument(str(e), case):
            raise Failure(f"{type(e).__name__} names no argument: {message}") from e
        return
    if on_meta:
        if not all(t.device.type == "meta" for t in tensors_of(actual)):
            raise Failure(f"a call on meta returned {describe(actual)}")
        return
    if expected is Invalid:
        raise Failure(f"accepted a call the contract rejects ({why})")
    if touched & set(case.unmodelled):
        return
    assert_matches(actual, expected, case.tolerance)


def record_call(text):
    """Writes the call about to run where the parent test finds it if this process dies in it."""
    with open(os.environ.get("RECOPS_PROPERTY_CURRENT", os.devnull), "w") as f:
        f.write(text)
