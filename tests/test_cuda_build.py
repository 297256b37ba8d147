"""The CUDA build path: with a CUDA torch and a matching nvcc (as in CI), setup.py compiles recops'
.cu sources, and the ops without a CUDA kernel yet get one that raises NotImplementedError naming
the op (csrc/recops/cuda/not_yet_on_cuda_scaffold.cu). Runs without a GPU: the CUDA kernel is
called through the dispatcher directly, with CPU tensors it never reads."""

import os
import re
import shutil
import subprocess

import pytest
import torch

import recops  # noqa: F401  (loads the library)

SCAFFOLDED = ["hstu_dense_forward", "disentangled_attention", "split_embedding_codegen_forward"]


def _nvcc_major():
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    if not os.path.exists(nvcc):
        return None
    release = re.search(r"release (\d+)\.", subprocess.check_output([nvcc, "--version"], text=True))
    return release and release.group(1)


def _cuda_built():
    return torch._C._dispatch_has_kernel_for_dispatch_key("recops::hstu_dense_forward", "CUDA")


needs_cuda_build = pytest.mark.skipif(not _cuda_built(), reason="recops was built without CUDA")


@pytest.mark.skipif(
    torch.version.cuda is None or os.environ.get("RECOPS_CUDA") == "0",
    reason="torch is a CPU build (or RECOPS_CUDA=0)",
)
def test_cuda_torch_with_matching_nvcc_builds_the_cuda_sources():
    if _nvcc_major() != torch.version.cuda.split(".")[0]:
        pytest.skip("no nvcc matching torch's CUDA major version")
    assert _cuda_built()


def _dummy(argument):
    """A value of the argument's type: the scaffolded kernel must raise before reading any."""
    kind = str(argument.type)
    if kind.startswith("Optional["):
        return None
    return {
        "Tensor": torch.zeros(1),
        "Tensor[]": [torch.zeros(1)],
        "int": 1,
        "SymInt": 1,
        "float": 1.0,
        "bool": False,
        "str": "causal",
        "ScalarType": torch.float32,
    }[kind]


def _cuda_ops():
    return sorted(
        name.split("::")[1]
        for name in torch._C._dispatch_get_all_op_names()
        if name.startswith("recops::")
        and torch._C._dispatch_has_kernel_for_dispatch_key(name, "CUDA")
    )


@needs_cuda_build
def test_attention_and_tbe_ops_have_the_cuda_scaffold():
    assert set(SCAFFOLDED) <= set(_cuda_ops())


@needs_cuda_build
@pytest.mark.parametrize("name", _cuda_ops() if _cuda_built() else [])
def test_ops_without_cuda_kernel_say_so(name):
    op = getattr(torch.ops.recops, name).default
    args = [_dummy(a) for a in op._schema.arguments]
    cuda_only = torch._C.DispatchKeySet(torch._C.DispatchKey.CUDA)
    with pytest.raises(NotImplementedError, match=rf"recops::{name} has no CUDA kernel yet"):
        op.redispatch(cuda_only, *args)
