"""HSTU attention (issue 4): recops' fused kernel vs a reference that follows
generative-recommenders' PyTorch code op for op, both in the input dtype, autograd for the
reference's backward.

- The attention follows `pytorch_hstu_mha` (generative_recommenders/ops/pytorch/
  pt_hstu_attention.py): jagged_to_padded_dense viewed as [B, H, N, D], einsum to [B, H, N, N],
  `* alpha`, `silu(.) / N`, times the [1, N, N] mask it builds on every call (`valid_causal_mask`:
  the causal case of its `_get_valid_attn_mask`), einsum back, dense_to_jagged.
- The relative bias follows the research model's `RelativeBucketedTimeAndPositionBasedBias`
  (generative_recommenders/research/modeling/sequential/hstu.py) with the bucketization lambda that
  file configures: the position bias by padding, repeating and slicing `pos_w`, the time bias by
  `index_select` on float32 log buckets; it is added to the scores before the SiLU, as that file's
  `_hstu_attention_maybe_from_cache` does.

How the cost was checked: the upstream functions themselves (imported from a checkout of
generative-recommenders) and `reference` were timed interleaved in one process, fp32 and bf16,
fwd and fwd+bwd, at both shapes; docs/hstu_attention.md gives the ratios and conditions.

Timestamps past each sequence's end repeat its last one, so upstream's convention (the last
position's query time is the next, padded, timestamp) and recops' (the last position uses its own,
docs/ops.md section 3) give the same bias."""

import functools

import torch
import torch.nn.functional as F
from harness import measure_fwd_bwd

import recops

SHAPES = [(8, 512), (2, 2048)]  # (B, N); H = 2, D = 64, lengths uniform in [N/2, N]
HEADS, HEAD_DIM = 2, 64
NUM_BUCKETS = 128
ALPHA = 1.0


def valid_causal_mask(n):
    """[1, N, N] bool: j <= i, built as `_get_valid_attn_mask(causal=True)` builds it."""
    ids = torch.arange(0, n).view(1, n)
    row_ids = ids.view(n, 1).expand(n, n)
    col_ids = row_ids.t()
    row_col_dist = row_ids.view(1, n, n) - col_ids.view(1, n, n)
    eye = torch.eye(n, dtype=torch.bool).view(1, n, n)
    return torch.logical_or(eye, row_col_dist > 0)


def log_buckets(dt):
    """The research model's bucketization: floor(ln(max(|dt|, 1)) / 0.301), in float32."""
    return (torch.log(torch.abs(dt).clamp(min=1)) / 0.301).long()


def position_bias(pos_w, n):
    """[1, N, N]: pos_w[N - 1 + j - i], by padding, repeating and slicing the table."""
    t = F.pad(pos_w[: 2 * n - 1], [0, n]).repeat(n)
    t = t[..., :-n].reshape(1, n, 3 * n - 2)
    r = (2 * n - 1) // 2
    return t[:, :, r:-r]


def time_bias(ts, ts_w, n):
    """[B, N, N]: ts_w[bucket(ts[i + 1] - ts[j])], the last query using the last timestamp."""
    ext = torch.cat([ts, ts[:, n - 1 : n]], dim=1)
    buckets = torch.clamp(
        log_buckets(ext[:, 1:].unsqueeze(2) - ext[:, :-1].unsqueeze(1)), min=0, max=NUM_BUCKETS
    ).detach()
    return torch.index_select(ts_w, dim=0, index=buckets.view(-1)).view(ts.size(0), n, n)


def pad_heads(t, offsets, n):
    """Jagged [L, H, D] -> padded [B, H, N, D] (a transposed view, as upstream's _pad_qkv)."""
    rows, heads, dim = t.shape
    padded = torch.ops.fbgemm.jagged_to_padded_dense(
        values=t.reshape(rows, heads * dim), offsets=[offsets], max_lengths=[n], padding_value=0.0
    )
    return padded.view(-1, n, heads, dim).transpose(1, 2)


def reference(q, k, v, offsets, n, timestamps=None, ts_w=None, pos_w=None):
    rows, heads, dv = v.shape
    qp, kp, vp = (pad_heads(t, offsets, n) for t in (q, k, v))
    scores = torch.einsum("bhxa,bhya->bhxy", qp, kp) * ALPHA
    if ts_w is not None:
        scores = scores + (position_bias(pos_w, n) + time_bias(timestamps, ts_w, n)).unsqueeze(1)
    attn = F.silu(scores) / n
    attn = attn * valid_causal_mask(n).unsqueeze(1)
    out = torch.einsum("bhxd,bhdv->bhxv", attn, vp)
    return torch.ops.fbgemm.dense_to_jagged(out.transpose(1, 2).flatten(2, 3), [offsets], rows)[
        0
    ].view(rows, heads, dv)


