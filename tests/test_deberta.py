"""DeBERTa disentangled attention (docs/ops.md §6) against a plain-PyTorch reference that follows
HuggingFace's DebertaV2 DisentangledSelfAttention step by step (bmm, gather with the clamped bucket
index, mask fill, softmax, bmm), in float64; plus masks, dtypes, dropout, gradcheck, opcheck, bad
input and the drop-in module."""

import math
from types import SimpleNamespace

import pytest
import torch
from accuracy import TOLERANCE, assert_errors_within_rule
from cpu_features import cpu_has_bf16_dot
from threads import num_threads

import recops

ops = torch.ops.recops
F64 = torch.float64


# --------------------------------------------------------------------------- HF reference
def make_log_bucket_position(relative_pos, bucket_size, max_position):
    sign = torch.sign(relative_pos)
    mid = bucket_size // 2
    abs_pos = torch.where(
        (relative_pos < mid) & (relative_pos > -mid),
        torch.tensor(mid - 1).type_as(relative_pos),
        torch.abs(relative_pos),
    )
    log_pos = (
        torch.ceil(
            torch.log(abs_pos / mid) / torch.log(torch.tensor((max_position - 1) / mid)) * (mid - 1)
        )
        + mid
    )
    return torch.where(abs_pos <= mid, relative_pos.type_as(log_pos), log_pos * sign)


def build_relative_position(query_size, key_size, bucket_size=-1, max_position=-1):
    rel_pos_ids = torch.arange(query_size)[:, None] - torch.arange(key_size)[None, :]
    if bucket_size > 0 and max_position > 0:
        rel_pos_ids = make_log_bucket_position(rel_pos_ids, bucket_size, max_position)
    return rel_pos_ids.to(torch.long).unsqueeze(0)


def hf_attention(
    query_layer,
    key_layer,
    value_layer,
    pos_key_layer,
    pos_query_layer,
    attention_mask,
    pos_att_type,
    position_buckets,
    max_relative_positions,
    scale,
    heads,
    keep=None,
    dropout_p=0.0,
):
    """HF's DisentangledSelfAttention after the projections, in its [B * H, S, d] layout.

    attention_mask is the expanded [B, 1, Sq, Sk] one; scores are divided by `scale`. Where this
    departs from HF it follows the contract: rows with no kept key give zeros (DeBERTa's XSoftmax;
    HF v5 spreads them uniformly), and when Sq != Sk (where HF's sum does not broadcast) p2c takes
    row i of the key-grid matrix for query i (DeBERTa v1's pos_index), on a grid as large as both
    lengths. `keep` replays a dropout mask.
    """
    q_len, k_len = query_layer.size(-2), key_layer.size(-2)
    att_span = position_buckets if position_buckets > 0 else max_relative_positions
    attention_scores = torch.bmm(query_layer, key_layer.transpose(-1, -2) / scale)
    relative_pos = build_relative_position(
        q_len, k_len, position_buckets, max_relative_positions
    ).unsqueeze(1)
    if "c2p" in pos_att_type:
        c2p_att = torch.bmm(query_layer, pos_key_layer.transpose(-1, -2))
        c2p_pos = torch.clamp(relative_pos + att_span, 0, att_span * 2 - 1)
        c2p_att = torch.gather(
            c2p_att,
            dim=-1,
            index=c2p_pos.squeeze(0).expand([query_layer.size(0), q_len, k_len]),
        )
        attention_scores = attention_scores + c2p_att / scale
    if "p2c" in pos_att_type:
        grid = max(q_len, k_len)
        if grid == k_len == q_len:
            r_pos = relative_pos.squeeze(1)
        else:
            r_pos = build_relative_position(grid, grid, position_buckets, max_relative_positions)
        p2c_pos = torch.clamp(-r_pos + att_span, 0, att_span * 2 - 1)[:, :k_len, :]
        p2c_att = torch.bmm(key_layer, pos_query_layer.transpose(-1, -2))
        p2c_att = torch.gather(
            p2c_att,
            dim=-1,
            index=p2c_pos.expand([query_layer.size(0), k_len, grid]),
        ).transpose(-1, -2)[:, :q_len]
        attention_scores = attention_scores + p2c_att / scale
    attention_scores = attention_scores.view(-1, heads, q_len, k_len)
    rmask = ~attention_mask.bool()
    scores = attention_scores.masked_fill(rmask, torch.finfo(attention_scores.dtype).min)
    attention_probs = torch.softmax(scores, dim=-1).masked_fill(rmask, 0)
    if keep is not None:
        attention_probs = attention_probs * keep / (1 - dropout_p)
    context = torch.bmm(attention_probs.view(-1, q_len, k_len), value_layer)
    return context.view(-1, heads, q_len, value_layer.size(-1)), attention_probs


def expand_mask(mask, batch, q_len, k_len):
    """HF's DebertaV2Encoder.get_attention_mask: [B, S] -> m_i * m_j; None -> all ones."""
    if mask is None:
        return torch.ones(batch, 1, q_len, k_len, dtype=torch.bool)
    if mask.dim() == 2:
        extended = mask.unsqueeze(1).unsqueeze(2)
        return (extended * extended.squeeze(-2).unsqueeze(-1)).bool()
    return mask.bool()


