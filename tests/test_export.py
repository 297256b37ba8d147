"""recops.export (docs/deploy.md): a trained HSTU / FuXi-alpha / SASRec recommender exported with
torch.export as one graph from user histories to top-k items, compiled with AOTInductor, and
served from Python (aoti_load_package) and from the C++ program examples/cpp_serving, each giving
the eager ``recommend``'s top-k and scores for batches of 1 to 256 users of every length; and the
cached server's delta step exported and packaged, its pages written in place."""

import dataclasses
import os
import random
import shutil
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from torch.utils._pytree import tree_leaves, tree_map, tree_structure, treespec_dumps

import recops
from recops.export import (
    PackagedRecommender,
    RecommenderGraph,
    export_delta_step,
    export_recommender,
    graph_inputs,
    load_delta_step,
    package_delta_step,
    read_answers,
    write_requests,
)
from recops.export.delta_step import PackagedStep, example_step_inputs
from recops.models import ModelConfig, SequentialRecommender
from recops.models.recommend import recommend
from recops.serving import CachedRecommender

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NUM_ITEMS, MAX_SEQ_LEN, K = 300, 24, 10
MODELS = ("hstu", "fuxi", "sasrec")


def make_model(name: str) -> SequentialRecommender:
    torch.manual_seed({"hstu": 1, "fuxi": 2, "sasrec": 3}[name])
    config = ModelConfig(
        model=name, num_items=NUM_ITEMS, max_seq_len=MAX_SEQ_LEN, dim=32, num_heads=2,
        attention_dim=16, linear_dim=16, ffn_hidden_dim=32,
    )  # fmt: skip
    return SequentialRecommender(config).eval()


def histories(users: int, seed: int):
    """Histories of every length class: one item, the window's length, one over, and longer
    (cut to the window, the rest only excluded), with repeated items and equal timestamps."""
    rng = random.Random(seed)
    out = []
    for _ in range(users):
        length = rng.choice(
            [1, 2, MAX_SEQ_LEN - 1, MAX_SEQ_LEN, 3 * MAX_SEQ_LEN, rng.randint(1, 40)]
        )
        items = [rng.randint(1, NUM_ITEMS) for _ in range(length)]
        out.append((items, sorted(rng.randint(0, 10**6) for _ in range(length))))
    return out


def assert_same_top_k(items, scores, expected_items, expected_scores):
    """Equal scores to fp32 rounding and equal items, except where two items' scores tie."""
    torch.testing.assert_close(scores, expected_scores, rtol=1e-5, atol=1e-6)
    differ = items != expected_items
    torch.testing.assert_close(scores[differ], expected_scores[differ], rtol=1e-5, atol=1e-6)
    assert differ.float().mean() < 0.05


@pytest.fixture(scope="module", params=MODELS)
def model(request):
    return make_model(request.param)


CASES = [(1, True), (7, True), (7, False), (256, True)]


@pytest.mark.parametrize("users, exclude", CASES)
def test_exported_program_equals_eager_recommend(model, users, exclude):
    program = _exported(model)
    history = histories(users, seed=users)
    items, scores = program.module()(*graph_inputs(history, MAX_SEQ_LEN, None, exclude))
    expected = recommend(model, history, K, exclude_seen_items=exclude)
    assert_same_top_k(items, scores, *expected)


_programs = {}


def _exported(model):
    if model.config.model not in _programs:
        _programs[model.config.model] = export_recommender(model, K)
    return _programs[model.config.model]


def test_exported_graph_calls_recops_ops_as_single_nodes(model):
    targets = [str(n.target) for n in _exported(model).graph.nodes if n.op == "call_function"]
    attention = {
        "hstu": "recops.hstu_dense_forward.default",
        "fuxi": "recops.hstu_dense_forward_fuxi.default",
        "sasrec": "recops.jagged_to_padded_dense.default",
    }[model.config.model]
    assert targets.count(attention) >= model.config.num_layers
    assert targets.count("recops.mips_topk.default") == 1  # the catalogue's top-k
    assert not any("hstu_dense_backward" in t for t in targets)  # inference: no autograd


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_quantized_item_table_exports(kind):
    model = make_model("hstu")
    graph = RecommenderGraph(model, K, kind)
    program = export_recommender(model, K, kind)
    targets = [str(n.target) for n in program.graph.nodes]
    assert any(t.startswith("fbgemm.Fused") for t in targets)
    history = histories(9, seed=5)
    inputs = graph_inputs(history, MAX_SEQ_LEN)
    with torch.no_grad():
        expected = graph(*inputs)
    assert_same_top_k(*program.module()(*inputs), *expected)
    # The quantized table ranks close to fp32: most of each top-k agrees.
    fp32_items, _ = recommend(model, history, K)
    agree = [
        len(set(a.tolist()) & set(b.tolist())) for a, b in zip(expected[0], fp32_items, strict=True)
    ]
    assert sum(agree) >= 0.5 * fp32_items.numel()


