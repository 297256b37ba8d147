"""DeBERTa disentangled attention (issue 6): recops' fused kernel vs a reference that follows
HuggingFace transformers' DebertaV2 `DisentangledSelfAttention` (transformers 5.24,
models/deberta_v2/modeling_deberta_v2.py: `forward` from the projected layers on, and
`disentangled_attention_bias`) op for op, both in the input dtype, autograd for the backward.

- bmm of q with k transposed and divided by sqrt(3 d) (a float32 tensor cast to the input dtype);
  the position layers laid out per head and repeated over the batch; c2p and p2c by bmm to
  [B*H, S, 2 span], gathered with the clamped relative positions, each divided by the scale and
  summed into one bias (`score = 0; score += ...`) added to the scores; the mask made bool,
  masked_fill with the dtype's minimum, softmax, bmm with v.
- As HF's encoder does once per model (so outside the timed region) the padding mask [B, S] (int64,
  all tokens valid) becomes the [B, 1, S, S] mask of `get_attention_mask` and the relative
  positions are built.
- Left out: the q / k / v / position projections and the output's [B, S, H * d] permute, which
  are not the attention core recops' op replaces.

How the cost was checked: the upstream module's forward (transformers 5.24 imported from its
wheel, identity projections so that only the attention core runs) and `reference` were timed
interleaved in one process, fp32 and bf16, fwd and fwd+bwd, at both shapes; docs/deberta.md gives
the ratios and conditions."""

import functools

import torch
from harness import measure_fwd_bwd

import recops
from recops.operators.deberta import build_relative_position

SHAPES = [(2, 512), (1, 2048)]  # (B, S); H = 12, d = 64
HEADS, HEAD_DIM = 12, 64
BUCKETS, MAX_RELATIVE = 256, 512  # span 256
SPAN = BUCKETS


def per_head(pos, batch):
    """[2 span, H, d] -> [B * H, 2 span, d]: transpose_for_scores' layout, repeated over B."""
    return pos.permute(1, 0, 2).contiguous().repeat(batch, 1, 1)


def reference(q, k, v, pos_key, pos_query, mask4, relative_pos):
    batch, heads, n, d = q.shape
    query_layer, key_layer, value_layer = (t.reshape(batch * heads, n, d) for t in (q, k, v))
    scale = torch.sqrt(torch.tensor(d, dtype=torch.float) * 3)
    scores = torch.bmm(query_layer, key_layer.transpose(-1, -2) / scale.to(dtype=q.dtype))
    relative_pos = relative_pos.unsqueeze(1)
    pos_key_layer, pos_query_layer = per_head(pos_key, batch), per_head(pos_query, batch)
    bias = 0
    c2p = torch.bmm(query_layer, pos_key_layer.transpose(-1, -2))
    c2p_pos = torch.clamp(relative_pos + SPAN, 0, 2 * SPAN - 1)
    c2p = torch.gather(c2p, dim=-1, index=c2p_pos.squeeze(0).expand([batch * heads, n, n]))
    bias += c2p / scale.to(dtype=c2p.dtype)
    p2c_pos = torch.clamp(-relative_pos + SPAN, 0, 2 * SPAN - 1)
    p2c = torch.bmm(key_layer, pos_query_layer.transpose(-1, -2))
    p2c = torch.gather(p2c, dim=-1, index=p2c_pos.squeeze(0).expand([batch * heads, n, n]))
    bias += p2c.transpose(-1, -2) / scale.to(dtype=p2c.dtype)
    scores = (scores + bias).view(-1, heads, n, n)
    scores = scores.masked_fill(~(mask4.bool()), torch.finfo(q.dtype).min)
    probs = torch.softmax(scores, dim=-1)
    out = torch.bmm(probs.view(-1, n, n), value_layer)
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


def _inputs(batch, n):
    """float32 q, k, v, pos_key, pos_query and the masks; run() casts the five to each dtype, so
    both dtypes of a shape run on the same inputs."""
    q, k, v = (0.5 * torch.randn(batch, HEADS, n, HEAD_DIM) for _ in range(3))
    pos_key, pos_query = (0.5 * torch.randn(2 * SPAN, HEADS, HEAD_DIM) for _ in range(2))
    mask2 = torch.ones(batch, n, dtype=torch.bool)
    extended = mask2.long().unsqueeze(1).unsqueeze(2)
    mask4 = extended * extended.squeeze(-2).unsqueeze(-1)  # HF's get_attention_mask
    return [q, k, v, pos_key, pos_query], mask2, mask4


def run(limits):
    torch.manual_seed(0)
    rows = []
    for batch, n in SHAPES:
        relative_pos = build_relative_position(n, n, BUCKETS, MAX_RELATIVE)
        inputs, mask2, mask4 = _inputs(batch, n)
        fp32_case = None
        for dtype in (torch.float32, torch.bfloat16):
            leaves = [t.to(dtype).requires_grad_(True) for t in inputs]
            impls = {
                "reference": functools.partial(reference, *leaves, mask4, relative_pos),
                "recops": functools.partial(fused, *leaves, mask2),
            }
            # flops: q.k, q.pos_key, k.pos_query and P.v, each 2 B H S X d with X = S or 2 span.
            fwd_flops = 2 * batch * HEADS * HEAD_DIM * n * (2 * n + 4 * SPAN)
            case = f"B={batch} H={HEADS} S={n} {str(dtype).split('.')[-1]}"
            rows += measure_fwd_bwd(
                "deberta", case, impls, leaves, dtype, fwd_flops, 2, fp32_case=fp32_case
            )
            fp32_case = fp32_case or case
    return rows
