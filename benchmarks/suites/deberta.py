"""DeBERTa disentangled attention (issue 6): recops' fused kernel vs the reference formulation of
HuggingFace's DebertaV2 DisentangledSelfAttention (bmm to [B*H, S, S] scores, bmm to
[B*H, S, 2 span] position scores, gather with the clamped bucket index, mask fill, softmax, bmm),
both in the input dtype, autograd for the reference's backward. Every case carries a padding mask
[B, S] (all tokens valid), expanded to [B, 1, S, S] for the reference as HF's encoder does once per
model (outside the timed region)."""

import functools
import math

import torch
from harness import measure_fwd_bwd

import recops
from recops.deberta import build_relative_position

SHAPES = [(2, 512), (1, 2048)]  # (B, S); H = 12, d = 64
HEADS, HEAD_DIM = 12, 64
BUCKETS, MAX_RELATIVE = 256, 512  # span 256
SPAN = BUCKETS


def reference(q, k, v, pos_key, pos_query, mask4, relative_pos):
    batch, heads, n, d = q.shape
    scale = math.sqrt(d * 3)
    query_layer, key_layer, value_layer = (t.reshape(batch * heads, n, d) for t in (q, k, v))
    pos_key_layer = pos_key.transpose(0, 1).repeat(batch, 1, 1)
    pos_query_layer = pos_query.transpose(0, 1).repeat(batch, 1, 1)
    scores = torch.bmm(query_layer, key_layer.transpose(-1, -2) / scale)
    index = torch.clamp(relative_pos + SPAN, 0, 2 * SPAN - 1).squeeze(0)
    c2p = torch.bmm(query_layer, pos_key_layer.transpose(-1, -2))
    c2p = torch.gather(c2p, dim=-1, index=index.expand(batch * heads, n, n))
    p2c_index = torch.clamp(-relative_pos + SPAN, 0, 2 * SPAN - 1).squeeze(0)
    p2c = torch.bmm(key_layer, pos_query_layer.transpose(-1, -2))
    p2c = torch.gather(p2c, dim=-1, index=p2c_index.expand(batch * heads, n, n)).transpose(-1, -2)
    scores = scores + c2p / scale + p2c / scale
    scores = scores.view(batch, heads, n, n)
    scores = scores.masked_fill(~mask4, torch.finfo(q.dtype).min)
    probs = torch.softmax(scores, dim=-1)
    out = torch.bmm(probs.view(batch * heads, n, n), value_layer)
    return out.view(batch, heads, n, d)


def fused(q, k, v, pos_key, pos_query, mask2):
    return recops.disentangled_attention(
        q,
        k,
        v,
        pos_key,
        pos_query,
        mask2,
        position_buckets=BUCKETS,
        max_relative_positions=MAX_RELATIVE,
    )


def _inputs(batch, n, dtype):
    def leaf(*shape):
        return (0.5 * torch.randn(*shape)).to(dtype).requires_grad_(True)

    q, k, v = (leaf(batch, HEADS, n, HEAD_DIM) for _ in range(3))
    pos_key, pos_query = (leaf(2 * SPAN, HEADS, HEAD_DIM) for _ in range(2))
    mask2 = torch.ones(batch, n, dtype=torch.bool)
    mask4 = (mask2[:, None, None, :] & mask2[:, None, :, None]).contiguous()
    return [q, k, v, pos_key, pos_query], mask2, mask4


def run(limits):
    torch.manual_seed(0)
    rows = []
    for batch, n in SHAPES:
        relative_pos = build_relative_position(n, n, BUCKETS, MAX_RELATIVE)
        for dtype in (torch.float32, torch.bfloat16):
            leaves, mask2, mask4 = _inputs(batch, n, dtype)
            impls = {
                "reference": functools.partial(reference, *leaves, mask4, relative_pos),
                "recops": functools.partial(fused, *leaves, mask2),
            }
            # flops: q.k, q.pos_key, k.pos_query and P.v, each 2 B H S X d with X = S or 2 span.
            fwd_flops = 2 * batch * HEADS * HEAD_DIM * n * (2 * n + 4 * SPAN)
            case = f"B={batch} H={HEADS} S={n} {str(dtype).split('.')[-1]}"
            rows += measure_fwd_bwd("deberta", case, impls, leaves, dtype, fwd_flops, 2)
    return rows
