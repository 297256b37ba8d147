"""The FBGEMM binding (DESIGN.md): torch.ops.fbgemm.* works with FBGEMM's exact schemas whether
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
    "schemas": {n: str(getattr(torch.ops.fbgemm, n).default._schema) for n in _fbgemm.FBGEMM_SCHEMAS},
}))
"""


def _python(code, hide_fbgemm):
    env = dict(os.environ, RECOPS_HIDE_FBGEMM="1" if hide_fbgemm else "0")
    prelude = "import sys; sys.modules['fbgemm_gpu'] = None\n" if hide_fbgemm else ""
    out = subprocess.run(
        [sys.executable, "-c", prelude + code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def _schema_text(schema: str) -> str:
    return str(torch._C.parse_schema(schema))


def test_without_fbgemm_recops_defines_every_fbgemm_schema_verbatim():
    report = _python(_REPORT, hide_fbgemm=True)
    assert not report["fbgemm_loaded"]
    assert report["bindings"] == {name: "defined" for name in _fbgemm.FBGEMM_SCHEMAS}
    for name, schema in _fbgemm.FBGEMM_SCHEMAS.items():
        assert report["schemas"][name] == _schema_text("fbgemm::" + schema)


@pytest.mark.skipif(not recops.fbgemm_loaded, reason="fbgemm_gpu is not installed")
def test_with_fbgemm_recops_never_redefines_its_schemas():
    # FBGEMM's CPU wheel has CPU kernels for every op: recops binds nothing on CPU.
    assert recops.fbgemm_bindings == {}
    for name, schema in _fbgemm.FBGEMM_SCHEMAS.items():
        assert str(getattr(torch.ops.fbgemm, name).default._schema) == _schema_text(
            "fbgemm::" + schema
        )


@pytest.mark.skipif(not recops.fbgemm_loaded, reason="fbgemm_gpu is not installed")
@pytest.mark.parametrize(
    "imports", ["import fbgemm_gpu; import recops", "import recops; import fbgemm_gpu"]
)
def test_import_order_does_not_matter(imports):
    report = _python(imports + "\n" + _REPORT, hide_fbgemm=False)
    assert report["fbgemm_loaded"]
    assert report["bindings"] == {}


@pytest.mark.skipif(not recops.fbgemm_loaded, reason="fbgemm_gpu is not installed")
def test_cpu_override_routes_fbgemm_cpu_kernels_to_recops():
    code = "import os; os.environ['RECOPS_FBGEMM_CPU_OVERRIDE'] = '1'\n" + _REPORT
    report = _python(code, hide_fbgemm=False)
    cpu_ops = {n for n, keys in report["bindings"].items() if "CPU" in keys}
    assert "jagged_to_padded_dense_forward" in cpu_ops
    assert "permute_2D_sparse_data" in cpu_ops


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
