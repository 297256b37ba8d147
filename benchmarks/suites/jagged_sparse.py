"""Jagged and sparse ops (docs/ops.md section 1): recops vs FBGEMM's CPU kernels vs PyTorch.

Every case runs the same inputs through torch.ops.recops.X, torch.ops.fbgemm.X (FBGEMM's own CPU
kernel: recops only fills dispatch keys FBGEMM lacks) and PyTorch's equivalent (an aten op where
one exists, else a plain torch composition), checks once that all three agree exactly, then times
them interleaved. Bytes moved count what the op must read and write: values/dense data actually
copied, padding written, index tensors read and written.

Shapes follow FBGEMM's own benchmarks (bench/jagged_tensor_benchmark.py `device`: B=128, D=128,
max_len=128, lengths uniform in [0, max_len), fp16; sparse_ops_benchmark cumsum 2048x1024) plus a
production-like KJT permute (T=100, B=4096, ~5 ids per bag), torchrec's pooled-embedding regroup
(permute_pooled_embs, 26 x 64 columns, B = 512 and 4096), torchrec's row-wise input distribution
(block_bucketize_sparse_features, 26 x 4096 bags over 2 ranks), a large fp32 jagged<->dense case and
a size sweep of jagged_to_padded_dense / dense_to_jagged written to results/sweep_jagged.{csv,png}.
"""

import csv
import os
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from harness import Row, measure_quietly, print_speedups, results_dir

SUITE = "jagged_sparse"
R = torch.ops.recops
FB = torch.ops.fbgemm
A = torch.ops.aten

IMPLS = ("recops", "fbgemm", "torch")
COPY = "copy_"


@dataclass
class Case:
    name: str
    fns: dict  # impl name -> zero-argument callable running the op once
    bytes_moved: float
    # impl name -> output -> what is compared (impls whose outputs differ in form, e.g. a tuple)
    views: dict = field(default_factory=dict)


def _same(a, b, where: str) -> None:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        assert isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor), where
        assert a.dtype == b.dtype, f"{where}: dtype {a.dtype} != {b.dtype}"
        assert a.shape == b.shape, f"{where}: shape {tuple(a.shape)} != {tuple(b.shape)}"
        assert torch.equal(a, b), f"{where}: values differ"
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), f"{where}: structure differs"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{where}[{i}]")
    else:
        assert a is None and b is None, f"{where}: {a!r} != {b!r}"


def _verify(case: Case) -> None:
    """Exact agreement with FBGEMM (with the torch reference for ops FBGEMM has no CPU kernel
    for), once per case: a wrong fast kernel must never be reported."""
    outs = {name: case.views.get(name, lambda o: o)(fn()) for name, fn in case.fns.items()}
    judge = "fbgemm" if "fbgemm" in outs else "torch"
    for name, out in outs.items():
        if name not in (judge, COPY):
            _same(out, outs[judge], f"{case.name}: {name} vs {judge}")


def _measure(case: Case, min_seconds: float = 0.3) -> list[Row]:
    _verify(case)
    times, load = measure_quietly(case.fns, min_seconds=min_seconds)
    if load > 0.3:
        print(f"  noisy: {case.name} measured while others used {load:.1f} cores; rerun it")
    rows = []
    for name in case.fns:
        # Speed-up columns: recops vs fbgemm and torch, fbgemm vs torch; vs copy_ (a plain copy of
        # the same bytes, timed alongside) for the cases that carry one.
        compare = [b for b in (*IMPLS, COPY) if b in case.fns and _rank(b) > _rank(name)]
        extra = {"compare_to": compare, "others_load": round(load, 2)}
        rows.append(Row(SUITE, case.name, name, times[name], case.bytes_moved, extra=extra))
    return rows


def _rank(impl: str) -> int:
    return (*IMPLS, COPY).index(impl)


