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


@pytest.fixture(params=["native", "no_amx", "fp32_fallback"])
def bf16_path(request, monkeypatch):
    """bf16 attention every way: on the CPU's bf16 tiles where it has them ("native": on AMX CPUs
    the HSTU forward's fused AMX tiles), with the ISA capped at AVX-512 ("no_amx": the brgemm
    path), and capped below AVX-512 ("fp32_fallback"), where bf16 computes in fp32."""
    cap = {"no_amx": "avx512", "fp32_fallback": "avx2"}.get(request.param)
    if cap is None:
        monkeypatch.delenv("RECOPS_CPU_ISA", raising=False)
    else:
        monkeypatch.setenv("RECOPS_CPU_ISA", cap)
    return request.param