def reference(
    q,
    k,
    v,
    pos_key,
    pos_query,
    mask=None,
    *,
    pos_att_type=("c2p", "p2c"),
    position_buckets=256,
    max_relative_positions=512,
    keep=None,
    dropout_p=0.0,
    scale=None,
):
    """The op's semantics on [B, H, S, d] inputs through hf_attention; `scale` multiplies the
    scores (None: 1 / sqrt(d * (1 + number of position terms)))."""
    batch, heads, q_len, d = q.shape
    k_len = k.shape[2]

    def layer(t):  # HF's transpose_for_scores output: [B * H, S, d]
        return t.reshape(batch * heads, t.shape[2], t.shape[3])

    def pos_layer(t):  # transpose_for_scores(proj(rel_embeddings)).repeat(B, 1, 1)
        return None if t is None else t.transpose(0, 1).repeat(batch, 1, 1)

    return hf_attention(
        layer(q),
        layer(k),
        layer(v),
        pos_layer(pos_key),
        pos_layer(pos_query),
        expand_mask(mask, batch, q_len, k_len),
        pos_att_type,
        position_buckets,
        max_relative_positions,
        math.sqrt(d * (1 + len(pos_att_type))) if scale is None else divisor_of(scale),
        heads,
        keep,
        dropout_p,
    )


def divisor_of(scale):
    """HF divides the scores by its scale; the op multiplies them by its own."""
    return 1 / scale if scale != 0 else math.inf


# --------------------------------------------------------------------------- helpers
def make_inputs(batch, heads, q_len, k_len, d, span, dtype=F64, dv=None):
    def leaf(*shape):
        return torch.randn(*shape, dtype=F64).to(dtype).requires_grad_(True)

    q, k = leaf(batch, heads, q_len, d), leaf(batch, heads, k_len, d)
    v = leaf(batch, heads, k_len, dv or d)
    return q, k, v, leaf(2 * span, heads, d), leaf(2 * span, heads, d)


def span_of(position_buckets, max_relative_positions):
    return position_buckets if position_buckets > 0 else max_relative_positions


def outputs_and_grads(fn, inputs, grad_out, grad_probs):
    out, probs = fn(*inputs)
    loss = (out * grad_out).sum() + (probs * grad_probs).sum()
    grads = torch.autograd.grad(loss, inputs, allow_unused=True)
    return out, probs, grads


def assert_close_all(got, want, atol, rtol=0.0):
    for g, w in zip(got, want, strict=True):
        if w is None:
            assert g is None or not g.abs().any()
        else:
            torch.testing.assert_close(g.to(w.dtype), w, atol=atol, rtol=rtol)


def check_against_reference(inputs, mask=None, atol=1e-10, **options):
    def fused(*xs):
        return recops.disentangled_attention(*xs, mask, return_probs=True, **options)

    def ref(*xs):
        return reference(*xs, mask, **options)

    out, probs = fused(*inputs)
    grad_out, grad_probs = torch.randn_like(out, dtype=F64), torch.randn_like(probs, dtype=F64)
    got = outputs_and_grads(fused, inputs, grad_out.to(out.dtype), grad_probs.to(out.dtype))
    want = outputs_and_grads(ref, inputs, grad_out, grad_probs)
    assert_close_all(got[:2], want[:2], atol)
    assert_close_all(got[2], want[2], atol)
    return got


# --------------------------------------------------------------------------- semantics
SUBSETS = [(), ("c2p",), ("p2c",), ("c2p", "p2c")]
POSITIONS = [(-1, 6), (8, 24)]  # (position_buckets, max_relative_positions): identity, log buckets


@pytest.mark.parametrize("pos_att_type", SUBSETS)
@pytest.mark.parametrize("positions", POSITIONS)
@pytest.mark.parametrize("length", [1, 5, 40])  # 40: past the span and max_relative_positions
def test_matches_reference(pos_att_type, positions, length):
    buckets, max_rel = positions
    inputs = make_inputs(2, 3, length, length, 8, span_of(buckets, max_rel))
    check_against_reference(
        inputs,
        pos_att_type=pos_att_type,
        position_buckets=buckets,
        max_relative_positions=max_rel,
    )


@pytest.mark.parametrize(
    "length, positions, dtype",
    [
        (600, (256, 512), F64),  # HF's default bucketing
        (700, (-1, 4), F64),  # far tiles: every pair of a tile has the clamped index
        (700, (-1, 4), torch.float32),
    ],
)
def test_long_sequence_many_tiles(length, positions, dtype):
    # Several query blocks (64 rows) and key tiles (256 keys).
    buckets, max_rel = positions
    inputs = make_inputs(1, 2, length, length, 4, span_of(buckets, max_rel), dtype=dtype)
    mask = torch.arange(length)[None, :] < length - 3
    atol = 1e-9 if dtype == F64 else 5e-5
    check_against_reference(
        inputs, mask, atol=atol, position_buckets=buckets, max_relative_positions=max_rel
    )


def test_one_unit_split_into_chunks():
    # One (batch, head) pair over 4 threads: its query blocks go to several work items, whose
    # dk / dv and position-table gradients are partial sums.
    with num_threads(4):
        inputs = make_inputs(1, 1, 300, 300, 8, 16)
        check_against_reference(inputs, position_buckets=16, max_relative_positions=48)


@pytest.mark.parametrize("q_len, k_len", [(3, 11), (11, 3), (70, 20), (20, 70)])
def test_query_and_key_lengths_differ(q_len, k_len):
    inputs = make_inputs(2, 2, q_len, k_len, 8, 8)
    mask = torch.rand(2, 1, q_len, k_len) > 0.3
    for m in (None, mask):
        check_against_reference(inputs, m, position_buckets=8, max_relative_positions=24)