def _with_copy_reference(case: Case) -> Case:
    """Adds a `copy_` row: torch's copy of bytes_moved / 2 bytes into a preallocated buffer (the
    runner's bandwidth limit), timed in the same rounds, so `recops vs copy_` reads as the fraction
    of copy bandwidth reached at that very moment on a shared machine."""
    src = torch.ones(int(case.bytes_moved // 2), dtype=torch.uint8)
    dst = torch.empty_like(src)
    case.fns[COPY] = lambda: dst.copy_(src)
    case.views[COPY] = lambda out: None
    return case


def _nbytes(*tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def _random_jagged(batch: int, max_len: int, dim: int, dtype, gen) -> tuple:
    lengths = torch.randint(max_len, (batch,), generator=gen)
    offsets = FB.asynchronous_complete_cumsum(lengths)
    total = int(offsets[-1])
    values = torch.rand(total, dim, generator=gen).to(dtype)
    return values, offsets, total


# --------------------------------------------------------------------------- jagged <-> dense
def jagged_dense_cases(tag: str, batch: int, max_len: int, dim: int, dtype, gen) -> list[Case]:
    """jagged_to_padded_dense and dense_to_jagged on one jagged tensor (no truncation: every
    length < max_len, so every value is read or written exactly once)."""
    values, offsets, total = _random_jagged(batch, max_len, dim, dtype, gen)
    dense = FB.jagged_to_padded_dense(values, [offsets], [max_len])
    off_b = _nbytes(offsets)
    j2d_bytes = _nbytes(values, dense) + off_b
    d2j_bytes = 2 * _nbytes(values) + off_b
    first = {"recops": lambda o: o[0], "fbgemm": lambda o: o[0]}
    return [
        Case(
            f"jagged_to_padded_dense {tag}",
            {
                "recops": lambda: R.jagged_to_padded_dense(values, [offsets], [max_len]),
                "fbgemm": lambda: FB.jagged_to_padded_dense(values, [offsets], [max_len]),
                "torch": lambda: A._jagged_to_padded_dense_forward(values, [offsets], [max_len]),
            },
            j2d_bytes,
        ),
        Case(
            f"dense_to_jagged {tag}",
            {
                "recops": lambda: R.dense_to_jagged(dense, [offsets], total),
                "fbgemm": lambda: FB.dense_to_jagged(dense, [offsets], total),
                "torch": lambda: A._padded_dense_to_jagged_forward(dense, [offsets], total),
            },
            d2j_bytes,
            views=first,
        ),
    ]


def fbgemm_default_jagged_cases(gen) -> list[Case]:
    batch, max_len, dim = 128, 128, 128
    tag = f"B={batch} N={max_len} D={dim} fp16"
    cases = jagged_dense_cases(tag, batch, max_len, dim, torch.half, gen)
    values, offsets, total = _random_jagged(batch, max_len, dim, torch.half, gen)
    grad = torch.rand(batch, max_len, dim, generator=gen).half()
    values_1d = torch.rand(total, generator=gen)
    off_b = _nbytes(offsets)
    cases += [
        Case(
            f"jagged_to_padded_dense_backward {tag}",
            {
                "recops": lambda: R.jagged_to_padded_dense_backward(grad, [offsets], total),
                "fbgemm": lambda: FB.jagged_to_padded_dense_backward(grad, [offsets], total),
                "torch": lambda: A._padded_dense_to_jagged_forward(grad, [offsets], total),
            },
            2 * _nbytes(values) + off_b,
        ),
        Case(
            f"jagged_2d_to_dense {tag}",
            {
                "recops": lambda: R.jagged_2d_to_dense(values, offsets, max_len),
                "fbgemm": lambda: FB.jagged_2d_to_dense(values, offsets, max_len),
                "torch": lambda: A._jagged_to_padded_dense_forward(values, [offsets], [max_len]),
            },
            _nbytes(values, grad) + off_b,
        ),
        Case(
            f"jagged_1d_to_dense B={batch} N={max_len} fp32",
            {
                "recops": lambda: R.jagged_1d_to_dense(values_1d, offsets, max_len, 0),
                "fbgemm": lambda: FB.jagged_1d_to_dense(values_1d, offsets, max_len, 0),
                "torch": lambda: A._jagged_to_padded_dense_forward(values_1d, [offsets], [max_len]),
            },
            _nbytes(values_1d) + batch * max_len * 4 + off_b,
        ),
    ]
    return cases


# --------------------------------------------------------------------------- cumsum
def cumsum_cases(gen) -> list[Case]:
    rows, cols = 2048, 1024
    x = torch.randint(0, 100, (rows, cols), generator=gen)
    flat = x.flatten()
    n = flat.numel()
    tag = f"{rows}x{cols} int64"
    return [
        Case(
            f"complete_cumsum 2-D {tag}",
            {
                "recops": lambda: R.asynchronous_complete_cumsum(x),
                "fbgemm": lambda: FB.asynchronous_complete_cumsum(x),
                "torch": lambda: F.pad(torch.cumsum(x, 1), (1, 0)),
            },
            (n + rows * (cols + 1)) * 8,
        ),
        Case(
            f"complete_cumsum 1-D {n} int64",
            {
                "recops": lambda: R.asynchronous_complete_cumsum(flat),
                "fbgemm": lambda: FB.asynchronous_complete_cumsum(flat),
                "torch": lambda: F.pad(torch.cumsum(flat, 0), (1, 0)),
            },
            (2 * n + 1) * 8,
        ),
        Case(
            f"exclusive_cumsum 1-D {n} int64",
            {
                "recops": lambda: R.asynchronous_exclusive_cumsum(flat),
                "fbgemm": lambda: FB.asynchronous_exclusive_cumsum(flat),
                "torch": lambda: F.pad(torch.cumsum(flat[:-1], 0), (1, 0)),
            },
            2 * n * 8,
        ),
        Case(
            f"inclusive_cumsum 1-D {n} int64",
            {
                "recops": lambda: R.asynchronous_inclusive_cumsum(flat),
                "fbgemm": lambda: FB.asynchronous_inclusive_cumsum(flat),
                "torch": lambda: torch.cumsum(flat, 0),
            },
            2 * n * 8,
        ),
    ]


# --------------------------------------------------------------------------- permutes
def _torch_permute(permute, lengths, values, weights, segment_lengths):
    """Reference permute in plain torch: gather every permuted segment's element indices."""
    perm = permute.long()
    starts = F.pad(torch.cumsum(segment_lengths, 0), (1, 0))[:-1]
    seg_len = segment_lengths[perm]
    out_starts = F.pad(torch.cumsum(seg_len, 0), (1, 0))[:-1]
    index = torch.repeat_interleave(starts[perm] - out_starts, seg_len)
    index += torch.arange(index.numel())
    return lengths[perm], values[index], weights[index] if weights is not None else None


def _permute_bytes(permute, lengths, values, weights) -> float:
    return _nbytes(permute) + 2 * _nbytes(lengths) + 2 * _nbytes(values, weights)


def permute_cases(gen) -> list[Case]:
    cases = []

    def kjt(num_features, batch, low, high):
        lengths = torch.randint(low, high, (num_features, batch), dtype=torch.int32, generator=gen)
        total = int(lengths.sum())
        values = torch.randint(0, 2**40, (total,), generator=gen)
        weights = torch.rand(total, generator=gen)
        permute = torch.randperm(num_features, generator=gen).int()
        return lengths, values, weights, permute

    def permute_case(op_name, tag, permute, lengths, values, weights):
        # Segment t is row t of lengths ([T, B], 2-D form) or entry t (1-D form).
        seg = lengths.long().sum(1) if lengths.dim() == 2 else lengths.long()
        ours, theirs = getattr(R, op_name), getattr(FB, op_name)
        return Case(
            f"{op_name} {tag}",
            {
                "recops": lambda: ours(permute, lengths, values, weights),
                "fbgemm": lambda: theirs(permute, lengths, values, weights),
                "torch": lambda: _torch_permute(permute, lengths, values, weights, seg),
            },
            _permute_bytes(permute, lengths, values, weights),
        )

    two_d, one_d = "permute_2D_sparse_data", "permute_1D_sparse_data"
    # FBGEMM's permute benchmark shape: few features, long bags.
    lengths, values, weights, permute = kjt(40, 128, 1000, 2000)
    cases.append(permute_case(two_d, "T=40 B=128 L~1500 +w", permute, lengths, values, weights))

    # Production-like KJT: 100 features x 4096 samples, ~5 ids per bag, int64 ids, fp32 weights.
    t, b = 100, 4096
    lengths, values, weights, permute = kjt(t, b, 0, 11)
    cases.append(permute_case(two_d, f"T={t} B={b} L~5 +w", permute, lengths, values, weights))
    # The same feature permutation in the 1-D form: one segment per (feature, sample).
    perm_1d = (permute.long()[:, None] * b + torch.arange(b)).flatten().int()
    flat = lengths.flatten()
    cases.append(
        permute_case(one_d, f"T*B={t * b} feature-major L~5 +w", perm_1d, flat, values, weights)
    )
    # 1-D with every segment moved independently (random gather of ~5-id segments).
    perm_rand = torch.randperm(t * b, generator=gen).int()
    cases.append(
        permute_case(one_d, f"T*B={t * b} random L~5 +w", perm_rand, flat, values, weights)
    )

    # invert_permute on the 1-D segment permutation; offsets_range on the KJT's offsets.
    cases.append(
        Case(
            f"invert_permute n={t * b} int32",
            {
                "recops": lambda: R.invert_permute(perm_rand),
                "fbgemm": lambda: FB.invert_permute(perm_rand),
                "torch": lambda: torch.empty_like(perm_rand).scatter_(
                    0, perm_rand.long(), torch.arange(t * b, dtype=torch.int32)
                ),
            },
            2 * _nbytes(perm_rand),
        )
    )
    seg = flat.long()
    offsets = F.pad(torch.cumsum(seg, 0), (1, 0))[:-1]
    range_size = int(seg.sum())
    cases.append(
        Case(
            f"offsets_range {t * b} segments -> {range_size} int64",
            {
                "recops": lambda: R.offsets_range(offsets, range_size),
                "fbgemm": lambda: FB.offsets_range(offsets, range_size),
                "torch": lambda: torch.arange(range_size) - torch.repeat_interleave(offsets, seg),
            },
            _nbytes(offsets) + range_size * 8,
        )
    )
    return cases


def permute_pooled_cases(gen) -> list[Case]:
    """KeyedTensor regrouping of pooled embeddings (torchrec's column-wise output path): 26
    features of width 64 in a random order, fp32, at the torchrec example's batch per process
    (B = 512, in cache) and at B = 4096 (out of cache). The torch reference is the pure-PyTorch
    regroup torchrec falls back to (one slice per feature, then torch.cat), which materialises
    nothing but the output, like upstream's."""
    features, dim = 26, 64
    offsets = torch.arange(features + 1) * dim
    permute = torch.randperm(features, generator=gen)
    inv_permute = torch.empty_like(permute)
    inv_permute[permute] = torch.arange(features)
    bounds = [(int(offsets[p]), int(offsets[p + 1])) for p in permute.tolist()]

    def case(batch):
        pooled = torch.randn(batch, features * dim, generator=gen)
        args = (pooled, offsets, permute, offsets, inv_permute)  # equal widths: same inverse
        return Case(
            f"permute_pooled_embs B={batch} T={features} D={dim} fp32",
            {
                "recops": lambda: R.permute_pooled_embs(*args),
                "fbgemm": lambda: FB.permute_pooled_embs(*args),
                "torch": lambda: torch.cat([pooled[:, a:b] for a, b in bounds], dim=1),
            },
            2 * _nbytes(pooled),
        )

    return [case(512), case(4096)]


def _torch_block_bucketize(lengths, ids, block_sizes, my_size):
    """block_bucketize_sparse_features (uniform blocks, no weights or positions) as a plain torch
    composition: bucket and re-based id per id, then one stable sort by (bucket, bag). torchrec has
    no pure-PyTorch fallback for this op, so this is what a user without FBGEMM would write."""
    bags = lengths.numel()
    bag = torch.repeat_interleave(torch.arange(bags), lengths)
    block = block_sizes.repeat_interleave(bags // block_sizes.numel())[bag]
    inside = ids < block * my_size
    bucket = torch.where(inside, ids // block, ids % my_size)
    new_ids = torch.where(inside, ids % block, ids // my_size)
    key = bucket * bags + bag
    order = torch.sort(key, stable=True).indices
    new_lengths = torch.bincount(key, minlength=my_size * bags).to(lengths.dtype)
    return new_lengths, new_ids[order]


def block_bucketize_cases(gen) -> list[Case]:
    """torchrec's row-wise input distribution: 26 features x B = 4096 bags of ~5 ids over 2
    ranks, int64 ids in [0, 2 x block), the pure-torch reference above."""
    features, batch, my_size, block = 26, 4096, 2, 100_000
    lengths = torch.randint(0, 10, (features * batch,), generator=gen)
    ids = torch.randint(0, my_size * block, (int(lengths.sum()),), generator=gen)
    block_sizes = torch.full((features,), block)
    args = (lengths, ids, False, False, block_sizes, my_size)
    first_two = {impl: lambda out: out[:2] for impl in ("recops", "fbgemm")}
    return [
        Case(
            f"block_bucketize_sparse_features T={features} B={batch} L~5 ranks={my_size}",
            {
                "recops": lambda: R.block_bucketize_sparse_features(*args),
                "fbgemm": lambda: FB.block_bucketize_sparse_features(*args),
                "torch": lambda: _torch_block_bucketize(lengths, ids, block_sizes, my_size),
            },
            # lengths and ids read, new lengths and ids written
            _nbytes(lengths, ids) + my_size * _nbytes(lengths) + _nbytes(ids),
            views=first_two,
        )
    ]


# --------------------------------------------------------------------------- sparse: new ops
def _torch_expand_permute(permute, input_offset, output_offset):
    """expand_into_jagged_permute as plain torch, the index _torch_permute gathers with: each
    output segment's start in the input, repeated over the segment, plus a running position."""
    seg_len = output_offset[1:] - output_offset[:-1]
    shift = input_offset[:-1][permute.long()] - output_offset[:-1]
    return torch.repeat_interleave(shift, seg_len) + torch.arange(
        int(output_offset[-1]), dtype=input_offset.dtype
    )


def new_sparse_cases(gen) -> list[Case]:
    """The permute_2D_sparse_data forms torchrec calls (permute_sparse_features,
    permute_2D_sparse_data_input1D, permute_2D_sparse_preallocated_out) on the production-like
    KJT of permute_cases (T=100, B=4096, ~5 ids per bag, int64 ids, fp32 weights); torchrec's
    variable-batch all-to-all recat (expand_into_jagged_permute: 100 features x 8 ranks, batches
    of 1024..4096); the inference bucketize of block_bucketize_cases with the unbucketize permute
    and bucket mapping. Torch references: _torch_permute (torchrec's KJT permute without FBGEMM
    is this gather), _torch_expand_permute and _torch_block_bucketize plus the two mappings (no
    upstream fallback exists; what a user without FBGEMM would write)."""
    cases = []
    t, b = 100, 4096
    lengths = torch.randint(0, 11, (t, b), generator=gen)
    total = int(lengths.sum())
    values = torch.randint(0, 2**40, (total,), generator=gen)
    weights = torch.rand(total, generator=gen)
    permute = torch.randperm(t, generator=gen).int()
    seg = lengths.sum(1)
    moved = _permute_bytes(permute, lengths, values, weights)

    def permute_case(name, ours, theirs, flat=False):
        view = (
            {impl: (lambda out: (out[0].reshape(t, b), *out[1:])) for impl in IMPLS} if flat else {}
        )
        return Case(
            name,
            {
                "recops": ours,
                "fbgemm": theirs,
                "torch": lambda: _torch_permute(permute, lengths, values, weights, seg),
            },
            moved,
            views=view,
        )

    args = (permute, lengths, values, weights)
    cases.append(
        permute_case(
            f"permute_sparse_features T={t} B={b} L~5 +w",
            lambda: R.permute_sparse_features(*args),
            lambda: FB.permute_sparse_features(*args),
        )
    )
    flat = lengths.flatten()
    cases.append(
        permute_case(
            f"permute_2D_sparse_data_input1D T={t} B={b} L~5 +w",
            lambda: R.permute_2D_sparse_data_input1D(permute, flat, values, b, weights),
            lambda: FB.permute_2D_sparse_data_input1D(permute, flat, values, b, weights),
            flat=True,
        )
    )
    outs = {
        impl: (torch.empty_like(lengths), torch.empty_like(values), torch.empty_like(weights))
        for impl in ("recops", "fbgemm")
    }
    cases.append(
        permute_case(
            f"permute_2D_sparse_preallocated_out T={t} B={b} L~5 +w",
            lambda: R.permute_2D_sparse_preallocated_out(*args, None, *outs["recops"]),
            lambda: FB.permute_2D_sparse_preallocated_out(*args, None, *outs["fbgemm"]),
        )
    )

    features, ranks = 100, 8
    batch = torch.randint(1024, 4097, (ranks,), generator=gen)
    sizes = batch.repeat_interleave(features)  # segment r * features + f: rank r's batch
    recat = (torch.arange(features)[:, None] + torch.arange(ranks) * features).flatten().int()
    input_offset = F.pad(sizes.cumsum(0), (1, 0)).int()
    output_offset = F.pad(sizes[recat.long()].cumsum(0), (1, 0)).int()
    size = int(output_offset[-1])
    recat_args = (recat, input_offset, output_offset, size)
    cases.append(
        Case(
            f"expand_into_jagged_permute {features}x{ranks} segments -> {size} int32",
            {
                "recops": lambda: R.expand_into_jagged_permute(*recat_args),
                "fbgemm": lambda: FB.expand_into_jagged_permute(*recat_args),
                "torch": lambda: _torch_expand_permute(recat, input_offset, output_offset),
            },
            _nbytes(recat, input_offset, output_offset) + 4 * size,
        )
    )

    features, batch_size, my_size, block = 26, 4096, 2, 100_000
    bb_lengths = torch.randint(0, 10, (features * batch_size,), generator=gen)
    ids = torch.randint(0, my_size * block, (int(bb_lengths.sum()),), generator=gen)
    block_sizes = torch.full((features,), block)
    bb_args = (bb_lengths, ids, False, True, block_sizes, my_size)
    mapped = {"return_bucket_mapping": True}

    def torch_inference():
        new_lengths, new_ids = _torch_block_bucketize(bb_lengths, ids, block_sizes, my_size)
        bag = torch.repeat_interleave(torch.arange(bb_lengths.numel()), bb_lengths)
        bucket = torch.where(ids < block * my_size, ids // block, ids % my_size)
        order = torch.sort(bucket * bb_lengths.numel() + bag, stable=True).indices
        unbucketize = torch.empty_like(order).scatter_(0, order, torch.arange(order.numel()))
        return new_lengths, new_ids, unbucketize, bucket

    picked = {impl: (lambda out: (out[0], out[1], out[4], out[5])) for impl in ("recops", "fbgemm")}
    cases.append(
        Case(
            f"block_bucketize_sparse_features_inference T={features} B={batch_size} L~5 "
            f"ranks={my_size} +sequence +mapping",
            {
                "recops": lambda: R.block_bucketize_sparse_features_inference(*bb_args, **mapped),
                "fbgemm": lambda: FB.block_bucketize_sparse_features_inference(*bb_args, **mapped),
                "torch": torch_inference,
            },
            # lengths and ids read; new lengths, ids, unbucketize permute and mapping written
            _nbytes(bb_lengths, ids) + my_size * _nbytes(bb_lengths) + 3 * _nbytes(ids),
            views=picked,
        )
    )
    return cases


# --------------------------------------------------------------------------- size sweep
LARGE = "large B=1024 N=512 D=128 fp32"
SWEEP_BATCHES = [16 * 2**i for i in range(9)]  # dense [B, 128, 128] fp32: 1 MiB .. 256 MiB


def sweep(limits, gen) -> list[dict]:
    """jagged_to_padded_dense and dense_to_jagged over total dense size; returns CSV records."""
    records = []
    for batch in SWEEP_BATCHES:
        j2d, d2j = jagged_dense_cases(f"B={batch}", batch, 128, 128, torch.float, gen)
        for op, case in (("jagged_to_padded_dense", j2d), ("dense_to_jagged", d2j)):
            _verify(case)
            times, _ = measure_quietly(case.fns, attempts=2, min_runs=5, min_seconds=0.15)
            for impl, seconds in times.items():
                gbps = case.bytes_moved / seconds / 1e9
                records.append(
                    {
                        "op": op,
                        "impl": impl,
                        "batch": batch,
                        "dense_mib": batch * 128 * 128 * 4 / 2**20,
                        "bytes_moved": int(case.bytes_moved),
                        "seconds": seconds,
                        "gbps": gbps,
                        "pct_copy": 100 * gbps / limits.copy_gbps,
                    }
                )
        del j2d, d2j
    return records


def write_sweep(records: list[dict], limits) -> None:
    out = results_dir()
    with open(os.path.join(out, "sweep_jagged.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(records[0]))
        writer.writeheader()
        writer.writerows(records)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: sweep plot skipped")
        return
    ops = sorted({r["op"] for r in records}, reverse=True)
    fig, axes = plt.subplots(1, len(ops), figsize=(6 * len(ops), 4.5), sharey=True)
    for ax, op in zip(axes, ops, strict=True):
        for impl in IMPLS:
            mine = [r for r in records if r["op"] == op and r["impl"] == impl]
            ax.plot([r["dense_mib"] for r in mine], [r["gbps"] for r in mine], "o-", label=impl)
        ax.axhline(limits.copy_gbps, color="gray", linestyle="--", label="copy_ (measured)")
        # glibc maps allocations of >= 32 MiB afresh, so larger outputs are faulted in every call
        # (dense_to_jagged's output, the values, is about half the dense size).
        at = 32 if op == "jagged_to_padded_dense" else 64
        ax.axvline(at, color="gray", linestyle=":", label="output 32 MiB: fresh pages per call")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("padded dense size [B, 128, 128] fp32 (MiB)")
        ax.set_title(op)
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("achieved GB/s (read + written)")
    axes[0].legend(loc="upper right", fontsize="small")
    fig.suptitle(f"recops vs FBGEMM vs torch, CPU, {limits.threads} threads")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "sweep_jagged.png"), dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------- jagged: new ops
def new_jagged_cases(gen) -> list[Case]:
    """segment_sum_csr, asynchronous_batched_complete_cumsum, jagged_index_select and its 2-D
    forward / gradient op, on torchrec KJT-pooling-like sizes. The torch references follow FBGEMM's
    CPU ops: segment_sum_csr as aten's segment_reduce over the scaled offsets, the batched cumsum as
    cumsum per row, jagged_index_select as a gather of the selected rows (repeat_interleave of the
    selected segments' starts plus each row's position) and its gradient as index_add_ into them.
    Values are small integers so that every implementation's sums are exact and agree."""
    cases = []
    num_segments, batch_size = 20000, 16
    seg_lengths = torch.randint(0, 20, (num_segments,), generator=gen)
    csr = F.pad(seg_lengths.cumsum(0), (1, 0))
    values = torch.randint(-3, 4, (int(csr[-1]) * batch_size,), generator=gen).float()
    cases.append(
        Case(
            f"segment_sum_csr S={num_segments} B={batch_size} fp32",
            {
                "recops": lambda: R.segment_sum_csr(batch_size, csr, values),
                "fbgemm": lambda: FB.segment_sum_csr(batch_size, csr, values),
                "torch": lambda: torch.segment_reduce(values, "sum", offsets=csr * batch_size),
            },
            _nbytes(values, csr) + num_segments * 4,
        )
    )
    rows, cols = 2048, 1024
    x = torch.randint(0, 100, (rows, cols), generator=gen)
    cases.append(
        Case(
            f"batched_complete_cumsum {rows}x{cols} int64",
            {
                "recops": lambda: R.asynchronous_batched_complete_cumsum(x),
                "fbgemm": lambda: FB.asynchronous_batched_complete_cumsum(x),
                "torch": lambda: F.pad(torch.cumsum(x, 1), (1, 0)),
            },
            (x.numel() + rows * (cols + 1)) * 8,
        )
    )
    num_in, max_len, dim, count = 4096, 64, 64, 8192
    lengths = torch.randint(0, max_len, (num_in,), generator=gen)
    jagged = torch.randint(-8, 8, (int(lengths.sum()), dim), generator=gen).float()
    indices = torch.randint(0, num_in, (count,), generator=gen)
    out_lengths = lengths[indices]
    in_offsets, out_offsets = lengths.cumsum(0), out_lengths.cumsum(0)
    out_rows = int(out_offsets[-1])
    starts = in_offsets - lengths

    def torch_rows():
        first = starts[indices].repeat_interleave(out_lengths)
        position = torch.arange(out_rows) - (out_offsets - out_lengths).repeat_interleave(
            out_lengths
        )
        return first + position

    grad = torch.randint(-8, 8, (out_rows, dim), generator=gen).float()
    tag = f"N={num_in} L<{max_len} D={dim} select {count} fp32"
    cases.append(
        Case(
            f"jagged_index_select {tag}",
            {
                "recops": lambda: R.jagged_index_select(jagged, lengths, indices),
                "fbgemm": lambda: FB.jagged_index_select(jagged, lengths, indices),
                "torch": lambda: [jagged[torch_rows()], lengths[indices]],
            },
            2 * out_rows * dim * 4 + _nbytes(lengths, indices),
        )
    )
    add_args = (grad, indices, out_offsets, in_offsets, out_rows, jagged.shape[0])
    cases.append(
        Case(
            f"jagged_index_add_2d_forward {tag}",
            {
                "recops": lambda: R.jagged_index_add_2d_forward(*add_args),
                "fbgemm": lambda: FB.jagged_index_add_2d_forward(*add_args),
                "torch": lambda: torch.zeros_like(jagged).index_add_(0, torch_rows(), grad),
            },
            (2 * out_rows + 2 * jagged.shape[0]) * dim * 4,
        )
    )
    # keyed_jagged_index_select_dim1 (no CPU kernel in FBGEMM): the same batch entries taken from
    # every key of a KJT, against the gather a plain-PyTorch port of FBGEMM's CUDA op does.
    keys, batch, picked = 26, 4096, 2048
    kjt_lengths = torch.randint(0, 10, (keys * batch,), generator=gen)
    kjt_offsets = F.pad(kjt_lengths.cumsum(0), (1, 0))
    kjt_values = torch.randint(0, 1 << 20, (int(kjt_offsets[-1]),), generator=gen)
    selected = torch.randint(0, batch, (picked,), generator=gen)
    segments = (torch.arange(keys)[:, None] * batch + selected[None, :]).flatten()

    def torch_keyed_select():
        seg_lengths = kjt_lengths[segments]
        out_starts = seg_lengths.cumsum(0) - seg_lengths
        total = int(seg_lengths.sum())
        first = kjt_offsets[segments].repeat_interleave(seg_lengths, output_size=total)
        position = torch.arange(total) - out_starts.repeat_interleave(
            seg_lengths, output_size=total
        )
        return [kjt_values[first + position], seg_lengths]

    cases.append(
        Case(
            f"keyed_jagged_index_select_dim1 T={keys} B={batch} select {picked} int64",
            {
                "recops": lambda: R.keyed_jagged_index_select_dim1(
                    kjt_values, kjt_lengths, kjt_offsets, selected, batch
                ),
                "torch": torch_keyed_select,
            },
            2 * keys * picked * 4.5 * 8 + _nbytes(kjt_lengths, selected),
        )
    )
    cases.append(_jagged_unique_indices_case(gen))
    return cases


def _torch_jagged_unique_indices(hash_size_cumsum, hash_size_offsets, offsets, indices):
    """FBGEMM's jagged_unique_indices (CUDA-only there) as plain PyTorch, step for step as its CUDA
    op runs: linearize each index by its feature's hash_size_cumsum entry, torch.unique (sorted,
    with the inverse) as its at::_unique, scatter each index to its unique slot (its delinearize
    kernel), then per feature group the distinct values in the group's hash range (a binary search
    of the sorted uniques) spread over the group's bags, the first ones taking one more."""
    num_features = hash_size_cumsum.numel() - 1
    batch = (offsets.numel() - 1) // num_features
    bag_lengths = offsets.diff()
    feature = torch.arange(num_features).repeat_interleave(batch)
    linear = hash_size_cumsum[feature].repeat_interleave(bag_lengths) + indices
    unique_linear, reverse = torch.unique(linear, sorted=True, return_inverse=True)
    unique = torch.empty_like(unique_linear).scatter_(0, reverse, indices)
    first, end = hash_size_offsets[:-1], hash_size_offsets[1:]
    lo = torch.searchsorted(unique_linear, hash_size_cumsum[first])
    hi = torch.searchsorted(unique_linear, hash_size_cumsum[end])
    last = end == num_features
    hi = torch.where(last, unique_linear.numel(), hi)
    empty = (hash_size_cumsum[first] == hash_size_cumsum[end]) & ~last
    count = torch.where(empty, 0, (hi - lo).clamp(min=0))
    group_bags = (end - first).clamp(min=0) * batch
    share = torch.where(group_bags > 0, count // group_bags.clamp(min=1), 0)
    extra = torch.where(group_bags > 0, count % group_bags.clamp(min=1), 0)
    bag_start = torch.cumsum(group_bags, 0) - group_bags
    position = torch.arange(int(group_bags.sum())) - bag_start.repeat_interleave(group_bags)
    lengths = (
        share.repeat_interleave(group_bags)
        + (position < extra.repeat_interleave(group_bags)).long()
    )
    lengths = F.pad(lengths, (0, offsets.numel() - 1 - lengths.numel()))
    return [lengths, F.pad(lengths.cumsum(0), (1, 0)), unique, reverse]


def _jagged_unique_indices_case(gen) -> Case:
    """jagged_unique_indices on the managed-collision shape torchrec's mc_modules passes (one group
    per feature): T features x B bags, ids drawn from hash sizes of 2^20, so about one in ten
    repeats within a feature."""
    features, batch, hash_size = 26, 2048, 1 << 20
    lengths = torch.randint(0, 20, (features * batch,), generator=gen)
    offsets = F.pad(lengths.cumsum(0), (1, 0))
    indices = torch.randint(0, hash_size, (int(offsets[-1]),), generator=gen) % (hash_size // 8)
    hash_size_cumsum = torch.arange(features + 1) * hash_size
    hash_size_offsets = torch.arange(features + 1)
    args = (hash_size_cumsum, hash_size_offsets, offsets, indices)
    return Case(
        f"jagged_unique_indices T={features} B={batch} int64",
        {
            "recops": lambda: R.jagged_unique_indices(*args),
            "torch": lambda: _torch_jagged_unique_indices(*args),
        },
        4 * _nbytes(indices) + 3 * _nbytes(offsets),
    )


# --------------------------------------------------------------------------- entry point
def run(limits) -> list[Row]:
    gen = torch.Generator().manual_seed(0)
    groups: list[Callable[[], list[Case]]] = [
        lambda: fbgemm_default_jagged_cases(gen),
        lambda: cumsum_cases(gen),
        lambda: permute_cases(gen),
        lambda: permute_pooled_cases(gen),
        lambda: block_bucketize_cases(gen),
        lambda: new_sparse_cases(gen),
        lambda: new_jagged_cases(gen),
        lambda: map(
            _with_copy_reference, jagged_dense_cases(LARGE, 1024, 512, 128, torch.float, gen)
        ),
    ]
    rows = []
    for make in groups:
        for case in make():  # one group's inputs live at a time
            rows += _measure(case)
    write_sweep(sweep(limits, gen), limits)

    print_speedups(SUITE, rows)
    return rows
