"""The loss family (docs/ops.md §9): recops.sampled_softmax_loss against the models' PyTorch
composition (recops.models.loss.sampled_softmax_loss, which the torch backend trains with) and a
float64 version of it, at the training step's shapes and at the edges (masked negatives, no
negatives, bool and zero weights, strided rows), and its input checks. opcheck, gradcheck and the
bad-input properties run on op_cases' draws (family "loss")."""

import pytest
import torch
from accuracy import assert_close, assert_errors_within_rule
from threads import num_threads

import recops
from recops.models.encoder import l2_normalize
from recops.models.loss import sampled_softmax_loss as composition

BF16 = torch.bfloat16


def batch(rows=300, dim=50, negatives=128, dtype=torch.float32, ids=1682, seed=0):
    """A training step's operands: unit-norm queries, raw positives and negatives, ids from a
    catalogue of `ids` items (few ids: many negatives equal a row's positive), bool weights."""
    gen = torch.Generator().manual_seed(seed)
    queries = l2_normalize(torch.randn(rows, dim, generator=gen, dtype=torch.float64))
    return {
        "queries": queries.to(dtype),
        "positives": torch.randn(rows, dim, generator=gen, dtype=torch.float64).to(dtype),
        "positive_ids": torch.randint(1, ids + 1, (rows,), generator=gen),
        "negatives": torch.randn(negatives, dim, generator=gen, dtype=torch.float64).to(dtype),
        "negative_ids": torch.randint(1, ids + 1, (negatives,), generator=gen),
        "temperature": 0.05,
        "weights": torch.rand(rows, generator=gen) > 0.1,
    }


LEAVES = ("queries", "positives", "negatives")


def loss_and_grads(fn, b, dtype=None):
    """fn's loss and gradients with the float operands as leaves of `dtype` (default theirs)."""
    leaves = {n: b[n].detach().to(dtype or b[n].dtype).requires_grad_() for n in LEAVES}
    args = {**b, **leaves}
    loss = fn(
        args["queries"],
        args["positives"],
        args["positive_ids"],
        args["negatives"],
        args["negative_ids"],
        args["temperature"],
        args["weights"],
    )
    return (loss, *torch.autograd.grad(loss, [leaves[n] for n in LEAVES]))


@pytest.mark.parametrize(
    "shape",
    [(300, 50, 128), (1, 3, 1), (64, 16, 32), (131, 50, 0), (7, 5, 200)],
    ids=lambda s: "x".join(map(str, s)),
)
def test_equals_the_composition_in_float64(shape):
    b = batch(*shape, dtype=torch.float64, ids=20)
    for got, want in zip(
        loss_and_grads(recops.sampled_softmax_loss, b), loss_and_grads(composition, b), strict=True
    ):
        assert_close(got, want, torch.float64)


@pytest.mark.parametrize("rows,shift", [(40, 1), (40, 3), (40, 0), (5, 5), (1, 1)])
def test_positive_shift_equals_the_composition_on_shifted_rows(rows, shift):
    """positive_shift=s pairs query i with positive i + s: the composition on the shifted slices
    (the torch backend's next-item loss), in float64; the rows no pair reads get zero gradients."""
    b = batch(rows, 16, 24, dtype=torch.float64, ids=20, seed=rows + shift)

    def shifted(queries, positives, positive_ids, negatives, negative_ids, temperature, weights):
        m = queries.shape[0] - shift
        return composition(
            queries[:m],
            positives[shift:],
            positive_ids[shift:],
            negatives,
            negative_ids,
            temperature,
            weights[:m],
        )

    def fused(*args):
        return recops.sampled_softmax_loss(*args, positive_shift=shift)

    if shift == rows:  # no pair: NaN like the composition's mean of nothing, zero gradients
        loss, grad_q, grad_p, grad_n = loss_and_grads(fused, b)
        assert torch.isnan(loss) and not grad_q.any() and not grad_p.any()
        return
    for got, want in zip(loss_and_grads(fused, b), loss_and_grads(shifted, b), strict=True):
        assert_close(got, want, torch.float64)


def test_fp32_and_bf16_within_the_rule_of_the_composition():
    for dtype in (torch.float32, BF16):
        b = batch(dtype=dtype, ids=60)
        exact = loss_and_grads(composition, b, torch.float64)
        low = loss_and_grads(composition, b)
        got = loss_and_grads(recops.sampled_softmax_loss, b)
        assert all(g.dtype == dtype for g in got)
        assert_errors_within_rule(("loss", *LEAVES), exact, low, got)


def test_masked_negatives_pass_no_gradient():
    b = batch(rows=4, negatives=6, dtype=torch.float64)
    b["negative_ids"][:] = b["positive_ids"][0]  # every negative is row 0's positive
    b["positive_ids"][1:] = 0  # and no other row's
    b["weights"] = torch.tensor([True, False, False, False])
    loss, _, _, grad_negatives = loss_and_grads(recops.sampled_softmax_loss, b)
    assert float(loss.detach()) == pytest.approx(0.0, abs=1e-12)  # only the positive is left
    assert torch.count_nonzero(grad_negatives) == 0


def test_float_weights_and_strided_rows():
    b = batch(rows=257, dtype=torch.float32)
    b["weights"] = torch.rand(257, generator=torch.Generator().manual_seed(3))
    wide = torch.randn(257, 80)
    wide[:, 10:60] = b["queries"]
    b["queries"] = wide[:, 10:60]  # rows of stride 80
    for got, want in zip(
        loss_and_grads(recops.sampled_softmax_loss, b), loss_and_grads(composition, b), strict=True
    ):
        assert_close(got, want, torch.float32, relative_to_max=True)


