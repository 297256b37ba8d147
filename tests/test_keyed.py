"""The keyed family (FBGEMM's schemas; docs/keyed.md): merge_pooled_embeddings,
kt_regroup_arguments, permute_multi_embedding(_function) and regroup_keyed_tensor against
plain-PyTorch references and fbgemm-gpu-cpu, gradients, opcheck, torchrec's composition and bad
inputs."""

import itertools

import pytest
import torch
from accuracy import TOLERANCE
from op_cases import keyed_plan
from torch.autograd import gradcheck
from torch.library import opcheck

import recops
from recops.operators.keyed import KEYED_OPS

ops = torch.ops.recops
CPU = torch.device("cpu")
FLOAT_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
FBGEMM_DTYPES = (torch.float32, torch.float16, torch.bfloat16)  # FBGEMM's CPU kernel: no float64


# --------------------------------------------------------------------------- keyed tensors
def random_keyed(gen, tensors, keys_per_tensor, batch, dtype=torch.float32, max_width=6):
    """(keys, lengths, values): `tensors` keyed tensors of `keys_per_tensor` keys each, zero-width
    keys included."""
    keys, lengths, values = [], [], []
    for i in range(tensors):
        keys.append([f"f{i}_{k}" for k in range(keys_per_tensor)])
        widths = torch.randint(0, max_width, (keys_per_tensor,), generator=gen).tolist()
        lengths.append(widths)
        values.append((torch.randn(batch, sum(widths), generator=gen) * 4).to(dtype))
    return keys, lengths, values


def random_groups(gen, keys, num_groups, duplicates=True, use_all=False):
    """Groups of keys: every key once (use_all, shuffled), or a random draw with repeats."""
    flat = [k for tensor_keys in keys for k in tensor_keys]
    if use_all or not duplicates:
        order = [flat[i] for i in torch.randperm(len(flat), generator=gen).tolist()]
        if not use_all:
            order = order[: len(order) // 2 + 1]
    else:
        picks = torch.randint(0, len(flat), (len(flat) + 2,), generator=gen).tolist()
        order = [flat[i] for i in picks]
        if use_all:
            order += flat
    cuts = sorted(torch.randint(0, len(order) + 1, (num_groups - 1,), generator=gen).tolist())
    bounds = [0, *cuts, len(order)]
    return [order[a:b] for a, b in itertools.pairwise(bounds)]


def reference_regroup(keys, lengths, values, groups):
    """Each group's key columns side by side (a key listed twice resolves to its first place)."""
    columns = {}
    for tensor_keys, widths, value in zip(keys, lengths, values, strict=True):
        offset = 0
        for key, width in zip(tensor_keys, widths, strict=True):
            columns.setdefault(key, value[:, offset : offset + width])
            offset += width
    batch = values[0].shape[0]
    return [
        torch.cat([columns[k] for k in group], dim=1) if group else values[0].new_empty((batch, 0))
        for group in groups
    ]


def reference_arguments(keys, lengths, groups):
    """FBGEMM's permutes written from its documentation (op_cases.keyed_plan): one row per output
    key, and `next` chaining the repeats of a key (+index from the first, -index from later ones,
    -moves last); then the input and output widths, as tensors and as a list."""
    moves, in_widths, out_widths = keyed_plan({"keys": keys, "lengths": lengths, "groups": groups})
    return (
        torch.tensor(moves, dtype=torch.int32).view(-1, 6),
        torch.tensor(in_widths, dtype=torch.int32),
        torch.tensor(out_widths, dtype=torch.int32),
        out_widths,
    )


def case(seed, tensors=3, keys_per_tensor=4, batch=5, dtype=torch.float32, groups=3, **kw):
    gen = torch.Generator().manual_seed(seed)
    keys, lengths, values = random_keyed(gen, tensors, keys_per_tensor, batch, dtype)
    return keys, lengths, values, random_groups(gen, keys, groups, **kw)


SHAPES = [(1, 1, 1, 1), (2, 3, 0, 2), (3, 4, 7, 3), (4, 5, 33, 1), (2, 2, 4, 4), (5, 6, 300, 6)]


def assert_all_equal(actual, expected):
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected, strict=True):
        assert a.dtype == e.dtype and a.shape == e.shape
        assert torch.equal(a, e)


