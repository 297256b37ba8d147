"""INT8 weights (weights_precision=SparseType.INT8, FBGEMM's fused 8-bit rowwise rows: D codes,
then a float32 scale and bias) in recops' TBE: the forward looks them up as FBGEMM's CPU module
does (checked side by side for 20 batches on the same bytes), every pooling, per-sample weights,
every output dtype against the dequantized float64 reference; there is no INT8 backward (nor in
FBGEMM's CPU module), and asking for one raises before any state changes."""

import pytest
import torch
from test_embedding import HOST, fbgemm_module, make_batch

from recops import OptimType, PoolingMode, SparseType, SplitTableBatchedEmbeddingBagsCodegen
from recops.embedding.int8 import ROW_TAIL, dequantize_rows, quantize_rows

SHAPES = [(30, 8), (25, 4), (40, 12)]
FTM = [0, 0, 1, 2]
POOLINGS = [PoolingMode.SUM, PoolingMode.MEAN, PoolingMode.NONE]


def int8_module(pooling, shapes=SHAPES, ftm=FTM, **kwargs):
    if pooling == PoolingMode.NONE:
        shapes = [(rows, 8) for rows, _ in shapes]
    module = SplitTableBatchedEmbeddingBagsCodegen(
        [(rows, dim, *HOST) for rows, dim in shapes],
        feature_table_map=ftm,
        weights_precision=SparseType.INT8,
        pooling_mode=pooling,
        **kwargs,
    )
    torch.manual_seed(5)
    module.init_embedding_weights_uniform(-1.0, 1.0)
    return module


def reference_forward(module, indices, offsets, psw):
    """float64 pooled (or per-index) rows of the dequantized tables."""
    tables = [dequantize_rows(w).double() for w in module.split_embedding_weights()]
    T = len(module.feature_table_map)
    B = (offsets.numel() - 1) // T
    if module.pooling_mode == PoolingMode.NONE:
        rows = [None] * indices.numel()
        for k in range(T * B):
            table = tables[module.feature_table_map[k // B]]
            for p in range(int(offsets[k]), int(offsets[k + 1])):
                scale = 1.0 if psw is None else float(psw[p])
                rows[p] = scale * table[int(indices[p])]
        return torch.stack(rows) if rows else torch.zeros(0, 8, dtype=torch.float64)
    out = []
    for b in range(B):
        pieces = []
        for t in range(T):
            table = tables[module.feature_table_map[t]]
            begin, end = int(offsets[t * B + b]), int(offsets[t * B + b + 1])
            acc = torch.zeros(table.shape[1], dtype=torch.float64)
            for p in range(begin, end):
                acc += (1.0 if psw is None else float(psw[p])) * table[int(indices[p])]
            if module.pooling_mode == PoolingMode.MEAN and end > begin:
                acc /= end - begin
            pieces.append(acc)
        out.append(torch.cat(pieces))
    total_D = sum(tables[t].shape[1] for t in module.feature_table_map)
    return torch.stack(out) if out else torch.zeros(0, total_D, dtype=torch.float64)


def test_quantized_rows_round_trip_within_half_a_step():
    values = torch.randn(50, 12) * 3
    rows = quantize_rows(values)
    assert rows.dtype == torch.uint8 and rows.shape == (50, 12 + ROW_TAIL)
    step = (values.max(1).values - values.min(1).values) / 255
    assert torch.all((dequantize_rows(rows) - values).abs() <= step.unsqueeze(1) / 2 + 1e-6)


@pytest.mark.parametrize("output_dtype", [SparseType.FP32, SparseType.FP16, SparseType.BF16])
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("pooling", POOLINGS, ids=lambda p: p.name)
def test_forward_matches_dequantized_reference(pooling, weighted, output_dtype):
    module = int8_module(pooling, output_dtype=output_dtype)
    gen = torch.Generator().manual_seed(int(pooling) * 2 + weighted)
    rows = [SHAPES[t][0] for t in FTM]
    for batch_size in (1, 7, 0):
        indices, offsets = make_batch(gen, rows, batch_size, max_bag=6)
        psw = torch.rand(indices.numel(), generator=gen) + 0.5 if weighted else None
        with torch.no_grad():
            out = module(indices, offsets, psw)
        expected = reference_forward(module, indices, offsets, psw)
        tol = {SparseType.FP32: 1e-5, SparseType.FP16: 2e-3, SparseType.BF16: 1.6e-2}
        torch.testing.assert_close(
            out.double(),
            expected.reshape(out.shape),
            rtol=tol[output_dtype],
            atol=tol[output_dtype],
        )


# FBGEMM's CPU module returns the raw codes of rows at stride D for PoolingMode.NONE (neither
# scale, bias nor the row tail applied): NONE is checked against the reference only.
@pytest.mark.parametrize("pooling", POOLINGS[:2], ids=lambda p: p.name)
def test_forward_matches_fbgemm(fbgemm_ops, pooling):
    ours = int8_module(pooling)
    theirs = fbgemm_module(fbgemm_ops, ours)  # copies weights_host: the same bytes
    ftm_rows = [ours.embedding_specs[t][0] for t in FTM]
    gen = torch.Generator().manual_seed(61)
    for _ in range(20):
        indices, offsets = make_batch(gen, ftm_rows, 5, max_bag=6)
        psw = torch.rand(indices.numel(), generator=gen) + 0.5
        with torch.no_grad():
            for weights in (None, psw) if pooling == PoolingMode.SUM else (None,):
                torch.testing.assert_close(
                    ours(indices, offsets, weights), theirs(indices, offsets, weights)
                )
    for ours_w, theirs_w in zip(
        ours.split_embedding_weights(), theirs.split_embedding_weights(), strict=True
    ):
        assert ours_w.shape == theirs_w.shape and torch.equal(ours_w, theirs_w)


def test_backward_raises_and_changes_nothing():
    module = int8_module(PoolingMode.SUM, optimizer=OptimType.EXACT_ROWWISE_ADAGRAD)
    before = module.weights_host.detach().clone()
    indices, offsets = make_batch(torch.Generator().manual_seed(3), [30, 30, 25, 40], 4, 3)
    psw = torch.rand(indices.numel()).requires_grad_()
    out = module(indices, offsets, psw)
    with pytest.raises(RuntimeError, match="INT8"):
        out.sum().backward()
    assert torch.equal(module.weights_host.detach(), before)
    assert torch.all(module.momentum1_host == 0)
    assert not module.weights_host.requires_grad
    with pytest.raises(RuntimeError, match="INT8"):
        torch.ops.recops.backward_codegen_sgd_unweighted_exact(
            torch.zeros_like(out),
            module.weights_host.detach(),
            module.weights_offsets,
            module.D_offsets,
            module.rows_per_table,
            indices,
            offsets,
            0,
            module.learning_rate_tensor,
        )
    assert torch.equal(module.weights_host.detach(), before)