def test_padding_mask():
    lengths = torch.tensor([30, 25, 1, 0])
    mask = torch.arange(30)[None, :] < lengths[:, None]
    inputs = make_inputs(4, 2, 30, 30, 8, 8)
    out, probs, _ = check_against_reference(
        inputs, mask, position_buckets=8, max_relative_positions=24
    )
    # Padded query rows see no key: zero output and probabilities (HF's expanded mask m_i * m_j).
    assert not out[~mask[:, None, :, None].expand_as(out)].any()
    assert not probs[~mask[:, None, :, None].expand_as(probs)].any()


def test_padding_mask_with_holes_and_dtypes():
    mask = torch.rand(3, 17) > 0.3
    inputs = make_inputs(3, 2, 17, 17, 4, 8)
    base = recops.disentangled_attention(*inputs, mask, position_buckets=8)
    for m in (mask.long(), mask.to(F64), mask.to(torch.uint8)):
        torch.testing.assert_close(
            recops.disentangled_attention(*inputs, m, position_buckets=8), base, atol=0, rtol=0
        )
    check_against_reference(inputs, mask, position_buckets=8)


def test_dense_mask_with_fully_masked_rows():
    mask = torch.rand(2, 1, 33, 33) > 0.5
    mask[0, 0, 4] = False
    mask[1, 0, 20:] = False
    inputs = make_inputs(2, 3, 33, 33, 8, 8)
    out, probs, grads = check_against_reference(inputs, mask, position_buckets=8)
    assert not out[0, :, 4].any() and not out[1, :, 20:].any()
    assert not probs[0, :, 4].any() and not probs[1, :, 20:].any()
    assert all(torch.isfinite(g).all() for g in grads)


def test_empty_inputs():
    for batch, length in ((0, 5), (2, 0)):
        inputs = make_inputs(batch, 2, length, length, 4, 8)
        out, probs = recops.disentangled_attention(*inputs, position_buckets=8, return_probs=True)
        assert out.shape == (batch, 2, length, 4) and probs.shape == (batch, 2, length, length)
        grads = torch.autograd.grad(out.sum(), inputs, allow_unused=True)
        assert all(g is None or not g.any() for g in grads)


def test_value_head_dim_may_differ_and_noncontiguous_inputs():
    q, k, v, pk, pq = make_inputs(2, 3, 12, 12, 8, 8, dv=5)
    # [B, S, H, d] projections viewed as [B, H, S, d], as the module passes them.
    qt = q.detach().transpose(1, 2).contiguous().transpose(1, 2).requires_grad_(True)
    check_against_reference((qt, k, v, pk, pq), position_buckets=8)


def test_explicit_scale_and_unused_table_may_be_none():
    q, k, v, pk, _ = make_inputs(1, 2, 9, 9, 4, 8)
    got = recops.disentangled_attention(
        q, k, v, pk, None, pos_att_type="c2p", position_buckets=8, scale=0.3
    )
    # reference() scales by 1 / sqrt(d * (1 + terms)): rescale q to get 0.3.
    factor = 0.3 * math.sqrt(4 * 2)
    want, _ = reference(q * factor, k, v, pk, None, pos_att_type=("c2p",), position_buckets=8)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)


# --------------------------------------------------------------------------- dtypes
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_low_precision_dtypes(dtype):
    _, atol = TOLERANCE[dtype]
    low = make_inputs(2, 2, 100, 100, 16, 16, dtype=dtype)
    mask = torch.arange(100)[None, :] < torch.tensor([[100], [70]])
    out, probs = recops.disentangled_attention(
        *low, mask, position_buckets=16, max_relative_positions=48, return_probs=True
    )
    assert out.dtype == probs.dtype == dtype
    grads = torch.autograd.grad(out.float().sum() + probs.float().square().sum(), low)
    assert all(g.dtype == dtype for g in grads)
    # Against the float64 reference on the same (rounded) inputs.
    exact = [t.detach().to(F64).requires_grad_(True) for t in low]
    ref_out, ref_probs = reference(*exact, mask, position_buckets=16, max_relative_positions=48)
    ref_grads = torch.autograd.grad(ref_out.sum() + ref_probs.square().sum(), exact)
    assert_close_all((out, probs), (ref_out, ref_probs), atol)
    for g, w in zip(grads, ref_grads, strict=True):
        scale = w.abs().max().item()
        torch.testing.assert_close(g.to(F64), w, atol=atol * max(scale, 1.0), rtol=0.05)