# --------------------------------------------------------------------------- regroup
@pytest.mark.parametrize("tensors, keys_per_tensor, batch, groups", SHAPES)
@pytest.mark.parametrize("duplicates", [False, True])
def test_kt_regroup_arguments_matches_reference(
    tensors, keys_per_tensor, batch, groups, duplicates
):
    keys, lengths, values, grouped = case(
        batch, tensors, keys_per_tensor, batch, groups=groups, duplicates=duplicates
    )
    got = ops.kt_regroup_arguments(values[0], keys, lengths, grouped)
    want = reference_arguments(keys, lengths, grouped)
    assert_all_equal(got[:3], want[:3])
    assert got[3] == want[3]


@pytest.mark.parametrize("tensors, keys_per_tensor, batch, groups", SHAPES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_regroup_matches_reference(tensors, keys_per_tensor, batch, groups, dtype):
    keys, lengths, values, grouped = case(7 + batch, tensors, keys_per_tensor, batch, dtype, groups)
    want = reference_regroup(keys, lengths, values, grouped)
    assert_all_equal(ops.regroup_keyed_tensor(values, keys, lengths, grouped), want)
    args = ops.kt_regroup_arguments(values[0], keys, lengths, grouped)
    assert_all_equal(ops.permute_multi_embedding(values, *args), want)
    assert_all_equal(ops.permute_multi_embedding_function(values, *args), want)


def test_non_contiguous_and_duplicate_input_keys():
    keys, lengths, values, groups = case(3, 3, 4, 6)
    strided = [torch.stack([v, v], -1).select(-1, 0).t().contiguous().t() for v in values]
    strided[1] = values[1].t().contiguous().t()  # column-major
    assert not strided[1].is_contiguous()
    assert_all_equal(
        ops.regroup_keyed_tensor(strided, keys, lengths, groups),
        reference_regroup(keys, lengths, values, groups),
    )
    # A key listed in two keyed tensors resolves to its first place; the second keeps its columns.
    keys[2][0] = keys[0][1]
    groups = [[keys[0][1], keys[2][1]], [keys[2][0]]]
    assert_all_equal(
        ops.regroup_keyed_tensor(values, keys, lengths, groups),
        reference_regroup(keys, lengths, values, groups),
    )


def test_empty_groups_and_no_groups():
    keys, lengths, values, _ = case(4)
    outs = ops.regroup_keyed_tensor(values, keys, lengths, [[], [keys[0][0]], []])
    assert [o.shape for o in outs] == [(5, 0), (5, lengths[0][0]), (5, 0)]
    assert ops.regroup_keyed_tensor(values, keys, lengths, []) == []


@pytest.mark.parametrize("dtype", FBGEMM_DTYPES)
@pytest.mark.parametrize("tensors, keys_per_tensor, batch, groups", SHAPES)
def test_matches_fbgemm(fbgemm_ops, dtype, tensors, keys_per_tensor, batch, groups):
    keys, lengths, values, grouped = case(
        11 + batch, tensors, keys_per_tensor, batch, dtype, groups
    )
    got = ops.kt_regroup_arguments(values[0], keys, lengths, grouped)
    want = fbgemm_ops.kt_regroup_arguments(values[0], keys, lengths, grouped)
    assert_all_equal(got[:3], want[:3])
    assert got[3] == want[3]
    expected = fbgemm_ops.permute_multi_embedding(values, *want)
    assert_all_equal(ops.permute_multi_embedding(values, *got), expected)
    assert_all_equal(ops.permute_multi_embedding_function(values, *got, False), expected)
    assert_all_equal(ops.regroup_keyed_tensor(values, keys, lengths, grouped), expected)


@pytest.mark.parametrize("dtype", FBGEMM_DTYPES)
def test_reverse_matches_fbgemm(fbgemm_ops, dtype):
    """The backward op: gradients moved back, repeats summed. Every key is used (FBGEMM leaves
    the gradient of an unused key uninitialised; recops makes it 0)."""
    keys, lengths, values, groups = case(12, 3, 4, 9, dtype, 4, use_all=True)
    permutes, in_shapes, out_shapes, out_lengths = ops.kt_regroup_arguments(
        values[0], keys, lengths, groups
    )
    gen = torch.Generator().manual_seed(0)
    grads = [torch.randn(9, w, generator=gen).to(dtype) for w in out_lengths]
    in_lengths = [v.shape[1] for v in values]
    args = (grads, permutes, out_shapes, in_shapes, in_lengths, True)
    got = ops.permute_multi_embedding_function(*args)
    want = fbgemm_ops.permute_multi_embedding_function(*args)
    tol = {} if dtype == torch.float32 else dict(rtol=1e-2, atol=1e-2)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, **tol)


