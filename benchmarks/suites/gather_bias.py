"""Rank-1 gather and the relative attention bias (issue 3) against their PyTorch formulations, and
FBGEMM's index_select_dim0 family (group_index_select_dim0, batch_index_select_dim0) against
FBGEMM's CPU kernels and the torch composition.

Each case runs with the default thread count and again with one thread (per-core efficiency, and
a view that other processes competing for the cores disturb less). Every recops result is checked
against its reference once before timing.
"""

import torch
import torch.nn.functional as F
from harness import Row, measure_quietly, median_time

ops = torch.ops.recops
FB = torch.ops.fbgemm
SUITE = "gather_bias"
DIVISOR = 0.301
NUM_BUCKETS = 128
READ = "read inputs (amax)"


def _gather_rows(n, m, threads):
    x = torch.randn(n)
    index = torch.randint(0, n, (m,))
    grad = torch.randn(m)
    case = f"x={n} index={m} int64, {threads} thr"
    torch.testing.assert_close(ops.gather_for_rank1(x, index), torch.index_select(x, 0, index))
    # fp32 sums of ~m / n gradients per slot: both sides carry rounding error of order
    # sqrt(m / n) * eps * |sum|, so compare both against the float64 sum.
    exact = torch.zeros(n, dtype=torch.float64).index_add_(0, index, grad.double())
    torch.testing.assert_close(
        ops.index_select_for_rank1_backward(grad, x, index).double(), exact, rtol=1e-5, atol=1e-2
    )
    moved = m * (index.element_size() + x.element_size())
    # Each op is timed back to back (median_time), not interleaved with its reference: after the
    # single-threaded index_add_ the OpenMP workers have gone to sleep, and waking them would
    # charge recops about 0.15 ms per call that no back-to-back caller pays.
    fwd = {
        "torch.index_select": median_time(lambda: torch.index_select(x, 0, index)),
        "recops": median_time(lambda: ops.gather_for_rank1(x, index)),
    }
    bwd = {
        "index_add_": median_time(lambda: torch.zeros_like(x).index_add_(0, index, grad)),
        "recops": median_time(lambda: ops.index_select_for_rank1_backward(grad, x, index)),
        # The backward's floor: a parallel max over its two inputs reads the same bytes and
        # does next to nothing with them.
        READ: median_time(lambda: (index.amax(), grad.amax())),
    }
    return [
        Row(SUITE, f"gather fwd {case}", "torch.index_select", fwd["torch.index_select"],
            bytes_moved=moved),
        Row(SUITE, f"gather fwd {case}", "recops", fwd["recops"], bytes_moved=moved,
            extra={"compare_to": ["torch.index_select"]}),
        Row(SUITE, f"gather bwd {case}", "index_add_", bwd["index_add_"], bytes_moved=moved),
        Row(SUITE, f"gather bwd {case}", "recops", bwd["recops"], bytes_moved=moved,
            extra={"compare_to": ["index_add_", READ]}),
        Row(SUITE, f"gather bwd {case}", READ, bwd[READ], bytes_moved=moved),
    ]  # fmt: skip


def torch_relative_bias(timestamps, ts_w, pos_w, log_dtype=torch.float32):
    """HSTU's formulation: bucketise the [B, N, N] deltas with torch ops (next item's timestamp
    as the query, the last item using its own; the log in float32 like HSTU, or in float64, the
    precision recops evaluates it in), index_select the time table, and build the position bias
    by padding, tiling and slicing the position table."""
    batch, n = timestamps.shape
    t = F.pad(pos_w[: 2 * n - 1], [0, n]).repeat(n)
    t = t[..., :-n].reshape(1, n, 3 * n - 2)
    r = (2 * n - 1) // 2
    extended = torch.cat([timestamps, timestamps[:, n - 1 : n]], dim=1)
    deltas = extended[:, 1:].unsqueeze(2) - extended[:, :-1].unsqueeze(1)
    buckets = (torch.log(deltas.abs().clamp(min=1).to(log_dtype)) / DIVISOR).long()
    buckets = buckets.clamp(0, NUM_BUCKETS).detach()
    ts_bias = torch.index_select(ts_w, 0, buckets.view(-1)).view(batch, n, n)
    return t[:, :, r:-r] + ts_bias


def _bias_rows(batch, n, threads):
    timestamps = torch.randint(0, 10**9, (batch, n)).sort(dim=1).values
    ts_w = torch.randn(NUM_BUCKETS + 1, requires_grad=True)
    pos_w = torch.randn(2 * n - 1, requires_grad=True)
    grad = torch.randn(batch, n, n)

    def recops_bias():
        return ops.relative_attn_bias_time(timestamps, ts_w, pos_w)

    def reference_bias():
        return torch_relative_bias(timestamps, ts_w, pos_w)

    # Guard against the float64 composition: the table gradients sum up to B N^2 / 129 fp32
    # terms per bucket, whose rounding error (either side's) is no fp32 reference's to judge.
    tables64 = [t.detach().double().requires_grad_(True) for t in (ts_w, pos_w)]
    expected = torch_relative_bias(timestamps, *tables64, torch.float64)
    expected.backward(grad.double())
    out = recops_bias()
    torch.testing.assert_close(out.double(), expected.detach(), rtol=1e-6, atol=1e-6)
    out.backward(grad)
    for got, table in zip((ts_w.grad, pos_w.grad), tables64, strict=True):
        torch.testing.assert_close(got.double(), table.grad, rtol=1e-4, atol=1e-2)
    ts_w.grad = pos_w.grad = None

    case = f"relative bias time+pos B={batch} N={n}, {threads} thr"
    out_bytes = batch * n * n * 4
    rows = []
    for label, fn in (("fwd", lambda f: f()), ("fwd+bwd", lambda f: f().backward(grad))):
        ref_s = median_time(lambda fn=fn: fn(reference_bias))
        our_s = median_time(lambda fn=fn: fn(recops_bias))
        moved = out_bytes * (1 if label == "fwd" else 2)
        rows.append(Row(SUITE, f"{case} {label}", "torch composition", ref_s, bytes_moved=moved))
        rows.append(
            Row(SUITE, f"{case} {label}", "recops", our_s, bytes_moved=moved,
                extra={"compare_to": ["torch composition"]})
        )  # fmt: skip
    return rows