def test_graph_inputs_validate():
    with pytest.raises(ValueError, match="user_histories is empty"):
        graph_inputs([], MAX_SEQ_LEN)
    with pytest.raises(ValueError, match=r"user_histories\[1\] needs as many timestamps"):
        graph_inputs([([1], [2]), ([], [])], MAX_SEQ_LEN)
    with pytest.raises(ValueError, match="request_times needs one time per user"):
        graph_inputs([([1], [2])], MAX_SEQ_LEN, request_times=[1, 2])
    with pytest.raises(ValueError, match="k must be in"):
        RecommenderGraph(make_model("sasrec"), k=NUM_ITEMS + 1)


# --- AOTInductor packages: compiled once each (the slow part of this file). ---


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A recops.train checkpoint of the HSTU model (train.save_checkpoint's layout)."""
    model = make_model("hstu")
    path = tmp_path_factory.mktemp("export") / "run.pt"
    run = {"model": dataclasses.asdict(model.config), "ops": "recops"}
    torch.save({"run": run, "trainer": {"model": model.state_dict()}}, path)
    return path


@pytest.fixture(scope="module")
def packages(checkpoint, tmp_path_factory):
    """One package a model: HSTU through the command line, the others through the API."""
    directory = tmp_path_factory.mktemp("packages")
    paths = {"hstu": directory / "hstu.pt2"}
    command = [sys.executable, "-m", "recops.export", "--checkpoint", str(checkpoint)]
    result = subprocess.run(
        [*command, "--out", str(paths["hstu"]), "--k", str(K)],
        capture_output=True, text=True, timeout=900,
        env={**os.environ, "PYTHONPATH": ROOT},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "hstu, max_seq_len 24, 300 items, top-10, fp32 item table" in result.stdout
    for name in ("fuxi", "sasrec"):
        paths[name] = recops.export.package_recommender(make_model(name), directory / f"{name}.pt2")
    return paths


def test_export_command_refuses_another_suffix(checkpoint, tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "recops.export", "--checkpoint", str(checkpoint),
         "--out", str(tmp_path / "model.zip")],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ROOT},
    )  # fmt: skip
    assert result.returncode == 2 and "--out must name a .pt2 file" in result.stderr


@pytest.mark.parametrize("name", MODELS)
def test_package_from_python_equals_eager_recommend(packages, name):
    model, served = make_model(name), PackagedRecommender(packages[name])
    assert (served.max_seq_len, served.num_items, served.k) == (MAX_SEQ_LEN, NUM_ITEMS, K)
    for users, exclude in CASES:
        history = histories(users, seed=100 + users)
        times = [t[-1] + 3600 * (u % 3) for u, (_, t) in enumerate(history)]
        got = served.recommend(history, request_times=times, exclude_seen_items=exclude)
        expected = recommend(model, history, K, request_times=times, exclude_seen_items=exclude)
        assert_same_top_k(*got, *expected)


def test_package_refuses_unknown_items(packages):
    served = PackagedRecommender(packages["sasrec"])
    with pytest.raises(ValueError, match=r"history items must be item ids in \[1, 300\]"):
        served.recommend([([NUM_ITEMS + 1], [5])])


@pytest.fixture(scope="module")
def program():
    """examples/cpp_serving, built against the installed torch wheel's CMake config."""
    missing = [tool for tool in ("cmake", "c++") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"the C++ serving program needs CMake and a C++ compiler: {missing} not found")
    build = os.path.join(ROOT, "build", "cpp_serving")
    configure = [
        "cmake", "-S", os.path.join(ROOT, "examples", "cpp_serving"), "-B", build,
        f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}",
    ]  # fmt: skip
    for command in (configure, ["cmake", "--build", build, "-j2"]):
        result = subprocess.run(command, capture_output=True, text=True, timeout=900)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return os.path.join(build, "recops_cpp_serving")


