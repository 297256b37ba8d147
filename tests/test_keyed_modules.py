"""FBGEMM's module classes over permute_pooled_embs in recops (recops.PermutePooledEmbeddings,
recops.PermutePooledEmbeddingsSplit): FBGEMM's constructor and forward signatures, results and
gradients equal to FBGEMM's own classes and to a plain-PyTorch reference."""

import inspect
import itertools

import pytest
import torch
from op_cases import permute_column_blocks

import recops

CLASSES = ("PermutePooledEmbeddings", "PermutePooledEmbeddingsSplit")
FBGEMM_MODULES = {
    "PermutePooledEmbeddings": "fbgemm_gpu.permute_pooled_embedding_modules",
    "PermutePooledEmbeddingsSplit": "fbgemm_gpu.permute_pooled_embedding_modules_split",
}


def fbgemm_class(name):
    if not recops.fbgemm_loaded:
        pytest.skip("fbgemm_gpu is not loaded in this configuration")
    module = pytest.importorskip(FBGEMM_MODULES[name])
    return getattr(module, name)


def signature(fn):
    return inspect.signature(fn, eval_str=True)  # annotations as types, written either way


def reference(pooled, embs_dims, permute):
    return permute_column_blocks(pooled, [0, *itertools.accumulate(embs_dims)], permute)


def random_case(seed, features=6, batch=5, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    dims = torch.randint(0, 7, (features,), generator=gen).tolist()
    permute = torch.randperm(features, generator=gen).tolist()
    pooled = torch.randn(batch, sum(dims), generator=gen).to(dtype)
    return dims, permute, pooled


@pytest.mark.parametrize("name", CLASSES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("features, batch", [(1, 1), (6, 5), (4, 0), (20, 64)])
def test_matches_reference(name, dtype, features, batch):
    dims, permute, pooled = random_case(features + batch, features, batch, dtype)
    module = getattr(recops, name)(dims, permute)
    assert torch.equal(module(pooled), reference(pooled, dims, permute))


@pytest.mark.parametrize("name", CLASSES)
def test_gradients(name):
    dims, permute, pooled = random_case(1, dtype=torch.float64)
    module = getattr(recops, name)(dims, permute, torch.device("cpu"))
    pooled.requires_grad_()
    assert torch.autograd.gradcheck(module, (pooled,))


@pytest.mark.parametrize("name", CLASSES)
def test_signatures_match_fbgemm(name):
    theirs = fbgemm_class(name)
    ours = getattr(recops, name)
    call = "forward" if name.endswith("Split") else "__call__"
    for method in ("__init__", call):
        assert signature(getattr(ours, method)) == signature(getattr(theirs, method))
    assert issubclass(ours, torch.nn.Module) == issubclass(theirs, torch.nn.Module)


@pytest.mark.parametrize("name", CLASSES)
def test_matches_fbgemm(name):
    theirs = fbgemm_class(name)
    dims, permute, pooled = random_case(2, features=9, batch=7)
    ours_module, their_module = getattr(recops, name)(dims, permute), theirs(dims, permute)
    grads = []
    for module in (ours_module, their_module):
        x = pooled.clone().requires_grad_()
        out = module(x)
        out.backward(torch.arange(out.numel(), dtype=out.dtype).view(out.shape))
        grads.append((out.detach(), x.grad))
    assert torch.equal(grads[0][0], grads[1][0]) and torch.equal(grads[0][1], grads[1][1])
    for attr in ("_offset_dim_list", "_permute", "_inv_offset_dim_list", "_inv_permute"):
        assert torch.equal(getattr(ours_module, attr), getattr(their_module, attr))
    if isinstance(their_module, torch.nn.Module):
        assert list(ours_module.state_dict()) == list(their_module.state_dict())


def test_split_module_traces_and_compiles():
    dims, permute, pooled = random_case(3)
    module = recops.PermutePooledEmbeddingsSplit(dims, permute)
    traced = torch.fx.symbolic_trace(module)
    assert torch.equal(traced(pooled), reference(pooled, dims, permute))
    compiled = torch.compile(module, backend="eager", fullgraph=True)
    assert torch.equal(compiled(pooled), reference(pooled, dims, permute))
