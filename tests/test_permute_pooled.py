"""permute_pooled_embs and its _split / _auto_grad / _auto_grad_split twins (FBGEMM's schema; the
output regrouping of column-wise sharding in torchrec): against a plain-PyTorch reference, against
fbgemm-gpu-cpu, gradients, opcheck and bad inputs."""

import pytest
import torch
from op_cases import permute_column_blocks
from torch.autograd import gradcheck

import recops  # noqa: F401
from recops.operators.sparse import PERMUTE_POOLED_EMBS

ops = torch.ops.recops
AUTOGRAD = ("permute_pooled_embs_auto_grad", "permute_pooled_embs_auto_grad_split")


def make_lists(dims, permute):
    """FBGEMM's four lists for feature widths `dims` regrouped by `permute`."""
    offsets = torch.tensor([0, *torch.tensor(dims).cumsum(0).tolist()])
    inv_permute = torch.empty(len(permute), dtype=torch.long)
    inv_permute[torch.tensor(permute, dtype=torch.long)] = torch.arange(len(permute))
    inv_offsets = torch.tensor([0, *torch.tensor([dims[p] for p in permute]).cumsum(0).tolist()])
    return offsets, torch.tensor(permute, dtype=torch.long), inv_offsets, inv_permute


def reference(pooled, offsets, permute):
    return permute_column_blocks(pooled, offsets.tolist(), permute.tolist())


def random_case(gen, features, batch, dtype=torch.float32, max_dim=9):
    dims = torch.randint(0, max_dim, (features,), generator=gen).tolist()  # zero-width too
    permute = torch.randperm(features, generator=gen).tolist()
    pooled = (torch.randn(batch, sum(dims), generator=gen) * 10).to(dtype)
    return pooled, make_lists(dims, permute)


@pytest.mark.parametrize("name", PERMUTE_POOLED_EMBS)
@pytest.mark.parametrize("features, batch", [(1, 1), (5, 7), (12, 0), (0, 3), (30, 200)])
def test_matches_reference(name, features, batch):
    gen = torch.Generator().manual_seed(features * 1000 + batch)
    pooled, lists = random_case(gen, features, batch)
    out = getattr(ops, name)(pooled, *lists)
    assert torch.equal(out, reference(pooled, lists[0], lists[1]))


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64]
)
def test_dtypes_and_non_contiguous(dtype):
    gen = torch.Generator().manual_seed(1)
    pooled, lists = random_case(gen, 6, 9, dtype)
    wide = torch.zeros(pooled.shape[1], pooled.shape[0] * 2, dtype=dtype)
    view = wide.t()[::2]  # non-contiguous, same values
    view.copy_(pooled)
    assert not view.is_contiguous()
    out = ops.permute_pooled_embs_split(view, *lists)
    assert out.dtype == dtype and torch.equal(out, reference(pooled, lists[0], lists[1]))


@pytest.mark.parametrize("name", PERMUTE_POOLED_EMBS)
def test_matches_fbgemm(fbgemm_ops, name):
    gen = torch.Generator().manual_seed(2)
    for features, batch in [(3, 4), (17, 33), (1, 0)]:
        pooled, lists = random_case(gen, features, batch, max_dim=40)
        torch.testing.assert_close(
            getattr(ops, name)(pooled, *lists), getattr(fbgemm_ops, name)(pooled, *lists)
        )


@pytest.mark.parametrize("name", AUTOGRAD)
def test_gradients(name):
    gen = torch.Generator().manual_seed(3)
    pooled, lists = random_case(gen, 5, 4, torch.float64)
    pooled.requires_grad_()
    assert gradcheck(lambda x: getattr(ops, name)(x, *lists), (pooled,))


def test_gradients_match_fbgemm(fbgemm_ops):
    gen = torch.Generator().manual_seed(4)
    pooled, lists = random_case(gen, 7, 5)
    grads = []
    for op in (ops.permute_pooled_embs_auto_grad_split, fbgemm_ops.permute_pooled_embs_auto_grad):
        x = pooled.clone().requires_grad_()
        op(x, *lists).backward(torch.arange(x.numel(), dtype=x.dtype).view(x.shape))
        grads.append(x.grad)
    assert torch.equal(grads[0], grads[1])


@pytest.mark.parametrize("name", PERMUTE_POOLED_EMBS)
def test_routed_fbgemm_op_runs_recops(fbgemm_ops, name):
    """recops.use_for_fbgemm routes them, as a family: FBGEMM's autograd for an _auto_grad op
    calls its sibling ops."""
    gen = torch.Generator().manual_seed(6)
    pooled, lists = random_case(gen, 4, 3)
    offsets, permute, inv_offsets, inv_permute = lists
    pooled.requires_grad_(name in AUTOGRAD)
    op = getattr(fbgemm_ops, name)
    recops.use_for_fbgemm(PERMUTE_POOLED_EMBS)
    try:
        out = op(pooled, *lists)
        # recops' checks answer through torch.ops.fbgemm (FBGEMM's kernel would read out of range)
        with pytest.raises(RuntimeError, match="is not a feature"):
            op(pooled, offsets, permute + 4, inv_offsets, inv_permute)
    finally:
        recops.use_for_fbgemm(PERMUTE_POOLED_EMBS, enable=False)
    assert torch.equal(out.detach(), reference(pooled.detach(), offsets, permute))


def bad_cases():
    pooled = torch.zeros(2, 6)
    offsets, permute, inv_offsets, inv_permute = make_lists([2, 4], [1, 0])
    good = (pooled, offsets, permute, inv_offsets, inv_permute)

    def change(index, value):
        args = list(good)
        args[index] = value
        return tuple(args)

    return [
        ("1-D embeddings", change(0, torch.zeros(6)), "pooled_embs"),
        ("int32 offsets", change(1, offsets.int()), "offset_dim_list must be int64"),
        ("short offsets", change(1, offsets[:2]), r"offset_dim_list must be int64 \[3\]"),
        ("offsets from 1", change(1, torch.tensor([1, 2, 6])), r"offset_dim_list\[0\] must be 0"),
        ("decreasing", change(1, torch.tensor([0, 4, 2])), "must be non-decreasing"),
        ("short of width", change(1, torch.tensor([0, 2, 5])), "must end at pooled_embs.size"),
        ("feature out of range", change(2, torch.tensor([2, 0])), "is not a feature"),
        ("negative feature", change(2, torch.tensor([-1, 0])), "is not a feature"),
        ("widths disagree", change(3, torch.tensor([0, 2, 6])), "inv_offset_dim_list gives"),
        ("short inverse", change(4, inv_permute[:1]), r"inv_permute_list must be int64 \[2\]"),
        ("2-D permute", change(2, permute.view(1, 2)), "permute_list must be 1-D"),
    ]


@pytest.mark.parametrize("name", PERMUTE_POOLED_EMBS)
@pytest.mark.parametrize("case", bad_cases(), ids=lambda c: c[0])
def test_bad_inputs_raise(name, case):
    _, args, match = case
    with pytest.raises(RuntimeError, match=match):
        getattr(ops, name)(*args)
