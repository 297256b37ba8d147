"""Plain-PyTorch reference of HSTU attention (docs/ops.md section 4), written independently of the
kernels: pad each sequence, build the [H, n, n] scores and the mask element by element."""

import torch


def hstu_mask(
    n, contextual_seq_len=0, num_targets=0, target_group_size=1, max_attn_len=0, causal=True
):
    c, t, g, w = contextual_seq_len, num_targets, target_group_size, max_attn_len
    p = torch.arange(n)
    ids = (p - c + 1).clamp(min=0) if c > 0 else p
    top = n - t - (c - 1 if c > 0 else 0)
    ids = torch.minimum(ids, torch.tensor(top))
    d = ids[:, None] - ids[None, :]
    if not causal:
        d = d.abs()
    mask = (torch.eye(n, dtype=torch.bool) | (d > 0)) & ((w == 0) | (d <= w))
    if c > 0:
        mask |= (ids[:, None] == 0) & (ids[None, :] < top)
    if g > 1 and t > 0:
        first = n - t
        i, j = p[:, None], p[None, :]
        same_group = (i >= first) & (j >= first) & ((i - first) // g == (j - first) // g)
        if causal:
            same_group &= j <= i
        mask |= same_group
    return mask


def time_buckets(tq, ts, divisor=0.301, num_buckets=128):
    dt = (tq[:, None] - ts[None, :]).abs().clamp(min=1)
    return (torch.log(dt.double()) / divisor).long().clamp(0, num_buckets)


def relative_bias(ts, ts_w, pos_w, max_seq_len, query_time_shift=True, divisor=0.301):
    n = ts.shape[0]
    tq = torch.cat([ts[1:], ts[-1:]]) if query_time_shift and n > 0 else ts
    buckets = time_buckets(tq, ts, divisor, ts_w.shape[0] - 1)
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    return ts_w[buckets] + pos_w[max_seq_len - 1 + j - i]


def hstu_reference(
    q,
    k,
    v,
    seq_offsets,
    max_seq_len,
    *,
    lengths=None,
    alpha=1.0,
    silu_scale=None,
    mask="causal",
    contextual_seq_len=0,
    num_targets=None,
    target_group_size=1,
    max_attn_len=0,
    attn_bias=None,
    timestamps=None,
    ts_w=None,
    pos_w=None,
    query_time_shift=True,
    bucket_divisor=0.301,
):
    """q, k [L, H, Dqk], v [L, H, Dv] jagged; returns [L, H, Dv] (rows outside sequences 0)."""
    if silu_scale is None:
        silu_scale = 1.0 / max(max_seq_len, 1)
    out = torch.zeros(q.shape[0], q.shape[1], v.shape[2], dtype=q.dtype)
    outs = []
    for b in range(seq_offsets.numel() - 1):
        start = int(seq_offsets[b])
        n = int(lengths[b]) if lengths is not None else int(seq_offsets[b + 1]) - start
        qb, kb, vb = q[start : start + n], k[start : start + n], v[start : start + n]
        s = alpha * torch.einsum("ihd,jhd->hij", qb, kb)
        if attn_bias is not None:
            bias = attn_bias.expand(seq_offsets.numel() - 1, q.shape[1], max_seq_len, max_seq_len)
            s = s + bias[b, :, :n, :n]
        if ts_w is not None:
            ts = timestamps[b, :n] if timestamps.dim() == 2 else timestamps[start : start + n]
            s = s + relative_bias(ts, ts_w, pos_w, max_seq_len, query_time_shift, bucket_divisor)
        if isinstance(mask, torch.Tensor):
            m = mask.expand(seq_offsets.numel() - 1, q.shape[1], max_seq_len, max_seq_len)
            m = m[b, :, :n, :n].to(s.dtype)
        else:
            t = 0 if num_targets is None else int(num_targets[b])
            m = hstu_mask(
                n, contextual_seq_len, t, target_group_size, max_attn_len, causal=mask == "causal"
            ).to(s.dtype)
        a = torch.nn.functional.silu(s) * silu_scale * m
        outs.append((start, n, torch.einsum("hij,jhd->ihd", a, vb)))
    for start, n, o in outs:
        out = out.index_copy(0, torch.arange(start, start + n), o) if n else out
    return out