def reference_backward(keys, lengths, values, groups, grads):
    """The gradient of reference_regroup by autograd through slices and torch.cat (float64)."""
    leaves = [v.double().requires_grad_() for v in values]
    outs = reference_regroup(keys, lengths, leaves, groups)
    used = [(o, g.double()) for o, g in zip(outs, grads, strict=True) if o.numel()]
    if used:
        torch.autograd.backward([o for o, _ in used], [g for _, g in used])
    return [torch.zeros_like(v) if v.grad is None else v.grad for v in leaves]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("op", ["permute_multi_embedding", "regroup_keyed_tensor"])
def test_gradients_match_reference(dtype, op):
    """Repeated keys sum their gradients; unused keys get 0."""
    keys, lengths, values, groups = case(13, 3, 5, 6, dtype, 3)
    leaves = [v.clone().requires_grad_() for v in values]
    if op == "regroup_keyed_tensor":
        outs = ops.regroup_keyed_tensor(leaves, keys, lengths, groups)
    else:
        outs = ops.permute_multi_embedding(
            leaves, *ops.kt_regroup_arguments(values[0], keys, lengths, groups)
        )
    gen = torch.Generator().manual_seed(1)
    grads = [torch.randn(o.shape, generator=gen).to(dtype) for o in outs]
    torch.autograd.backward(outs, grads)
    want = reference_backward(keys, lengths, values, groups, grads)
    low = dtype in (torch.float16, torch.bfloat16)  # else torch's defaults, tighter in float32
    tol = dict(zip(("rtol", "atol"), TOLERANCE[dtype], strict=True)) if low else {}
    for leaf, w in zip(leaves, want, strict=True):
        torch.testing.assert_close(leaf.grad.double(), w, **tol)


def test_gradient_of_one_output():
    """Outputs the loss does not reach contribute nothing."""
    keys, lengths, values, groups = case(14, 2, 3, 4, groups=3)
    leaves = [v.clone().requires_grad_() for v in values]
    outs = ops.regroup_keyed_tensor(leaves, keys, lengths, groups)
    outs[1].sum().backward()
    grads = [torch.zeros_like(o) for o in outs]
    grads[1] = torch.ones_like(outs[1])
    for leaf, w in zip(
        leaves, reference_backward(keys, lengths, values, groups, grads), strict=True
    ):
        torch.testing.assert_close(leaf.grad.double(), w)


@pytest.mark.parametrize("op", ["permute_multi_embedding", "regroup_keyed_tensor"])
def test_gradcheck(op):
    keys, lengths, values, groups = case(15, 2, 3, 3, torch.float64, 3)
    args = ops.kt_regroup_arguments(values[0], keys, lengths, groups)

    def fn(*leaves):
        if op == "regroup_keyed_tensor":
            return tuple(ops.regroup_keyed_tensor(list(leaves), keys, lengths, groups))
        return tuple(ops.permute_multi_embedding(list(leaves), *args))

    assert gradcheck(fn, tuple(v.requires_grad_() for v in values))


