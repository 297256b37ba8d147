"""Variable batch size per feature ("VBE") in the TBE module (docs/ops.md section 7).

``batch_size_per_feature_per_rank[t][r]`` bags of feature t come from rank r; the pooled output is
flat, rank-major: for each rank, each feature's rows of its dim. Checked side by side with
fbgemm_gpu's CPU module where it implements VBE (SGD, rowwise Adagrad), and for every optimizer
against the same module on the fixed-batch equivalent: each feature padded with empty bags to the
largest batch, the output's rows gathered into the VBE layout and the gradient scattered back
(empty bags add nothing, to the output or to the update).
"""

import itertools

import pytest
import torch
from test_embedding import (
    FBGEMM_OPTIMIZERS,
    OPTIMIZERS,
    TOLERANCES,
    assert_close,
    fbgemm_module,
    grad_like,
    make_module,
)

from recops import BoundsCheckMode, OptimType, PoolingMode, SparseType

SHAPES = [(30, 8), (25, 4), (40, 12)]
# Table 0 serves features 0 and 1, adjacent: FBGEMM's CPU backward aggregates a shared table
# exactly only then.
FTM = [0, 0, 1, 2]
POOLED = [PoolingMode.SUM, PoolingMode.MEAN]


def make_batch_sizes(gen, num_features, ranks, max_batch=6):
    sizes = torch.randint(0, max_batch + 1, (num_features, ranks), generator=gen)
    return sizes.tolist()


