"""Table-batched embedding bags with fused optimizer (docs/ops.md section 7).

Every configuration is checked against a reference built here from torch.nn.functional
embedding_bag / embedding per table (sparse gradients, coalesced: summed per row) plus the update
formulas of docs/ops.md, in float64; and, where FBGEMM's CPU module implements the feature, side by
side with fbgemm_gpu's SplitTableBatchedEmbeddingBagsCodegen on identical weights and inputs.
"""

import itertools
import warnings

import pytest
import torch
import torch.nn.functional as F
from threads import num_threads

import recops
from recops import (
    BoundsCheckMode,
    ComputeDevice,
    EmbeddingLocation,
    OptimType,
    PoolingMode,
    SparseType,
    SplitTableBatchedEmbeddingBagsCodegen,
    WeightDecayMode,
)
from recops.embedding.optimizers import OPTIMIZERS as OPTIMIZER_TABLE

ops = torch.ops.recops

# Every optimizer of the optimizer table, in its order; those FBGEMM's CPU module implements too;
# the Adam family (bias-corrected by the step count, LAMB included), which it has no CPU kernel
# for.
OPTIMIZERS = list(OPTIMIZER_TABLE)
FBGEMM_OPTIMIZERS = [o for o in OPTIMIZERS if OPTIMIZER_TABLE[o].fbgemm_cpu]
ADAM_FAMILY = [o for o in OPTIMIZERS if OPTIMIZER_TABLE[o].bias_corrected]
LAMB_FAMILY = [o for o in ADAM_FAMILY if OPTIMIZER_TABLE[o].decays_in_update]
ROWWISE_SECOND_MOMENT = [o for o in ADAM_FAMILY if OPTIMIZER_TABLE[o].state_layouts[1] == "rowwise"]
BETAS = (0.8, 0.9)  # the Adam family's beta1, beta2 in these tests
# Rowwise RMSprop-AR's ar_alpha, ema_beta and min_shrinkage in these tests: with LR, a row
# untouched for 4 steps reaches the min_shrinkage floor.
RMSPROP_AR = {"ar_alpha": 4.0, "ema_beta": 0.7, "min_shrinkage": 0.3}
POOLINGS = [PoolingMode.SUM, PoolingMode.MEAN, PoolingMode.NONE]
PRECISIONS = [SparseType.FP32, SparseType.FP16, SparseType.BF16]
HOST = (EmbeddingLocation.HOST, ComputeDevice.CPU)
LR, EPS = 0.05, 1e-2
# Per storage dtype: (rtol, atol) for weights and outputs after a few steps.
TOLERANCES = {
    torch.float32: (1e-5, 1e-5),
    torch.float16: (4e-3, 1e-2),
    torch.bfloat16: (1.6e-2, 1.6e-2),
}