@pytest.mark.parametrize("dtype", FBGEMM_DTYPES)
def test_gradients_match_fbgemm(fbgemm_ops, dtype):
    keys, lengths, values, groups = case(16, 3, 4, 8, dtype, 3, use_all=True)
    gen = torch.Generator().manual_seed(2)
    results = []
    for namespace in (ops, fbgemm_ops):
        leaves = [v.clone().requires_grad_() for v in values]
        outs = namespace.regroup_keyed_tensor(leaves, keys, lengths, groups)
        gen.manual_seed(2)
        torch.autograd.backward(outs, [torch.randn(o.shape, generator=gen).to(dtype) for o in outs])
        results.append([leaf.grad for leaf in leaves])
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b)


def test_matches_torchrec_compositions():
    """torchrec's KeyedTensor.regroup: _fbgemm_permute_pooled_embs (cat, permute_pooled_embs,
    split) when every key is used once, _regroup_keyed_tensors (slices and one cat) otherwise."""
    keys, lengths, values, groups = case(17, 3, 4, 6, groups=3, use_all=True)
    flat_keys = [k for ks in keys for k in ks]
    flat_lengths = [w for ws in lengths for w in ws]
    flat_groups = [k for g in groups for k in g]
    permute = [flat_keys.index(k) for k in flat_groups]
    inv_lengths = [flat_lengths[p] for p in permute]
    inverse = [0] * len(permute)
    for i, p in enumerate(permute):
        inverse[p] = i
    permuted = ops.permute_pooled_embs_auto_grad(
        torch.cat(values, dim=1),
        torch.tensor([0, *itertools.accumulate(flat_lengths)]),
        torch.tensor(permute),
        torch.tensor([0, *itertools.accumulate(inv_lengths)]),
        torch.tensor(inverse),
    )
    splits = [sum(flat_lengths[flat_keys.index(k)] for k in g) for g in groups]
    assert_all_equal(
        ops.regroup_keyed_tensor(values, keys, lengths, groups),
        list(permuted.split(splits, dim=1)),
    )


# --------------------------------------------------------------------------- merge
MERGE_CASES = [
    # (shapes, cat_dim)
    ([(3, 4), (3, 0), (3, 7)], 1),
    ([(3, 4), (5, 4), (0, 4)], 0),
    ([(2, 3, 4), (2, 3, 1)], 2),
    ([(2, 3, 4), (2, 3, 1)], -1),
    ([(2, 3, 4), (2, 5, 4)], 1),
    ([(6,), (0,), (2,)], 0),
    ([(0, 5), (0, 2)], 1),
    ([(300, 200), (300, 57), (300, 1)], 1),  # several tasks' worth of bytes
    ([(1000, 100), (500, 100)], 0),  # one row per part: split inside it
]


@pytest.mark.parametrize("shapes, cat_dim", MERGE_CASES)
@pytest.mark.parametrize("dtype", [*FLOAT_DTYPES, torch.int64, torch.uint8, torch.bool])
def test_merge_matches_cat(shapes, cat_dim, dtype):
    gen = torch.Generator().manual_seed(len(shapes))
    tensors = [(torch.randn(s, generator=gen) * 9).to(dtype) for s in shapes]
    out = ops.merge_pooled_embeddings(tensors, 0, CPU, cat_dim)
    assert out.dtype == dtype and torch.equal(out, torch.cat(tensors, cat_dim))


def test_merge_default_dim_and_non_contiguous():
    a = torch.randn(6, 4).t()
    b = torch.randn(4, 3)[:, ::2]
    assert not a.is_contiguous() and not b.is_contiguous()
    assert torch.equal(ops.merge_pooled_embeddings([a, b], 4, CPU), torch.cat([a, b], 1))


def test_merge_falls_back_to_cat_rules():
    """Mixed dtypes take the first tensor's dtype; 1-D empty tensors are skipped (torch.cat)."""
    a, b = torch.randn(2, 3), torch.randn(2, 4, dtype=torch.float64)
    out = ops.merge_pooled_embeddings([a, torch.empty(0), b], 2, CPU)
    assert out.dtype == torch.float32
    assert torch.equal(out, torch.cat([a, b.float()], 1))


