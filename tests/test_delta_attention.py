"""The delta step of HSTU / FuXi-alpha attention (serving over cached keys, docs/serving.md):
torch.ops.recops.hstu_delta_attention / fuxi_delta_attention through recops.delta_hstu_mha and
recops.delta_fuxi_attention.

References: generative-recommenders' pytorch_cached_hstu_mha, followed op for op in plain
PyTorch below (padded K / V, the [B, N, N] mask, the new rows' slice of it), for the drop-in; and
the float64 full-sequence references of hstu_reference.py, whose rows at the new positions are
what a delta step must give (cached == recompute), for jagged deltas, the relative bias and
FuXi-alpha. Paged keys must give exactly what the same keys as jagged rows give.
"""

import functools

import pytest
import torch
import torch.nn.functional as F
from accuracy import assert_close
from hstu_reference import fuxi_reference, hstu_mask, hstu_reference, table_biases
from threads import num_threads
from torch.library import opcheck

import recops

ops = torch.ops.recops
F64 = torch.float64
N = 24  # max_seq_len


def offsets_of(lengths):
    lengths = torch.as_tensor(lengths, dtype=torch.int64)
    return torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])


def delta_rows(seq_offsets, deltas):
    """The rows of the full sequences that the new rows are: the last deltas[b] of sequence b."""
    return torch.cat(
        [
            torch.arange(int(seq_offsets[b + 1]) - d, int(seq_offsets[b + 1]))
            for b, d in enumerate(deltas)
        ]
        + [torch.zeros(0, dtype=torch.int64)]
    )


def pytorch_cached_hstu_mha(
    max_seq_len, alpha, delta_q, k, v, seq_offsets, num_targets=None, max_attn_len=0,
    contextual_seq_len=0,
):  # fmt: skip
    """generative-recommenders' reference, op for op: K and V padded to [B, H, N, D], the scores
    of the delta rows against them, silu / N, the full [B, N, N] valid-attention mask of which
    the delta rows' rows are selected."""
    L, H, D = delta_q.shape
    V = v.shape[2]
    B = seq_offsets.numel() - 1
    delta_size = L // B
    lengths = seq_offsets[1:] - seq_offsets[:-1]
    position = torch.arange(max_seq_len)
    valid = position[None, :] < lengths[:, None]
    full_k = k.new_zeros(B, max_seq_len, H, D)
    full_v = v.new_zeros(B, max_seq_len, H, V)
    full_k[valid] = k
    full_v[valid] = v
    dq = delta_q.view(B, delta_size, H, D).transpose(1, 2)
    s = torch.einsum("bhxa,bhya->bhxy", dq, full_k.transpose(1, 2)) * alpha
    s = F.silu(s) / max_seq_len
    masks = torch.stack(
        [
            F.pad(
                hstu_mask(
                    int(n),
                    contextual_seq_len,
                    0 if num_targets is None else int(num_targets[b]),
                    1,
                    max_attn_len,
                ),  # fmt: skip
                (0, max_seq_len - int(n), 0, max_seq_len - int(n)),
            )
            for b, n in enumerate(lengths)
        ]
    )
    rows = (position[None, :] >= (lengths - delta_size)[:, None]) & valid
    mask = masks[rows].view(B, delta_size, max_seq_len)
    out = torch.einsum("bhxy,byhv->bhxv", s * mask[:, None], full_v)
    return out.transpose(1, 2).reshape(-1, H, V)


MASKS = {
    "causal": {},
    "targets": {"num_targets": torch.tensor([2, 0, 3])},
    "contextual": {"contextual_seq_len": 3},
    "windowed": {"max_attn_len": 4},
    "all": {"num_targets": torch.tensor([1, 2, 0]), "contextual_seq_len": 2, "max_attn_len": 5},
}


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("dtype", [F64, torch.float32])
def test_drop_in_equals_pytorch_cached_hstu_mha(mask, dtype):
    torch.manual_seed(0)
    lengths, delta = [9, 4, 20], 4
    seq_offsets = offsets_of(lengths)
    k, v = (torch.randn(sum(lengths), 2, 16, dtype=dtype) for _ in range(2))
    delta_q = torch.randn(3 * delta, 2, 16, dtype=dtype)
    expected = pytorch_cached_hstu_mha(N, 0.7, delta_q, k, v, seq_offsets, **MASKS[mask])
    actual = recops.delta_hstu_mha(N, 0.7, delta_q, k, v, seq_offsets, **MASKS[mask])
    if dtype == F64:
        torch.testing.assert_close(actual, expected, rtol=0, atol=1e-10)
    else:
        assert_close(actual, expected)