def _serve(program, package, requests, out, *flags):
    return subprocess.run(
        [program, "--package", str(package), "--library", recops.library_path,
         "--requests", str(requests), "--out", str(out), *flags],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip


@pytest.mark.parametrize("name", MODELS)
def test_cpp_program_equals_eager_recommend(program, packages, name, tmp_path):
    history = histories(300, seed=7)
    times = [t[-1] + 60 * (u % 5) for u, (_, t) in enumerate(history)]
    write_requests(tmp_path / "requests.txt", history, times)
    # Two workers sharing the queue, batches of 1 to 256 users (the last one partial).
    for batch_size in (1, 37, 256):
        answers = tmp_path / f"answers-{batch_size}.txt"
        flags = ("--workers", "2", "--batch-size", str(batch_size), "--repeat", "2")
        result = _serve(program, packages[name], tmp_path / "requests.txt", answers, *flags)
        assert result.returncode == 0, result.stderr[-3000:]
        assert f'"users": 300, "batches": {-(-300 // batch_size)}' in result.stderr
        assert_same_top_k(
            *read_answers(answers), *recommend(make_model(name), history, K, request_times=times)
        )


def test_cpp_program_rejects_bad_requests(program, packages, tmp_path):
    requests = tmp_path / "bad.txt"
    for text, message in [
        ("100 1:5\n\n200 4:x\n", "line 3: 'x' is not an integer"),
        ("100 1:5 301:6\n", "line 1: item 301 is outside [1, 300]"),
        ("100\n", "line 1: a history needs an item"),
        ("100 7\n", "line 1: '7' is not item:timestamp"),
    ]:
        requests.write_text(text)
        result = _serve(program, packages["hstu"], requests, tmp_path / "out.txt")
        assert result.returncode == 2 and message in result.stderr, result.stderr[-2000:]
    result = _serve(program, packages["hstu"], requests, tmp_path / "out.txt", "--workers", "0")
    assert result.returncode == 2 and "--workers must be at least 1" in result.stderr


# --- The cached server's delta step: pages in (written in place), the new rows' states out. ---


def _server(name, **options):
    return CachedRecommender(make_model(name), cache_bytes=1 << 20, page_rows=8, **options)


@pytest.mark.parametrize("name", ["hstu", "fuxi"])
def test_exported_delta_step_equals_eager_step_and_writes_the_pages(name):
    served = _server(name)
    program = export_delta_step(served)
    targets = {str(n.target) for n in program.graph.nodes}
    assert f"recops.{name}_delta_attention.default" in targets
    inputs = example_step_inputs(served)
    eager, exported = (tree_map(torch.clone, inputs) for _ in range(2))
    with torch.no_grad():
        expected = served.step(*eager)
    torch.testing.assert_close(program.module()(*exported), expected, rtol=1e-6, atol=1e-6)
    pages = [tree_leaves(t[7:]) for t in (exported, eager, inputs)]  # every layer's pools
    for written, reference, before in zip(*pages, strict=True):
        torch.testing.assert_close(written, reference, rtol=1e-6, atol=1e-6)
        assert not torch.equal(written, before)


def test_delta_step_export_refuses_the_torch_reference():
    with pytest.raises(ValueError, match="only a server on recops' delta op"):
        export_delta_step(_server("hstu", attention="torch"))


def test_cached_server_on_a_packaged_delta_step_equals_full_recompute(tmp_path):
    served = _server("hstu")
    load_delta_step(served, package_delta_step(served, tmp_path / "delta.pt2"))
    model = served.model
    history = histories(6, seed=11)
    # Observed in two parts: the second encodes against the rows the package cached.
    for part in (slice(0, -2), slice(-2, None)):
        users = [u for u, (items, _) in enumerate(history) if items[part]]
        events = [(history[u][0][part], history[u][1][part]) for u in users]
        served.observe(users, events)
    users = list(range(len(history)))
    times = [t[-1] + 60 for _, t in history]
    got = served.recommend(users, K, request_times=times)
    assert_same_top_k(*got, *recommend(model, history, K, request_times=times))
    served.set_step(None)  # eager again: the same answers from the same cache
    assert_same_top_k(*served.recommend(users, K, request_times=times), *got)


def test_packaged_step_refuses_a_package_of_another_layer_count():
    # A package's call spec as AOTInductor stores it: a step of three layers' pools.
    three_layers = ((0,) * 7 + ([0] * 3, [0] * 3, 0), {})
    specs = [treespec_dumps(tree_structure(three_layers)), treespec_dumps(tree_structure(0))]
    loader = SimpleNamespace(get_call_spec=lambda: specs, boxed_run=None)
    with pytest.raises(ValueError, match="takes 14 tensors .* of 2 layers takes 12"):
        PackagedStep(SimpleNamespace(loader=loader), num_layers=2)
