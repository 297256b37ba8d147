"""The delta step of HSTU attention (serving over cached keys): recops.delta_hstu_mha vs a
reference that follows generative-recommenders' `pytorch_cached_hstu_mha`
(generative_recommenders/ops/pytorch/pt_hstu_attention.py) op for op: K and V through
`jagged_to_padded_dense` to [B, H, N, D], einsum of the delta queries against them, `* alpha`,
`silu(.) / N`, the full [B, N, N] valid mask of `_get_valid_attn_mask` from which the delta rows'
rows are selected by a boolean index, einsum back. Forward only (serving), fp32 and bf16.

How the cost was checked: upstream's function itself (imported from a checkout of
generative-recommenders) and `reference` were timed interleaved in one process at the cases
below; docs/serving.md gives the ratios.

Rates: GB/s counts what a delta step must read and write (K and V of every sequence, the new
rows' q and output), against the machine's copy rate; at a few new rows the step streams K / V
once. GFLOP/s counts the two products (Q K^T and A V) of the new rows against all keys.
"""

import functools

import torch
import torch.nn.functional as F
from harness import check_matches, measure_case

import recops
from suites.hstu import valid_causal_mask

BATCH, HISTORY, HEADS, HEAD_DIM = 16, 2048, 2, 64
DELTAS = [1, 4, 16, 32, 128]
ALPHA = 1.0


def padded_heads(t, offsets, n, batch):
    rows, heads, dim = t.shape
    padded = torch.ops.fbgemm.jagged_to_padded_dense(
        values=t.reshape(rows, heads * dim), offsets=[offsets], max_lengths=[n], padding_value=0.0
    )
    return padded.view(batch, -1, heads, dim).transpose(1, 2)


def reference(max_seq_len, alpha, delta_q, k, v, seq_offsets):
    rows, heads, dim = delta_q.shape
    batch = seq_offsets.numel() - 1
    delta = rows // batch
    dq = delta_q.view(batch, -1, heads, dim).transpose(1, 2)
    full_k = padded_heads(k, seq_offsets, max_seq_len, batch)
    full_v = padded_heads(v, seq_offsets, max_seq_len, batch)
    scores = torch.einsum("bhxa,bhya->bhxy", dq, full_k) * alpha
    scores = F.silu(scores) / max_seq_len
    lengths = seq_offsets[1:] - seq_offsets[:-1]
    full_mask = valid_causal_mask(max_seq_len)  # _get_valid_attn_mask's causal mask
    positions = torch.arange(max_seq_len).view(1, -1)
    rows_of_delta = torch.logical_and(
        positions >= (lengths - delta).view(-1, 1), positions < lengths.view(-1, 1)
    )
    mask = full_mask.expand(batch, -1, -1).flatten(0, 1)[rows_of_delta.view(-1), :]
    scores = scores * mask.view(-1, delta, max_seq_len).unsqueeze(1)
    out = torch.einsum("bhxd,bhdv->bhxv", scores, full_v)
    return out.transpose(1, 2).reshape(-1, heads, v.shape[2])


def paged(k, v, seq_offsets, page_rows=64):
    """The same keys in pages of a cache (a shuffled page table)."""
    batch = seq_offsets.numel() - 1
    n = int(seq_offsets[1] - seq_offsets[0])
    per_sequence = -(-n // page_rows)
    order = torch.randperm(batch * per_sequence)
    table = order.view(batch, per_sequence).to(torch.int32)
    pages = []
    for t in (k, v):
        pool = t.new_zeros(batch * per_sequence * page_rows, *t.shape[1:])
        slots = (table.long()[:, :, None] * page_rows + torch.arange(page_rows)).view(batch, -1)
        pool[slots[:, :n].reshape(-1)] = t
        pages.append(pool.view(-1, page_rows, *t.shape[1:]))
    return pages, table, torch.full((batch,), n, dtype=torch.int64)


def run(limits):
    torch.manual_seed(0)
    rows = []
    for delta in DELTAS:
        n = HISTORY + delta
        seq_offsets = torch.arange(BATCH + 1, dtype=torch.int64) * n
        k, v = (0.5 * torch.randn(BATCH * n, HEADS, HEAD_DIM) for _ in range(2))
        delta_q = 0.5 * torch.randn(BATCH * delta, HEADS, HEAD_DIM)
        (k_pages, v_pages), table, lengths = paged(k, v, seq_offsets)
        for dtype in (torch.float32, torch.bfloat16) if delta == 32 else (torch.float32,):
            q_, k_, v_ = (t.to(dtype) for t in (delta_q, k, v))
            kp, vp = k_pages.to(dtype), v_pages.to(dtype)
            fns = {
                "reference": functools.partial(reference, n, ALPHA, q_, k_, v_, seq_offsets),
                "recops": functools.partial(
                    recops.delta_hstu_mha, n, ALPHA, q_, k_, v_, seq_offsets
                ),
                "recops paged": functools.partial(
                    recops.delta_hstu_mha,
                    n,
                    ALPHA,
                    q_,
                    kp,
                    vp,
                    None,
                    page_table=table,
                    seq_lengths=lengths,
                ),  # fmt: skip
            }
            case = f"B={BATCH} keys={n} new={delta} {str(dtype).split('.')[-1]}"
            check_matches(fns["reference"], fns["recops"], dtype, case)
            check_matches(fns["recops"], fns["recops paged"], dtype, case + " paged")
            element = q_.element_size()
            moved = (2 * BATCH * n + 2 * BATCH * delta) * HEADS * HEAD_DIM * element
            flops = 2 * 2 * BATCH * delta * n * HEADS * HEAD_DIM
            with torch.no_grad():
                case_rows = measure_case(
                    "delta", case, fns, moved, order=["recops", "recops paged", "reference"]
                )
            for r in case_rows:
                r.flops = flops
                r.extra["dtype"] = str(dtype).split(".")[-1]
            rows += case_rows
    return rows
