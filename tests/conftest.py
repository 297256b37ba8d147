"""Test configuration. RECOPS_HIDE_FBGEMM=1 runs the suite as if fbgemm_gpu were not installed,
which proves that recops alone defines and serves torch.ops.fbgemm.*: recops then ignores it
(recops/_fbgemm.py), and the tests' own `import fbgemm_gpu` fails as if it were absent."""

import os
import sys

if os.environ.get("RECOPS_HIDE_FBGEMM") == "1":
    sys.modules["fbgemm_gpu"] = None  # makes `import fbgemm_gpu` fail and find_spec return None

import pytest  # noqa: E402
import torch  # noqa: E402

import recops  # noqa: E402


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def fbgemm_ops():
    """FBGEMM's own CPU ops, for side-by-side comparison; skipped when FBGEMM is hidden/absent."""
    if not recops.fbgemm_loaded:
        pytest.skip("fbgemm_gpu is not loaded in this configuration")
    return torch.ops.fbgemm


@pytest.fixture(params=["native", "fp32_fallback"])
def bf16_path(request, monkeypatch):
    """bf16 attention both ways: on the CPU's bf16 tiles where it has them ("native"), and with the
    ISA capped below AVX-512 ("fp32_fallback"), where bf16 computes in fp32."""
    if request.param == "fp32_fallback":
        monkeypatch.setenv("RECOPS_CPU_ISA", "avx2")
    else:
        monkeypatch.delenv("RECOPS_CPU_ISA", raising=False)
    return request.param