def fused(q, k, v, offsets, n, timestamps=None, ts_w=None, pos_w=None):
    return recops.hstu_attention(
        q, k, v, offsets, n, alpha=ALPHA, timestamps=timestamps, ts_w=ts_w, pos_w=pos_w
    )


def _query_key_deltas(ts, n):
    ext = torch.cat([ts, ts[:, n - 1 : n]], dim=1)
    return ext[:, 1:].unsqueeze(2) - ext[:, :-1].unsqueeze(1)


def _timestamps(lengths, n):
    """[B, N] increasing timestamps; positions past a sequence's end repeat its last one. Redrawn
    where a query-key delta falls where float32 log buckets (upstream's, and the reference's) and
    float64 ones (recops', docs/ops.md section 3) disagree (a few deltas per million), so that
    both sides bucket alike."""
    ts = torch.randint(0, 10**6, (lengths.numel(), n)).sort(dim=1).values
    last = ts.gather(1, (lengths - 1).clamp(min=0).unsqueeze(1))
    past_end = torch.arange(n)[None, :] >= lengths[:, None]
    ts = torch.where(past_end, last, ts)
    valid = ~past_end
    pairs = valid[:, :, None] & valid[:, None, :]
    for _ in range(100):
        dt = _query_key_deltas(ts, n).abs().clamp(min=1)
        disagree = pairs & (log_buckets(dt) != (torch.log(dt.double()) / 0.301).long())
        if not disagree.any():
            return ts
        b, _, j = disagree.nonzero(as_tuple=True)  # move the key times of those pairs
        ts[b, j] += torch.randint(1, 100, b.shape)
        ts = ts.sort(dim=1).values
        ts = torch.where(past_end, ts.gather(1, (lengths - 1).clamp(min=0).unsqueeze(1)), ts)
    raise RuntimeError("could not draw timestamps on which both bucket conventions agree")


def _inputs(batch, n, with_bias):
    """float32 q, k, v (and the relative bias's timestamps and tables), offsets and lengths; the
    suites cast them to each dtype (in_dtype), so both dtypes of a shape run on the same work."""
    lengths = torch.randint(n // 2, n + 1, (batch,))
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    total = int(offsets[-1])
    qkv = [0.5 * torch.randn(total, HEADS, HEAD_DIM) for _ in range(3)]
    extra = {}
    if with_bias:
        extra = dict(
            timestamps=_timestamps(lengths, n),
            ts_w=0.02 * torch.randn(NUM_BUCKETS + 1),
            pos_w=0.02 * torch.randn(2 * n - 1),
        )
    return qkv, offsets, lengths, extra


def in_dtype(qkv, extra, dtype):
    """(qkv, extra) with every float tensor cast to `dtype` as a leaf that requires grad."""

    def leaf(t):
        return t.to(dtype).requires_grad_(True) if t.is_floating_point() else t

    return [leaf(t) for t in qkv], {name: leaf(t) for name, t in extra.items()}


def _leaves(qkv, extra):
    return qkv + [t for t in extra.values() if t.requires_grad]


def run(limits):
    torch.manual_seed(0)
    rows = []
    for batch, n in SHAPES:
        for with_bias in (False, True):
            inputs, offsets, lengths, extras = _inputs(batch, n, with_bias)
            fwd_flops = 2 * HEADS * 2 * HEAD_DIM * float((lengths.double() ** 2).sum()) / 2
            fp32_case = None
            for dtype in (torch.float32, torch.bfloat16):
                qkv, extra = in_dtype(inputs, extras, dtype)
                bias = " +rel-bias" if with_bias else ""
                case = f"B={batch} N={n} {str(dtype).split('.')[-1]}{bias}"
                impls = {
                    name: functools.partial(fn, *qkv, offsets, n, **extra)
                    for name, fn in (("reference", reference), ("recops", fused))
                }
                leaves = _leaves(qkv, extra)
                rows += measure_fwd_bwd(
                    "hstu", case, impls, leaves, dtype, fwd_flops, 2.5, fp32_case=fp32_case
                )
                fp32_case = fp32_case or case
    return rows
