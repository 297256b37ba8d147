"""The fused layer ops and the fused loss (issue 28) against the PyTorch composition the torch
backend runs, which follows generative-recommenders' research HSTU layer
(SequentialTransductionUnitJagged with its default SiLU activation: `F.silu(F.layer_norm(x) @
uvqk)` on all of u, v, q, k; the production op `hstu_compute_uqvk` applies SiLU to u only) and
its output stage (`hstu_compute_output`'s `x + F.dropout(u * F.layer_norm(attn)) @ W_o`): the
reference here is
`recops.models.torch_backend.TorchBackend`'s layer_input (with its split into u, v, q, k, whose
backward concatenates the pieces' gradients) / layer_output themselves and `F.dropout`, so it
costs what the model's reference costs (checked by reading both: the same norm, matmul, SiLU,
split, product, dropout and linear calls, nothing added).

Cases are the main job's layers (ML-100K, a batch of 128 users of up to 200 events, 10214 rows):
HSTU's input (d = 50 to u, v, q, k = 200) and output (50 to 50, layer norm), FuXi-alpha's (RMS
norm, u three channels wide: 50 to 300, output 150 to 50), and a dropout of the rows. Forward
(no grad) and forward + backward, fp32 and bf16 (autocast-free: the tensors themselves bf16).
GB/s counts each op's inputs read and outputs written once; GFLOP/s the projection's products
(forward 2 L d w, backward twice that).

The encoder's input features (positional_input_features) are compared with
TorchBackend.input_features (generative-recommenders' learnable positional embedding
preprocessor: embeddings times sqrt(d), plus F.embedding of the positions, F.dropout), and the
state normalisation (l2_normalize) with recops.models.encoder.l2_normalize (x / norm clamped at
eps, as generative-recommenders' L2NormEmbeddingPostprocessor writes it).

FuXi-alpha's feed-forward stage (fuxi_layer_ffn) is compared with TorchBackend.feed_forward, the
FuXi-alpha code's MFFN stage 2 (`F.rms_norm`, `F.dropout`, the gate / up / down linears,
`F.silu`), d = hidden = 50. The fused loss (sampled_softmax_loss) is compared with
recops.models.loss.sampled_softmax_loss, the loss both backends trained with before it: it
follows generative-recommenders' SampledSoftmaxLoss (L2-normalised embeddings, temperature 0.05,
a negative equal to the positive masked to -5e4) but shares 128 negatives across the batch's
rows, one [M, d] x [d, R] product, where upstream gathers R negatives per row; the reference is
thus the cheaper of the two formulations, and the speed-up is the smaller one.
"""

import functools
import types

import torch
import torch.nn.functional as F
from harness import check_matches, measure_fwd_bwd

import recops
from recops.models.encoder import l2_normalize
from recops.models.loss import sampled_softmax_loss
from recops.models.torch_backend import TorchBackend

ROWS, DIM, DROPOUT = 10214, 50, 0.2
HIDDEN, NEGATIVES, ITEMS = 50, 128, 1682
# (model, norm, the input's u, v, q, k widths, output width)
LAYERS = [
    ("HSTU", "layer_norm", [50, 50, 50, 50], 50),
    ("FuXi-alpha", "rms_norm", [150, 50, 50, 50], 150),
]
torch_backend = TorchBackend()


def recops_input(x, weight, norm, split):
    return recops.hstu_layer_input(x, weight, norm=norm, eps=1e-6, split=split)


def recops_output(x, u, attn, linear, norm, p):
    return recops.hstu_layer_output(
        x, u, attn, linear.weight, linear.bias, norm=norm, eps=1e-6, dropout_p=p
    )


