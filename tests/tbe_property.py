"""The TBE part of the bad-input property (run by op_properties.py): a training step, forward and
fused backward, of SplitTableBatchedEmbeddingBagsCodegen on a mutated batch either raises a clean
exception naming an argument and leaves every weight and optimizer-state byte as it was, or
matches one step of the float64 reference of test_embedding.py on that batch, which must then be
one the contract accepts (bounds checks FATAL and NONE: WARNING repairs in place)."""

import itertools

import torch
from hypothesis import given, note, settings
from hypothesis import strategies as st
from mutations import CLEAN_ERRORS, Failure, assert_matches, describe, mutate, record_call
from op_cases import INDEX_DTYPES, Invalid, ints, require
from test_embedding import OPTIMIZERS, POOLINGS, Reference, make_module
from test_embedding_vbe import FixedBatchTwin

from recops import BoundsCheckMode, PoolingMode
from recops.embedding.optimizers import OPTIMIZERS as OPTIMIZERS_BY_TYPE

FEATURE_TABLES = [0, 1, 0]  # table 0 serves features 0 and 2
ARGUMENTS = (
    "indices",
    "offsets",
    "per_sample_weights",
    "weights",
    "rows_per_table",
    "batch_size_per_feature_per_rank",
)


def make_step(d):
    """A module and a valid batch (indices, offsets, per_sample_weights) for it."""
    pooling = d.choice(POOLINGS)
    rows = [d.int(0, 5), d.int(1, 5)]
    dims = [4, 4] if pooling == PoolingMode.NONE else [4, 8]
    module = make_module(
        list(zip(rows, dims, strict=True)),
        FEATURE_TABLES,
        d.choice(OPTIMIZERS),
        pooling,
        bounds_check_mode=d.choice((BoundsCheckMode.FATAL, BoundsCheckMode.NONE)),
        embedding_table_index_type=d.choice(INDEX_DTYPES),
    )
    gen = d.generator()
    # Pooled batches may have a variable batch size per feature, from R = 0..2 ranks.
    sizes = None
    if pooling != PoolingMode.NONE and d.bool():
        ranks = d.int(0, 2)
        sizes = [[d.int(0, 2) for _ in range(ranks)] for _ in FEATURE_TABLES]
    batch = d.int(1, 3)
    bags = [sum(s) for s in sizes] if sizes is not None else [batch] * len(FEATURE_TABLES)
    per_bag_rows = [rows[t] for t, n in zip(FEATURE_TABLES, bags, strict=True) for _ in range(n)]
    lengths = [d.int(0, 3) if r else 0 for r in per_bag_rows]
    indices = [
        torch.randint(0, max(r, 1), (n,), generator=gen)
        for r, n in zip(per_bag_rows, lengths, strict=True)
    ]
    index_dtype = d.choice(INDEX_DTYPES)
    args = {
        "indices": torch.cat([torch.zeros(0, dtype=torch.long), *indices]).to(index_dtype),
        "offsets": torch.tensor([0, *itertools.accumulate(lengths)], dtype=index_dtype),
        "per_sample_weights": torch.rand(sum(lengths), generator=gen) if d.bool() else None,
    }
    if sizes is not None:
        args["batch_size_per_feature_per_rank"] = sizes
    return module, args


def expected_batch_sizes(module, sizes, num_bags):
    """Bags per feature of a variable batch, and the fixed-batch twin of its layout, or Invalid."""
    T = len(FEATURE_TABLES)
    require(module.pooling_mode != PoolingMode.NONE, "a variable batch is pooled")
    require(isinstance(sizes, list | tuple) and len(sizes) == T, "T lists of batch sizes")
    require(all(isinstance(s, list | tuple) for s in sizes), "lists of batch sizes")
    require(len({len(s) for s in sizes}) == 1, "R batch sizes per feature")
    require(all(type(b) is int and b >= 0 for s in sizes for b in s), "batch sizes ints >= 0")
    require(sum(map(sum, sizes)) == num_bags, "batch sizes add up to the bags")
    dims = [module.embedding_specs[t][1] for t in FEATURE_TABLES]
    return [sum(s) for s in sizes], FixedBatchTwin([list(s) for s in sizes], dims)


