"""The built wheel: `python -m build --wheel --no-isolation` gives a wheel that installs into a
scratch virtual environment, imports there, and requires the torch release it was built against
(the extension is bound to that torch's ABI)."""

import os
import subprocess
import sys
import sysconfig
import zipfile

import torch

import recops

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(*args, **kwargs):
    return subprocess.run(args, check=True, capture_output=True, text=True, **kwargs).stdout


def test_wheel_installs_into_a_scratch_venv_and_imports(tmp_path):
    _run(sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", tmp_path, cwd=ROOT)
    (wheel,) = tmp_path.glob("recops-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read(f"recops-{recops.__version__}.dist-info/METADATA").decode()
    assert "recops/py.typed" in names and any(n.startswith("recops/_C") for n in names)
    major, minor = torch.__version__.split(".")[:2]
    assert f"Requires-Dist: torch=={major}.{minor}.*" in metadata.splitlines()

    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", venv)
    python = venv / "bin" / "python"
    # The scratch venv borrows this environment's torch (a .pth file) instead of downloading it.
    purelib = _run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    (tmp_path / purelib.strip() / "borrowed_torch.pth").write_text(sysconfig.get_paths()["purelib"])
    # --ignore-installed: a recops installed in the borrowed environment must not count (or go).
    _run(
        python,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--no-deps",
        "--no-index",
        "--ignore-installed",
        wheel,
    )
    report = _run(
        python,
        "-c",
        "import recops, torch; offsets = [torch.tensor([0, 3])]; "
        "v = torch.ops.fbgemm.jagged_to_padded_dense(torch.ones(3, 2), offsets, [4]); "
        "print(recops.__version__, recops.__file__, float(v.sum()))",
        cwd=tmp_path,  # not the source tree, whose recops/ would shadow the installed one
    ).split()
    assert report[0] == recops.__version__
    assert report[1].startswith(str(venv)) and float(report[2]) == 6.0