@pytest.mark.parametrize("shapes, cat_dim", MERGE_CASES[:2] + MERGE_CASES[7:])
def test_merge_matches_fbgemm(fbgemm_ops, shapes, cat_dim):
    tensors = [torch.randn(s) for s in shapes]
    torch.testing.assert_close(
        ops.merge_pooled_embeddings(tensors, 0, CPU, cat_dim),
        fbgemm_ops.merge_pooled_embeddings(tensors, 0, CPU, cat_dim),
        rtol=0,
        atol=0,
    )


def test_merge_gradients():
    a = torch.randn(3, 2, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    assert gradcheck(lambda x, y: ops.merge_pooled_embeddings([x, y], 3, CPU, 1), (a, b))
    assert gradcheck(lambda x, y: ops.merge_pooled_embeddings([x.t(), y.t()], 3, CPU, 0), (a, b))


def test_merge_moves_to_target_device():
    out = ops.merge_pooled_embeddings([torch.ones(2, 2)], 2, torch.device("meta"))
    assert out.device.type == "meta" and out.shape == (2, 2)


# --------------------------------------------------------------------------- opcheck
def test_opcheck():
    keys, lengths, values, groups = case(18, 2, 3, 4, groups=3)
    args = ops.kt_regroup_arguments(values[0], keys, lengths, groups)
    # The other keyed ops' opcheck runs on op_cases' calls (test_opcheck.py).
    opcheck(ops.permute_multi_embedding_function, (values, *args, False))
    grads = [torch.randn(4, w) for w in args[3]]
    in_lengths = [v.shape[1] for v in values]
    opcheck(
        ops.permute_multi_embedding_function, (grads, args[0], args[2], args[1], in_lengths, True)
    )


def test_compiles():
    keys, lengths, values, groups = case(19, 2, 3, 4, groups=2)

    def fn(vs):
        outs = ops.regroup_keyed_tensor(vs, keys, lengths, groups)
        return ops.merge_pooled_embeddings(outs, vs[0].shape[0], CPU, 1)

    compiled = torch.compile(fn, backend="eager", fullgraph=True)
    assert torch.equal(compiled(values), fn(values))


# --------------------------------------------------------------------------- routing
def test_routed_fbgemm_ops_run_recops(fbgemm_ops):
    """Routed as a family: FBGEMM's autograd kernels call kt_regroup_arguments and
    permute_multi_embedding_function, whose checks then answer."""
    keys, lengths, values, groups = case(20, 2, 3, 4, groups=2)
    names = KEYED_OPS
    recops.use_for_fbgemm(names)
    try:
        out = fbgemm_ops.regroup_keyed_tensor(values, keys, lengths, groups)
        with pytest.raises(RuntimeError, match=r"reads tensor 1, not one of the 1 tensors"):
            fbgemm_ops.regroup_keyed_tensor(values[:1], keys, lengths, groups)
        with pytest.raises(IndexError, match=r"groups\[0\]\[0\] = 'nope' is not one of the keys"):
            fbgemm_ops.kt_regroup_arguments(values[0], keys, lengths, [["nope"]])
        leaves = [v.clone().requires_grad_() for v in values]
        with pytest.raises(RuntimeError, match=r"pooled_embs\[1\] must have as many rows"):
            fbgemm_ops.regroup_keyed_tensor([leaves[0], leaves[1][:1]], keys, lengths, groups)
    finally:
        recops.use_for_fbgemm(names, enable=False)
    assert_all_equal(out, reference_regroup(keys, lengths, values, groups))


# --------------------------------------------------------------------------- bad input
def bad_permute_cases():
    keys, lengths, values, groups = case(21, 2, 2, 3, groups=2)
    permutes, in_shapes, out_shapes, out_lengths = ops.kt_regroup_arguments(
        values[0], keys, lengths, groups
    )
    good = [values, permutes, in_shapes, out_shapes, out_lengths]

    def change(index, value):
        args = list(good)
        args[index] = value
        return args

    def moved(field, value):
        p = permutes.clone()
        p[0, field] = value
        return change(1, p)

    return [
        ("no tensors", change(0, []), "pooled_embs must hold at least one tensor"),
        (
            "1-D embeddings",
            change(0, [values[0].view(-1), values[1]]),
            r"pooled_embs\[0\] must be 2-D",
        ),
        (
            "int embeddings",
            change(0, [v.long() for v in values]),
            r"pooled_embs\[0\] must be float",
        ),
        ("mixed dtypes", change(0, [values[0], values[1].double()]), "must share one dtype"),
        (
            "rows differ",
            change(0, [values[0], values[1][:1]]),
            r"pooled_embs\[1\] must have as many rows",
        ),
        ("int64 permutes", change(1, permutes.long()), r"permutes must be int32 \[moves, 6\]"),
        ("5 columns", change(1, permutes[:, :5]), r"permutes must be int32 \[moves, 6\]"),
        ("bad input", moved(0, 2), r"permutes\[0\] reads tensor 2, not one of the 2 tensors"),
        ("negative output", moved(1, -1), r"permutes\[0\] writes output -1"),
        ("read past", moved(2, 10**6), r"permutes\[0\] reads columns"),
        ("write past", moved(3, 10**6), r"permutes\[0\] writes columns"),
        ("negative width", moved(4, -3), r"permutes\[0\] has a negative length"),
        (
            "negative out length",
            change(4, [-1, *out_lengths[1:]]),
            r"out_lengths\[0\] must be >= 0",
        ),
    ]


@pytest.mark.parametrize("case_", bad_permute_cases(), ids=lambda c: c[0])
def test_permute_bad_inputs_raise(case_):
    _, args, match = case_
    with pytest.raises((RuntimeError, ValueError), match=match):
        ops.permute_multi_embedding(*args)


def test_regroup_bad_inputs_raise():
    keys, lengths, values, groups = case(22, 2, 2, 3, groups=2)
    with pytest.raises(ValueError, match=r"keys and lengths must describe as many"):
        ops.kt_regroup_arguments(values[0], keys, lengths[:1], groups)
    with pytest.raises(ValueError, match=r"keys\[1\] and lengths\[1\] must have one entry per key"):
        ops.kt_regroup_arguments(values[0], keys, [lengths[0], lengths[1][:1]], groups)
    with pytest.raises(ValueError, match=r"lengths\[0\]\[1\] must be >= 0, got -2"):
        ops.kt_regroup_arguments(values[0], keys, [[1, -2], lengths[1]], groups)
    with pytest.raises(ValueError, match=r"lengths\[0\] must sum to at most 2\^31 - 1"):
        ops.kt_regroup_arguments(values[0], keys, [[2**31 - 1, 1], lengths[1]], groups)
    with pytest.raises(ValueError, match=r"groups\[0\] must have widths .* at most 2\^31 - 1"):
        ops.kt_regroup_arguments(values[0], keys, [[2**30, 1], lengths[1]], [[keys[0][0]] * 2])
    with pytest.raises(IndexError, match=r"groups\[1\]\[0\] = 'x' is not one of the keys"):
        ops.regroup_keyed_tensor(values, keys, lengths, [[keys[0][0]], ["x"]])
    with pytest.raises(RuntimeError, match=r"keys must have one entry per tensor of pooled_embs"):
        ops.regroup_keyed_tensor(values[:1], keys, lengths, groups)
    wide = [[lengths[0][0] + 5, lengths[0][1]], lengths[1]]
    with pytest.raises(
        RuntimeError,
        match=r"groups\[.*\]\[.*\] \('f0_1', per keys and lengths\) "
        r"reads columns",
    ):
        ops.regroup_keyed_tensor(values, keys, wide, [["f0_1"]])


def test_merge_bad_inputs_raise():
    with pytest.raises(RuntimeError, match=r"pooled_embeddings cannot be concatenated.*Sizes"):
        ops.merge_pooled_embeddings([torch.zeros(2, 3), torch.zeros(3, 3)], 2, CPU, 1)
    with pytest.raises(
        RuntimeError, match=r"pooled_embeddings cannot be concatenated.*cat_dim = 5"
    ):
        ops.merge_pooled_embeddings([torch.zeros(2, 3)], 2, CPU, 5)
    with pytest.raises(RuntimeError, match=r"pooled_embeddings cannot be concatenated"):
        ops.merge_pooled_embeddings([torch.zeros(2), torch.zeros(2, 3)], 2, CPU, 1)
