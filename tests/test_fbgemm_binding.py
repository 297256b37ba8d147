"""The FBGEMM binding (docs/design.md): torch.ops.fbgemm.* works with FBGEMM's exact schemas whether
fbgemm_gpu is installed, imported before recops, imported after it, or absent."""

import json
import os
import subprocess
import sys

import pytest
import torch

import recops
from recops import _fbgemm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAMILY_TESTS = [
    "tests/test_cumsum.py",
    "tests/test_jagged.py",
    "tests/test_sparse.py",
    "tests/test_bad_input.py",
    "tests/test_compile.py",
]

# Prints, as JSON, each fbgemm op's schema and how recops bound it.
_REPORT = """
import json, torch, recops
from recops import _fbgemm
print(json.dumps({
    "fbgemm_loaded": recops.fbgemm_loaded,
    "bindings": recops.fbgemm_bindings,
    "schemas": {n: str(getattr(torch.ops.fbgemm, n).default._schema) for n in _fbgemm.FBGEMM_OPS},
}))
"""


def _python(code, hide_fbgemm, block_import=True):
    """Runs ``code`` in a fresh interpreter; returns (the JSON its last line printed, its stderr).
    ``hide_fbgemm`` sets RECOPS_HIDE_FBGEMM=1, and ``block_import`` also makes ``import
    fbgemm_gpu`` fail there, as if it were not installed."""
    env = dict(os.environ, RECOPS_HIDE_FBGEMM="1" if hide_fbgemm else "0")
    block = hide_fbgemm and block_import
    prelude = "import sys; sys.modules['fbgemm_gpu'] = None\n" if block else ""
    out = subprocess.run(
        [sys.executable, "-c", prelude + code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


def _filled():
    """What recops serves for FBGEMM at import: the keys FBGEMM leaves empty (ops it implements
    on CUDA only), which recops keeps however the other ops are routed."""
    bindings = {}
    for name, key in sorted(_fbgemm.filled):
        bindings.setdefault(name, []).append(key)
    return bindings


def _with_routes(routed):
    """The bindings after routing `routed` (op -> keys): the filled keys stay, first (an op can be
    both, e.g. bounds_check_indices, which fbgemm-gpu-cpu has on CPU only)."""
    bindings = _filled()
    for name, keys in routed.items():
        kept = bindings.get(name, [])
        bindings[name] = kept + [key for key in keys if key not in kept]
    return bindings


def _fbgemm_schema(name):
    return str(getattr(torch.ops.fbgemm, name).default._schema)


@pytest.mark.parametrize("block_import", [True, False], ids=["absent", "hidden-by-variable"])
def test_without_fbgemm_recops_defines_every_fbgemm_schema(block_import):
    report, _ = _python(_REPORT, hide_fbgemm=True, block_import=block_import)
    assert not report["fbgemm_loaded"]
    assert report["bindings"] == {name: "defined" for name in _fbgemm.FBGEMM_OPS}
    for name in _fbgemm.FBGEMM_OPS:
        assert report["schemas"][name] == "fbgemm::" + _fbgemm.recops_schema(name)


@pytest.mark.skipif(not recops.fbgemm_loaded, reason="fbgemm_gpu is not installed")
def test_recops_schemas_are_fbgemms_verbatim():
    # recops defines torch.ops.fbgemm from its twins' schemas: they must be FBGEMM's own.
    for name in _fbgemm.FBGEMM_OPS:
        assert _fbgemm_schema(name) == "fbgemm::" + _fbgemm.recops_schema(name)


@pytest.mark.skipif(not recops.fbgemm_loaded, reason="fbgemm_gpu is not installed")
def test_with_fbgemm_recops_binds_only_what_fbgemm_lacks():
    # FBGEMM's CPU wheel has CPU kernels for every op but the CUDA-only ones: recops fills those.
    assert recops.fbgemm_bindings == _filled()
    assert "keyed_jagged_index_select_dim1" in _filled()  # FBGEMM has it on CUDA only
    # FBGEMM registers these at AutogradCPU only (its autograd calls CPU helper ops): the CPU key,
    # reached under inference mode, is empty.
    assert _filled()["batch_index_select_dim0"] == ["CPU"]


@pytest.mark.skipif(not recops.fbgemm_loaded, reason="fbgemm_gpu is not installed")
@pytest.mark.parametrize(
    "imports", ["import fbgemm_gpu; import recops", "import recops; import fbgemm_gpu"]
)
def test_import_order_does_not_matter(imports):
    report, _ = _python(imports + "\n" + _REPORT, hide_fbgemm=False)
    assert report["fbgemm_loaded"]
    assert report["bindings"] == _filled()


@pytest.mark.skipif(not recops.fbgemm_loaded, reason="fbgemm_gpu is not installed")
def test_library_loaded_before_fbgemm_serves_fbgemm_ops_with_a_warning():
    # recops' library alone defines torch.ops.fbgemm as it loads, so FBGEMM's can no longer load:
    # `import recops` goes on without it and says so.
    code = """
import glob, json, warnings, torch
torch.ops.load_library(glob.glob("recops/_C*.so")[0])
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import recops
cumsum = torch.ops.fbgemm.asynchronous_complete_cumsum(torch.tensor([1, 2])).tolist()
print(json.dumps({"fbgemm_loaded": recops.fbgemm_loaded, "bindings": recops.fbgemm_bindings,
                  "cumsum": cumsum, "warnings": [str(w.message) for w in caught]}))
"""
    report, _ = _python(code, hide_fbgemm=False)
    assert not report["fbgemm_loaded"]
    assert report["bindings"] == {name: "defined" for name in _fbgemm.FBGEMM_OPS}
    assert report["cumsum"] == [0, 1, 3]
    assert any("loaded before fbgemm_gpu" in w for w in report["warnings"]), report["warnings"]


# FBGEMM's CPU invert_permute does not check its input; recops' raises on a repeated entry, which
# tells whose kernel ran.
_ROUTED = """
import json, warnings, torch, recops
def runs_recops():
    try:
        torch.ops.fbgemm.invert_permute(torch.tensor([0, 0, 2]))
    except ValueError:
        return True
    return False
before = runs_recops()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    recops.use_for_fbgemm(ops=OPS)
    routed = runs_recops()
    bindings = {k: list(v) for k, v in recops.fbgemm_bindings.items()}
    recops.use_for_fbgemm(ops=OPS, enable=False)
print(json.dumps({"before": before, "routed": routed, "after": runs_recops(),
                  "bindings": bindings, "after_bindings": recops.fbgemm_bindings,
                  "warnings": [str(w.message) for w in caught]}))
"""


@pytest.mark.skipif(not recops.fbgemm_loaded, reason="fbgemm_gpu is not installed")
@pytest.mark.parametrize("ops", [None, ["invert_permute"]])
def test_use_for_fbgemm_routes_fbgemms_own_op_to_recops_without_warning(ops):
    report, stderr = _python(_ROUTED.replace("OPS", repr(ops)), hide_fbgemm=False)
    assert not report["before"] and report["routed"] and not report["after"]
    expected = _fbgemm.FBGEMM_OPS if ops is None else ops
    # The CPU key, FBGEMM's AutogradCPU kernel where it has one, an op with no tensor argument at
    # its composite key (recops._fbgemm._route_keys); the keys recops fills for FBGEMM stay.
    routed = {n: _fbgemm._route_keys(n, "CPU") for n in expected if n not in _fbgemm.COMPOSITES}
    assert report["bindings"] == _with_routes(routed)
    assert report["after_bindings"] == _filled()
    assert report["warnings"] == []
    assert "Overriding" not in stderr and "Warning" not in stderr


@pytest.mark.skipif(not recops.fbgemm_loaded, reason="fbgemm_gpu is not installed")
def test_use_for_fbgemm_results_and_gradients_match_fbgemms():
    values = torch.randn(7, 3, requires_grad=True)
    offsets = torch.tensor([0, 2, 2, 7])

    def run():
        values.grad = None
        dense = torch.ops.fbgemm.jagged_to_padded_dense(values, [offsets], [4], -1.0)
        (dense * torch.arange(dense.numel()).reshape(dense.shape)).sum().backward()
        return dense.detach(), values.grad.clone()

    expected = run()
    recops.use_for_fbgemm()
    try:
        assert set(recops.fbgemm_bindings) == set(_fbgemm.FBGEMM_OPS) - set(_fbgemm.COMPOSITES)
        actual = run()
    finally:
        recops.use_for_fbgemm(enable=False)
    assert recops.fbgemm_bindings == _filled()
    for a, e in zip(actual, expected, strict=True):
        torch.testing.assert_close(a, e, rtol=0, atol=0)


def test_use_for_fbgemm_rejects_unknown_ops_and_devices():
    with pytest.raises(ValueError, match="ops must name FBGEMM ops"):
        recops.use_for_fbgemm(ops=["not_an_op"])
    with pytest.raises(ValueError, match="device must be one of"):
        recops.use_for_fbgemm(device="tpu")


@pytest.mark.skipif(not recops.fbgemm_loaded, reason="fbgemm_gpu is not installed")
def test_cpu_override_variable_routes_fbgemm_cpu_kernels_to_recops():
    code = "import os; os.environ['RECOPS_FBGEMM_CPU_OVERRIDE'] = '1'\n" + _REPORT
    report, stderr = _python(code, hide_fbgemm=False)
    routed = {
        n: _fbgemm._route_keys(n, "CPU") for n in _fbgemm.FBGEMM_OPS if n not in _fbgemm.COMPOSITES
    }
    assert report["bindings"] == _with_routes(routed)
    assert "Overriding" not in stderr


@pytest.mark.skipif(
    os.environ.get(_fbgemm.HIDE_FBGEMM_VARIABLE) == "1",
    reason="this run hides fbgemm_gpu itself: the family suites in it are the check",
)
def test_family_suites_pass_without_fbgemm():
    """Runs the jagged/sparse suites in a subprocess that hides fbgemm_gpu, so every
    torch.ops.fbgemm.* call there is served by recops alone."""
    present = [path for path in FAMILY_TESTS if os.path.exists(os.path.join(ROOT, path))]
    env = dict(os.environ, RECOPS_HIDE_FBGEMM="1")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *present],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
