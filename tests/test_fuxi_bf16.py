"""FuXi-alpha attention in bf16 (docs/fuxi_attention.md): native bf16 tiles where the CPU has
AVX512_BF16, fp32 tiles under RECOPS_CPU_ISA=avx2. Accuracy rule (flash-attention's, accuracy.py):
the error against float64 (same bf16 values) of the output and every gradient is at most twice
the bf16 plain-PyTorch reference's own."""

import pytest
import torch
from accuracy import assert_errors_within_rule
from hstu_reference import fuxi_reference, table_biases
from test_fuxi_attention import _dense_biases, _jagged

import recops

BF16, F64 = torch.bfloat16, torch.float64


def errors_within_rule(make_leaves, run_reference, run_recops):
    """make_leaves(dtype) -> list of leaves; the runners map leaves to an output."""
    outs = {}
    for name, dtype, fn in (
        ("exact", F64, run_reference),
        ("bf16_ref", BF16, run_reference),
        ("recops", BF16, run_recops),
    ):
        leaves = [t.detach().clone().requires_grad_() for t in make_leaves(dtype)]
        out = fn(leaves)
        if name == "exact":
            grad_out = torch.randn_like(out).to(BF16).to(F64)
        grads = torch.autograd.grad(out, leaves, grad_out.to(dtype), allow_unused=True)
        grads = [
            torch.zeros_like(t) if g is None else g for g, t in zip(grads, leaves, strict=True)
        ]
        outs[name] = [out.double()] + [g.double() for g in grads]
    names = ["output"] + [f"grad {i}" for i in range(len(outs["exact"]) - 1)]
    assert_errors_within_rule(names, outs["exact"], outs["bf16_ref"], outs["recops"])


MASKS = [
    {},
    {"num_targets": [1, 0, 3, 2]},
    {"contextual_seq_len": 2, "max_attn_len": 9},
    {"mask": "none"},
]


@pytest.mark.parametrize("channels", ["semantic", "time", "position", "all"])
@pytest.mark.parametrize("reference_layout", [False, True])
@pytest.mark.parametrize("mask", range(len(MASKS)))
def test_bf16_accuracy_dense_biases(channels, reference_layout, mask, bf16_path):
    n, lengths = 140, [5, 0, 140, 71]
    q, k, v, offsets = _jagged(lengths, dqk=32, dv=32)
    ts_bias, pos_bias = _dense_biases(len(lengths), n)
    options = dict(MASKS[mask])
    if "num_targets" in options:
        options["num_targets"] = torch.tensor(options["num_targets"])
    names = ["q", "k", "v"]
    masters = [q, k, v]
    if channels in ("time", "all"):
        names.append("ts_bias")
        masters.append(ts_bias)
    if channels in ("position", "all"):
        names.append("pos_bias")
        masters.append(pos_bias)
    masters = [t.to(BF16).to(F64) for t in masters]

    def call(fn):
        def run(leaves):
            named = dict(zip(names, leaves, strict=True))
            return fn(
                named.pop("q"),
                named.pop("k"),
                named.pop("v"),
                offsets,
                n,
                reference_layout=reference_layout,
                **named,
                **options,
            )

        return run

    errors_within_rule(
        lambda dtype: [t.to(dtype) for t in masters],
        call(fuxi_reference),
        call(recops.fuxi_attention),
    )


# Sequences past 192 keys: the time channel of their later blocks summed over runs of keys.
@pytest.mark.parametrize("n, lengths", [(130, [130, 0, 1, 67]), (300, [300, 0, 1, 230])])
@pytest.mark.parametrize("dqk, dv", [(64, 64), (5, 7)])
def test_bf16_accuracy_fused_tables(dqk, dv, n, lengths, bf16_path):
    q, k, v, offsets = _jagged(lengths, dqk=dqk, dv=dv)
    timestamps = torch.randint(0, 10**6, (sum(lengths),)).sort().values
    ts_w, pos_w = torch.randn(129, dtype=F64), torch.randn(2 * n - 1, dtype=F64)
    masters = [t.to(BF16).to(F64) for t in (q, k, v, ts_w, pos_w)]

    def reference(leaves):
        q, k, v, ts_w, pos_w = leaves
        ts_bias, pos_bias = table_biases(timestamps, offsets, ts_w, pos_w, n, True)
        return fuxi_reference(q, k, v, offsets, n, ts_bias=ts_bias, pos_bias=pos_bias)

    def fused(leaves):
        q, k, v, ts_w, pos_w = leaves
        return recops.fuxi_attention(
            q, k, v, offsets, n, timestamps=timestamps, ts_w=ts_w, pos_w=pos_w
        )

    errors_within_rule(lambda dtype: [t.to(dtype) for t in masters], reference, fused)


def test_bf16_accuracy_dense_layout_custom_mask(bf16_path):
    batch, n, heads, d = 3, 70, 2, 16
    q, k, v = (torch.randn(batch, n, heads, d, dtype=F64).to(BF16).to(F64) for _ in range(3))
    custom = torch.rand(batch, 1, n, n) > 0.3
    ts_bias, pos_bias = (t.to(BF16).to(F64) for t in _dense_biases(batch, n))
    offsets = torch.arange(batch + 1) * n

    def reference(leaves):
        q, k, v, ts, pos = leaves
        flat = [t.reshape(batch * n, heads, d) for t in (q, k, v)]
        out = fuxi_reference(*flat, offsets, n, ts_bias=ts, pos_bias=pos, mask=custom)
        return out.reshape(batch, n, -1)

    def fused(leaves):
        q, k, v, ts, pos = leaves
        return recops.fuxi_attention(q, k, v, mask=custom, ts_bias=ts, pos_bias=pos)

    errors_within_rule(
        lambda dtype: [t.to(dtype) for t in (q, k, v, ts_bias, pos_bias)], reference, fused
    )