def expected_step(module, args):
    """The reference's (indices, offsets, per-sample weights) for `args`, or Invalid."""
    indices = args["indices"]
    offsets = args["offsets"]
    for name in ("indices", "offsets"):
        t = args[name]
        require(isinstance(t, torch.Tensor) and t.device.type == "cpu", f"{name} on cpu")
        require(t.dtype in INDEX_DTYPES and t.dim() == 1, f"{name} int32/int64 1-D")
    if module.embedding_table_index_type == torch.int32 or torch.int32 in (
        indices.dtype,
        offsets.dtype,
    ):
        for name in ("indices", "offsets"):
            require(all(-(2**31) <= x < 2**31 for x in ints(args[name])), f"{name} fit in int32")
    T = len(FEATURE_TABLES)
    o = ints(offsets)
    n = indices.numel()
    require(len(o) >= 1, "offsets not empty")
    twin = None
    if args.get("batch_size_per_feature_per_rank") is not None:
        bags, twin = expected_batch_sizes(
            module, args["batch_size_per_feature_per_rank"], len(o) - 1
        )
    else:
        require((len(o) - 1) % T == 0, "T * B + 1 offsets")
        bags = [(len(o) - 1) // T] * T
    first_bag = list(itertools.accumulate(bags, initial=0))
    require(o[0] >= 0 and all(b >= a for a, b in itertools.pairwise(o)), "offsets non-decreasing")
    if module.bounds_check_mode == BoundsCheckMode.FATAL:
        require(o[-1] == n, "offsets[-1] == len(indices)")
    require(o[-1] <= n, "offsets within indices")
    values = ints(indices)
    for f, t in enumerate(FEATURE_TABLES):
        rows = module.embedding_specs[t][0]
        bag_indices = values[o[first_bag[f]] : o[first_bag[f + 1]]]
        require(all(0 <= x < rows for x in bag_indices), "indices in range")
    psw = args.get("per_sample_weights")
    if psw is not None:
        require(isinstance(psw, torch.Tensor) and psw.device.type == "cpu", "psw on cpu")
        require(psw.dim() == 1 and psw.numel() == n and not psw.is_complex(), "psw per index")
        psw = psw.float()
    if twin is not None:
        return indices, twin.offsets(offsets), psw, twin
    return indices, offsets, psw, None


def reference_step(ref, module, indices, offsets, psw, twin, grad):
    """The float64 reference's output, updating its tables; NONE pooling pads the rows of indices
    outside every bag with zeros, as the module's output has one row per index; a variable batch
    runs as its fixed-batch twin."""
    if twin is not None:
        out, _ = ref.step(indices, offsets, twin.to_fixed(grad), psw)
        return twin.to_vbe(out)
    out_grad = grad
    o = ints(offsets)
    if module.pooling_mode == PoolingMode.NONE:
        out_grad = grad[o[0] : o[-1]]
    out, _ = ref.step(indices, offsets, out_grad, psw)
    if module.pooling_mode == PoolingMode.NONE:
        padded = torch.zeros(indices.numel(), out.shape[1], dtype=out.dtype)
        padded[o[0] : o[-1]] = out
        out = padded
    return out


def state_bytes(module):
    state = [module.weights_host.detach().clone()]
    for name in OPTIMIZERS_BY_TYPE[module.optimizer].state_buffers:
        state.append(getattr(module, f"{name}_host").clone())
    return state


def check_step(d, note):
    module, args = make_step(d)
    args, labels, _ = mutate(args, d, d.choice((0, 1, 1, 2)))
    call = "\n".join(f"  {n} = {describe(v)}" for n, v in args.items())
    setup = f"{module.optimizer.name} {module.pooling_mode.name} {module.bounds_check_mode.name}"
    note(f"TBE step ({setup}, tables {module.embedding_specs}), mutated: {labels}\n{call}")
    record_call(f"TBE step {setup} {labels}\n{call}")
    try:
        expected = expected_step(module, args)
    except Invalid as e:
        expected, why = None, str(e)
    before = state_bytes(module)
    ref = Reference(module)  # the tables before the step
    try:
        out = module(**{n: v for n, v in args.items()})
        grad = torch.randn(out.shape, generator=d.generator())
        out.backward(grad)
    except CLEAN_ERRORS as e:
        if not any(n in str(e) for n in ARGUMENTS):
            raise Failure(f"{type(e).__name__} names no argument: {str(e).splitlines()[0]}") from e
        for now, then in zip(state_bytes(module), before, strict=True):
            if not torch.equal(now.view(torch.uint8), then.view(torch.uint8)):
                raise Failure("a rejected step changed weights or optimizer state") from e
        return
    if expected is None:
        raise Failure(f"accepted a batch the contract rejects ({why})")
    want = reference_step(ref, module, *expected, grad)
    tolerance = {torch.float64: (1e-5, 1e-5)}
    assert_matches(out.double(), want, tolerance, "output")
    for t, weights in enumerate(module.split_embedding_weights()):
        assert_matches(weights.double(), ref.weights[t], tolerance, f"weights of table {t}")
    for t, states in enumerate(module.split_optimizer_states()):
        for state, expected in zip(states, ref.states[t], strict=True):
            assert_matches(state.double(), expected, {torch.float64: (1e-4, 1e-5)}, "state")


def tbe_step_test(examples, common_settings, draw_of):
    @settings(max_examples=examples, **common_settings)
    @given(st.data())
    def run(data):
        check_step(draw_of(data), note)

    return run
