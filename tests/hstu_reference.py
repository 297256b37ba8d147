"""Plain-PyTorch references of HSTU attention (docs/ops.md section 4) and FuXi-alpha attention
(section 5), written independently of the kernels: per sequence, build the [H, n, n] scores and
the mask element by element. The tests and op_cases.py share them."""

import torch
import torch.nn.functional as F


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


def sequences(seq_offsets, lengths=None):
    """(b, first row, length) per sequence; lengths (the dense layout's) override the offsets'."""
    for b in range(seq_offsets.numel() - 1):
        start = int(seq_offsets[b])
        n = int(lengths[b]) if lengths is not None else int(seq_offsets[b + 1]) - start
        yield b, start, n


def masked_silu(s, m, structured):
    """silu(s) * m. Under a structured mask (hstu_mask's rules) the hidden scores are replaced by
    zeros before and after the SiLU, as the fused kernels (these and generative-recommenders'
    Triton ones) skip them: a NaN or inf score a query row cannot see reaches neither its output
    nor, through the SiLU's backward, its gradients. A custom mask multiplies, weights and all."""
    if not structured:
        return F.silu(s) * m
    visible = m != 0
    return torch.where(visible, F.silu(torch.where(visible, s, torch.zeros_like(s))), 0.0) * m


def sequence_mask(mask, b, n, shape, num_targets, rule, dtype):
    """Sequence b's [H or 1, n, n] mask: the corner of a custom mask expanded to shape
    [B, H, N, N], or hstu_mask's "causal" / "none" rule with
    rule = (contextual_seq_len, target_group_size, max_attn_len)."""
    if isinstance(mask, torch.Tensor):
        return mask.expand(shape)[b, :, :n, :n].to(dtype)
    c, g, w = rule
    t = 0 if num_targets is None else int(num_targets[b])
    return hstu_mask(n, c, t, g, w, causal=mask == "causal").to(dtype)


def scatter_rows(out, pieces):
    """out with rows [start, start + n) replaced by each (start, n, rows) piece, out of place so
    gradients flow to the pieces."""
    for start, n, rows in pieces:
        if n:
            out = out.index_copy(0, torch.arange(start, start + n), rows)
    return out


def reference_bucket(delta_magnitude, divisor=0.301, num_buckets=128):
    """clamp(floor(ln(max(|dt|, 1)) / divisor), 0, nb) with torch.log in float64."""
    q = torch.log(delta_magnitude.double().clamp(min=1)) / divisor
    return q.floor().clamp(0, num_buckets).long()


def magnitudes(query, keys):
    """|query - key| for every pair: exact in int64 for integer timestamps, float64 otherwise."""
    if query.dtype.is_floating_point:
        return (query.double()[:, None] - keys.double()[None, :]).abs()
    return (query.long()[:, None] - keys.long()[None, :]).abs()


def reference_pos_bias(pos_w, n):
    """[1, N, N] with bias[i, j] = pos_w[N - 1 + j - i], built like HSTU's research code: pad the
    table, tile it N times, cut the tiling into rows of 3N - 2 and take the middle columns."""
    t = F.pad(pos_w[: 2 * n - 1], [0, n]).repeat(n)
    t = t[..., :-n].reshape(1, n, 3 * n - 2)
    r = (2 * n - 1) // 2
    return t[..., r : 3 * n - 2 - r]


def time_buckets(tq, ts, divisor=0.301, num_buckets=128):
    """[n, n] buckets of |tq[i] - ts[j]|."""
    return reference_bucket(magnitudes(tq, ts), divisor, num_buckets)


