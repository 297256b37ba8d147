"""recops.training and the recops.train command: short synthetic runs learn, are reproducible,
resume from checkpoints exactly, and train the same weights compiled as eagerly."""

import dataclasses
import itertools
import json
import subprocess
import sys

import pytest
import torch

from recops import train
from recops.data import synthetic_sequences
from recops.models import MODELS, ModelConfig
from recops.training import TrainConfig, Trainer, build_model, chance_hit_rate, compare
from recops.training.metrics import RankingMetrics
from recops.training.trainer import COMPILE_FUSED_UPDATE_MIN_TORCH, torch_release

NUM_ITEMS = 96


@pytest.fixture(scope="module")
def data():
    return synthetic_sequences(160, NUM_ITEMS, 8, 24, num_groups=8, seed=0)


def tiny(model="hstu", **overrides):
    sizes = dict(dim=16, num_heads=2, attention_dim=8, linear_dim=8, ffn_hidden_dim=16)
    sizes.update(overrides)
    return ModelConfig(model, NUM_ITEMS, max_seq_len=16, num_layers=1, **sizes)


FAST = TrainConfig(batch_size=32, learning_rate=1e-2, num_negatives=32)


def trainer_for(data, model_config, train_config=FAST, backend="recops"):
    return Trainer(build_model(model_config, train_config, backend), data, train_config)


def weights(trainer):
    return {k: v.clone() for k, v in trainer.model.state_dict().items()}


def outcomes(history):
    """What a run's records must reproduce: the loss and validation metrics (not timings)."""
    return [(record["loss"], record["valid"]) for record in history]


def assert_same_weights(a, b, **tolerance):
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], msg=key, **tolerance)


@pytest.mark.parametrize("model", MODELS)
def test_short_synthetic_run_learns(data, model):
    trainer = trainer_for(data, tiny(model, dropout=0.0))
    history = trainer.fit(3)
    losses = [record["loss"] for record in history]
    assert losses[0] > losses[1] > losses[2]
    hit_rate = history[-1]["valid"]["hr@10"]
    assert hit_rate > 4 * chance_hit_rate(10, NUM_ITEMS), hit_rate
    test = trainer.evaluate("test")
    assert test["hr@1"] <= test["hr@10"] <= test["hr@50"] <= 1
    assert test["ndcg@10"] <= test["ndcg@50"] and 0 < test["mrr"] <= 1


def test_ranking_metrics_of_known_ranks():
    metrics = RankingMetrics()
    metrics.add(torch.tensor([1, 3]))
    metrics.add(torch.tensor([60]))
    result = metrics.result()
    assert result["hr@1"] == pytest.approx(1 / 3) and result["hr@10"] == pytest.approx(2 / 3)
    assert result["hr@50"] == pytest.approx(2 / 3)
    assert result["ndcg@10"] == pytest.approx((1 + 1 / 2) / 3)  # 1/log2(2), 1/log2(4)
    assert result["mrr"] == pytest.approx((1 + 1 / 3 + 1 / 60) / 3)


def test_same_seed_same_run(data):
    runs = [trainer_for(data, tiny()) for _ in range(2)]
    for trainer in runs:
        trainer.fit(2)
    assert outcomes(runs[0].history) == outcomes(runs[1].history)
    assert_same_weights(weights(runs[0]), weights(runs[1]), rtol=0, atol=0)
    other = trainer_for(data, tiny(), dataclasses.replace(FAST, seed=7))
    other.fit(1)
    assert other.history[0]["loss"] != runs[0].history[0]["loss"]


@pytest.mark.parametrize("backend", ["recops", "torch"])
def test_resume_from_checkpoint_matches_uninterrupted_run(data, tmp_path, backend):
    straight = trainer_for(data, tiny(), backend=backend)
    straight.fit(2)
    first = trainer_for(data, tiny(), backend=backend)
    first.fit(1)
    torch.save(first.state_dict(), tmp_path / "run.pt")
    resumed = trainer_for(data, tiny(), backend=backend)
    resumed.load_state_dict(torch.load(tmp_path / "run.pt", weights_only=False))
    resumed.fit(2)
    assert outcomes(resumed.history) == outcomes(straight.history)
    assert_same_weights(weights(resumed), weights(straight), rtol=0, atol=0)


FUSED_UPDATE_COMPILES = torch_release() >= COMPILE_FUSED_UPDATE_MIN_TORCH


@pytest.mark.skipif(
    not FUSED_UPDATE_COMPILES, reason="compiling the fused TBE update needs a newer torch"
)
@pytest.mark.parametrize("model", ["hstu", "fuxi"])  # the recops attention ops (and the TBE)
def test_compiled_training_gives_the_eager_weights(data, model):
    # aot_eager runs AOTAutograd (functionalisation, the joint graph and its partition into a
    # forward and a backward) without inductor's kernels, so the weights must match bit for
    # bit; fullgraph=True (the trainer's setting) also proves the recops ops break no graph.
    # Dropout is off: compiled graphs draw their random masks differently.
    config = dataclasses.replace(FAST, compile_backend="aot_eager")
    runs = {}
    for compiled in (False, True):
        trainer = trainer_for(
            data, tiny(model, dropout=0.0), dataclasses.replace(config, compile=compiled)
        )
        for batch, negatives in itertools.islice(trainer.batches(0), 3):
            trainer.step(batch, negatives)
        runs[compiled] = weights(trainer)
    assert_same_weights(runs[True], runs[False], rtol=0, atol=0)


