"""HSTU attention in bf16 (docs/hstu_attention.md, "bf16"): on CPUs with AVX512_BF16 the tiles run
on bf16 products with fp32 accumulation, elsewhere (or with RECOPS_CPU_ISA=avx2) in fp32.

Accuracy rule (flash-attention's, accuracy.py): against the float64 reference fed the same bf16
values, recops' error (output and every gradient) is at most twice the error of the plain-PyTorch
reference run in bf16, on every mask, bias and layout, on both paths."""

import pytest
import torch
from accuracy import assert_errors_within_rule
from cpu_features import cpu_has_bf16_dot
from hstu_reference import hstu_reference
from test_hstu_attention import (
    LENGTHS,
    MASKS,
    MAX_LEN,
    dense_bias,
    jagged_qkv,
    mask_options,
    offsets_of,
    reference,
    relative_tables,
)

import recops

BF16, F64 = torch.bfloat16, torch.float64


def run(fn, master, dtype, grad_out, options):
    leaves = {name: t.detach().to(dtype, copy=True).requires_grad_() for name, t in master.items()}
    out = fn(**leaves, **options)
    if out.requires_grad:
        out.backward(grad_out.to(dtype))
    grads = [
        torch.zeros_like(t) if leaves[n].grad is None else leaves[n].grad for n, t in master.items()
    ]
    return [out.double()] + [g.double() for g in grads]


def check_bf16_accuracy(tensors, **options):
    """recops in bf16 vs the bf16 plain-PyTorch reference, both measured against float64."""
    master = {name: t.to(BF16).to(F64) for name, t in tensors.items()}
    exact_out = reference(**master, **options)
    grad_out = torch.randn_like(exact_out).to(BF16).to(F64)
    exact = run(reference, master, F64, grad_out, options)
    bf16_ref = run(reference, master, BF16, grad_out, options)
    got = run(recops.hstu_attention, master, BF16, grad_out, options)
    assert_errors_within_rule(["output", *master], exact, bf16_ref, got)


@pytest.mark.parametrize("bias", ["none", "dense", "relative"])
@pytest.mark.parametrize("mask", list(MASKS))
def test_bf16_accuracy_masks_and_biases(mask, bias, bf16_path):
    tensors = jagged_qkv(LENGTHS, heads=2, dqk=32, dv=32)
    options = dict(seq_offsets=offsets_of(LENGTHS), max_seq_len=MAX_LEN, alpha=0.7)
    options.update(mask_options(mask))
    if bias == "dense":
        tensors["attn_bias"] = dense_bias([len(LENGTHS), 1, MAX_LEN, MAX_LEN])
    elif bias == "relative":
        tensors.update(relative_tables(MAX_LEN))
        options["timestamps"] = torch.randint(0, 10**7, (sum(LENGTHS),)).sort().values
    check_bf16_accuracy(tensors, **options)


@pytest.mark.parametrize(
    "dqk, dv, heads", [(64, 64, 2), (5, 7, 3), (24, 40, 1), (1, 3, 4), (80, 96, 1)]
)
def test_bf16_accuracy_head_dims(dqk, dv, heads, bf16_path):
    """Head dims that are not multiples of the products' 16-value granule are zero-padded."""
    lengths = [33, 0, 100, 1, 64]
    check_bf16_accuracy(
        {**jagged_qkv(lengths, heads, dqk, dv), "attn_bias": dense_bias([1, heads, 100, 100])},
        seq_offsets=offsets_of(lengths),
        max_seq_len=100,
        silu_scale=0.05,
        num_targets=torch.tensor([3, 0, 10, 1, 0]),
    )


@pytest.mark.parametrize("bias", ["none", "relative"])
def test_bf16_accuracy_dense_layout_and_custom_mask(bias, bf16_path):
    batch, n, heads, d = 3, 70, 2, 16
    tensors = {name: torch.randn(batch, n, heads, d, dtype=F64) for name in ("q", "k", "v")}
    options = dict(lengths=torch.tensor([70, 0, 33]), mask=torch.rand(batch, 1, n, n) < 0.6)
    if bias == "relative":
        tensors.update(relative_tables(n))
        options["timestamps"] = torch.randint(0, 10**6, (batch, n)).sort(dim=1).values
    check_bf16_accuracy(tensors, **options)


def test_bf16_non_contiguous_and_empty(bf16_path):
    packed = torch.randn(40, 2, 48, dtype=F64)
    q, k, v = packed.split([16, 16, 16], dim=-1)
    check_bf16_accuracy({"q": q, "k": k, "v": v}, seq_offsets=offsets_of([40, 0]), max_seq_len=40)
    check_bf16_accuracy(jagged_qkv([0, 0]), seq_offsets=offsets_of([0, 0]), max_seq_len=8)


def test_bf16_fallback_is_the_fp32_computation(monkeypatch):
    """Under the ISA cap bf16 inputs are computed in fp32 and rounded once; without it, on a CPU
    with bf16 dot products, the native path runs (and rounds its operands: other results)."""
    lengths = [70, 3, 128]
    tensors = {n: t.to(BF16) for n, t in jagged_qkv(lengths, 2, 32, 32).items()}
    options = dict(seq_offsets=offsets_of(lengths), max_seq_len=128, contextual_seq_len=2)
    monkeypatch.setenv("RECOPS_CPU_ISA", "avx2")
    fallback = recops.hstu_attention(**tensors, **options)
    fp32 = recops.hstu_attention(**{n: t.float() for n, t in tensors.items()}, **options)
    assert torch.equal(fallback, fp32.to(BF16))
    monkeypatch.delenv("RECOPS_CPU_ISA")
    native = recops.hstu_attention(**tensors, **options)
    if cpu_has_bf16_dot():
        assert not torch.equal(native, fallback)
    exact = hstu_reference(**{n: t.double() for n, t in tensors.items()}, **options)
    for out in (native, fallback):
        torch.testing.assert_close(out.double(), exact, rtol=3e-2, atol=3e-2 * exact.abs().max())