def relative_bias(ts, ts_w, pos_w, max_seq_len, query_time_shift=True, divisor=0.301):
    n = ts.shape[0]
    tq = torch.cat([ts[1:], ts[-1:]]) if query_time_shift and n > 0 else ts
    buckets = time_buckets(tq, ts, divisor, ts_w.shape[0] - 1)
    if n == 0:
        return ts_w[buckets]
    return ts_w[buckets] + reference_pos_bias(pos_w, max_seq_len)[0, :n, :n]


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
    batch, heads = seq_offsets.numel() - 1, q.shape[1]
    shape = (batch, heads, max_seq_len, max_seq_len)
    rule = (contextual_seq_len, target_group_size, max_attn_len)
    pieces = []
    for b, start, n in sequences(seq_offsets, lengths):
        qb, kb, vb = q[start : start + n], k[start : start + n], v[start : start + n]
        s = alpha * torch.einsum("ihd,jhd->hij", qb, kb)
        if attn_bias is not None:
            s = s + attn_bias.expand(shape)[b, :, :n, :n]
        if ts_w is not None:
            ts = timestamps[b, :n] if timestamps.dim() == 2 else timestamps[start : start + n]
            s = s + relative_bias(ts, ts_w, pos_w, max_seq_len, query_time_shift, bucket_divisor)
        m = sequence_mask(mask, b, n, shape, num_targets, rule, s.dtype)
        a = masked_silu(s, m, isinstance(mask, str)) * silu_scale
        pieces.append((start, n, torch.einsum("hij,jhd->ihd", a, vb)))
    return scatter_rows(q.new_zeros(q.shape[0], heads, v.shape[2]), pieces)


def table_biases(timestamps, seq_offsets, ts_w, pos_w, n, query_time_shift=True, divisor=0.301):
    """FuXi's fused tables as the dense biases they stand for: ts_bias [B, N, N] (zero outside a
    sequence) and pos_bias [1, N, N], from jagged timestamps."""
    batch = seq_offsets.numel() - 1
    ts_bias = torch.zeros(batch, n, n, dtype=ts_w.dtype)
    for b, start, length in sequences(seq_offsets):
        if length == 0:
            continue
        ts = timestamps[start : start + length]
        tq = torch.cat([ts[1:], ts[-1:]]) if query_time_shift else ts
        ts_bias[b, :length, :length] = ts_w[time_buckets(tq, ts, divisor, ts_w.numel() - 1)]
    return ts_bias, reference_pos_bias(pos_w, n) if n else pos_w.new_zeros(1, 0, 0)


def fuxi_reference(
    q,
    k,
    v,
    seq_offsets,
    max_seq_len,
    *,
    lengths=None,
    ts_bias=None,
    pos_bias=None,
    alpha=1.0,
    silu_scale=None,
    mask="causal",
    num_targets=None,
    contextual_seq_len=0,
    target_group_size=1,
    max_attn_len=0,
    reference_layout=False,
):
    """FuXi-alpha (docs/ops.md section 5), per sequence: the semantic, time and position channels
    as materialised einsums, side by side per row ([L, C * H * Dv]; rows outside sequences 0).
    ts_bias is [B or 1, N, N], pos_bias [1, N, N]; reference_layout interleaves the channels per
    head in the order position, time, semantic."""
    if silu_scale is None:
        silu_scale = 1.0 / max(max_seq_len, 1)
    batch, heads, dv = seq_offsets.numel() - 1, q.shape[1], v.shape[2]
    shape = (batch, heads, max_seq_len, max_seq_len)
    rule = (contextual_seq_len, target_group_size, max_attn_len)
    pieces = []
    for b, start, n in sequences(seq_offsets, lengths):
        qb, kb, vb = q[start : start + n], k[start : start + n], v[start : start + n]
        m = sequence_mask(mask, b, n, shape, num_targets, rule, q.dtype).expand(heads, n, n)
        a = masked_silu(alpha * torch.einsum("ihd,jhd->hij", qb, kb), m, isinstance(mask, str))
        channels = {"semantic": torch.einsum("hij,jhd->ihd", a * silu_scale, vb)}
        if ts_bias is not None:
            bias = ts_bias.expand(batch, max_seq_len, max_seq_len)[b, :n, :n]
            channels["time"] = torch.einsum("hij,jhd->ihd", m * bias, vb)
        if pos_bias is not None:
            channels["position"] = torch.einsum("hij,jhd->ihd", m * pos_bias[0, :n, :n], vb)
        order = (
            ("position", "time", "semantic")
            if reference_layout
            else ("semantic", "time", "position")
        )
        present = [channels[c] for c in order if c in channels]
        if reference_layout:
            piece = torch.stack(present, 2).reshape(n, len(present) * heads * dv)
        else:
            piece = torch.cat([c.reshape(n, heads * dv) for c in present], 1)
        pieces.append((start, n, piece))
    width = (1 + (ts_bias is not None) + (pos_bias is not None)) * heads * dv
    return scatter_rows(q.new_zeros(q.shape[0], width), pieces)