def test_no_weight_is_nan_like_the_composition():
    b = batch(rows=5)
    b["weights"] = torch.zeros(5, dtype=torch.bool)
    assert torch.isnan(recops.sampled_softmax_loss(*loss_args(b)))
    assert torch.isnan(composition(*loss_args(b)))


def loss_args(b):
    return (
        b["queries"],
        b["positives"],
        b["positive_ids"],
        b["negatives"],
        b["negative_ids"],
        b["temperature"],
        b["weights"],
    )


def test_same_bits_for_any_thread_count():
    b = batch(rows=1000)
    results = []
    for threads in (1, 2):
        with num_threads(threads):
            results.append(loss_and_grads(recops.sampled_softmax_loss, b))
    for one, two in zip(*results, strict=True):
        assert torch.equal(one, two)


def test_backward_scales_the_forwards_gradients_by_grad_output():
    """The forward computes the gradients for a grad_output of 1 (sampled_softmax_loss_and_grads)
    only when grad mode is on and an operand needs them; the backward scales them, for the
    operands that asked only."""
    b = batch(rows=70, negatives=9)
    queries = b["queries"].double().requires_grad_()
    args = {**b, "queries": queries, "positives": b["positives"].double()}
    args["negatives"] = b["negatives"].double()
    with torch.no_grad():
        assert not recops.sampled_softmax_loss(*loss_args(args)).requires_grad
    loss = recops.sampled_softmax_loss(*loss_args(args))
    (got,) = torch.autograd.grad(-2.5 * loss, [queries])
    (want,) = torch.autograd.grad(-2.5 * composition(*loss_args(args)), [queries])
    assert_close(got, want, torch.float64)
    assert not got.requires_grad


def test_unit_grad_output_accumulates_like_any_other():
    """With grad_output 1 the backward passes the forward's gradients on as they are: retained and
    run again, or summed with another path's gradient, they must come out as the composition's
    (nothing may add into the saved tensors)."""
    b = batch(rows=30, negatives=7, dtype=torch.float64)
    leaves = {n: b[n].detach().clone().requires_grad_() for n in LEAVES}
    args = {**b, **leaves}
    loss = recops.sampled_softmax_loss(*loss_args(args))
    loss.backward(retain_graph=True)
    (loss + leaves["queries"].sum()).backward()  # a second path into queries, and the loss again
    want = loss_and_grads(composition, b)
    assert_close(leaves["queries"].grad, 2 * want[1] + 1, torch.float64)
    assert_close(leaves["positives"].grad, 2 * want[2], torch.float64)
    assert_close(leaves["negatives"].grad, 2 * want[3], torch.float64)


def test_double_backward_raises():
    """The saved gradients carry no graph: create_graph=True is refused, not answered with a
    gradient that treats them as constants."""
    b = batch(rows=8, negatives=3)
    queries = b["queries"].clone().requires_grad_()
    loss = recops.sampled_softmax_loss(*loss_args({**b, "queries": queries}))
    with pytest.raises(RuntimeError, match="create_graph"):
        torch.autograd.grad(loss, [queries], create_graph=True)


def test_autocast_computes_in_fp32():
    b = batch(rows=40)
    b["queries"] = b["queries"].to(BF16)  # bf16 states, fp32 item embeddings
    with torch.autocast("cpu", dtype=BF16):
        loss = recops.sampled_softmax_loss(*loss_args(b))
    assert loss.dtype == torch.float32
    b["queries"] = b["queries"].float()
    assert_close(loss, composition(*loss_args(b)), torch.float32)


def test_compiles_in_a_full_graph():
    b = batch(rows=33, negatives=9)
    compiled = torch.compile(recops.sampled_softmax_loss, fullgraph=True, backend="aot_eager")
    got, want = loss_and_grads(compiled, b), loss_and_grads(recops.sampled_softmax_loss, b)
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)


@pytest.mark.parametrize(
    "change,message",
    [
        (lambda b: b.update(positives=b["positives"][:-1]), "positives must have queries' shape"),
        (lambda b: b.update(negatives=b["negatives"][:, :-1]), "negatives must have queries'"),
        (lambda b: b.update(positive_ids=b["positive_ids"][:-1]), "positive_ids must have one id"),
        (lambda b: b.update(negative_ids=b["negative_ids"].float()), "negative_ids"),
        (lambda b: b.update(weights=b["weights"][:2]), "weights must have one value"),
        (lambda b: b.update(temperature=0.0), "temperature must be positive"),
        (lambda b: b.update(negatives=b["negatives"].double()), "negatives"),
        (lambda b: b.update(queries=b["queries"].int()), "queries"),
        (lambda b: b.update(positive_shift=7), r"positive_shift must be in \[0, queries.size"),
        (lambda b: b.update(positive_shift=-1), "positive_shift must be in"),
    ],
)
def test_bad_input_raises_naming_the_argument(change, message):
    b = batch(rows=6, negatives=4)
    change(b)
    shift = b.pop("positive_shift", 0)
    with pytest.raises((ValueError, RuntimeError, TypeError), match=message):
        recops.sampled_softmax_loss(*loss_args(b), positive_shift=shift)