@pytest.mark.filterwarnings("ignore:TF32 acceleration on top of oneDNN")  # mkldnn.flags' own
def test_brgemm_tile_products():
    # fp32 with S = 320 (two key tiles, five query blocks), head dim 32 and span 32: the tile
    # products run on oneDNN's brgemm micro-kernel; the padding extents 320, 160 and 200 make the
    # third batch row's last key tile ragged (sgemm) in the same call.
    low = make_inputs(3, 2, 320, 320, 32, 32, dtype=torch.float32)
    mask = torch.arange(320)[None, :] < torch.tensor([[320], [160], [200]])
    options = dict(position_buckets=32, max_relative_positions=128)
    out, probs = recops.disentangled_attention(*low, mask, return_probs=True, **options)
    grads = torch.autograd.grad(out.sum() + probs.square().sum(), low)
    exact = [t.detach().to(F64).requires_grad_(True) for t in low]
    ref_out, ref_probs = reference(*exact, mask, **options)
    ref_grads = torch.autograd.grad(ref_out.sum() + ref_probs.square().sum(), exact)
    assert_close_all((out, probs), (ref_out, ref_probs), 2e-5)
    for g, w in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(
            g.to(F64), w, atol=2e-5 * max(w.abs().max().item(), 1.0), rtol=1e-3
        )
    # With oneDNN disabled (torch.backends.mkldnn), PyTorch's brgemm falls back to sgemm.
    with torch.backends.mkldnn.flags(enabled=False):
        fallback = recops.disentangled_attention(*low, mask, **options)
    torch.testing.assert_close(fallback, out, atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------- bf16
# On CPUs with AVX512_BF16 the tile products run on bf16 operands with fp32 accumulation
# (kernels/disentangled_attention_bf16.h); elsewhere, or with RECOPS_CPU_ISA capped below
# AVX-512, bf16 computes in fp32. Accuracy rule (flash-attention's, accuracy.py): against the
# float64 reference fed the same bf16 values, recops' error (output, probabilities and every
# gradient) is at most twice the error of the reference run in bf16, on both paths.
BF16 = torch.bfloat16
DROPOUT_SEED = 1234


def check_bf16_accuracy(inputs, mask=None, dropout_p=0.0, **options):
    """recops in bf16 vs the reference in bf16, both measured against the float64 reference on the
    same bf16 values (outputs, probabilities and the gradients of a loss on both)."""
    master = [t.detach().to(BF16).to(F64) for t in inputs]
    keep = None
    if dropout_p > 0:  # the kernel's dropout mask (the same in every dtype), replayed
        torch.manual_seed(DROPOUT_SEED)
        _, probs = recops.disentangled_attention(
            *master, mask, dropout_p=dropout_p, return_probs=True, **options
        )
        keep = probs != 0

    def fused(*xs):
        torch.manual_seed(DROPOUT_SEED)
        return recops.disentangled_attention(
            *xs, mask, dropout_p=dropout_p, return_probs=True, **options
        )

    def ref(*xs):
        return reference(*xs, mask, keep=keep, dropout_p=dropout_p, **options)

    out, probs = ref(*master)
    grad_out = torch.randn_like(out).to(BF16).to(F64)
    grad_probs = torch.randn_like(probs).to(BF16).to(F64)

    def run(fn, dtype):
        leaves = [t.to(dtype).requires_grad_(True) for t in master]
        out, probs, grads = outputs_and_grads(fn, leaves, grad_out.to(dtype), grad_probs.to(dtype))
        assert out.dtype == probs.dtype == dtype
        return [out.double(), probs.double()] + [None if g is None else g.double() for g in grads]

    exact, bf16_ref, got = run(ref, F64), run(ref, BF16), run(fused, BF16)
    names = ["output", "probs", "q", "k", "v", "pos_key", "pos_query"]
    assert_errors_within_rule(names, exact, bf16_ref, got)


@pytest.mark.parametrize("pos_att_type", SUBSETS)
@pytest.mark.parametrize("positions", POSITIONS)
def test_bf16_accuracy_position_terms(pos_att_type, positions, bf16_path):
    buckets, max_rel = positions
    inputs = make_inputs(2, 3, 40, 40, 16, span_of(buckets, max_rel))
    check_bf16_accuracy(
        inputs, pos_att_type=pos_att_type, position_buckets=buckets, max_relative_positions=max_rel
    )


def bf16_masks(batch, q_len, k_len):
    lengths = torch.tensor([q_len, q_len - 9, 1, 0])[:batch]
    dense = torch.rand(batch, 1, q_len, k_len) > 0.4
    dense[0, 0, 4] = False  # a query row that sees no key
    dense[1, 0, 20:] = False
    return {
        "padding": torch.arange(q_len)[None, :] < lengths[:, None],
        "padding_with_holes": torch.rand(batch, q_len) > 0.3,
        "dense": dense,
    }


@pytest.mark.parametrize("mask", ["padding", "padding_with_holes", "dense"])
def test_bf16_accuracy_masks(mask, bf16_path):
    # 70 query rows and keys: two query blocks, padded head dims (24, 8).
    inputs = make_inputs(4, 2, 70, 70, 24, 8, dv=8)
    check_bf16_accuracy(inputs, bf16_masks(4, 70, 70)[mask], position_buckets=8)


@pytest.mark.parametrize("mask", [None, "padding_with_holes"])
def test_bf16_accuracy_dropout(mask, bf16_path):
    inputs = make_inputs(2, 2, 40, 40, 16, 8)
    m = None if mask is None else bf16_masks(2, 40, 40)[mask]
    check_bf16_accuracy(inputs, m, dropout_p=0.25, position_buckets=8, max_relative_positions=24)


@pytest.mark.parametrize(
    "q_len, k_len, d, dv, positions",
    [
        (11, 70, 8, 8, (8, 24)),  # Sq != Sk
        (70, 20, 5, 7, (-1, 6)),  # head dims off the 16-value granule
        (300, 300, 32, 32, (16, 48)),  # two key tiles, five query blocks
        (600, 600, 16, 16, (256, 512)),  # HF's default bucketing
    ],
)
def test_bf16_accuracy_lengths_and_head_dims(q_len, k_len, d, dv, positions, bf16_path):
    buckets, max_rel = positions
    inputs = make_inputs(1, 2, q_len, k_len, d, span_of(buckets, max_rel), dv=dv)
    check_bf16_accuracy(inputs, position_buckets=buckets, max_relative_positions=max_rel)


def test_bf16_accuracy_noncontiguous_and_chunked(bf16_path):
    # [B, S, H, d] projections viewed as [B, H, S, d], as the module passes them; one unit over 4
    # threads, so its query blocks go to several work items (partial dk, dv and table gradients).
    q, k, v, pk, pq = make_inputs(1, 1, 200, 200, 16, 16)
    q = q.detach().transpose(1, 2).contiguous().transpose(1, 2)
    with num_threads(4):
        check_bf16_accuracy((q, k, v, pk, pq), position_buckets=16, max_relative_positions=48)


def test_bf16_empty_inputs(bf16_path):
    for batch, length in ((0, 5), (2, 0)):
        inputs = make_inputs(batch, 2, length, length, 4, 8, dtype=BF16)
        out, probs = recops.disentangled_attention(*inputs, position_buckets=8, return_probs=True)
        assert out.dtype == probs.dtype == BF16
        assert out.shape == (batch, 2, length, 4) and probs.shape == (batch, 2, length, length)
        grads = torch.autograd.grad(out.float().sum(), inputs, allow_unused=True)
        assert all(g is None or not g.any() for g in grads)


def test_bf16_fallback_is_the_fp32_computation(monkeypatch):
    """Under the ISA cap bf16 inputs are computed in fp32 and rounded once; without it, on a CPU
    with bf16 dot products, the native path runs (and rounds its operands: other results)."""
    inputs = [t.detach() for t in make_inputs(2, 2, 70, 70, 16, 8, dtype=BF16)]
    options = dict(position_buckets=8, max_relative_positions=24)
    monkeypatch.setenv("RECOPS_CPU_ISA", "avx2")
    fallback = recops.disentangled_attention(*inputs, **options)
    fp32 = recops.disentangled_attention(*(t.float() for t in inputs), **options)
    assert torch.equal(fallback, fp32.to(BF16))
    monkeypatch.delenv("RECOPS_CPU_ISA")
    native = recops.disentangled_attention(*inputs, **options)
    if cpu_has_bf16_dot():
        assert not torch.equal(native, fallback)
    torch.testing.assert_close(native.float(), fp32, atol=2e-2, rtol=2e-2)


# --------------------------------------------------------------------------- gradcheck
@pytest.mark.parametrize("pos_att_type", [("c2p", "p2c"), ("p2c",)])
def test_gradcheck(pos_att_type):
    inputs = make_inputs(1, 2, 6, 5, 3, 4)
    mask = torch.tensor([[[[1, 1, 0, 1, 1]] * 5 + [[0, 0, 0, 0, 0]]]], dtype=torch.bool)

    def fn(*xs):
        return recops.disentangled_attention(
            *xs,
            mask,
            pos_att_type=pos_att_type,
            position_buckets=4,
            max_relative_positions=8,
            return_probs=True,
        )

    assert torch.autograd.gradcheck(fn, inputs)


def test_gradcheck_with_dropout():
    inputs = make_inputs(1, 2, 7, 7, 3, 4)

    def fn(*xs):
        out, _, probs = ops.disentangled_attention(
            *xs, None, "c2p|p2c", 4, 8, None, 0.4, 1234, True
        )
        return out, probs

    assert torch.autograd.gradcheck(fn, inputs)


# --------------------------------------------------------------------------- dropout
def test_dropout_mask_is_seeded_and_regenerated_in_backward():
    inputs = make_inputs(2, 2, 40, 40, 8, 8)
    options = dict(position_buckets=8, max_relative_positions=24, return_probs=True)
    torch.manual_seed(7)
    out_a, probs_a = recops.disentangled_attention(*inputs, dropout_p=0.25, **options)
    torch.manual_seed(7)
    out_b, probs_b = recops.disentangled_attention(*inputs, dropout_p=0.25, **options)
    torch.testing.assert_close(out_a, out_b, atol=0, rtol=0)
    out_c, _ = recops.disentangled_attention(*inputs, dropout_p=0.25, **options)
    assert not torch.equal(out_a, out_c)

    keep = probs_a != 0
    kept = keep.double().mean().item()
    assert abs(kept - 0.75) < 0.02, kept
    # Same inputs, the same mask replayed in the reference: outputs and all gradients agree.
    grad_out = torch.randn_like(out_a)
    torch.manual_seed(7)
    got = torch.autograd.grad(
        (recops.disentangled_attention(*inputs, dropout_p=0.25, **options)[0] * grad_out).sum(),
        inputs,
    )
    want_out, _ = reference(
        *inputs, keep=keep, dropout_p=0.25, position_buckets=8, max_relative_positions=24
    )
    torch.testing.assert_close(out_a, want_out, atol=1e-10, rtol=0)
    want = torch.autograd.grad((want_out * grad_out).sum(), inputs)
    assert_close_all(got, want, 1e-10)


def test_dropout_extremes():
    inputs = make_inputs(1, 2, 9, 9, 4, 8)
    plain = recops.disentangled_attention(*inputs, position_buckets=8)
    torch.testing.assert_close(
        recops.disentangled_attention(*inputs, position_buckets=8, dropout_p=0.0), plain
    )
    assert not recops.disentangled_attention(*inputs, position_buckets=8, dropout_p=1.0).any()


# --------------------------------------------------------------------------- op registration
def opcheck_cases():
    q, k, v, pk, pq = make_inputs(2, 2, 9, 7, 4, 4, dtype=torch.float32)
    mask = torch.rand(2, 1, 9, 7) > 0.2
    pk_default, pq_default = make_inputs(1, 2, 1, 1, 4, 256, dtype=torch.float32)[3:]
    yield (q, k, v, pk_default, pq_default), {}
    yield (q, k, v, pk, pq, mask, "c2p", 4, 8, 0.5, 0.0, 0, True), {}
    yield (q, k, v, None, pq, None, "p2c", -1, 4, None, 0.3, 5, False), {}


@pytest.mark.parametrize("case", range(3))
@pytest.mark.parametrize("name", ["disentangled_attention", "disetangle_attention"])
def test_opcheck(name, case):
    args, kwargs = list(opcheck_cases())[case]
    torch.library.opcheck(getattr(ops, name), args, kwargs)


def test_opcheck_backward():
    q, k, v, pk, pq = (t.detach() for t in make_inputs(1, 2, 8, 8, 4, 4, dtype=torch.float32))
    out, lse, probs = ops.disentangled_attention(
        q, k, v, pk, pq, None, "c2p|p2c", 4, 8, None, 0.0, 0, True
    )
    args = (
        torch.randn_like(out),
        torch.randn_like(probs),
        q,
        k,
        v,
        pk,
        pq,
        None,
        out,
        lse,
        probs,
        "c2p|p2c",
        4,
        8,
    )
    torch.library.opcheck(ops.disentangled_attention_backward, args)


def test_alias_matches():
    inputs = make_inputs(1, 2, 10, 10, 4, 8)
    a = ops.disetangle_attention(*inputs, None, "c2p|p2c", 8, 24)[0]
    b = ops.disentangled_attention(*inputs, None, "c2p|p2c", 8, 24)[0]
    torch.testing.assert_close(a, b, atol=0, rtol=0)
    ga = torch.autograd.grad(a.sum(), inputs)
    gb = torch.autograd.grad(b.sum(), inputs)
    assert_close_all(ga, gb, 0)


# --------------------------------------------------------------------------- log buckets
# Power-of-two bucket sizes with max_position 2 or 4 times the bucket size, 512 or 1024 (HF's
# default (256, 512) among them): the op's correctly rounded float32 logarithms and torch's give
# the same buckets on every distance below 2^14 (kernels/deberta_positions.h).
LOG_BUCKET_CONFIGS = [
    (bucket, max_position)
    for bucket in (2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
    for max_position in sorted({2 * bucket, 4 * bucket, 512, 1024})
    if max_position - 1 > bucket // 2
]


@pytest.mark.parametrize("bucket_size, max_position", LOG_BUCKET_CONFIGS)
def test_log_bucket_position_matches_hf(bucket_size, max_position):
    rel = torch.arange(-(2**14), 2**14 + 1)
    want = make_log_bucket_position(rel, bucket_size, max_position).to(torch.long)
    got = ops.deberta_log_bucket_position(rel, bucket_size, max_position)
    assert got.dtype == torch.long
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    # int32 input, any shape; the Python helper returns HF's float result.
    rel2 = rel[:1000].view(10, 100).to(torch.int32)
    torch.testing.assert_close(
        ops.deberta_log_bucket_position(rel2, bucket_size, max_position), want[:1000].view(10, 100)
    )
    torch.testing.assert_close(
        recops.deberta.make_log_bucket_position(rel2, bucket_size, max_position),
        make_log_bucket_position(rel2.long(), bucket_size, max_position),
        atol=0,
        rtol=0,
    )


def test_log_bucket_position_op_registration():
    rel = torch.arange(-40, 41).view(9, 9)
    meta = ops.deberta_log_bucket_position(rel.to("meta", torch.int32), 8, 24)
    assert meta.shape == rel.shape and meta.dtype == torch.long
    assert ops.deberta_log_bucket_position(torch.empty(0, 3, dtype=torch.long), 8, 24).shape == (
        0,
        3,
    )


@pytest.mark.parametrize(
    "rel, bucket_size, max_position, error, match",
    [
        (torch.arange(4.0), 8, 24, RuntimeError, r"relative_pos must be int32 or int64"),
        (torch.arange(4), 1, 24, ValueError, r"bucket_size >= 2"),
        (torch.arange(4), 8, 5, ValueError, r"max_position > bucket_size / 2 \+ 1, got 8 and 5"),
        (torch.arange(4), 0, 0, ValueError, r"got 0 and 0"),
    ],
)
def test_log_bucket_position_bad_input(rel, bucket_size, max_position, error, match):
    with pytest.raises(error, match=match):
        ops.deberta_log_bucket_position(rel, bucket_size, max_position)


# --------------------------------------------------------------------------- bad input
def bad_input_cases():
    def base():
        return dict(
            q=torch.randn(2, 3, 5, 4),
            k=torch.randn(2, 3, 6, 4),
            v=torch.randn(2, 3, 6, 4),
            pos_key=torch.randn(16, 3, 4),
            pos_query=torch.randn(16, 3, 4),
            attention_mask=None,
            position_buckets=8,
        )

    cases = [
        (dict(k=torch.randn(2, 3, 6, 5)), RuntimeError, r"q and k must have the same head dim"),
        (dict(q=torch.randn(2, 3, 5)), RuntimeError, r"q must be 4-D"),
        (dict(v=torch.randn(2, 3, 7, 4)), RuntimeError, r"k and v must have the same length"),
        (dict(k=torch.randn(2, 2, 6, 4)), RuntimeError, r"must share batch and head dims"),
        (dict(v=torch.randn(2, 3, 6, 4).double()), RuntimeError, r"q and v must share one dtype"),
        (dict(q=torch.ones(2, 3, 5, 4, dtype=torch.long)), RuntimeError, r"q must be float32"),
        (dict(pos_key=torch.randn(12, 3, 4)), RuntimeError, r"pos_key must have shape \[2 \* span"),
        (dict(pos_query=torch.randn(16, 3, 5)), RuntimeError, r"pos_query must have shape"),
        (dict(pos_key=None), RuntimeError, r"contains 'c2p' but pos_key is None"),
        (dict(pos_key=torch.randn(16, 3, 4).double()), RuntimeError, r"share one dtype"),
        (dict(attention_mask=torch.ones(2, 5)), RuntimeError, r"2-D attention_mask is a padding"),
        (
            dict(attention_mask=torch.ones(2, 1, 5, 5)),
            RuntimeError,
            r"attention_mask must be \[B, S\] or \[B, 1, Sq, Sk\] = \[2, 1, 5, 6\]",
        ),
        (dict(pos_att_type=("c2p", "p2p")), ValueError, r"pos_att_type must be a '\|'-separated"),
        (dict(dropout_p=1.5), ValueError, r"dropout_p must be in \[0, 1\]"),
        (dict(position_buckets=-1, max_relative_positions=0), ValueError, r"position terms need"),
        (dict(position_buckets=1), ValueError, r"position_buckets >= 2"),
        (dict(max_relative_positions=5), ValueError, r"max_relative_positions > position_buck"),
        # HF's log bucketing divides by log((max_relative_positions - 1) / (buckets / 2)) <= 0.
        (dict(max_relative_positions=4), ValueError, r"buckets / 2 \+ 1, got 8 and 4"),
        (dict(max_relative_positions=2), ValueError, r"buckets / 2 \+ 1, got 8 and 2"),
        # Log buckets without a maximum position (HF's module substitutes max_position_embeddings
        # for a value below 1 before it gets here).
        (dict(max_relative_positions=0), ValueError, r"buckets / 2 \+ 1, got 8 and 0"),
        (dict(max_relative_positions=-1), ValueError, r"buckets / 2 \+ 1, got 8 and -1"),
        (dict(scale=float("nan")), ValueError, r"scale must be a finite number.*got nan"),
        (dict(scale=float("-inf")), ValueError, r"scale must be a finite number.*got -inf"),
        (dict(scale=1e39), ValueError, r"scale must be a finite number in float32's range"),
    ]
    for change, error, match in cases:
        kwargs = base()
        if "max_relative_positions" in change and change.get("position_buckets", 8) > 0:
            kwargs["pos_key"] = kwargs["pos_query"] = torch.randn(16, 3, 4)
        kwargs.update(change)
        yield pytest.param(kwargs, error, match, id=match[:40])


@pytest.mark.parametrize("kwargs, error, match", list(bad_input_cases()))
def test_bad_input(kwargs, error, match):
    args = [kwargs.pop(n) for n in ("q", "k", "v", "pos_key", "pos_query", "attention_mask")]
    with pytest.raises(error, match=match):
        recops.disentangled_attention(*args, **kwargs)


def test_nan_scores_give_nan_as_in_torch():
    """A query row whose kept scores are all NaN gives NaN output (and NaN probabilities at its
    kept keys, zero at the masked ones), as torch's softmax does; the kernel's row max skipped the
    NaNs and returned the zeros of a fully masked row."""
    q, k, v, pos_key, pos_query = (t.detach() for t in make_inputs(2, 2, 3, 3, 4, 4))
    q[0, 1, 2] = math.nan
    mask = torch.ones(2, 1, 3, 3, dtype=torch.bool)
    mask[0, 0, 2, 0] = False
    for m in (None, mask):
        out, probs = recops.disentangled_attention(
            q, k, v, pos_key, pos_query, m, position_buckets=4, return_probs=True
        )
        want_out, want_probs = reference(q, k, v, pos_key, pos_query, m, position_buckets=4)
        assert out[0, 1, 2].isnan().all() and not out[0, 1, :2].isnan().any()
        torch.testing.assert_close(out, want_out, equal_nan=True)
        torch.testing.assert_close(probs, want_probs.view(probs.shape), equal_nan=True)


def test_backward_checks_the_forward_results():
    q, k, v = torch.randn(2, 3, 5, 4), torch.randn(2, 3, 6, 4), torch.randn(2, 3, 6, 4)
    tables = (torch.randn(16, 3, 4), torch.randn(16, 3, 4))
    out, lse, _ = ops.disentangled_attention(q, k, v, *tables, None, "c2p|p2c", 8)
    grad = torch.ones_like(out)
    cases = [
        (dict(softmax_lse=lse.long()), r"softmax_lse must be the forward's log-sum-exp, in Float"),
        (dict(softmax_lse=lse.half()), r"softmax_lse must be .* in Float, got Half"),
        (dict(grad_output=grad.long()), r"grad_output must be float32"),
        (dict(output=out.int()), r"output must be float32"),
    ]
    for change, match in cases:
        args = {"grad_output": grad, "output": out, "softmax_lse": lse, **change}
        with pytest.raises(RuntimeError, match=match):
            ops.disentangled_attention_backward(
                args["grad_output"],
                None,
                q,
                k,
                v,
                *tables,
                None,
                args["output"],
                args["softmax_lse"],
                None,
                "c2p|p2c",
                8,
            )


# --------------------------------------------------------------------------- module
def make_config(**overrides):
    config = dict(
        hidden_size=32,
        num_attention_heads=4,
        relative_attention=True,
        pos_att_type=["p2c", "c2p"],
        share_att_key=False,
        position_buckets=8,
        max_relative_positions=24,
        max_position_embeddings=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    config.update(overrides)
    return SimpleNamespace(**config)


def hf_module_reference(module, config, hidden_states, attention_mask, rel_embeddings):
    """HF's DisentangledSelfAttention.forward with the module's own weights."""
    heads = config.num_attention_heads
    pos_att_type = config.pos_att_type
    if isinstance(pos_att_type, str):
        pos_att_type = [x.strip() for x in pos_att_type.lower().split("|")]

    def transpose_for_scores(x):
        x = x.view(x.size()[:-1] + (heads, -1))
        return x.permute(0, 2, 1, 3).contiguous().view(-1, x.size(1), x.size(-1))

    batch = hidden_states.shape[0]
    query_layer = transpose_for_scores(module.query_proj(hidden_states))
    key_layer = transpose_for_scores(module.key_proj(hidden_states))
    value_layer = transpose_for_scores(module.value_proj(hidden_states))
    terms = pos_att_type if config.relative_attention else []
    # HF counts the terms even without relative attention, and takes the square root in float32.
    scale_factor = 1 + ("c2p" in pos_att_type) + ("p2c" in pos_att_type)
    head_size = torch.tensor(query_layer.size(-1), dtype=torch.float)
    scale = float(torch.sqrt(head_size * scale_factor))
    buckets, max_rel = config.position_buckets, config.max_relative_positions
    span = buckets if buckets > 0 else max_rel
    rel = rel_embeddings[: 2 * span].unsqueeze(0)
    share = config.share_att_key
    pos_key_layer = pos_query_layer = None
    if "c2p" in terms:
        proj = module.key_proj if share else module.pos_key_proj
        pos_key_layer = transpose_for_scores(proj(rel)).repeat(batch, 1, 1)
    if "p2c" in terms:
        proj = module.query_proj if share else module.pos_query_proj
        pos_query_layer = transpose_for_scores(proj(rel)).repeat(batch, 1, 1)
    context, probs = hf_attention(
        query_layer,
        key_layer,
        value_layer,
        pos_key_layer,
        pos_query_layer,
        attention_mask,
        terms,
        buckets,
        max_rel,
        scale,
        heads,
    )
    return context.permute(0, 2, 1, 3).reshape(batch, hidden_states.shape[1], -1), probs


HF_NAMES = {
    "query_proj.weight",
    "query_proj.bias",
    "key_proj.weight",
    "key_proj.bias",
    "value_proj.weight",
    "value_proj.bias",
}


@pytest.mark.parametrize(
    "overrides, extra_names",
    [
        (
            {},
            {
                "pos_key_proj.weight",
                "pos_key_proj.bias",
                "pos_query_proj.weight",
                "pos_query_proj.bias",
            },
        ),
        ({"share_att_key": True, "pos_att_type": "p2c|c2p"}, set()),
        (
            {"pos_att_type": ["c2p"], "position_buckets": -1},
            {"pos_key_proj.weight", "pos_key_proj.bias"},
        ),
        ({"relative_attention": False}, set()),
    ],
)
def test_module_matches_hf_layer(overrides, extra_names):
    config = make_config(**overrides)
    module = recops.DisentangledSelfAttention(config).double()
    assert {
        name: p.shape for name, p in module.state_dict().items()
    }.keys() == HF_NAMES | extra_names
    for name, p in module.state_dict().items():
        assert p.shape == ((32,) if name.endswith("bias") else (32, 32))
    hidden = torch.randn(2, 21, 32, dtype=F64, requires_grad=True)
    rel_embeddings = torch.randn(2 * 24 + 5, 32, dtype=F64)
    mask = torch.ones(2, 21)
    mask[1, 15:] = 0
    mask4 = expand_mask(mask, 2, 21, 21).to(torch.uint8)
    context, probs = module(hidden, mask4, True, rel_embeddings=rel_embeddings)
    ref_context, ref_probs = hf_module_reference(module, config, hidden, mask4, rel_embeddings)
    torch.testing.assert_close(context, ref_context, atol=1e-12, rtol=0)
    torch.testing.assert_close(probs, ref_probs, atol=1e-12, rtol=0)
    g = torch.randn_like(context)
    got = torch.autograd.grad((context * g).sum(), [hidden, *module.parameters()])
    want = torch.autograd.grad((ref_context * g).sum(), [hidden, *module.parameters()])
    assert_close_all(got, want, 1e-10)
    # A [B, S] padding mask means the same; output_attentions=False gives no probabilities.
    context2, none = module(hidden, mask, rel_embeddings=rel_embeddings)
    assert none is None
    torch.testing.assert_close(context2, context, atol=0, rtol=0)


def test_module_relative_pos_and_training():
    config = make_config(attention_probs_dropout_prob=0.2, hidden_dropout_prob=0.1)
    module = recops.DisentangledSelfAttention(config)
    hidden = torch.randn(2, 13, 32, requires_grad=True)
    rel_embeddings = torch.randn(16, 32)
    mask = torch.ones(2, 13)
    default = recops.deberta.build_relative_position(13, 13, 8, 24)
    torch.testing.assert_close(default, build_relative_position(13, 13, 8, 24), atol=0, rtol=0)
    module.eval()
    a, _ = module(hidden, mask, relative_pos=default, rel_embeddings=rel_embeddings)
    b, _ = module(hidden, mask, rel_embeddings=rel_embeddings)
    torch.testing.assert_close(a, b, atol=0, rtol=0)
    with pytest.raises(ValueError, match="relative_pos differs"):
        module(hidden, mask, relative_pos=default + 1, rel_embeddings=rel_embeddings)
    module.train()
    c, _ = module(hidden, mask, rel_embeddings=rel_embeddings)
    assert not torch.equal(c, b)
    c.sum().backward()
    assert hidden.grad is not None and module.pos_key_proj.weight.grad is not None