def full_and_delta_inputs(lengths, deltas, dtype, heads=2, dqk=16, dv=8):
    """q, k, v of the full sequences, their timestamps and bias tables (float64 values rounded
    to dtype), and the new rows' q."""
    rows = sum(lengths)
    q, k, v = (torch.randn(rows, heads, d, dtype=F64).to(dtype) for d in (dqk, dqk, dv))
    timestamps = torch.cumsum(torch.randint(0, 5000, (rows,)), 0)
    ts_w = torch.randn(129, dtype=F64).to(dtype)
    pos_w = torch.randn(2 * N - 1, dtype=F64).to(dtype)
    seq_offsets = offsets_of(lengths)
    return q, k, v, timestamps, ts_w, pos_w, seq_offsets, delta_rows(seq_offsets, deltas)


CASES = {
    "jagged deltas": ([7, 12, 1, 20], [3, 12, 1, 2]),
    "one new row": ([5, 17, 24], [1, 1, 1]),
    "zero new rows": ([6, 0, 9], [0, 0, 4]),
    "empty batch": ([], []),
}


def paged(k, v, timestamps, seq_offsets, page_rows, spare_pages=3):
    """The sequences' keys, values and times in shuffled pages of page_rows rows (spare pages
    hold garbage), with the page table: the cache's layout."""
    lengths = (seq_offsets[1:] - seq_offsets[:-1]).tolist()
    used = [-(-n // page_rows) for n in lengths]
    pages = sum(used) + spare_pages
    order = torch.randperm(pages).tolist()
    k_pages = torch.randn(pages, page_rows, *k.shape[1:]).to(k.dtype)
    v_pages = torch.randn(pages, page_rows, *v.shape[1:]).to(v.dtype)
    t_pages = torch.randint(0, 10**9, (pages, page_rows)).double()
    table = torch.full((len(lengths), max(used, default=0) + 1), -1, dtype=torch.int32)
    for b, n in enumerate(lengths):
        for j in range(used[b]):
            page = order.pop()
            table[b, j] = page
            rows = slice(
                int(seq_offsets[b]) + j * page_rows,
                int(seq_offsets[b]) + min(n, (j + 1) * page_rows),
            )
            count = rows.stop - rows.start
            k_pages[page, :count], v_pages[page, :count] = k[rows], v[rows]
            t_pages[page, :count] = timestamps[rows].double()
    return k_pages, v_pages, t_pages, table, torch.tensor(lengths, dtype=torch.int64)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("dtype", [F64, torch.float32, torch.bfloat16, torch.float16])
def test_hstu_delta_equals_recompute(case, bias, dtype):
    """The new rows' outputs are the full sequences' rows at their positions (causal: a row sees
    only earlier keys), for jagged and paged keys."""
    torch.manual_seed(1)
    lengths, deltas = CASES[case]
    q, k, v, ts, ts_w, pos_w, seq_offsets, rows = full_and_delta_inputs(lengths, deltas, dtype)
    options = {"timestamps": ts, "ts_w": ts_w, "pos_w": pos_w} if bias else {}
    reference_options = {name: t.double() for name, t in options.items()}
    expected = hstu_reference(
        *(t.double() for t in (q, k, v)), seq_offsets, N, alpha=0.5, **reference_options
    )[rows]
    delta_offsets = offsets_of(deltas)
    actual = recops.delta_hstu_mha(
        N, 0.5, q[rows], k, v, seq_offsets, delta_offsets=delta_offsets, **options
    )
    assert actual.dtype == dtype
    assert_close(actual, expected, dtype, atol_factor=4)
    k_pages, v_pages, t_pages, table, seq_lengths = paged(k, v, ts, seq_offsets, page_rows=4)
    if bias:
        options["timestamps"] = t_pages
    from_pages = recops.delta_hstu_mha(
        N, 0.5, q[rows], k_pages, v_pages, None, delta_offsets=delta_offsets, page_table=table,
        seq_lengths=seq_lengths, **options,
    )  # fmt: skip
    assert_close(from_pages, actual, dtype)  # the same products, key runs split at pages


@pytest.mark.parametrize("case", ["jagged deltas", "zero new rows"])
@pytest.mark.parametrize("dtype", [F64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("reference_layout", [False, True])
def test_fuxi_delta_equals_recompute(case, dtype, reference_layout):
    torch.manual_seed(2)
    lengths, deltas = CASES[case]
    q, k, v, ts, ts_w, pos_w, seq_offsets, rows = full_and_delta_inputs(lengths, deltas, dtype)
    ts_bias, pos_bias = table_biases(ts, seq_offsets, ts_w.double(), pos_w.double(), N)
    expected = fuxi_reference(
        *(t.double() for t in (q, k, v)), seq_offsets, N, ts_bias=ts_bias, pos_bias=pos_bias,
        reference_layout=reference_layout,
    )[rows]  # fmt: skip
    options = {"ts_w": ts_w, "pos_w": pos_w, "reference_layout": reference_layout}
    delta_offsets = offsets_of(deltas)
    actual = recops.delta_fuxi_attention(
        N, q[rows], k, v, seq_offsets, delta_offsets=delta_offsets, timestamps=ts, **options
    )
    assert_close(actual, expected, dtype, atol_factor=4, relative_to_max=True)
    k_pages, v_pages, t_pages, table, seq_lengths = paged(k, v, ts, seq_offsets, page_rows=6)
    from_pages = recops.delta_fuxi_attention(
        N, q[rows], k_pages, v_pages, None, delta_offsets=delta_offsets, page_table=table,
        seq_lengths=seq_lengths, timestamps=t_pages, **options,
    )  # fmt: skip
    assert_close(from_pages, actual, dtype)  # the same products, key runs split at pages


LONG_N = 1400  # max_seq_len of the long sequences below


# (lengths, new rows, threads): fewer query blocks than threads.
SPLIT_KEYS = {
    "one sequence, 2 threads": ([1390], [3], 2),
    "two, 3 threads": ([1390, 1100], [3, 1], 3),
    # The products on the brgemm (more than four new rows): runs of keys past one piece.
    "many new rows, 2 threads": ([1390, 150], [37, 20], 2),
    # More new rows than a query block: the fp32 kernels lay out K^T per thread, part by part.
    "two blocks, 3 threads": ([1390], [100], 3),
}


@pytest.mark.parametrize("model", ["hstu", "fuxi"])
@pytest.mark.parametrize("mask", ["causal", "all"])
@pytest.mark.parametrize("case", SPLIT_KEYS)
@pytest.mark.parametrize("dtype", [F64, torch.float32])
def test_long_keys_split_between_threads(model, mask, case, dtype):
    """Fewer query blocks than threads (a serving step: a few long sequences, a few new rows):
    the threads split each block's keys in parts and add up their outputs. The parts must cover
    every key once, for windowed blocks (first key past 0), targets and contextual rows too."""
    torch.manual_seed(3)
    lengths, deltas, threads = SPLIT_KEYS[case]
    masks = {
        "causal": {},
        "all": {
            "num_targets": torch.tensor([2, 0][: len(lengths)]),
            "contextual_seq_len": 5,
            "max_attn_len": 1200,
        },
    }[mask]
    q, k, v = (torch.randn(sum(lengths), 2, d, dtype=F64).to(dtype) for d in (16, 16, 8))
    ts = torch.cumsum(torch.randint(0, 5000, (sum(lengths),)), 0)
    ts_w, pos_w = torch.randn(129, dtype=F64), torch.randn(2 * LONG_N - 1, dtype=F64)
    seq_offsets = offsets_of(lengths)
    rows = delta_rows(seq_offsets, deltas)
    q64, k64, v64 = (t.double() for t in (q, k, v))
    if model == "hstu":
        expected = hstu_reference(
            q64, k64, v64, seq_offsets, LONG_N, alpha=0.5, timestamps=ts, ts_w=ts_w, pos_w=pos_w,
            **masks,
        )[rows]  # fmt: skip
        run = functools.partial(
            recops.delta_hstu_mha, LONG_N, 0.5, timestamps=ts, ts_w=ts_w.to(dtype),
            pos_w=pos_w.to(dtype), **masks,
        )  # fmt: skip
    else:
        ts_bias, pos_bias = table_biases(ts, seq_offsets, ts_w, pos_w, LONG_N)
        expected = fuxi_reference(
            q64, k64, v64, seq_offsets, LONG_N, ts_bias=ts_bias, pos_bias=pos_bias, **masks
        )[rows]
        run = functools.partial(
            recops.delta_fuxi_attention, LONG_N, timestamps=ts, ts_w=ts_w.to(dtype),
            pos_w=pos_w.to(dtype), **masks,
        )  # fmt: skip
    with num_threads(threads):
        actual = run(q[rows], k, v, seq_offsets, delta_offsets=offsets_of(deltas))
        # From a paged cache: each part's keys in runs that break at pages.
        k_pages, v_pages, t_pages, table, seq_lengths = paged(k, v, ts, seq_offsets, page_rows=64)
        from_pages = run(
            q[rows], k_pages, v_pages, None, delta_offsets=offsets_of(deltas), page_table=table,
            seq_lengths=seq_lengths, timestamps=t_pages,
        )  # fmt: skip
    assert_close(actual, expected, dtype, atol_factor=4, relative_to_max=True)
    assert_close(from_pages, actual, dtype)


def test_one_channel_fuxi_and_equal_deltas():
    """Without bias tables FuXi-alpha's delta has the semantic channel only; equal deltas by
    default."""
    torch.manual_seed(3)
    q, k, v, *_, seq_offsets, rows = full_and_delta_inputs([5, 8], [2, 2], F64)
    expected = fuxi_reference(q, k, v, seq_offsets, N)[rows]
    actual = recops.delta_fuxi_attention(N, q[rows], k, v, seq_offsets)
    torch.testing.assert_close(actual, expected, rtol=0, atol=1e-12)


def test_sliced_queries_and_keys_read_in_place():
    """q, k, v slices of one wider projection (as the models split it) give the contiguous
    result."""
    torch.manual_seed(4)
    lengths, deltas = [6, 11], [2, 3]
    seq_offsets, delta_offsets = offsets_of(lengths), offsets_of(deltas)
    projection = torch.randn(sum(lengths), 2, 48)
    q, k, v = projection[..., :16], projection[..., 16:32], projection[..., 32:]
    rows = delta_rows(seq_offsets, deltas)
    kwargs = {"delta_offsets": delta_offsets}
    expected = recops.delta_hstu_mha(
        N, 1.0, q[rows].contiguous(), k.contiguous(), v.contiguous(), seq_offsets, **kwargs
    )
    actual = recops.delta_hstu_mha(N, 1.0, q[rows], k, v, seq_offsets, **kwargs)
    torch.testing.assert_close(actual, expected, rtol=0, atol=0)


def test_odd_pages_of_half_precision_are_gathered():
    """fp16 pages (converted to the fp32 kernels) are copied out of their pages first, any page
    size: the same as the jagged keys."""
    torch.manual_seed(5)
    q, k, v, ts, ts_w, pos_w, seq_offsets, rows = full_and_delta_inputs(
        [9, 4], [3, 1], torch.float16
    )
    k_pages, v_pages, t_pages, table, seq_lengths = paged(k, v, ts, seq_offsets, page_rows=3)
    delta_offsets = offsets_of([3, 1])
    jagged = ops.hstu_delta_attention(
        q[rows],
        k,
        v,
        delta_offsets,
        seq_offsets,
        None,
        None,
        N,
        timestamps=ts,
        ts_w=ts_w,
        pos_w=pos_w,
    )
    from_pages = ops.hstu_delta_attention(
        q[rows], k_pages, v_pages, delta_offsets, None, table, seq_lengths, N, timestamps=t_pages,
        ts_w=ts_w, pos_w=pos_w,
    )  # fmt: skip
    torch.testing.assert_close(from_pages, jagged, rtol=0, atol=0)


def opcheck_inputs():
    torch.manual_seed(6)
    q, k, v, ts, ts_w, pos_w, seq_offsets, rows = full_and_delta_inputs(
        [5, 7], [2, 3], torch.float32
    )
    delta_offsets = offsets_of([2, 3])
    options = {"timestamps": ts, "ts_w": ts_w, "pos_w": pos_w}
    k_pages, v_pages, t_pages, table, seq_lengths = paged(k, v, ts, seq_offsets, page_rows=4)
    yield (q[rows], k, v, delta_offsets, seq_offsets, None, None, N), options
    paged_options = dict(options, timestamps=t_pages)
    yield (q[rows], k_pages, v_pages, delta_offsets, None, table, seq_lengths, N), paged_options


@pytest.mark.parametrize("name", ["hstu_delta_attention", "fuxi_delta_attention"])
def test_opcheck(name):
    for args, kwargs in opcheck_inputs():
        opcheck(getattr(ops, name).default, args, kwargs)


def bad_call(**changes):
    torch.manual_seed(7)
    lengths, deltas = [5, 7], [2, 3]
    q, k, v, ts, ts_w, pos_w, seq_offsets, rows = full_and_delta_inputs(
        lengths, deltas, torch.float32
    )
    k_pages, v_pages, t_pages, table, seq_lengths = paged(k, v, ts, seq_offsets, page_rows=4)
    args = {"q": q[rows], "k": k, "v": v, "delta_offsets": offsets_of(deltas),
            "seq_offsets": seq_offsets, "page_table": None, "seq_lengths": None,
            "max_seq_len": N}  # fmt: skip
    if changes.pop("use_pages", False):
        args.update(
            k=k_pages, v=v_pages, seq_offsets=None, page_table=table, seq_lengths=seq_lengths
        )
    args.update(changes)
    return lambda: ops.hstu_delta_attention(**args)


BAD = {
    "delta longer than its sequence": (
        {"delta_offsets": torch.tensor([0, 6, 5 + 0])},
        "delta_offsets",
    ),
    "delta offsets past q": ({"delta_offsets": torch.tensor([0, 2, 4])}, "delta_offsets\\[-1\\]"),
    "delta offsets decreasing": ({"delta_offsets": torch.tensor([0, 3, 2])}, "delta_offsets"),
    "other batch": ({"delta_offsets": torch.tensor([0, 5])}, "same"),
    "no keys": ({"seq_offsets": None}, "one of the two"),
    "both layouts": ({"use_pages": True, "seq_offsets": offsets_of([5, 7])}, "one of the two"),
    "page outside the pool": (
        {"use_pages": True, "page_table": torch.tensor([[0, 1, -1], [99, 2, 3]])},
        "page_table\\[1, 0\\]",
    ),
    "page table too narrow": (
        {"use_pages": True, "page_table": torch.tensor([[0], [1]])},
        "columns",
    ),
    "paged without lengths": ({"use_pages": True, "seq_lengths": None}, "seq_lengths"),
    "length past max_seq_len": ({"max_seq_len": 6}, "max_seq_len"),
    "pages given as rows": (
        {"use_pages": True, "seq_offsets": None, "k": torch.randn(12, 2, 16)},
        "4-D pages",
    ),
    "head dims": ({"k": torch.randn(12, 2, 8)}, "head dim"),
    "dtypes": ({"v": torch.randn(12, 2, 8, dtype=F64)}, "dtype"),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_input_raises_naming_the_argument(case):
    changes, message = BAD[case]
    with pytest.raises((RuntimeError, ValueError), match=message):
        bad_call(**changes)()


def test_paged_timestamps_must_be_the_pages_shape():
    call = bad_call(use_pages=True, timestamps=torch.zeros(12), ts_w=torch.randn(129),
                    pos_w=torch.randn(2 * N - 1))  # fmt: skip
    with pytest.raises(RuntimeError, match="with page_table, timestamps"):
        call()


def test_unequal_deltas_need_delta_offsets():
    q, k, v, *_ = full_and_delta_inputs([5, 7], [2, 3], torch.float32)
    with pytest.raises(ValueError, match="split equally"):
        recops.delta_hstu_mha(N, 1.0, q[:5], k, v, offsets_of([5, 7]))
