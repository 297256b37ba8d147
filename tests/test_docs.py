"""Every ```python block of README.md and docs/*.md runs as written (examples must not rot)."""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCKS = [
    pytest.param(block, id=f"{path.name}:{index}")
    for path in PAGES
    for index, block in enumerate(re.findall(r"```python\n(.*?)```", path.read_text(), re.S))
]


@pytest.mark.parametrize("code", BLOCKS)
def test_doc_example_runs(code):
    if "import torchrec" in code:
        pytest.importorskip("torchrec")  # docs/torchrec.md: run by `make test-torchrec`
    exec(compile(code, "<doc>", "exec"), {})
