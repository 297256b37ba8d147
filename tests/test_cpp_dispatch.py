"""recops' library in a C++ process with no Python (docs/design.md, "FBGEMM binding"): loading it
defines every recops:: op and every fbgemm:: op recops serves, with their CPU kernels, and ops
called through torch's dispatcher equal ATen references (tests/cpp_dispatch/dispatch_main.cpp)."""

import os
import shutil
import subprocess

import pytest
import torch

import recops
from recops import _fbgemm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE = os.path.join(ROOT, "tests", "cpp_dispatch")
BUILD = os.path.join(ROOT, "build", "cpp_dispatch")


def _cxx_standard():
    """The C++ standard recops is built with: torch's headers need C++20 from 2.13 (setup.py)."""
    major, minor = (int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
    return "20" if (major, minor) >= (2, 13) else "17"


def _run(command):
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def program():
    missing = [tool for tool in ("cmake", "c++") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"the C++ dispatch test needs CMake and a C++ compiler: {missing} not found")
    configure = [
        "cmake",
        "-S",
        SOURCE,
        "-B",
        BUILD,
        f"-DTORCH_DIR={os.path.dirname(torch.__file__)}",
        f"-DTORCH_CXX11_ABI={int(torch.compiled_with_cxx11_abi())}",
        f"-DCMAKE_CXX_STANDARD={_cxx_standard()}",
    ]
    for command in (configure, ["cmake", "--build", BUILD, "-j1"]):
        result = _run(command)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return os.path.join(BUILD, "recops_cpp_dispatch")


@pytest.fixture(scope="module")
def expected_ops(tmp_path_factory):
    """Every recops:: op this (Python) process has and every fbgemm:: op recops serves."""
    names = sorted(n for n in torch._C._dispatch_get_all_op_names() if n.startswith("recops::"))
    names += [f"fbgemm::{name}" for name in _fbgemm.FBGEMM_OPS]
    return names, tmp_path_factory.mktemp("cpp_dispatch")


def _write(directory, names):
    path = directory / f"ops-{len(names)}.txt"
    path.write_text("\n".join(names) + "\n")
    return str(path)


def test_library_alone_defines_and_serves_every_op_in_a_cpp_process(program, expected_ops):
    names, directory = expected_ops
    assert "recops::hstu_dense_forward" in names and "fbgemm::jagged_to_padded_dense" in names
    result = _run([program, recops.library_path, _write(directory, names)])
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert f"ok: {len(names)} ops resolve" in result.stdout


def test_cpp_process_reports_an_op_the_library_lacks(program, expected_ops):
    names, directory = expected_ops
    result = _run([program, recops.library_path, _write(directory, [*names, "recops::not_an_op"])])
    assert result.returncode == 1
    assert result.stdout.splitlines() == ["FAILED: recops::not_an_op has a schema"]