def input_rows(model, norm, split, dtype):
    """The projection as the models run it: split into u, v, q, k (the reference's split views,
    whose backward concatenates; recops' pieces)."""
    width = sum(split)
    x = torch.randn(ROWS, DIM, dtype=dtype, requires_grad=True)
    weight = (0.1 * torch.randn(DIM, width, dtype=dtype)).requires_grad_()
    impls = {
        "reference": functools.partial(torch_backend.layer_input, x, weight, norm, 1e-6, split),
        "recops": functools.partial(recops_input, x, weight, norm, split),
    }
    flops = 2 * ROWS * DIM * width
    rows = measure_fwd_bwd(
        "layer", f"{model} input L={ROWS} {DIM}->{width} {_name(dtype)}", impls, [x, weight],
        dtype, flops, 2,
    )  # fmt: skip
    moved = (ROWS * DIM + ROWS * width) * x.element_size()
    for r in rows:
        r.bytes_moved = moved if r.case.endswith(" fwd") else 3 * moved
    return rows


def output_rows(model, norm, width, dtype):
    x = torch.randn(ROWS, DIM, dtype=dtype, requires_grad=True)
    u, attn = (torch.randn(ROWS, width, dtype=dtype, requires_grad=True) for _ in range(2))
    linear = torch.nn.Linear(width, DIM, dtype=dtype)
    case = f"{model} output L={ROWS} {width}->{DIM} p={DROPOUT} {_name(dtype)}"

    def impls(p):
        return {
            "reference": functools.partial(
                torch_backend.layer_output, x, u, attn, linear, norm, 1e-6, p, True
            ),
            "recops": functools.partial(recops_output, x, u, attn, linear, norm, p),
        }

    # The two draw different dropout masks: compared without dropout, timed with it.
    check_matches(impls(0.0)["reference"], impls(0.0)["recops"], dtype, case)
    leaves = [x, u, attn, linear.weight, linear.bias]
    flops = 2 * ROWS * width * DIM
    rows = measure_fwd_bwd("layer", case, impls(DROPOUT), leaves, dtype, flops, 2, check=False)
    moved = (2 * ROWS * width + 2 * ROWS * DIM) * x.element_size()
    for r in rows:
        r.bytes_moved = moved if r.case.endswith(" fwd") else 3 * moved
    return rows


def dropout_rows(dtype):
    x = torch.randn(ROWS, DIM, dtype=dtype, requires_grad=True)
    impls = {
        "reference": functools.partial(F.dropout, x, DROPOUT, True),
        "recops": functools.partial(recops.counter_dropout, x, DROPOUT),
    }
    rows = measure_fwd_bwd(
        "layer", f"dropout L={ROWS} x {DIM} p={DROPOUT} {_name(dtype)}", impls, [x], dtype, 0, 0,
        check=False,
    )  # fmt: skip
    for r in rows:
        r.bytes_moved = (2 if r.case.endswith(" fwd") else 4) * x.numel() * x.element_size()
    return rows


def features_rows(dtype):
    """The encoder's input features: TorchBackend.input_features (multiply, embedding, add,
    F.dropout) against positional_input_features; positions of sequences of up to 200 rows."""
    x = torch.randn(ROWS, DIM, dtype=dtype, requires_grad=True)
    table = torch.randn(200, DIM, dtype=dtype, requires_grad=True)
    positions = torch.arange(ROWS) % 200
    layout = types.SimpleNamespace(positions=positions)  # what TorchBackend.positions reads
    scale = DIM**0.5

    def impls(p):
        return {
            "reference": functools.partial(
                torch_backend.input_features, x, table, layout, scale, p, True
            ),
            "recops": functools.partial(
                recops.positional_input_features, x, positions, table, scale, p
            ),
        }

    check_matches(*impls(0.0).values(), dtype, "input features")  # masks differ when p > 0
    case = f"input features L={ROWS} x {DIM} p={DROPOUT} {_name(dtype)}"
    rows = measure_fwd_bwd("layer", case, impls(DROPOUT), [x, table], dtype, 0, 0, check=False)
    for r in rows:
        r.bytes_moved = (2 if r.case.endswith(" fwd") else 4) * x.numel() * x.element_size()
    return rows