# --------------------------------------------------------------------------- configurations
def make_tables(gen, num_tables, pooling, max_dim=256):
    """(rows, dim) per table: dims multiples of 4 up to max_dim, one dim for NONE pooling."""
    dims = [4 * int(torch.randint(1, max_dim // 4 + 1, (1,), generator=gen)) for _ in range(2)]
    shapes = []
    for t in range(num_tables):
        rows = int(torch.randint(8, 40, (1,), generator=gen))
        dim = dims[0] if pooling == PoolingMode.NONE else dims[t % 2] + 4 * t
        shapes.append((rows, min(dim, max_dim)))
    return shapes


def shared_table_map(num_tables, adjacent):
    """Features of num_tables tables where table 0 serves two features: next to each other, or
    apart (FBGEMM's CPU backward aggregates a shared table exactly only when they are adjacent)."""
    features = list(range(num_tables))
    return [0, *features] if adjacent or num_tables == 1 else [*features, 0]


def make_batch(gen, rows_per_feature, batch_size, max_bag, index_dtype=torch.int64):
    """Feature-major bags of 0..max_bag indices, drawn from few rows so duplicates occur within
    and across bags."""
    lengths = torch.randint(0, max_bag + 1, (len(rows_per_feature) * batch_size,), generator=gen)
    indices = []
    for f, rows in enumerate(rows_per_feature):
        n = int(lengths[f * batch_size : (f + 1) * batch_size].sum())
        indices.append(torch.randint(0, min(rows, 6 + rows // 3), (n,), generator=gen))
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    return torch.cat(indices).to(index_dtype), offsets.to(index_dtype)


def make_module(shapes, ftm, optimizer, pooling, precision=SparseType.FP32, **kwargs):
    module = SplitTableBatchedEmbeddingBagsCodegen(
        [(rows, dim, *HOST) for rows, dim in shapes],
        feature_table_map=ftm,
        optimizer=optimizer,
        pooling_mode=pooling,
        weights_precision=precision,
        learning_rate=LR,
        eps=EPS,
        beta1=BETAS[0],
        beta2=BETAS[1],
        **RMSPROP_AR,
        **kwargs,
    )
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for w in module.split_embedding_weights():
            w.copy_(torch.rand(w.shape, generator=gen, dtype=torch.float64) * 2 - 1)
    return module


def grad_like(out, seed):
    return torch.randn(out.shape, generator=torch.Generator().manual_seed(seed)).to(out.dtype)


# --------------------------------------------------------------------------- reference
class Reference:
    """The same tables in float64 with torch's embedding ops and the update formulas."""

    def __init__(self, module):
        self.ftm = module.feature_table_map
        self.dtype = module.weights_precision.as_dtype()
        self.weights = [w.double().clone() for w in module.split_embedding_weights()]
        self.states = [[s.double().clone() for s in st] for st in module.split_optimizer_states()]
        self.iter = int(module.iter)  # steps taken: bias correction, RMSprop-AR's staleness
        self.optimizer = module.optimizer
        self.pooling = module.pooling_mode
        self.wd, self.wd_mode = module.weight_decay, module.weight_decay_mode
        self.clip = module.max_gradient if module.gradient_clipping else None

    def forward(self, indices, offsets, psw, leaves):
        indices, offsets = indices.long(), offsets.long()
        T = len(self.ftm)
        B = (offsets.numel() - 1) // T
        outs = []
        for f, t in enumerate(self.ftm):
            begin, end = int(offsets[f * B]), int(offsets[(f + 1) * B])
            idx = indices[begin:end]
            bag_offsets = offsets[f * B : (f + 1) * B] - begin
            weights = None if psw is None else psw[begin:end]
            if self.pooling == PoolingMode.NONE:
                out = F.embedding(idx, leaves[t], sparse=True)
                outs.append(out if weights is None else out * weights[:, None])
                continue
            out = F.embedding_bag(
                idx, leaves[t], bag_offsets, mode="sum", per_sample_weights=weights, sparse=True
            )
            if self.pooling == PoolingMode.MEAN:
                lengths = torch.diff(offsets[f * B : (f + 1) * B + 1]).clamp(min=1)
                out = out / lengths[:, None]
            outs.append(out)
        return torch.cat(outs, dim=0 if self.pooling == PoolingMode.NONE else 1)

    def step(self, indices, offsets, grad_output, psw=None):
        """Returns (output, per-sample-weight gradient) and applies the update."""
        self.iter += 1
        leaves = [w.clone().requires_grad_() for w in self.weights]
        psw = None if psw is None else psw.double().detach().requires_grad_()
        out = self.forward(indices, offsets, psw, leaves)
        grad = grad_output.double()
        if self.clip is not None:
            grad = grad.clamp(-self.clip, self.clip)
        out.backward(grad)
        for t, leaf in enumerate(leaves):
            if leaf.grad is not None:
                g = leaf.grad.coalesce()
                self.update(t, g.indices()[0], g.values())
        return out.detach(), None if psw is None else psw.grad

    def update(self, t, rows, g):
        w, lr, states = self.weights[t], LR, self.states[t] if self.states else []
        keep = 1.0
        if self.optimizer in LAMB_FAMILY:  # LAMB decays in its update direction, whatever the mode
            pass
        elif self.optimizer == OptimType.ROWWISE_RMSPROP_AR:  # no weight decay, whatever the mode
            pass
        elif self.optimizer in ADAM_FAMILY:  # FBGEMM's Adam decays decoupled, whatever the mode
            keep = 1 - lr * self.wd
        elif self.wd_mode == WeightDecayMode.L2:
            g = g + self.wd * w[rows]
        elif self.wd_mode == WeightDecayMode.DECOUPLE:
            keep = 1 - lr * self.wd
        if self.optimizer == OptimType.EXACT_SGD:
            new = keep * w[rows] - lr * g
        elif self.optimizer == OptimType.EXACT_ADAGRAD:
            states[0][rows] += g * g
            new = keep * w[rows] - lr * g / (states[0][rows].sqrt() + EPS)
        elif self.optimizer == OptimType.EXACT_ROWWISE_ADAGRAD:
            states[0][rows] += (g * g).mean(dim=1)
            multiplier = lr / (states[0][rows].sqrt() + EPS)
            new = keep * w[rows] - multiplier[:, None] * g
        elif self.optimizer == OptimType.ROWWISE_RMSPROP_AR:
            # A row untouched since step prev_iter (0: never) shrinks by
            # max(min_shrinkage, 1 - clamp(lr * ar_alpha * steps since, 0, 1)).
            v, prev_iter = states
            v[rows] = RMSPROP_AR["ema_beta"] * v[rows] + (1 - RMSPROP_AR["ema_beta"]) * (
                g * g
            ).mean(dim=1)
            gap = torch.where(prev_iter[rows] == 0, 1.0, self.iter - prev_iter[rows])
            shrink = (lr * RMSPROP_AR["ar_alpha"] * gap).clamp(0, 1)
            keep = (1 - shrink).clamp(min=RMSPROP_AR["min_shrinkage"])[:, None]
            prev_iter[rows] = float(self.iter)
            new = keep * w[rows] - (lr / (v[rows].sqrt() + EPS))[:, None] * g
        else:
            (b1, b2), step = BETAS, self.iter
            m, v = states
            m[rows] = b1 * m[rows] + (1 - b1) * g
            if self.optimizer in ROWWISE_SECOND_MOMENT:
                v[rows] = b2 * v[rows] + (1 - b2) * (g * g).mean(dim=1)
                denominator = ((v[rows] / (1 - b2**step)).sqrt() + EPS)[:, None]
            else:
                v[rows] = b2 * v[rows] + (1 - b2) * g * g
                denominator = (v[rows] / (1 - b2**step)).sqrt() + EPS
            direction = (m[rows] / (1 - b1**step)) / denominator
            if self.optimizer in LAMB_FAMILY:
                # Each row is a layer: r = direction + wd * w, scaled by ||w|| / ||r|| (1 where a
                # norm is 0).
                r = direction + self.wd * w[rows]
                w_norm = w[rows].norm(dim=1, keepdim=True)
                r_norm = r.norm(dim=1, keepdim=True)
                ratio = torch.where((w_norm > 0) & (r_norm > 0), w_norm / r_norm, 1.0)
                new = w[rows] - lr * ratio * r
            else:
                new = keep * w[rows] - lr * direction
        w[rows] = new.to(self.dtype).double()  # stored precision


def assert_close(actual, expected, dtype, msg=""):
    rtol, atol = TOLERANCES[dtype]
    torch.testing.assert_close(actual.double(), expected.double(), rtol=rtol, atol=atol, msg=msg)


def check_against_reference(module, batches, psw_fn=None, steps_dtype=None, reference=None):
    ref = reference or Reference(module)
    dtype = steps_dtype or module.weights_precision.as_dtype()
    for step, (indices, offsets) in enumerate(batches):
        psw = None if psw_fn is None else psw_fn(indices)
        psw_leaf = None if psw is None else psw.clone().requires_grad_()
        out = module(indices, offsets, psw_leaf)
        grad = grad_like(out, seed=step)
        expected, expected_psw_grad = ref.step(indices, offsets, grad, psw)
        assert_close(out, expected, max(dtype, out.dtype, key=lambda d: TOLERANCES[d][0]))
        out.backward(grad)
        if psw is not None:
            assert_close(psw_leaf.grad, expected_psw_grad, dtype, msg="per-sample weight grad")
        for t, w in enumerate(module.split_embedding_weights()):
            assert_close(w, ref.weights[t], dtype, msg=f"weights of table {t}, step {step}")
        for t, states in enumerate(module.split_optimizer_states()):
            for state, expected in zip(states, ref.states[t], strict=True):
                torch.testing.assert_close(state.double(), expected, rtol=1e-4, atol=1e-5)


# --------------------------------------------------------------------------- vs reference
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("precision", PRECISIONS, ids=lambda p: p.name)
@pytest.mark.parametrize("pooling", POOLINGS, ids=lambda p: p.name)
@pytest.mark.parametrize("optimizer", OPTIMIZERS, ids=lambda o: o.name)
def test_matches_reference(optimizer, pooling, precision, weighted):
    seed = OPTIMIZERS.index(optimizer) * 100 + int(pooling) * 10 + int(precision) * 2 + weighted
    gen = torch.Generator().manual_seed(seed)
    num_tables = int(torch.randint(1, 5, (1,), generator=gen))
    shapes = make_tables(gen, num_tables, pooling)
    ftm = shared_table_map(num_tables, adjacent=False)
    module = make_module(shapes, ftm, optimizer, pooling, precision)
    rows = [shapes[t][0] for t in ftm]
    batch_size = int(torch.randint(1, 24, (1,), generator=gen))
    batches = [make_batch(gen, rows, batch_size, max_bag=8) for _ in range(3)]
    psw_fn = (lambda idx: torch.rand(idx.numel(), generator=gen) + 0.5) if weighted else None
    check_against_reference(module, batches, psw_fn)


@pytest.mark.parametrize("seed", range(4))
def test_random_shapes_and_batches(seed):
    """T = 1..5 features (one table shared), mixed dims up to 256, B = 1..128, bags of 0..20."""
    gen = torch.Generator().manual_seed(100 + seed)
    num_tables = 1 + seed
    shapes = make_tables(gen, num_tables, PoolingMode.SUM)
    ftm = shared_table_map(num_tables, adjacent=seed % 2 == 0)
    optimizer = OPTIMIZERS[seed % 3]
    module = make_module(shapes, ftm, optimizer, PoolingMode.SUM)
    rows = [shapes[t][0] for t in ftm]
    batches = [make_batch(gen, rows, batch_size, max_bag=20) for batch_size in (1, 128, 37)]
    check_against_reference(module, batches)


@pytest.mark.parametrize("mode", [WeightDecayMode.L2, WeightDecayMode.DECOUPLE], ids=str)
@pytest.mark.parametrize("optimizer", OPTIMIZERS, ids=lambda o: o.name)
def test_weight_decay(optimizer, mode):
    gen = torch.Generator().manual_seed(3)
    shapes = make_tables(gen, 2, PoolingMode.SUM)
    ftm = shared_table_map(2, adjacent=True)
    module = make_module(
        shapes, ftm, optimizer, PoolingMode.SUM, weight_decay=0.3, weight_decay_mode=mode
    )
    batches = [make_batch(gen, [shapes[t][0] for t in ftm], 9, max_bag=6) for _ in range(3)]
    check_against_reference(module, batches)


@pytest.mark.parametrize("optimizer", OPTIMIZERS, ids=lambda o: o.name)
def test_gradient_clipping(optimizer):
    gen = torch.Generator().manual_seed(4)
    shapes = make_tables(gen, 2, PoolingMode.MEAN)
    ftm = shared_table_map(2, adjacent=False)
    module = make_module(
        shapes, ftm, optimizer, PoolingMode.MEAN, gradient_clipping=True, max_gradient=0.4
    )
    batches = [make_batch(gen, [shapes[t][0] for t in ftm], 9, max_bag=6) for _ in range(3)]
    check_against_reference(module, batches, lambda idx: torch.rand(idx.numel(), generator=gen))


def test_large_table_sorts_with_64_bit_keys():
    """2^23 rows and per-sample weights (positions as payload) need more than 32 key bits."""
    rows = 1 << 23
    module = SplitTableBatchedEmbeddingBagsCodegen(
        [(rows, 1, *HOST)], optimizer=OptimType.EXACT_SGD, learning_rate=1.0
    )
    gen = torch.Generator().manual_seed(17)
    hot = torch.tensor([0, rows - 1, rows // 2])
    indices = torch.cat([hot, torch.randint(0, rows, (3000,), generator=gen), hot.flip(0)])
    offsets = torch.tensor([0, 700, 701, indices.numel()])
    psw = torch.rand(indices.numel(), generator=gen)
    module(indices, offsets, psw).sum().backward()
    expected = torch.zeros(rows, dtype=torch.float64).index_add_(0, indices, -psw.double())
    touched = indices.unique()
    torch.testing.assert_close(
        module.weights_host.detach()[touched].double(), expected[touched], rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize("output_dtype", PRECISIONS, ids=lambda p: p.name)
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=str)
def test_index_and_output_dtypes(index_dtype, output_dtype):
    gen = torch.Generator().manual_seed(5)
    shapes = make_tables(gen, 3, PoolingMode.SUM)
    ftm = shared_table_map(3, adjacent=False)
    module = make_module(
        shapes, ftm, OptimType.EXACT_ROWWISE_ADAGRAD, PoolingMode.SUM, output_dtype=output_dtype
    )
    rows = [shapes[t][0] for t in ftm]
    batches = [make_batch(gen, rows, 11, max_bag=5, index_dtype=index_dtype) for _ in range(2)]
    out = module(*batches[0])
    assert out.dtype == output_dtype.as_dtype()
    check_against_reference(module, batches[1:])


@pytest.mark.parametrize("output_dtype", PRECISIONS, ids=lambda p: p.name)
def test_sequence_rows_streamed_equal_cached(output_dtype, monkeypatch):
    """A sequence (NONE) lookup writes the same rows with streaming stores (used above the cache
    size; forced here) as with normal ones: rows of 132 elements end inside a cache line."""
    gen = torch.Generator().manual_seed(12)
    module = make_module(
        [(40, 132), (30, 132)],
        [0, 1, 0],
        OptimType.EXACT_SGD,
        PoolingMode.NONE,
        output_dtype=output_dtype,
    )
    module.weights_host.data.uniform_(-1, 1, generator=gen)
    batch = make_batch(gen, [40, 30, 40], 9, max_bag=6)
    with torch.no_grad():
        cached = module(*batch)
        monkeypatch.setenv("RECOPS_STREAM_ABOVE_BYTES", "0")
        streamed = module(*batch)
    assert cached.shape[0] == batch[0].numel() > 0
    assert torch.equal(streamed, cached)


@pytest.mark.parametrize("isa", ["baseline", "avx2"])
def test_instruction_set_variants_agree(isa, monkeypatch):
    """Every compiled variant computes the same results (up to fp32 summation order)."""
    gen = torch.Generator().manual_seed(6)
    shapes = [
        (30, 468),
        (20, 36),
    ]  # column blocks of every width (256 + 128 + 64 + 16 + 4), fp16 tails
    for precision, optimizer in itertools.product(PRECISIONS, OPTIMIZERS):
        batch = make_batch(gen, [30, 30, 20], 8, max_bag=7)
        results = []
        for cap in (None, isa):
            if cap is not None:
                monkeypatch.setenv("RECOPS_CPU_ISA", cap)
            module = make_module(shapes, [0, 0, 1], optimizer, PoolingMode.SUM, precision)
            out = module(*batch, torch.rand(batch[0].numel(), generator=torch.Generator()))
            out.backward(torch.ones_like(out))
            results.append((out.detach(), module.weights_host.detach().clone()))
            monkeypatch.delenv("RECOPS_CPU_ISA", raising=False)
        dtype = precision.as_dtype()
        for a, b in zip(results[0], results[1], strict=True):
            assert_close(a, b, dtype)


def test_thread_count_does_not_change_results():
    gen = torch.Generator().manual_seed(8)
    shapes = make_tables(gen, 3, PoolingMode.SUM)
    rows = [shapes[t][0] for t in [0, 0, 1, 2]]
    batch = make_batch(gen, rows, 64, max_bag=20)
    results = []
    for n in (1, max(2, torch.get_num_threads())):
        with num_threads(n):
            module = make_module(shapes, [0, 0, 1, 2], OptimType.EXACT_ADAGRAD, PoolingMode.SUM)
            out = module(*batch)
            out.backward(grad_like(out, 0))
            results.append(module.weights_host.detach().clone())
    assert torch.equal(results[0], results[1])


def test_feature_requires_grad():
    gen = torch.Generator().manual_seed(9)
    module = make_module([(20, 8), (20, 12)], [0, 1], OptimType.EXACT_SGD, PoolingMode.SUM)
    indices, offsets = make_batch(gen, [20, 20], 5, max_bag=4)
    psw = torch.rand(indices.numel(), requires_grad=True)
    out = module(indices, offsets, psw, feature_requires_grad=torch.tensor([0, 1]))
    out.backward(grad_like(out, 1))
    first_feature = slice(0, int(offsets[5]))
    assert torch.all(psw.grad[first_feature] == 0)
    assert torch.any(psw.grad[int(offsets[5]) :] != 0)


@pytest.mark.parametrize("optimizer", OPTIMIZERS, ids=lambda o: o.name)
@pytest.mark.parametrize("pooling", POOLINGS, ids=lambda p: p.name)
def test_empty_batches(pooling, optimizer):
    module = make_module([(10, 8), (10, 8)], [0, 1], optimizer, pooling)
    before = module.weights_host.detach().clone()
    for offsets in (torch.zeros(1, dtype=torch.long), torch.zeros(7, dtype=torch.long)):
        out = module(torch.zeros(0, dtype=torch.long), offsets)
        batch = (offsets.numel() - 1) // 2
        expected = (0, 8) if pooling == PoolingMode.NONE else (batch, 16)
        assert out.shape == expected and torch.all(out == 0)
        out.sum().backward()
    assert torch.equal(module.weights_host.detach(), before)
    assert all(
        torch.all(state == 0) for states in module.split_optimizer_states() for state in states
    )


# --------------------------------------------------------------------------- vs FBGEMM
def fbgemm_module(fbgemm, module, **kwargs):
    """FBGEMM's CPU module with the same configuration and weights as `module`."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from fbgemm_gpu.split_embedding_configs import SparseType as FbgemmSparseType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import (
        EmbeddingLocation as FbgemmLocation,
    )
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import PoolingMode as FbgemmPooling
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice as FbgemmDevice,
    )
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        SplitTableBatchedEmbeddingBagsCodegen as FbgemmTBE,
    )
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        WeightDecayMode as FbgemmWeightDecay,
    )

    reference = FbgemmTBE(
        [
            (rows, dim, FbgemmLocation.HOST, FbgemmDevice.CPU)
            for rows, dim, *_ in module.embedding_specs
        ],
        feature_table_map=module.feature_table_map,
        optimizer=EmbOptimType[module.optimizer.name],
        pooling_mode=FbgemmPooling(int(module.pooling_mode)),
        weights_precision=FbgemmSparseType[module.weights_precision.name],
        output_dtype=FbgemmSparseType[module.output_dtype.name],
        learning_rate=LR,
        eps=EPS,
        weight_decay=module.weight_decay,
        weight_decay_mode=FbgemmWeightDecay(int(module.weight_decay_mode)),
        ar_alpha=module.ar_alpha,
        ema_beta=module.ema_beta,
        min_shrinkage=module.min_shrinkage,
        gradient_clipping=module.gradient_clipping,
        max_gradient=module.max_gradient,
        **kwargs,
    )
    with torch.no_grad():
        reference.weights_host.copy_(module.weights_host)
    return reference


def run_side_by_side(fbgemm, module, batches, weighted=False, fbgemm_kwargs=None):
    theirs = fbgemm_module(fbgemm, module, **(fbgemm_kwargs or {}))
    dtype = module.weights_precision.as_dtype()
    gen = torch.Generator().manual_seed(11)
    for step, (indices, offsets) in enumerate(batches):
        psw = torch.rand(indices.numel(), generator=gen) + 0.5 if weighted else None
        ours_psw = None if psw is None else psw.clone().requires_grad_()
        theirs_psw = None if psw is None else psw.clone().requires_grad_()
        ours_out = module(indices, offsets, ours_psw)
        theirs_out = theirs(indices, offsets, theirs_psw)
        assert_close(
            ours_out, theirs_out, max(dtype, ours_out.dtype, key=lambda d: TOLERANCES[d][0])
        )
        grad = grad_like(ours_out, seed=step)
        ours_out.backward(grad)
        theirs_out.backward(grad)
        if psw is not None:
            assert_close(ours_psw.grad, theirs_psw.grad, dtype, msg="per-sample weight grad")
        ours_w, theirs_w = module.split_embedding_weights(), theirs.split_embedding_weights()
        for t, (ours, expected) in enumerate(zip(ours_w, theirs_w, strict=True)):
            assert_close(ours, expected, dtype, msg=f"weights of table {t}, step {step}")
        for ours, expected in zip(
            module.split_optimizer_states(), theirs.split_optimizer_states(), strict=True
        ):
            # Every state buffer (momentum1 first).
            for ours_state, their_state in zip(ours, expected, strict=True):
                torch.testing.assert_close(ours_state, their_state, rtol=1e-4, atol=1e-5)


# FBGEMM's CPU module lacks bf16 weights and outputs; with per-sample weights it ignores them
# under NONE pooling and leaves the 1/L out of MEAN pooling's backward; those are compared with
# the reference only.
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("precision", PRECISIONS[:2], ids=lambda p: p.name)
@pytest.mark.parametrize("pooling", POOLINGS, ids=lambda p: p.name)
@pytest.mark.parametrize("optimizer", FBGEMM_OPTIMIZERS, ids=lambda o: o.name)
def test_matches_fbgemm(fbgemm_ops, optimizer, pooling, precision, weighted):
    if weighted and pooling != PoolingMode.SUM:
        pytest.skip("FBGEMM's CPU module mishandles per-sample weights with MEAN / NONE pooling")
    gen = torch.Generator().manual_seed(FBGEMM_OPTIMIZERS.index(optimizer) * 10 + int(pooling))
    num_tables = 3
    shapes = make_tables(gen, num_tables, pooling)
    ftm = shared_table_map(num_tables, adjacent=True)
    module = make_module(shapes, ftm, optimizer, pooling, precision)
    rows = [shapes[t][0] for t in ftm]
    batches = [make_batch(gen, rows, batch_size, max_bag=12) for batch_size in (5, 16, 1, 32)]
    run_side_by_side(fbgemm_ops, module, batches, weighted)


@pytest.mark.parametrize("mode", [WeightDecayMode.L2, WeightDecayMode.DECOUPLE], ids=str)
def test_rowwise_weight_decay_matches_fbgemm(fbgemm_ops, mode):
    # FBGEMM's CPU rowwise Adagrad applies weight decay only on its generic path, taken by shared
    # tables (and fp16 weights); its fast path for unshared fp32 tables ignores weight decay. So
    # here one table serves both features.
    gen = torch.Generator().manual_seed(12)
    shapes = make_tables(gen, 1, PoolingMode.SUM)
    module = make_module(
        shapes,
        [0, 0],
        OptimType.EXACT_ROWWISE_ADAGRAD,
        PoolingMode.SUM,
        weight_decay=0.2,
        weight_decay_mode=mode,
    )
    batches = [make_batch(gen, [shapes[0][0]] * 2, 8, max_bag=6) for _ in range(3)]
    run_side_by_side(fbgemm_ops, module, batches)


@pytest.mark.parametrize("weight_decay_mode", list(WeightDecayMode)[:3], ids=lambda m: m.name)
@pytest.mark.parametrize("precision", PRECISIONS[:2], ids=lambda p: p.name)
def test_rowwise_rmsprop_ar_matches_fbgemm_over_20_steps(fbgemm_ops, precision, weight_decay_mode):
    """Rows touched at irregular intervals (small bags over many rows): the staleness shrink at
    every gap up to the min_shrinkage floor; weight decay in any mode is ignored, as FBGEMM does."""
    gen = torch.Generator().manual_seed(21)
    shapes = make_tables(gen, 3, PoolingMode.SUM, max_dim=64)
    ftm = shared_table_map(3, adjacent=True)
    module = make_module(
        shapes,
        ftm,
        OptimType.ROWWISE_RMSPROP_AR,
        PoolingMode.SUM,
        precision,
        weight_decay=0.1,
        weight_decay_mode=weight_decay_mode,
    )
    rows = [shapes[t][0] for t in ftm]
    sizes = torch.randint(1, 6, (20,), generator=gen).tolist()
    batches = [make_batch(gen, rows, batch_size, max_bag=3) for batch_size in sizes]
    run_side_by_side(fbgemm_ops, module, batches)
    assert int(module.iter) == 20
    assert any((states[1] > 1).any() for states in module.split_optimizer_states())


@pytest.mark.parametrize("optimizer", FBGEMM_OPTIMIZERS, ids=lambda o: o.name)
def test_optimizer_state_names_match_fbgemm(fbgemm_ops, optimizer):
    module = make_module([(20, 8), (30, 4)], [0, 1], optimizer, PoolingMode.SUM)
    theirs = fbgemm_module(fbgemm_ops, module)
    ours_state, their_state = module.get_optimizer_state(), theirs.get_optimizer_state()
    assert [list(s) for s in ours_state] == [list(s) for s in their_state]
    assert set(module.state_dict()) <= set(theirs.state_dict())


@pytest.mark.parametrize("optimizer", FBGEMM_OPTIMIZERS, ids=lambda o: o.name)
def test_gradient_clipping_matches_fbgemm(fbgemm_ops, optimizer):
    gen = torch.Generator().manual_seed(13)
    shapes = make_tables(gen, 2, PoolingMode.SUM)
    ftm = shared_table_map(2, adjacent=True)
    module = make_module(
        shapes, ftm, optimizer, PoolingMode.SUM, gradient_clipping=True, max_gradient=0.3
    )
    batches = [make_batch(gen, [shapes[t][0] for t in ftm], 8, max_bag=6) for _ in range(3)]
    run_side_by_side(fbgemm_ops, module, batches, weighted=True)


def test_state_dict_loads_from_fbgemm(fbgemm_ops):
    gen = torch.Generator().manual_seed(14)
    module = make_module([(20, 8), (30, 4)], [0, 1, 1], OptimType.EXACT_ADAGRAD, PoolingMode.SUM)
    theirs = fbgemm_module(fbgemm_ops, module)
    out = theirs(*make_batch(gen, [20, 30, 30], 6, max_bag=5))
    out.backward(torch.ones_like(out))
    fresh = make_module([(20, 8), (30, 4)], [0, 1, 1], OptimType.EXACT_ADAGRAD, PoolingMode.SUM)
    fresh.load_state_dict(theirs.state_dict(), strict=False)
    assert torch.equal(fresh.weights_host, theirs.weights_host)
    assert torch.equal(fresh.momentum1_host, theirs.momentum1_host)


def test_fbgemm_enums_are_accepted(fbgemm_ops):
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from fbgemm_gpu.split_embedding_configs import SparseType as FbgemmSparseType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import (
        EmbeddingLocation as FbgemmLocation,
    )
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice as FbgemmDevice,
    )

    module = SplitTableBatchedEmbeddingBagsCodegen(
        [(10, 4, FbgemmLocation.HOST, FbgemmDevice.CPU)],
        optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD,
        weights_precision=FbgemmSparseType.FP16,
    )
    assert module.optimizer == OptimType.EXACT_ROWWISE_ADAGRAD
    assert module.weights_host.dtype == torch.float16
    adam = SplitTableBatchedEmbeddingBagsCodegen(
        [(10, 4, FbgemmLocation.HOST, FbgemmDevice.CPU)], optimizer=EmbOptimType.ADAM
    )
    assert adam.optimizer == OptimType.ADAM
    lamb = SplitTableBatchedEmbeddingBagsCodegen(
        [(10, 4, FbgemmLocation.HOST, FbgemmDevice.CPU)],
        optimizer=EmbOptimType.PARTIAL_ROWWISE_LAMB,
    )
    assert lamb.optimizer == OptimType.PARTIAL_ROWWISE_LAMB
    with pytest.raises(NotImplementedError, match="optimizer"):
        SplitTableBatchedEmbeddingBagsCodegen(
            [(10, 4, FbgemmLocation.HOST, FbgemmDevice.CPU)], optimizer=EmbOptimType.LARS_SGD
        )


# --------------------------------------------------------------------------- bounds checking
def bad_inputs():
    """(name, indices, offsets, exception) for a 2-feature, B=2 batch on tables of 10 rows."""
    good_idx = torch.tensor([1, 2, 3, 4, 5, 6, 7, 8])
    good_off = torch.tensor([0, 2, 4, 6, 8])
    too_big = good_idx.clone()
    too_big[5] = 10
    negative = good_idx.clone()
    negative[0] = -2  # -1 marks a pruned row (FBGEMM's rule; see test_pruned_row_marker)
    decreasing = good_off.clone()
    decreasing[2] = 1
    past_end = good_off.clone()
    past_end[4] = 9
    return [
        ("index too large", too_big, good_off, IndexError),
        ("negative index", negative, good_off, IndexError),
        ("decreasing offsets", good_idx, decreasing, ValueError),
        ("offsets past the indices", good_idx, past_end, ValueError),
    ]


@pytest.mark.parametrize("case", bad_inputs(), ids=lambda c: c[0])
@pytest.mark.parametrize("optimizer", OPTIMIZERS, ids=lambda o: o.name)
def test_fatal_raises_and_leaves_state_untouched(optimizer, case):
    _, indices, offsets, error = case
    module = make_module(
        [(10, 8), (10, 4)],
        [0, 1],
        optimizer,
        PoolingMode.SUM,
        bounds_check_mode=BoundsCheckMode.FATAL,
    )
    out = module(torch.arange(8) % 10, torch.tensor([0, 2, 4, 6, 8]))
    out.backward(torch.ones_like(out))  # a good step first: state is non-trivial
    weights = module.weights_host.detach().clone()
    states = [[s.clone() for s in st] for st in module.split_optimizer_states()]
    inputs = (indices.clone(), offsets.clone())
    with pytest.raises(error, match="out of range|malformed"):
        module(*inputs)
    assert torch.equal(inputs[0], indices) and torch.equal(inputs[1], offsets)
    assert torch.equal(module.weights_host.detach(), weights)
    for state, before in zip(module.split_optimizer_states(), states, strict=True):
        assert all(torch.equal(s, b) for s, b in zip(state, before, strict=True))


@pytest.mark.parametrize("mode", [BoundsCheckMode.WARNING, BoundsCheckMode.IGNORE], ids=str)
def test_warning_and_ignore_repair_input(mode, capfd):
    """The repair warning comes from the C++ check, as FBGEMM's does (so the module never reads
    the counter back): on stderr, once per repaired batch as FBGEMM logs, in WARNING mode only."""
    module = make_module(
        [(10, 8), (10, 4)], [0, 1], OptimType.EXACT_SGD, PoolingMode.SUM, bounds_check_mode=mode
    )
    for _, indices, offsets, _ in bad_inputs():
        indices, offsets = indices.clone(), offsets.clone()
        out = module(indices, offsets)
        # The repaired input (bad indices -> 0, offsets clamped in order) is what was used.
        assert torch.all((indices >= 0) & (indices < 10))
        assert torch.all(torch.diff(offsets) >= 0) and offsets[-1] <= indices.numel()
        torch.testing.assert_close(
            out,
            Reference(module)
            .forward(indices, offsets, None, [w.double() for w in module.split_embedding_weights()])
            .float(),
        )
    stderr = capfd.readouterr().err
    assert stderr.count("out-of-range indices were set to 0") == (
        len(bad_inputs()) if mode == BoundsCheckMode.WARNING else 0
    )
    # FBGEMM's counter, kept by WARNING only: the batch's repairs (the last batch's: its last
    # offset).
    expected = 1 if mode == BoundsCheckMode.WARNING else 0
    assert module.bounds_check_warning.item() == expected


def test_warning_mode_forward_compiles_as_one_graph():
    """WARNING (FBGEMM's default mode) checks and repairs inside the op: the module reads nothing
    back per step, so a forward compiles with fullgraph=True and repairs as in eager."""
    module = make_module(
        [(10, 8), (10, 4)],
        [0, 1],
        OptimType.EXACT_SGD,
        PoolingMode.SUM,
        bounds_check_mode=BoundsCheckMode.WARNING,
    )
    compiled = torch.compile(module, fullgraph=True, backend="aot_eager")
    indices, offsets = torch.tensor([1, 12, 3]), torch.tensor([0, 2, 2, 3, 3])
    with torch.no_grad():
        got = compiled(indices.clone(), offsets.clone())
        assert module.bounds_check_warning.item() == 1  # this batch's repair
        want = module(torch.tensor([1, 0, 3]), offsets.clone())
    torch.testing.assert_close(got, want)


def test_none_mode_still_rejects_out_of_range_indices():
    """BoundsCheckMode.NONE skips the check-and-repair pass; the kernels still refuse to read or
    write outside a table (IndexError, before any update)."""
    module = make_module(
        [(10, 8)],
        None,
        OptimType.EXACT_ADAGRAD,
        PoolingMode.SUM,
        bounds_check_mode=BoundsCheckMode.NONE,
    )
    with pytest.raises(IndexError, match="out of range for feature 0"):
        module(torch.tensor([1, 10]), torch.tensor([0, 1, 2]))
    weights = module.weights_host.detach().clone()
    out = module(torch.tensor([1, 2]), torch.tensor([0, 1, 2]))
    bad = torch.tensor([1, -3])
    with pytest.raises(IndexError, match="out of range"):
        ops.backward_codegen_adagrad_unweighted_exact(
            torch.ones_like(out),
            module.weights_host.detach(),
            module.weights_offsets,
            module.D_offsets,
            module.rows_per_table,
            bad,
            torch.tensor([0, 1, 2]),
            0,
            module.momentum1_host,
            module.momentum1_offsets,
            module.learning_rate_tensor,
        )
    assert torch.equal(module.weights_host.detach(), weights)
    assert torch.all(module.momentum1_host == 0)


def state_snapshot(module):
    return module.weights_host.detach().clone(), [
        [s.clone() for s in st] for st in module.split_optimizer_states()
    ]


def assert_state_unchanged(module, snapshot):
    weights, states = snapshot
    assert torch.equal(module.weights_host.detach(), weights)
    for state, before in zip(module.split_optimizer_states(), states, strict=True):
        assert all(torch.equal(s, b) for s, b in zip(state, before, strict=True))


@pytest.mark.parametrize("mode", [BoundsCheckMode.FATAL, BoundsCheckMode.WARNING], ids=str)
def test_int32_index_type_never_wraps(mode):
    """embedding_table_index_type=torch.int32 narrows int64 input after a range check: an index
    int32 cannot hold raises IndexError (it used to wrap, 2^32 -> row 0, and the step updated row
    0) and the step changes nothing; indices that fit give what the int64 index type gives."""
    kwargs = dict(bounds_check_mode=mode, embedding_table_index_type=torch.int32)
    module = make_module(
        [(10, 8)], None, OptimType.EXACT_ROWWISE_ADAGRAD, PoolingMode.SUM, **kwargs
    )
    snapshot = state_snapshot(module)
    for bad in (2**32, 2**40, -(2**31) - 1):
        with pytest.raises(IndexError, match=rf"indices.flatten\(\)\[1\] = {bad} does not fit"):
            module(torch.tensor([1, bad]), torch.tensor([0, 2]))
    with pytest.raises(IndexError, match=r"offsets.flatten\(\)\[1\] = 4294967298 does not fit"):
        module(torch.tensor([1, 2], dtype=torch.int32), torch.tensor([0, 2**32 + 2]))
    assert_state_unchanged(module, snapshot)

    wide = make_module([(10, 8)], None, OptimType.EXACT_ROWWISE_ADAGRAD, PoolingMode.SUM)
    indices, offsets = torch.tensor([1, 9, 1, 0]), torch.tensor([0, 3, 4])
    outs = [m(indices, offsets) for m in (module, wide)]
    assert torch.equal(outs[0], outs[1])
    for out in outs:
        out.backward(grad_like(out, 3))
    assert torch.equal(module.weights_host, wide.weights_host)
    assert torch.equal(module.momentum1_host, wide.momentum1_host)


@pytest.mark.parametrize("optimizer", OPTIMIZERS, ids=lambda o: o.name)
def test_empty_tables_share_offsets_with_the_next(optimizer):
    """A 0-row table sits at the weights (and state) offset of the next table, as FBGEMM lays it
    out; it is a table of its own there, not the next one."""
    shapes = [(0, 8), (12, 8), (0, 4), (9, 4)]
    ftm = [0, 1, 2, 3, 1]
    module = make_module(shapes, ftm, optimizer, PoolingMode.SUM)
    assert module.weights_offsets.tolist() == [0, 0, 96, 96, 0]
    gen = torch.Generator().manual_seed(21)
    rows = [shapes[t][0] for t in ftm]
    batches = []
    for batch_size in (3, 5):
        lengths = torch.randint(0, 4, (len(ftm), batch_size), generator=gen)
        lengths[[0, 2]] = 0  # nothing can be looked up in an empty table
        indices = [
            torch.randint(0, max(r, 1), (int(n),), generator=gen)
            for r, n in zip(rows, lengths.sum(1), strict=True)
        ]
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.flatten().cumsum(0)])
        batches.append((torch.cat(indices), offsets))
    check_against_reference(module, batches)
    fatal = make_module(shapes, ftm, optimizer, PoolingMode.SUM, bounds_check_mode=0)
    with pytest.raises(IndexError, match="out of range"):
        fatal(torch.tensor([0]), torch.tensor([0, 1, 1, 1, 1, 1]))


def layout_args(weights_offsets, rows, dims=(4, 4)):
    D_offsets = torch.tensor([0, *itertools.accumulate(dims)], dtype=torch.int32)
    return torch.tensor(weights_offsets), D_offsets, torch.tensor(rows)


@pytest.mark.parametrize(
    "weights_offsets, rows, match",
    [
        (
            [0, 20],
            [10, 10],
            r"feature 1's table \(10 x 4 at weights_offsets\[1\] = 20\) overlaps "
            r"feature 0's table \(10 x 4 at weights_offsets\[0\] = 0\) inside weights",
        ),
        ([40, 0], [10, 12], r"feature 0's table .* overlaps feature 1's table"),
        ([0, 0], [10, 5], r"features sharing the table at weights_offsets 0 must agree"),
    ],
)
def test_overlapping_tables_are_rejected(weights_offsets, rows, match):
    """Distinct tables must not overlap inside weights: the update gives every row one owner."""
    weights = torch.rand(100)
    w_off, D_offsets, rows_t = layout_args(weights_offsets, rows)
    indices, offsets = torch.tensor([1, 2]), torch.tensor([0, 1, 2])
    with pytest.raises(RuntimeError, match=match):
        ops.split_embedding_codegen_forward(
            weights, w_off, D_offsets, 8, 4, rows_t, indices, offsets, 0, None, 0
        )
    before = weights.clone()
    with pytest.raises(RuntimeError, match=match):
        ops.backward_codegen_sgd_unweighted_exact(
            torch.ones(1, 8),
            weights,
            w_off,
            D_offsets,
            rows_t,
            indices,
            offsets,
            0,
            torch.tensor(0.1),
        )
    assert torch.equal(weights, before)


def test_overlapping_optimizer_state_is_rejected():
    weights, momentum1 = torch.rand(80), torch.zeros(20)
    w_off, D_offsets, rows = layout_args([0, 40], [10, 10])
    with pytest.raises(
        RuntimeError,
        match=r"feature 1's table \(10 x 1 at momentum1_offsets\[1\] "
        r"= 5\) overlaps .* inside momentum1",
    ):
        ops.backward_codegen_rowwise_adagrad_unweighted_exact(
            torch.ones(1, 8),
            weights,
            w_off,
            D_offsets,
            rows,
            torch.tensor([1, 2]),
            torch.tensor([0, 1, 2]),
            0,
            momentum1,
            torch.tensor([0, 5]),
            torch.tensor(0.1),
        )
    assert torch.all(momentum1 == 0)


def test_bad_hyper_parameters_are_rejected_before_any_update():
    module = make_module([(10, 8)], None, OptimType.EXACT_ADAGRAD, PoolingMode.SUM)
    indices, offsets = torch.tensor([1, 2]), torch.tensor([0, 1, 2])
    snapshot = state_snapshot(module)
    weights = module.weights_host.detach()
    base = dict(eps=EPS, weight_decay=0.0)
    cases = [
        (
            dict(lr=torch.tensor([0.1, 0.2])),
            RuntimeError,
            r"learning_rate_tensor must be a float32 "
            r"tensor of one value, got Float of shape \[2\]",
        ),
        (dict(lr=torch.tensor(1, dtype=torch.long)), RuntimeError, r"got Long of shape \[\]"),
        (dict(lr=torch.tensor(float("nan"))), ValueError, r"learning_rate_tensor must be a finite"),
        (dict(eps=float("inf")), ValueError, r"eps must be a finite number"),
        (dict(weight_decay=float("nan")), ValueError, r"weight_decay must be a finite number"),
        (dict(weight_decay=1e39), ValueError, r"weight_decay must be a finite number in float32"),
    ]
    for change, error, match in cases:
        args = {**base, "lr": module.learning_rate_tensor, **change}
        with pytest.raises(error, match=match):
            ops.backward_codegen_adagrad_unweighted_exact(
                torch.ones(2, 8),
                weights,
                module.weights_offsets,
                module.D_offsets,
                module.rows_per_table,
                indices,
                offsets,
                0,
                module.momentum1_host,
                module.momentum1_offsets,
                args["lr"],
                args["eps"],
                args["weight_decay"],
            )
    clipping = make_module(
        [(10, 8)],
        None,
        OptimType.EXACT_SGD,
        PoolingMode.SUM,
        gradient_clipping=True,
        max_gradient=float("nan"),
    )
    out = clipping(indices, offsets)
    with pytest.raises(ValueError, match=r"max_gradient must be a finite number"):
        out.sum().backward()
    module.set_learning_rate(float("inf"))
    out = module(indices, offsets)
    with pytest.raises(ValueError, match=r"learning_rate_tensor must be a finite number"):
        out.sum().backward()
    assert_state_unchanged(module, snapshot)


def test_feature_requires_grad_nonzero_means_true():
    # A narrowing cast to int32 would turn 2^32 into 0 ("no gradient").
    gen = torch.Generator().manual_seed(9)
    module = make_module([(20, 8), (20, 12)], [0, 1], OptimType.EXACT_SGD, PoolingMode.SUM)
    indices, offsets = make_batch(gen, [20, 20], 5, max_bag=4)
    grads = []
    for requires in (torch.tensor([2**32, 0]), torch.tensor([1, 0])):
        psw = torch.rand(indices.numel(), generator=torch.Generator().manual_seed(1))
        out = ops.split_embedding_codegen_forward(
            module.weights_host.detach(),
            module.weights_offsets,
            module.D_offsets,
            module.total_D,
            module.max_D,
            module.rows_per_table,
            indices,
            offsets,
            0,
            psw,
            0,
        )
        grads.append(
            ops.split_embedding_codegen_grad_indice_weights(
                grad_like(out, 1),
                module.weights_host.detach(),
                module.weights_offsets,
                module.D_offsets,
                module.rows_per_table,
                indices,
                offsets,
                0,
                requires,
            )
        )
    assert torch.equal(grads[0], grads[1]) and torch.any(grads[0] != 0)


def test_fatal_needs_the_last_offset_at_the_last_index():
    """FBGEMM's FATAL rule: offsets[-1] must equal the number of indices (WARNING / IGNORE set it
    so); offsets[0] > 0 is accepted, the indices before it belong to no bag."""
    fatal = make_module([(10, 4)], None, OptimType.EXACT_SGD, PoolingMode.SUM, bounds_check_mode=0)
    weights = fatal.split_embedding_weights()[0]
    out = fatal(torch.tensor([1, 2, 3]), torch.tensor([1, 2, 3]))
    assert torch.equal(out, weights[[2, 3]])
    snapshot = state_snapshot(fatal)
    with pytest.raises(ValueError, match=r"offsets\[-1\] = 2 must equal the number of indices, 3"):
        fatal(torch.tensor([1, 2, 3]), torch.tensor([0, 1, 2]))
    assert_state_unchanged(fatal, snapshot)
    for mode in (BoundsCheckMode.WARNING, BoundsCheckMode.IGNORE):
        module = make_module(
            [(10, 4)], None, OptimType.EXACT_SGD, PoolingMode.SUM, bounds_check_mode=mode
        )
        offsets = torch.tensor([0, 1, 2])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = module(torch.tensor([1, 2, 3]), offsets)
        # FBGEMM's counter, kept by WARNING only
        assert offsets.tolist() == [0, 1, 3]
        assert module.bounds_check_warning.item() == (mode == BoundsCheckMode.WARNING)
        weights = module.split_embedding_weights()[0]
        assert torch.equal(out, torch.stack([weights[1], weights[2] + weights[3]]))


@pytest.mark.parametrize("mode", [BoundsCheckMode.FATAL, BoundsCheckMode.WARNING], ids=str)
def test_last_offset_rule_matches_fbgemm(fbgemm_ops, mode):
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import BoundsCheckMode as Fbgemm

    module = make_module(
        [(10, 4)], None, OptimType.EXACT_SGD, PoolingMode.SUM, bounds_check_mode=mode
    )
    theirs = fbgemm_module(fbgemm_ops, module, bounds_check_mode=Fbgemm(int(mode)))
    indices = torch.tensor([1, 2, 3])
    for offsets in ([1, 2, 3], [0, 1, 2], [0, 1, 3]):
        results = []
        for m in (module, theirs):
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    results.append(m(indices.clone(), torch.tensor(offsets)))
            except (RuntimeError, ValueError):
                results.append(None)
        assert (results[0] is None) == (results[1] is None), offsets
        if results[0] is not None:
            torch.testing.assert_close(results[0], results[1])


# --------------------------------------------------------------------------- module API
def test_enums_have_fbgemm_names_and_values():
    assert [(m.name, m.value) for m in PoolingMode] == [("SUM", 0), ("MEAN", 1), ("NONE", 2)]
    assert [(m.name, m.value) for m in EmbeddingLocation] == [
        ("DEVICE", 0),
        ("MANAGED", 1),
        ("MANAGED_CACHING", 2),
        ("HOST", 3),
    ]
    assert [(m.name, m.value) for m in ComputeDevice] == [("CPU", 0), ("CUDA", 1)]
    assert [(m.name, m.value) for m in SparseType] == [
        ("FP32", 0),
        ("FP16", 1),
        ("INT8", 2),
        ("INT4", 3),
        ("INT2", 4),
        ("BF16", 5),
        ("FP8", 6),
    ]
    assert [(m.name, m.value) for m in OptimType] == [
        ("EXACT_SGD", "exact_sgd"),
        ("EXACT_ADAGRAD", "exact_adagrad"),
        ("EXACT_ROWWISE_ADAGRAD", "exact_row_wise_adagrad"),
        ("ADAM", "adam"),
        ("PARTIAL_ROWWISE_ADAM", "partial_row_wise_adam"),
        ("LAMB", "lamb"),
        ("PARTIAL_ROWWISE_LAMB", "partial_row_wise_lamb"),
        ("ROWWISE_RMSPROP_AR", "row_wise_rmsprop_ar"),
    ]
    assert recops.EmbOptimType is OptimType
    assert [(m.name, m.value) for m in WeightDecayMode] == [
        ("NONE", 0),
        ("L2", 1),
        ("DECOUPLE", 2),
        ("COUNTER", 3),
        ("COWCLIP", 4),
    ]
    assert [(m.name, m.value) for m in BoundsCheckMode] == [
        ("FATAL", 0),
        ("WARNING", 1),
        ("IGNORE", 2),
        ("NONE", 3),
    ]


@pytest.mark.parametrize("optimizer", OPTIMIZERS, ids=lambda o: o.name)
def test_state_dict_round_trip(optimizer):
    gen = torch.Generator().manual_seed(15)
    module = make_module([(20, 8), (30, 12)], [0, 1, 0], optimizer, PoolingMode.SUM)
    out = module(*make_batch(gen, [20, 30, 20], 6, max_bag=5))
    out.backward(torch.ones_like(out))
    state = module.state_dict()
    keys = {"weights_host"} | ({"momentum1_host"} if optimizer != OptimType.EXACT_SGD else set())
    if optimizer in ADAM_FAMILY:
        keys |= {"momentum2_host", "iter"}
    if optimizer == OptimType.ROWWISE_RMSPROP_AR:  # FBGEMM's: the step count, each row's last
        keys |= {"prev_iter_host", "iter"}
    assert set(state) == keys
    fresh = SplitTableBatchedEmbeddingBagsCodegen(
        [(20, 8, *HOST), (30, 12, *HOST)], feature_table_map=[0, 1, 0], optimizer=optimizer
    )
    fresh.load_state_dict(state)
    for ours, theirs in zip(
        fresh.split_embedding_weights(), module.split_embedding_weights(), strict=True
    ):
        assert torch.equal(ours, theirs)
    for ours, theirs in zip(
        fresh.split_optimizer_states(), module.split_optimizer_states(), strict=True
    ):
        assert all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True))
    if "iter" in keys:  # the step count is saved with the optimizers reading it (FBGEMM's)
        assert torch.equal(fresh.iter, module.iter)


# --------------------------------------------------------------------------- the Adam family
def dense_batches(gen, rows, steps):
    """Two features on one table, every row looked up in every batch (with duplicates), so a
    sparse Adam and torch.optim's dense one take the same steps."""
    for _ in range(steps):
        extra = torch.randint(0, rows, (7,), generator=gen)
        indices = torch.cat([torch.randperm(rows, generator=gen), extra])
        cut = sorted(torch.randint(0, indices.numel() + 1, (3,), generator=gen).tolist())
        yield indices, torch.tensor([0, *cut, indices.numel()])  # B = 2 bags per feature


def pooled_bags(tables, ftm, indices, offsets, sparse=False):
    """[B, sum of dims]: feature f's bags summed from tables[ftm[f]] (feature-major offsets)."""
    B = (offsets.numel() - 1) // len(ftm)
    outs = []
    for f, t in enumerate(ftm):
        begin, end = int(offsets[f * B]), int(offsets[(f + 1) * B])
        bag_offsets = offsets[f * B : (f + 1) * B] - begin
        bags = F.embedding_bag(
            indices[begin:end], tables[t], bag_offsets, mode="sum", sparse=sparse
        )
        outs.append(bags)
    return torch.cat(outs, dim=1)


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_adam_matches_torch_optim_on_dense_tables(weight_decay):
    """FBGEMM's ADAM is torch.optim.Adam; with weight decay, torch.optim.AdamW (decoupled). (Rows
    a batch does not look up keep their state, as in torch.optim.SparseAdam: test_matches_reference
    covers that.)"""
    rows, dim = 9, 8
    module = make_module(
        [(rows, dim)], [0, 0], OptimType.ADAM, PoolingMode.SUM, weight_decay=weight_decay
    )
    table = torch.nn.Parameter(module.split_embedding_weights()[0].double().clone())
    torch_optim = torch.optim.AdamW if weight_decay else torch.optim.Adam
    reference = torch_optim([table], lr=LR, betas=BETAS, eps=EPS, weight_decay=weight_decay)
    gen = torch.Generator().manual_seed(30)
    for step, (indices, offsets) in enumerate(dense_batches(gen, rows, 5)):
        out = module(indices, offsets)
        grad = grad_like(out, seed=step)
        out.backward(grad)
        reference.zero_grad()
        pooled_bags([table], [0, 0], indices, offsets).backward(grad.double())
        reference.step()
        torch.testing.assert_close(
            module.split_embedding_weights()[0].double(), table.detach(), rtol=1e-5, atol=1e-6
        )
    exp_avg, exp_avg_sq = module.split_optimizer_states()[0]
    state = reference.state[table]
    torch.testing.assert_close(exp_avg.double(), state["exp_avg"], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(exp_avg_sq.double(), state["exp_avg_sq"], rtol=1e-5, atol=1e-7)
    assert int(module.iter) == 5


@pytest.mark.parametrize(
    "full, partial",
    [
        (OptimType.ADAM, OptimType.PARTIAL_ROWWISE_ADAM),
        (OptimType.LAMB, OptimType.PARTIAL_ROWWISE_LAMB),
    ],
    ids=["adam", "lamb"],
)
def test_adam_family_state_layout_and_accessors(full, partial):
    shapes = [(5, 4), (7, 8)]
    elementwise = make_module(shapes, [1, 0], full, PoolingMode.SUM)
    rowwise = make_module(shapes, [1, 0], partial, PoolingMode.SUM)
    assert [[tuple(s.shape) for s in st] for st in elementwise.split_optimizer_states()] == [
        [(5, 4), (5, 4)],
        [(7, 8), (7, 8)],
    ]
    assert [[tuple(s.shape) for s in st] for st in rowwise.split_optimizer_states()] == [
        [(5, 4), (5,)],
        [(7, 8), (7,)],
    ]
    for module in (elementwise, rowwise):
        assert [set(s) for s in module.get_optimizer_state()] == [{"exp_avg", "exp_avg_sq"}] * 2
        module.update_hyper_parameters({"beta1": 0.5, "beta2": 0.75})
        assert (module.beta1, module.beta2) == (0.5, 0.75)
        module.set_optimizer_step(41)
        out = module(torch.tensor([1, 2, 3]), torch.tensor([0, 1, 3]))
        assert int(module.iter) == 42  # the forward took step 42
        out.sum().backward()


@pytest.mark.parametrize("optimizer", LAMB_FAMILY, ids=lambda o: o.name)
def test_lamb_trust_ratio_at_zero_norms(optimizer):
    """A zero row still moves (trust ratio 1, not ||w|| / ||r|| = 0) and a zero update direction
    leaves its row as it was (not inf * 0 = NaN)."""
    module = make_module([(4, 8)], None, optimizer, PoolingMode.SUM)
    with torch.no_grad():
        module.split_embedding_weights()[0][0].zero_()
    before = module.split_embedding_weights()[0].clone()
    out = module(torch.tensor([0, 1]), torch.tensor([0, 1, 2]))
    grad = torch.zeros_like(out)
    grad[0] = 1.0  # bag 0 looks up the zero row 0; bag 1 (row 1) gets a zero gradient
    out.backward(grad)
    after = module.split_embedding_weights()[0]
    assert torch.isfinite(after).all()
    # First step: m / c1 = g and v / c2 = g^2 (rowwise: its mean), so r = g / (|g| + eps) and
    # r = g / (sqrt(mean g^2) + eps) are both 1 / (1 + eps) per element, g being all ones.
    torch.testing.assert_close(after[0], torch.full((8,), -LR / (1 + EPS)))
    assert torch.equal(after[1:], before[1:])


@pytest.mark.parametrize("optimizer", ADAM_FAMILY, ids=lambda o: o.name)
def test_adam_rejects_bad_betas_and_steps_before_any_update(optimizer):
    module = make_module([(10, 8)], None, optimizer, PoolingMode.SUM)
    out = module(torch.tensor([1, 2]), torch.tensor([0, 1, 2]))
    out.sum().backward()  # a good step first: the state is non-trivial
    snapshot = state_snapshot(module)
    for change, match in [
        (dict(beta1=1.0), r"beta1 must be in \[0, 1\), got 1"),
        (dict(beta2=-0.1), r"beta2 must be in \[0, 1\)"),
        (dict(beta1=float("nan")), r"beta1 must be in \[0, 1\)"),
    ]:
        module.update_hyper_parameters(change)
        out = module(torch.tensor([1, 2]), torch.tensor([0, 1, 2]))
        with pytest.raises(ValueError, match=match):
            out.sum().backward()
        module.update_hyper_parameters({"beta1": BETAS[0], "beta2": BETAS[1]})
    suffix = optimizer.name.lower()
    backward = getattr(ops, f"backward_codegen_{suffix}_unweighted_exact")
    layout = (
        torch.ones(1, 8),
        module.weights_host.detach(),
        module.weights_offsets,
        module.D_offsets,
        module.rows_per_table,
        torch.tensor([1]),
        torch.tensor([0, 1]),
        0,
    )
    m1 = (module.momentum1_host, module.momentum1_offsets)
    m2 = (module.momentum2_host, module.momentum2_offsets)
    with pytest.raises(ValueError, match=r"iter must be >= 1"):
        backward(*layout, *m1, *m2, module.learning_rate_tensor, iter=0)
    if optimizer in LAMB_FAMILY:
        with pytest.raises(RuntimeError, match=r"LAMB applies its own decay in its update"):
            backward(*layout, *m1, *m2, module.learning_rate_tensor, iter=2, weight_decay_mode=1)
    with pytest.raises(RuntimeError, match=r"momentum1 and momentum2 must not share memory"):
        backward(*layout, *m1, *m1, module.learning_rate_tensor, iter=2)
    assert_state_unchanged(module, snapshot)


def test_accessors():
    module = SplitTableBatchedEmbeddingBagsCodegen(
        [(5, 4, *HOST), (7, 8, *HOST)],
        feature_table_map=[1, 0, 1],
        optimizer=OptimType.EXACT_ROWWISE_ADAGRAD,
        learning_rate=0.1,
    )
    assert torch.all(module.weights_host == 0)  # FBGEMM initialises zeros too
    weights = module.split_embedding_weights()
    assert [tuple(w.shape) for w in weights] == [(5, 4), (7, 8)]
    module.init_embedding_weights_uniform(-0.5, 0.5)
    assert all(torch.all(w.abs() <= 0.5) and torch.any(w != 0) for w in weights)  # views
    assert [tuple(s[0].shape) for s in module.split_optimizer_states()] == [(5,), (7,)]
    assert [set(s) for s in module.get_optimizer_state()] == [{"sum"}, {"sum"}]
    assert module.D_offsets.tolist() == [0, 8, 12, 20]
    assert module.hash_size_cumsum.tolist() == [5, 0, 5, 12]
    assert module.get_learning_rate() == pytest.approx(0.1)
    module.set_learning_rate(0.25)
    module.update_hyper_parameters({"eps": 1e-3, "weight_decay": 0.5})
    assert (module.get_learning_rate(), module.eps, module.weight_decay) == (0.25, 1e-3, 0.5)
    adagrad = SplitTableBatchedEmbeddingBagsCodegen([(5, 4, *HOST)], optimizer="exact_adagrad")
    assert tuple(adagrad.split_optimizer_states()[0][0].shape) == (5, 4)
    sgd = SplitTableBatchedEmbeddingBagsCodegen([(5, 4, *HOST)])
    assert sgd.split_optimizer_states() == [] and sgd.get_optimizer_state() == []


class NonDefaultConfig:
    """A configuration object (like FBGEMM's dataclasses) whose field differs from its default."""

    def __init__(self, value=1.0):
        self.value = value

    def __eq__(self, other):
        return isinstance(other, NonDefaultConfig) and other.value == self.value

    def __repr__(self):
        return f"NonDefaultConfig({self.value})"


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(optimizer="lars_sgd"), "optimizer"),
        (dict(cache_precision=SparseType.FP16), "cache_precision"),
        (dict(output_dtype=SparseType.INT8), "output_dtype"),
        (dict(output_dtype=SparseType.FP8), "output_dtype"),
        (dict(weights_precision=SparseType.INT4), "weights_precision"),
        (dict(weights_precision=SparseType.FP8), "weights_precision"),
        (dict(optimizer_state_dtypes={"momentum1": SparseType.FP16}), "optimizer_state_dtypes"),
        (
            dict(optimizer=OptimType.EXACT_ADAGRAD, uvm_non_rowwise_momentum=True),
            "uvm_non_rowwise_momentum",
        ),
        (dict(global_weight_decay=NonDefaultConfig(0.5)), "global_weight_decay"),
        (dict(counter_based_regularization=NonDefaultConfig(2.0)), "counter_based_regularization"),
        (dict(weight_decay_mode=3), "weight_decay_mode"),
        (dict(device="cuda"), "device"),
    ],
)
def test_unsupported_arguments_raise(kwargs, name):
    with pytest.raises(NotImplementedError, match=name):
        SplitTableBatchedEmbeddingBagsCodegen([(5, 4, *HOST)], **kwargs)


def test_arguments_and_accessors_torchrec_uses():
    module = SplitTableBatchedEmbeddingBagsCodegen(
        [(5, 4, *HOST), (7, 8, *HOST)],
        weights_precision=SparseType.FP16,
        cache_precision=SparseType.FP16,  # no cache: the weights' precision is accepted
        embedding_shard_info=[(10, 4, 5, 0), (7, 16, 0, 8)],
        res_params=object(),  # read by FBGEMM only with raw embedding streaming
        enable_raw_embedding_streaming=False,
    )
    assert module.embedding_shard_info == [(10, 4, 5, 0), (7, 16, 0, 8)]
    assert module.weights_physical_offsets == [0, 20]
    assert module.weights_dev.numel() == 0 and module.weights_uvm.numel() == 0
    assert not module.prefetch_pipeline
    module.flush()
    module.reset_cache_states()
    module.set_optimizer_step(7)
    assert int(module.iter) == 7
    with pytest.raises(NotImplementedError, match="enable_raw_embedding_streaming"):
        SplitTableBatchedEmbeddingBagsCodegen([(5, 4, *HOST)], enable_raw_embedding_streaming=True)


def test_unsupported_placement_and_forward_arguments():
    with pytest.raises(NotImplementedError, match="embedding_specs"):
        SplitTableBatchedEmbeddingBagsCodegen(
            [(5, 4, EmbeddingLocation.DEVICE, ComputeDevice.CUDA)]
        )
    with pytest.raises(TypeError, match="unexpected keyword"):
        SplitTableBatchedEmbeddingBagsCodegen([(5, 4, *HOST)], no_such_argument=1)
    module = SplitTableBatchedEmbeddingBagsCodegen([(5, 4, *HOST)])
    # A preallocated variable-batch output: FBGEMM's CPU module refuses it too.
    for name in ("vbe_output", "vbe_output_offsets"):
        with pytest.raises(NotImplementedError, match=name):
            module(torch.tensor([1]), torch.tensor([0, 1]), **{name: torch.zeros(4)})
    with pytest.raises(ValueError, match="one embedding dim"):
        SplitTableBatchedEmbeddingBagsCodegen(
            [(5, 4, *HOST), (5, 8, *HOST)], pooling_mode=PoolingMode.NONE
        )


# --------------------------------------------------------------------------- opcheck
def op_args():
    module = make_module([(12, 8), (9, 4)], [0, 1, 0], OptimType.EXACT_ADAGRAD, PoolingMode.SUM)
    indices, offsets = make_batch(torch.Generator().manual_seed(16), [12, 9, 12], 3, max_bag=4)
    layout = (module.weights_offsets, module.D_offsets)
    return module, indices, offsets, layout


def test_opcheck_forward_and_grad_ops():
    module, indices, offsets, (w_off, d_off) = op_args()
    weights = module.weights_host.detach()
    psw = torch.rand(indices.numel())
    for pooling, sample_weights, out_dtype in [(0, None, 0), (1, psw, 1), (2, psw, 5)]:
        d_offsets = torch.tensor([0, 4, 8, 12], dtype=torch.int32) if pooling == 2 else d_off
        w_offsets = torch.tensor([0, 48, 0]) if pooling == 2 else w_off
        rows = module.rows_per_table
        total_D = int(d_offsets[-1])
        max_D = 4 if pooling == 2 else 8
        args = (
            weights,
            w_offsets,
            d_offsets,
            total_D,
            max_D,
            rows,
            indices,
            offsets,
            pooling,
            sample_weights,
            out_dtype,
        )
        torch.library.opcheck(ops.split_embedding_codegen_forward, args)
        out = ops.split_embedding_codegen_forward(*args)
        torch.library.opcheck(
            ops.split_embedding_codegen_grad_indice_weights,
            (
                torch.randn(out.shape),
                weights,
                w_offsets,
                d_offsets,
                rows,
                indices,
                offsets,
                pooling,
                torch.tensor([1, 0, 1]),
                True,
                0.5,
            ),
        )


# The optimizers' op-name suffixes, and their state buffers (momentum, offsets) for op_args()'s
# two tables (12 x 8 and 9 x 4): D values a row elementwise, one rowwise.
OP_NAMES = [
    "sgd",
    "adagrad",
    "rowwise_adagrad",
    "adam",
    "partial_rowwise_adam",
    "lamb",
    "partial_rowwise_lamb",
]


def state_buffers(name):
    elementwise = (12 * 8 + 9 * 4, [0, 96, 0])
    rowwise = (12 + 9, [0, 12, 0])
    layouts = {
        "sgd": [],
        "adagrad": [elementwise],
        "rowwise_adagrad": [rowwise],
        "adam": [elementwise, elementwise],
        "partial_rowwise_adam": [elementwise, rowwise],
        "lamb": [elementwise, elementwise],
        "partial_rowwise_lamb": [elementwise, rowwise],
    }[name]
    return [t for size, offsets in layouts for t in (torch.zeros(size), torch.tensor(offsets))]


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("name", OP_NAMES)
def test_opcheck_backward_ops(name, weighted):
    module, indices, offsets, (w_off, d_off) = op_args()
    grad = torch.randn(3, int(d_off[-1]))
    args = [
        grad,
        module.weights_host.detach().clone(),
        w_off,
        d_off,
        module.rows_per_table,
        indices,
        offsets,
        1,
    ]
    if weighted:
        args.append(torch.rand(indices.numel()))
    args += state_buffers(name)
    args.append(torch.tensor(0.1))
    kind = "weighted" if weighted else "unweighted"
    torch.library.opcheck(getattr(ops, f"backward_codegen_{name}_{kind}_exact"), tuple(args))


def test_host_buffers():
    buffer = ops.embedding_host_zeros(1000, torch.float16)
    assert buffer.dtype == torch.float16 and buffer.shape == (1000,) and torch.all(buffer == 0)
    torch.library.opcheck(ops.embedding_host_zeros, (10, torch.bfloat16))


def test_opcheck_bounds_check():
    rows = torch.tensor([10, 10])
    torch.library.opcheck(
        ops.bounds_check_indices,
        (
            rows,
            torch.tensor([1, 12, 3, -1]),
            torch.tensor([0, 1, 2, 3, 4]),
            2,
            torch.zeros(1, dtype=torch.long),
        ),
    )


@pytest.mark.parametrize("name", OP_NAMES)
def test_opcheck_lookup_functions(name):
    module, indices, offsets, (w_off, d_off) = op_args()
    psw = torch.rand(indices.numel(), requires_grad=True)
    args = [
        module.weights_host.detach().clone().requires_grad_(),
        w_off,
        d_off,
        int(d_off[-1]),
        8,
        module.rows_per_table,
        indices,
        offsets,
        0,
        psw,
        None,
    ]
    args += state_buffers(name)
    args.append(torch.tensor(0.1))
    torch.library.opcheck(
        getattr(ops, f"split_embedding_codegen_lookup_{name}_function"), tuple(args)
    )


def test_docs_example_runs():
    """The example at the top of docs/embedding.md runs as written."""
    import pathlib
    import re

    page = pathlib.Path(__file__).resolve().parents[1] / "docs" / "embedding.md"
    example = re.search(r"```python\n(.*?)```", page.read_text(), re.DOTALL).group(1)
    exec(compile(example, str(page), "exec"), {})