def _forward_and_backward(title, impls, leaves, grads, moved):
    """(name, fns, bytes) of the forward and of the forward + backward of each impl, impl(leaves)
    giving the outputs; the backward reads and writes the forward's bytes twice more."""
    forward = {impl: (lambda fn=fn: fn(leaves)) for impl, fn in impls.items()}
    both = {
        impl: (lambda fn=fn: torch.autograd.grad(fn(leaves), leaves, grads))
        for impl, fn in impls.items()
    }
    return [(f"{title} fwd", forward, moved), (f"{title} fwd+bwd", both, 3 * moved)]


def group_select_cases(gen, features=8, rows=2048, batch=4096, dim=128):
    """torchrec's EmbeddingBagCollection with inverse indices
    (torchrec.modules.embedding_modules.process_pooled_embeddings): each feature's pooled
    embeddings of the deduplicated batch [rows, dim] are expanded to the full batch by its inverse
    indices, forward and forward + backward. The torch composition is what FBGEMM's CPU path
    computes: one index_select per feature, and autograd's index_add per feature backward."""
    tables = [torch.randn(rows, dim, generator=gen, requires_grad=True) for _ in range(features)]
    indices = [torch.randint(0, rows, (batch,), generator=gen) for _ in range(features)]
    grads = [torch.randn(batch, dim, generator=gen) for _ in range(features)]

    def torch_composition(xs):
        return [x.index_select(0, i) for x, i in zip(xs, indices, strict=True)]

    impls = {
        "recops": lambda xs: ops.group_index_select_dim0(xs, indices),
        "fbgemm": lambda xs: FB.group_index_select_dim0(xs, indices),
        "torch composition": torch_composition,
    }
    title = f"group_index_select_dim0 {features} x [{rows}, {dim}] -> {batch} rows"
    return _forward_and_backward(title, impls, tables, grads, features * batch * (dim * 4 + 8))


def batch_select_cases(gen, features=8, rows=2048, batch=4096, dim=64):
    """torchrec's sharded EmbeddingBagCollection with inverse indices
    (torchrec.distributed.embeddingbag.EmbeddingBagCollectionAwaitable._wait_impl): the packed
    per-feature embeddings of the deduplicated batch are expanded to [batch, features * dim]
    with permute_output_dim_0_1=True, forward and forward + backward. The torch composition is
    FBGEMM's CPU autograd function's: split, view, index_select and cat (index_add backward)."""
    num, row_sizes, cols = [batch] * features, [rows] * features, [dim] * features
    inputs = torch.randn(features * rows * dim, generator=gen, requires_grad=True)
    indices = torch.randint(0, rows, (features * batch,), generator=gen)
    grad = torch.randn(batch * features * dim, generator=gen)

    def torch_composition(x):
        tables = torch.split(x, [r * c for r, c in zip(row_sizes, cols, strict=True)])
        parts = torch.split(indices, num)
        outs = [
            t.view(r, c).index_select(0, i)
            for t, i, r, c in zip(tables, parts, row_sizes, cols, strict=True)
        ]
        return torch.cat(outs, dim=1).flatten()

    args = (indices, num, row_sizes, cols, True)
    impls = {
        "recops": lambda x: ops.batch_index_select_dim0(x, *args),
        "fbgemm": lambda x: FB.batch_index_select_dim0(x, *args),
        "torch composition": torch_composition,
    }
    title = f"batch_index_select_dim0 {features} x [{rows}, {dim}] -> {batch} rows"
    return _forward_and_backward(title, impls, inputs, grad, features * batch * (dim * 4 + 8))


def verify_index_select(fns):
    """recops equals FBGEMM exactly (the same gathers; backward sums in position order) and the
    torch composition within fp32 rounding of the summation order."""
    ours, theirs, composed = (fns[k]() for k in ("recops", "fbgemm", "torch composition"))
    if isinstance(ours, torch.Tensor):
        ours, theirs, composed = [ours], [theirs], [composed]
    for a, b, c in zip(ours, theirs, composed, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-5)
        torch.testing.assert_close(a, c, rtol=1e-6, atol=1e-5)


def _index_select_rows(threads, sizes=None):
    gen = torch.Generator().manual_seed(0)
    rows = []
    sizes = sizes or {}
    for name, fns, moved in group_select_cases(gen, **sizes) + batch_select_cases(gen, **sizes):
        verify_index_select(fns)
        times, _ = measure_quietly(fns)
        case = f"{name}, {threads} thr"
        for impl in fns:
            extra = {"compare_to": ["fbgemm", "torch composition"]} if impl == "recops" else {}
            rows.append(Row(SUITE, case, impl, times[impl], bytes_moved=moved, extra=extra))
    return rows


def run(limits):
    rows = []
    before = torch.get_num_threads()
    try:
        for threads in sorted({limits.threads, 1}, reverse=True):
            torch.set_num_threads(threads)
            rows += _gather_rows(129, 128 * 211 * 211, threads)
            rows += _gather_rows(20480, 1 << 20, threads)
            rows += _bias_rows(32, 256, threads)
            rows += _bias_rows(8, 1024, threads)
            rows += _index_select_rows(threads)
    finally:
        torch.set_num_threads(before)
    return rows
