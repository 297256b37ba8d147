"""Train and evaluate a sequential recommender (HSTU, FuXi-alpha, SASRec) on recops' ops or
their plain-PyTorch formulation: ``python -m recops.train --help``.

Prints a progress bar per epoch and a table row with the validation metrics, then the test
metrics (full ranking) and the training / recommendation throughput of both op backends; writes
``results.json`` and ``training.png`` to ``--out``. ``--checkpoint`` saves the run after every
epoch, ``--resume`` continues one (to the same result as an uninterrupted run).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import sys
import time

import torch

from recops.data import load_dataset
from recops.models import BACKENDS, MODELS, ModelConfig
from recops.training import DTYPES, TrainConfig, Trainer, build_model, chance_hit_rate, report
from recops.training.allocator import keep_freed_memory
from recops.training.throughput import compare_backends


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m recops.train", description=__doc__.split("\n")[0])
    p.add_argument("--model", choices=MODELS, default="hstu")
    p.add_argument(
        "--data",
        default="ml-100k",
        help="ml-100k, synthetic, or a path to "
        "ratings.dat (ML-1M), ratings.csv (ML-20M) or a recbole .inter file",
    )
    p.add_argument("--ops", choices=list(BACKENDS), default="recops", help="op backend")
    p.add_argument("--epochs", type=int, default=TrainConfig.epochs)
    p.add_argument("--batch-size", type=int, default=TrainConfig.batch_size)
    p.add_argument("--max-len", type=int, default=ModelConfig.max_seq_len)
    p.add_argument("--dim", type=int, default=ModelConfig.dim, help="embedding and per-head dim")
    p.add_argument("--layers", type=int, default=ModelConfig.num_layers)
    p.add_argument("--heads", type=int, default=ModelConfig.num_heads)
    p.add_argument("--dropout", type=float, default=ModelConfig.dropout)
    p.add_argument("--negatives", type=int, default=TrainConfig.num_negatives)
    p.add_argument("--lr", type=float, default=TrainConfig.learning_rate, help="Adam, dense")
    p.add_argument(
        "--item-lr", type=float, default=TrainConfig.item_learning_rate, help="Adagrad, item table"
    )
    p.add_argument("--dtype", choices=DTYPES, default="fp32")
    p.add_argument("--threads", type=int, default=None, help="intra-op threads (torch default)")
    p.add_argument("--compile", action="store_true", help="training step under torch.compile")
    p.add_argument("--seed", type=int, default=TrainConfig.seed)
    p.add_argument(
        "--speedup-steps",
        type=int,
        default=5,
        help="training steps timed per backend for the speed-up figure (0: skip the comparison)",
    )
    p.add_argument("--out", type=pathlib.Path, default=pathlib.Path("train-results"))
    p.add_argument("--checkpoint", type=pathlib.Path, help="save the run here after each epoch")
    p.add_argument("--resume", type=pathlib.Path, help="continue the run saved here")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p.parse_args(argv)


def configs(args, num_items):
    model = ModelConfig(
        model=args.model,
        num_items=num_items,
        max_seq_len=args.max_len,
        dim=args.dim,
        num_layers=args.layers,
        num_heads=args.heads,
        attention_dim=args.dim,
        linear_dim=args.dim,
        ffn_hidden_dim=args.dim,
        dropout=args.dropout,
    )
    train = TrainConfig(
        epochs=args.epochs,
        batch_size=args.batch_size,
        learning_rate=args.lr,
        item_learning_rate=args.item_lr,
        num_negatives=args.negatives,
        dtype=args.dtype,
        compile=args.compile,
        seed=args.seed,
    )
    return model, train


def progress_bar(disabled):
    if disabled:
        return None
    from tqdm import tqdm

    def wrap(batches, total):
        return tqdm(batches, total=total, leave=False, unit="batch", dynamic_ncols=True)

    return wrap


def save_checkpoint(path, trainer, run):
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    torch.save({"run": run, "trainer": trainer.state_dict()}, partial)
    os.replace(partial, path)  # a crash mid-save leaves the previous checkpoint intact


def resume(path, trainer, run):
    saved = torch.load(path, weights_only=False)
    mismatched = [k for k in ("model", "ops", "data", "train") if saved["run"][k] != run[k]]
    if mismatched:
        raise SystemExit(f"--resume {path}: the checkpoint's {', '.join(mismatched)} differ")
    trainer.load_state_dict(saved["trainer"])


def run(argv: list[str]) -> dict:
    """Runs the command line ``argv``; returns the record it writes to results.json."""
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    data = load_dataset(args.data)
    model_config, train_config = configs(args, data.num_items)
    trainer = Trainer(build_model(model_config, train_config, args.ops), data, train_config)
    # What must match for a checkpoint to continue this run (the epoch count may grow).
    run = {
        "model": dataclasses.asdict(model_config),
        "ops": args.ops,
        "data": data.name,
        "train": dataclasses.asdict(dataclasses.replace(train_config, epochs=0)),
    }
    if args.resume:
        resume(args.resume, trainer, run)
    print(
        f"{args.model} on {data.name} ({data.num_users} users, {data.num_items} items), "
        f"ops={args.ops}, {args.dtype}{', compiled' if args.compile else ''}, "
        f"{torch.get_num_threads()} threads; "
        f"HR@10 of chance {chance_hit_rate(10, data.num_items):.4f}"
    )
    print(report.epoch_header())
    for record in trainer.history:  # the epochs a resumed run already did
        print(report.epoch_row(record))

    def after_epoch(record):
        print(report.epoch_row(record), flush=True)
        if args.checkpoint:
            save_checkpoint(args.checkpoint, trainer, run)

    start = time.perf_counter()
    trainer.fit(train_config.epochs, progress_bar(args.no_progress), after_epoch)
    train_seconds = time.perf_counter() - start
    final = {"valid": trainer.evaluate("valid"), "test": trainer.evaluate("test")}
    print(report.metrics_table(final))
    throughput = None
    if args.speedup_steps > 0:
        throughput = compare_backends(model_config, train_config, data, args.speedup_steps)
        print("\n".join(report.throughput_lines(throughput)))

    args.out.mkdir(parents=True, exist_ok=True)
    record = {
        "command": ["python", "-m", "recops.train", *argv],
        **run,
        "train": dataclasses.asdict(train_config),  # run's has epochs 0: what a resume compares
        "epochs": train_config.epochs,
        "threads": torch.get_num_threads(),
        "train_seconds": train_seconds,  # of this invocation's epochs
        "history": trainer.history,
        **final,
        "throughput": throughput,
    }
    report.write_json(args.out / "results.json", record)
    title = f"{args.model} on {data.name}, ops={args.ops}"
    report.plot(args.out / "training.png", title, trainer.history, throughput)
    print(f"wrote {args.out / 'results.json'} and {args.out / 'training.png'}")
    return record


def main(argv: list[str] | None = None) -> None:
    """The ``recops-train`` console script and ``python -m recops.train``."""
    # The command owns its process, so it sets the process-wide allocator (run() may be called
    # inside another program's): no page faults on every step's large tensors.
    keep_freed_memory()
    run(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    main()