@pytest.mark.skipif(FUSED_UPDATE_COMPILES, reason="this torch compiles the fused TBE update")
def test_compile_on_an_older_torch_is_refused_with_the_version_needed(data):
    with pytest.raises(RuntimeError, match="needs torch >= "):
        trainer_for(data, tiny(), dataclasses.replace(FAST, compile=True))


def test_tbe_update_is_declared_to_the_compiler():
    # The fused backward of the item table writes the weights and the Adagrad state in place:
    # its schema says so, which is what lets torch.compile order and functionalise it.
    schema = torch.ops.recops.backward_codegen_adagrad_unweighted_exact.default._schema
    written = {a.name for a in schema.arguments if a.alias_info and a.alias_info.is_write}
    assert written == {"weights", "momentum1"}


def test_bf16_autocast_trains(data):
    trainer = trainer_for(data, tiny(), dataclasses.replace(FAST, dtype="bf16"))
    history = trainer.fit(2)
    assert history[1]["loss"] < history[0]["loss"]
    assert history[1]["valid"]["hr@10"] > 2 * chance_hit_rate(10, NUM_ITEMS)


def write_ratings(path, data):
    lines = []
    for user in range(data.num_users):
        for row in range(int(data.offsets[user]), int(data.offsets[user + 1])):
            lines.append(f"{user}::{int(data.items[row])}::5::{int(data.timestamps[row])}\n")
    path.write_text("".join(lines))
    return path


CLI_SIZES = ["--max-len", "12", "--dim", "8", "--layers", "1", "--negatives", "16"]


def test_command_line_trains_reports_and_resumes(data, tmp_path, capsys):
    ratings = write_ratings(tmp_path / "ratings.dat", data)
    common = ["--data", str(ratings), "--no-progress", *CLI_SIZES, "--batch-size", "64"]
    straight = train.run(
        [*common, "--epochs", "2", "--speedup-steps", "1", "--out", str(tmp_path / "a")]
    )
    out = capsys.readouterr().out
    assert "HR@10" in out and "NDCG@50" in out and "x speed-up" in out
    saved = json.loads((tmp_path / "a" / "results.json").read_text())
    assert saved["test"] == straight["test"] and len(saved["history"]) == 2
    assert saved["train"]["epochs"] == saved["epochs"] == 2
    assert saved["throughput"]["recops"]["train_sequences_per_second"] > 0
    assert (tmp_path / "a" / "training.png").read_bytes()[:4] == b"\x89PNG"

    checkpoint = str(tmp_path / "run.pt")
    no_speedup = [*common, "--speedup-steps", "0", "--checkpoint", checkpoint]
    train.run([*no_speedup, "--epochs", "1", "--out", str(tmp_path / "b")])
    resumed = train.run(
        [*no_speedup, "--epochs", "2", "--resume", checkpoint, "--out", str(tmp_path / "c")]
    )
    assert outcomes(resumed["history"]) == outcomes(straight["history"])
    assert resumed["test"] == straight["test"]
    compare.main(
        [str(tmp_path / d / "results.json") for d in "ac"] + ["--out", str(tmp_path / "o.png")]
    )
    lines = capsys.readouterr().out.splitlines()
    differences = [line.split()[3:] for line in lines if line.startswith("1 - 0")]
    assert differences == [["0.0000"] * 6] * 2  # valid and test: the resumed run is the same
    with pytest.raises(SystemExit, match="differ"):
        train.run([*no_speedup, "--epochs", "2", "--resume", checkpoint, "--dim", "12"])


_REUSE_CHECK = """
import ctypes, resource
from recops.training.allocator import keep_freed_memory
kept = keep_freed_memory()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
def faults_of_a_64_mib_block():  # malloc'd, written, freed (torch's allocator varies by release)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    block = libc.malloc(64 << 20)
    ctypes.memset(block, 1, 64 << 20)
    libc.free(block)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
faults_of_a_64_mib_block()  # the heap grows to hold it once
print(kept, faults_of_a_64_mib_block())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_training_allocator_reuses_freed_memory():
    """After keep_freed_memory (recops.train sets it) a freed 64 MiB block's pages are reused:
    a later one costs no page faults (glibc's default unmaps them and faults all 16,384 again)."""
    result = subprocess.run(
        [sys.executable, "-c", _REUSE_CHECK], capture_output=True, text=True, check=True
    )
    kept, faults = result.stdout.split()
    assert kept == "True"
    assert int(faults) < 100