def l2_normalize_rows(dtype):
    """The models' state normalisation: recops.models.encoder.l2_normalize (norm, clamp, divide)
    against l2_normalize."""
    x = torch.randn(ROWS, DIM, dtype=dtype, requires_grad=True)
    impls = {
        "reference": functools.partial(l2_normalize, x),
        "recops": functools.partial(recops.l2_normalize, x),
    }
    case = f"L2 normalize L={ROWS} x {DIM} {_name(dtype)}"
    rows = measure_fwd_bwd("layer", case, impls, [x], dtype, 0, 0)
    for r in rows:
        r.bytes_moved = (2 if r.case.endswith(" fwd") else 5) * x.numel() * x.element_size()
    return rows


def ffn_rows(dtype):
    x = torch.randn(ROWS, DIM, dtype=dtype, requires_grad=True)
    gate, up = (torch.nn.Linear(DIM, HIDDEN, bias=False, dtype=dtype) for _ in range(2))
    down = torch.nn.Linear(HIDDEN, DIM, bias=False, dtype=dtype)
    linears = (gate, up, down)
    case = f"FuXi-alpha feed-forward L={ROWS} {DIM}->{HIDDEN}->{DIM} p={DROPOUT} {_name(dtype)}"

    def impls(p):
        return {
            "reference": functools.partial(
                torch_backend.feed_forward, x, linears, "rms_norm", 1e-6, p, True
            ),
            "recops": functools.partial(
                recops.fuxi_layer_ffn, x, gate.weight, up.weight, down.weight, dropout_p=p
            ),
        }

    # The two draw different dropout masks: compared without dropout, timed with it.
    check_matches(impls(0.0)["reference"], impls(0.0)["recops"], dtype, case)
    leaves = [x, gate.weight, up.weight, down.weight]
    flops = 2 * ROWS * DIM * HIDDEN * 3
    rows = measure_fwd_bwd("layer", case, impls(DROPOUT), leaves, dtype, flops, 2, check=False)
    for r in rows:
        r.bytes_moved = (1 if r.case.endswith(" fwd") else 3) * 2 * x.numel() * x.element_size()
    return rows


def loss_rows(dtype):
    gen = torch.Generator().manual_seed(1)
    queries = l2_normalize(torch.randn(ROWS - 1, DIM, generator=gen)).to(dtype).requires_grad_()
    positives = torch.randn(ROWS - 1, DIM, generator=gen).to(dtype).requires_grad_()
    negatives = torch.randn(NEGATIVES, DIM, generator=gen).to(dtype).requires_grad_()
    positive_ids = torch.randint(1, ITEMS + 1, (ROWS - 1,), generator=gen)
    negative_ids = torch.randint(1, ITEMS + 1, (NEGATIVES,), generator=gen)
    weights = torch.rand(ROWS - 1, generator=gen) > 0.01
    args = (queries, positives, positive_ids, negatives, negative_ids, 0.05, weights)
    impls = {
        "reference": functools.partial(sampled_softmax_loss, *args),
        "recops": functools.partial(recops.sampled_softmax_loss, *args),
    }
    case = f"sampled softmax loss M={ROWS - 1} R={NEGATIVES} d={DIM} {_name(dtype)}"
    flops = 2 * (ROWS - 1) * NEGATIVES * DIM
    rows = measure_fwd_bwd(
        "layer", case, impls, [queries, positives, negatives], dtype, flops, 2
    )  # fmt: skip
    for r in rows:
        moved = (2 * queries.numel() + negatives.numel()) * queries.element_size()
        r.bytes_moved = moved if r.case.endswith(" fwd") else 2 * moved
    return rows


def _name(dtype):
    return str(dtype).split(".")[-1]


def run(limits):
    torch.manual_seed(0)
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        for model, norm, split, out_width in LAYERS:
            rows += input_rows(model, norm, split, dtype)
            rows += output_rows(model, norm, out_width, dtype)
        rows += ffn_rows(dtype)
        rows += dropout_rows(dtype)
        rows += features_rows(dtype)
        rows += l2_normalize_rows(dtype)
        rows += loss_rows(dtype)
    return rows