def make_vbe_batch(gen, rows_per_feature, batch_sizes, max_bag=6, index_dtype=torch.int64):
    """Feature-major bags (feature t: sum of batch_sizes[t] bags, rank by rank) of 0..max_bag
    indices drawn from few rows, so duplicates occur within and across bags and features."""
    indices, lengths = [], []
    for rows, sizes in zip(rows_per_feature, batch_sizes, strict=True):
        bag_lengths = torch.randint(0, max_bag + 1, (sum(sizes),), generator=gen)
        lengths.append(bag_lengths)
        n = int(bag_lengths.sum())
        indices.append(torch.randint(0, min(rows, 5 + rows // 4), (n,), generator=gen))
    lengths = torch.cat(lengths)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    return torch.cat(indices).to(index_dtype), offsets.to(index_dtype)


class FixedBatchTwin:
    """Maps a VBE batch to the fixed-batch one of B = the largest feature's bag count (feature t's
    bags first, then empty ones), and outputs and gradients between the two layouts."""

    def __init__(self, batch_sizes, dims):
        self.dims = dims
        self.sizes = batch_sizes
        self.B = max((sum(s) for s in batch_sizes), default=0)
        self.columns = [0, *itertools.accumulate(dims)]

    def offsets(self, offsets):
        fixed = [0]
        bag = 0
        for sizes in self.sizes:
            count = sum(sizes)
            fixed.extend(int(offsets[bag + b + 1]) for b in range(count))
            fixed.extend([int(offsets[bag + count])] * (self.B - count))
            bag += count
        return torch.tensor(fixed, dtype=offsets.dtype)

    def blocks(self):
        """(feature, first local bag, bags) of each VBE output block, in output order."""
        ranks = len(self.sizes[0]) if self.sizes else 0
        starts = [[0, *itertools.accumulate(s)] for s in self.sizes]
        for r in range(ranks):
            for t in range(len(self.sizes)):
                yield t, starts[t][r], self.sizes[t][r]

    def to_vbe(self, fixed_out):
        parts = [
            fixed_out[b : b + n, self.columns[t] : self.columns[t + 1]].reshape(-1)
            for t, b, n in self.blocks()
        ]
        return torch.cat(parts) if parts else fixed_out.new_zeros(0)

    def to_fixed(self, vbe_grad):
        fixed = vbe_grad.new_zeros((self.B, self.columns[-1]))
        position = 0
        for t, b, n in self.blocks():
            size = n * self.dims[t]
            block = vbe_grad[position : position + size].view(n, self.dims[t])
            fixed[b : b + n, self.columns[t] : self.columns[t + 1]] = block
            position += size
        return fixed


def compare_steps(ours, theirs, steps, dtype, state_tol=(1e-4, 1e-5)):
    """Runs steps (indices, offsets, our forward's keyword arguments, per-sample weights, their
    call (per-sample weights -> their output, it in our layout), our gradient -> theirs) on both
    modules, comparing outputs, per-sample-weight gradients, weights and optimizer state."""
    for step, (indices, offsets, kwargs, psw, theirs_call, to_theirs) in enumerate(steps):
        ours_psw = None if psw is None else psw.clone().requires_grad_()
        theirs_psw = None if psw is None else psw.clone().requires_grad_()
        out = ours(indices, offsets, ours_psw, **kwargs)
        expected_out, expected_vbe = theirs_call(theirs_psw)
        assert out.shape == expected_vbe.shape
        assert_close(out, expected_vbe, max(dtype, out.dtype, key=lambda d: TOLERANCES[d][0]))
        grad = grad_like(out, seed=step)
        out.backward(grad)
        expected_out.backward(to_theirs(grad))
        if psw is not None:
            assert_close(ours_psw.grad, theirs_psw.grad, dtype, msg=f"psw grad, step {step}")
        for t, (w, expected) in enumerate(
            zip(ours.split_embedding_weights(), theirs.split_embedding_weights(), strict=True)
        ):
            assert_close(w, expected, dtype, msg=f"weights of table {t}, step {step}")
        for states, expected in zip(
            ours.split_optimizer_states(), theirs.split_optimizer_states(), strict=True
        ):
            for state, expected_state in zip(states, expected, strict=True):
                torch.testing.assert_close(
                    state, expected_state, rtol=state_tol[0], atol=state_tol[1]
                )


def vbe_steps(seed, num_steps, ranks=(1, 2, 3), weighted=False):
    gen = torch.Generator().manual_seed(seed)
    rows = [SHAPES[t][0] for t in FTM]
    for step in range(num_steps):
        sizes = make_batch_sizes(gen, len(FTM), ranks[step % len(ranks)])
        indices, offsets = make_vbe_batch(gen, rows, sizes)
        psw = torch.rand(indices.numel(), generator=gen) + 0.5 if weighted else None
        yield indices, offsets, sizes, psw


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("pooling", POOLED, ids=lambda p: p.name)
@pytest.mark.parametrize("optimizer", FBGEMM_OPTIMIZERS, ids=lambda o: o.name)
def test_matches_fbgemm(fbgemm_ops, optimizer, pooling, weighted):
    if optimizer == OptimType.EXACT_ADAGRAD:
        pytest.skip("FBGEMM implements VBE for SGD and rowwise Adagrad only")
    if weighted and pooling != PoolingMode.SUM:
        pytest.skip("FBGEMM's CPU module mishandles per-sample weights with MEAN pooling")
    ours = make_module(SHAPES, FTM, optimizer, pooling)
    theirs = fbgemm_module(fbgemm_ops, ours)
    steps = []
    for indices, offsets, sizes, psw in vbe_steps(21, 20, weighted=weighted):

        def call(theirs_psw, indices=indices, offsets=offsets, sizes=sizes):
            out = theirs(indices, offsets, theirs_psw, batch_size_per_feature_per_rank=sizes)
            return out, out

        kwargs = dict(batch_size_per_feature_per_rank=sizes)
        steps.append((indices, offsets, kwargs, psw, call, lambda g: g))
    compare_steps(ours, theirs, steps, torch.float32)


@pytest.mark.parametrize("precision", [SparseType.FP32, SparseType.FP16], ids=lambda p: p.name)
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("pooling", POOLED, ids=lambda p: p.name)
@pytest.mark.parametrize("optimizer", OPTIMIZERS, ids=lambda o: o.name)
def test_matches_fixed_batch_twin(optimizer, pooling, weighted, precision):
    ours = make_module(SHAPES, FTM, optimizer, pooling, precision)
    twin = make_module(SHAPES, FTM, optimizer, pooling, precision)
    dims = [SHAPES[t][1] for t in FTM]
    steps = []
    seed = 31 + OPTIMIZERS.index(optimizer) * 4 + int(pooling) * 2 + weighted
    for indices, offsets, sizes, psw in vbe_steps(seed, 20, ranks=(2, 1, 4), weighted=weighted):
        mapping = FixedBatchTwin(sizes, dims)

        def call(twin_psw, indices=indices, offsets=offsets, mapping=mapping):
            out = twin(indices, mapping.offsets(offsets), twin_psw)
            return out, mapping.to_vbe(out)

        kwargs = dict(batch_size_per_feature_per_rank=sizes)
        steps.append((indices, offsets, kwargs, psw, call, mapping.to_fixed))
    compare_steps(ours, twin, steps, precision.as_dtype(), state_tol=(1e-6, 1e-7))


def test_output_layout_is_rank_major():
    """Each (rank, feature) block holds that rank's bags of the feature, rows of its dim."""
    module = make_module([(10, 2), (10, 3)], [0, 1], OptimType.EXACT_SGD, PoolingMode.SUM)
    weights = module.split_embedding_weights()
    sizes = [[1, 2], [2, 0]]  # feature 0: 1 bag from rank 0, 2 from rank 1; feature 1: 2, 0
    indices = torch.tensor([1, 2, 3, 4, 5])
    offsets = torch.tensor([0, 1, 2, 3, 4, 5])
    out = module(indices, offsets, batch_size_per_feature_per_rank=sizes)
    expected = torch.cat(
        [weights[0][1], weights[1][4], weights[1][5], weights[0][2], weights[0][3]]
    )
    torch.testing.assert_close(out, expected)


def test_empty_and_zero_rank_batches():
    module = make_module(SHAPES, FTM, OptimType.EXACT_ROWWISE_ADAGRAD, PoolingMode.SUM)
    before = module.weights_host.detach().clone()
    cases = [([[0], [0], [0], [0]], 0), ([[], [], [], []], 0)]
    cases.append(([[0, 2], [0, 0], [0, 0], [1, 0]], 2 * SHAPES[0][1] + SHAPES[2][1]))
    for sizes, size in cases:
        bags = sum(map(sum, sizes))
        out = module(
            torch.zeros(0, dtype=torch.long),
            torch.zeros(bags + 1, dtype=torch.long),
            batch_size_per_feature_per_rank=sizes,
        )
        assert out.shape == (size,)
        out.backward(torch.ones_like(out))
    assert torch.equal(module.weights_host.detach(), before)


@pytest.mark.parametrize(
    "sizes, match",
    [
        ([[1], [1], [1]], "batch_size_per_feature_per_rank must be int64 \\[T, R\\]"),
        ([[1], [1], [1], [2]], "add up to"),
        ([[1], [1], [1], [0]], "add up to"),
        ([[1, -1], [1, 0], [1, 0], [1, 0]], "must be >= 0"),
        ([[1, 2], [1], [1], [1]], "batch_size_per_feature_per_rank"),
    ],
)
def test_bad_batch_sizes_raise_and_change_nothing(sizes, match):
    for mode in (BoundsCheckMode.FATAL, BoundsCheckMode.NONE):
        module = make_module(
            SHAPES, FTM, OptimType.EXACT_ADAGRAD, PoolingMode.SUM, bounds_check_mode=mode
        )
        before = module.weights_host.detach().clone()
        with pytest.raises((RuntimeError, ValueError), match=match):
            module(
                torch.tensor([1, 2, 3, 4]),
                torch.tensor([0, 1, 2, 3, 4]),
                batch_size_per_feature_per_rank=sizes,
            )
        assert torch.equal(module.weights_host.detach(), before)
        assert torch.all(module.momentum1_host == 0)


def test_bounds_check_names_the_feature_of_a_variable_batch():
    module = make_module(
        SHAPES, FTM, OptimType.EXACT_SGD, PoolingMode.SUM, bounds_check_mode=BoundsCheckMode.FATAL
    )
    # Feature 2 (25 rows) has bags 2 and 3; index 25 in its second bag is out of range.
    indices = torch.tensor([1, 2, 3, 25, 4])
    offsets = torch.tensor([0, 1, 2, 3, 4, 5])
    sizes = [[2], [0], [2], [1]]
    with pytest.raises(IndexError, match="indices\\[3\\] = 25"):
        module(indices, offsets, batch_size_per_feature_per_rank=sizes)
    module.bounds_check_mode = BoundsCheckMode.NONE
    with pytest.raises(IndexError, match="feature 2 \\(bag 1\\)"):
        module(indices, offsets, batch_size_per_feature_per_rank=sizes)
    before = module.weights_host.detach().clone()
    module.bounds_check_mode = BoundsCheckMode.IGNORE
    out = module(indices, offsets.clone(), batch_size_per_feature_per_rank=sizes)
    assert torch.equal(out[20:24], module.split_embedding_weights()[1][0])  # repaired to row 0
    assert torch.equal(module.weights_host.detach(), before)


def test_none_pooling_rejects_a_variable_batch():
    module = make_module([(10, 4)], [0], OptimType.EXACT_SGD, PoolingMode.NONE)
    with pytest.raises(RuntimeError, match="batch_size_per_feature_per_rank.*PoolingMode.NONE"):
        module(torch.tensor([1]), torch.tensor([0, 1]), batch_size_per_feature_per_rank=[[1]])
