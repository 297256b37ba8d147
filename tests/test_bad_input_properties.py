"""The bad-input property suite: Hypothesis mutates valid calls of every op (op_cases.py,
mutations.py) and of the TBE module's training step (tbe_property.py); each call must raise a
clean exception naming an argument, or return the plain-PyTorch reference's result for a call the
contract accepts; a rejected TBE step must leave every weight and optimizer-state byte unchanged.

The families run in worker processes (op_properties.py), two at a time on one thread each, so a
crash fails one family with the call it died in instead of killing the test run. The example
counts add up to the suite's 10,000+ generated cases per run; RECOPS_PROPERTY_SCALE scales them
(e.g. 0.1 for a quick look, 10 for a long soak).
"""

import concurrent.futures
import os
import subprocess
import sys

import pytest

import recops

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = {
    "scans": 1500,
    "jagged": 1500,
    "sparse": 1200,
    "relative_bias": 1200,
    "hstu": 1000,
    "fuxi": 1000,
    "deberta": 1000,
    "layer": 800,
    "loss": 400,
    "retrieval": 300,
    "hashing": 600,
    "tbe": 1600,
    "keyed": 1000,
    "quantize": 800,
}
assert sum(EXAMPLES.values()) >= 10_000


def run_family(family, examples, tmp_path):
    current = tmp_path / f"{family}.current"
    env = dict(
        os.environ,
        RECOPS_PROPERTY_CURRENT=str(current),
        # The workers import the recops this test imported (in place, or an instrumented build).
        PYTHONPATH=os.path.dirname(os.path.dirname(recops.__file__)),
    )
    result = subprocess.run(
        [sys.executable, os.path.join(HERE, "op_properties.py"), family, str(examples)],
        env=env,
        capture_output=True,
        text=True,
    )
    last_call = current.read_text() if current.exists() else ""
    return result, last_call


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    scale = float(os.environ.get("RECOPS_PROPERTY_SCALE", "1"))
    tmp_path = tmp_path_factory.mktemp("properties")
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        futures = {
            family: pool.submit(run_family, family, max(1, round(n * scale)), tmp_path)
            for family, n in EXAMPLES.items()
        }
        return {family: future.result() for family, future in futures.items()}


@pytest.mark.parametrize("family", list(EXAMPLES))
def test_bad_input_property(results, family):
    result, last_call = results[family]
    if result.returncode < 0:
        pytest.fail(
            f"{family}: the worker died of signal {-result.returncode} in\n{last_call}\n"
            + result.stderr[-4000:]
        )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-6000:]
