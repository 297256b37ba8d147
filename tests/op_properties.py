"""The bad-input property, run by test_bad_input_properties.py in worker processes (a crash
fails the worker, not the test run): Hypothesis draws a valid call of an op from op_cases.CASES,
mutates it the ways a demanding user would (wrong dtype, rank, size, device; negative, huge and
2^31-crossing entries; non-monotonic offsets; non-contiguous and stride-0 views; NaN, inf and
out-of-range scalars), and the op must either raise a clean exception naming one of its arguments
or return what the plain-PyTorch reference computes for the mutated call, which must then be one
the contract accepts.

    PYTHONPATH=. python tests/op_properties.py FAMILY EXAMPLES   # one family (FAMILIES, or "tbe")
"""

import faulthandler
import os
import sys

import torch
from hypothesis import HealthCheck, Phase, given, note, settings
from hypothesis import strategies as st

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from mutations import check_call, describe, mutate, record_call  # noqa: E402
from op_cases import CASES, Draw  # noqa: E402

import recops  # noqa: E402,F401  (registers the ops)

# Workers split the op families; a family's cases are drawn uniformly. "tbe" is tbe_property.py.
FAMILIES = {
    "scans": ("cumsum", "offsets_range", "invert_permute", "gather", "index_select", "segment_sum"),
    "jagged": ("jagged", "dense_to_jagged"),
    "sparse": ("permute_", "block_bucketize"),
    "relative_bias": ("relative_attn_bias",),
    "hstu": ("hstu_dense_forward", "hstu_dense_backward"),
    "fuxi": ("_fuxi",),
    "deberta": ("disentangled", "deberta_"),
    "layer": ("counter_dropout", "hstu_layer_", "fuxi_layer_", "l2_normalize", "positional_"),
    "loss": ("sampled_softmax_loss",),
    "retrieval": ("mips_topk",),
    "hashing": ("zero_collision_hash", "create_zch_buffer"),
    "keyed": ("merge_pooled", "kt_regroup", "regroup_keyed", "permute_multi"),
    "quantize": ("RowwiseQuantized", "pruned_", "int_nbit_"),
}
SETTINGS = dict(
    deadline=None,
    database=None,
    derandomize=True,
    phases=(Phase.generate, Phase.shrink),
    suppress_health_check=list(HealthCheck),
)


def draw_of(data):
    return Draw(lambda lo, hi: data.draw(st.integers(lo, hi)))


def family_cases(family):
    names = FAMILIES[family]
    return [c for c in CASES if c.reference is not None and any(k in c.op_name for k in names)]


def property_test(family, examples):
    cases = family_cases(family)

    @settings(max_examples=examples, **SETTINGS)
    @given(st.data())
    def run(data):
        d = draw_of(data)
        case = d.choice(cases)
        args = case.make(d)
        args, labels, touched = mutate(args, d, d.choice((0, 1, 1, 1, 2)))
        call = "\n".join(f"  {n} = {describe(v)}" for n, v in args.items())
        note(f"{case.op_name}, mutated: {labels}\n{call}")
        record_call(f"{case.op_name} {labels}\n{call}")
        check_call(case, args, touched)

    return run


if __name__ == "__main__":
    faulthandler.enable()
    torch.set_num_threads(1)
    family, examples = sys.argv[1], int(sys.argv[2])
    if family == "tbe":
        from tbe_property import tbe_step_test

        tbe_step_test(examples, SETTINGS, draw_of)()
    else:
        property_test(family, examples)()
    print(f"{family}: {examples} examples passed")
