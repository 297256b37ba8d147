"""Rowwise Adagrad with counter: OptimType.EXACT_ROWWISE_ADAGRAD under WeightDecayMode COUNTER
(counter-based learning rates and weight decay) or COWCLIP (gradient clipping by the weight norm).

Every branch of the update (each counter weight-decay mode, each counter half-life kind, each
learning-rate mode, tail thresholds as counts and as ratios, adjustment delays, CowClip) is checked
side by side with fbgemm_gpu's CPU module over 20 steps, and against a float64 reference written
here from the formulas of docs/embedding.md. The reference also checks what FBGEMM's CPU module
cannot show: max_counter following the counts (its CPU module reads them from an empty device
buffer, so its max_counter stays 1), bf16 weights, MEAN pooling.
"""

import math

import pytest
import torch
from test_embedding import (
    EPS,
    LR,
    Reference,
    assert_state_unchanged,
    check_against_reference,
    fbgemm_module,
    make_batch,
    make_module,
    make_tables,
    run_side_by_side,
    shared_table_map,
    state_snapshot,
)
from test_embedding_vbe import FTM as VBE_FTM
from test_embedding_vbe import SHAPES as VBE_SHAPES
from test_embedding_vbe import compare_steps, vbe_steps

from recops import BoundsCheckMode, OptimType, PoolingMode, SparseType, WeightDecayMode
from recops.embedding import (
    CounterBasedRegularizationDefinition,
    CounterWeightDecayMode,
    CowClipDefinition,
    LearningRateMode,
    TailIdThreshold,
)

ops = torch.ops.recops
WD = 0.1
COUNTER, COWCLIP = WeightDecayMode.COUNTER, WeightDecayMode.COWCLIP
Decay, Rate = CounterWeightDecayMode, LearningRateMode

# (id, weight_decay_mode, the definition's fields): every branch of the update at least once.
CONFIGS = [
    (
        "decaying-count-lower-rate",
        COUNTER,
        dict(
            counter_halflife=4,
            learning_rate_mode=Rate.TAIL_ID_LR_DECREASE,
            adjustment_ub=0.5,
            tail_id_threshold=TailIdThreshold(1.5),
        ),
    ),
    (
        "presence-raise-rate-decouple",
        COUNTER,
        dict(
            counter_weight_decay_mode=Decay.DECOUPLE,
            counter_halflife=0,
            learning_rate_mode=Rate.TAIL_ID_LR_INCREASE,
            adjustment_iter=3,
        ),
    ),
    (
        "count-sgd-rate-l2",
        COUNTER,
        dict(
            counter_weight_decay_mode=Decay.L2,
            learning_rate_mode=Rate.COUNTER_SGD,
            adjustment_ub=2.0,
        ),
    ),
    (
        "adagradw-sqrt-count",
        COUNTER,
        dict(counter_weight_decay_mode=Decay.ADAGRADW, adjustment_iter=2),
    ),
    (
        "adagradw-capped-rate",
        COUNTER,
        dict(counter_weight_decay_mode=Decay.ADAGRADW, counter_halflife=-2, adjustment_ub=0.05),
    ),
    (
        "adagradw-ratio-threshold",
        COUNTER,
        dict(
            counter_weight_decay_mode=Decay.ADAGRADW,
            counter_halflife=3,
            learning_rate_mode=Rate.TAIL_ID_LR_DECREASE,
            tail_id_threshold=TailIdThreshold(0.5, is_ratio=True),
        ),
    ),
    (
        "cowclip-l2",
        COWCLIP,
        dict(
            counter_weight_decay_mode=Decay.L2,
            counter_halflife=3,
            weight_norm_coefficient=0.1,
            lower_bound=0.01,
        ),
    ),
    (
        "cowclip-decouple",
        COWCLIP,
        dict(counter_weight_decay_mode=Decay.DECOUPLE, weight_norm_coefficient=0.5),
    ),
    ("cowclip-floor-only", COWCLIP, dict(counter_halflife=0, lower_bound=0.02)),
]
CONFIG_IDS = [config[0] for config in CONFIGS]


def definition_kwargs(mode, fields, fbgemm=False):
    """The constructor's definition argument for `mode`: recops' dataclass, or FBGEMM's with the
    same fields (its enums by name)."""
    if fbgemm:
        import fbgemm_gpu.tbe.config.optimizer_config as config

        fields = dict(fields)
        for name, value in fields.items():
            if isinstance(value, TailIdThreshold):
                fields[name] = config.TailIdThreshold(value.val, value.is_ratio)
            elif hasattr(value, "name"):
                fields[name] = getattr(config, type(value).__name__)[value.name]
        counter, cowclip = config.CounterBasedRegularizationDefinition, config.CowClipDefinition
    else:
        counter, cowclip = CounterBasedRegularizationDefinition, CowClipDefinition
    if mode == COUNTER:
        return {"counter_based_regularization": counter(**fields)}
    return {"cowclip_regularization": cowclip(**fields)}


def counter_module(shapes, ftm, mode, fields, pooling=PoolingMode.SUM, precision=SparseType.FP32):
    return make_module(
        shapes,
        ftm,
        OptimType.EXACT_ROWWISE_ADAGRAD,
        pooling,
        precision,
        weight_decay=WD,
        weight_decay_mode=mode,
        **definition_kwargs(mode, fields),
    )


def irregular_batches(gen, rows, steps=20):
    """Small batches over many rows: rows come back after irregular gaps, so counts decay,
    staleness varies and some rows cross the tail threshold while others stay below."""
    sizes = torch.randint(1, 6, (steps,), generator=gen).tolist()
    return [make_batch(gen, rows, batch_size, max_bag=4) for batch_size in sizes]


# --------------------------------------------------------------------------- vs FBGEMM
@pytest.mark.parametrize("config", CONFIGS, ids=CONFIG_IDS)
def test_matches_fbgemm_over_20_steps(fbgemm_ops, config):
    _, mode, fields = config
    gen = torch.Generator().manual_seed(CONFIG_IDS.index(config[0]))
    shapes = make_tables(gen, 3, PoolingMode.SUM, max_dim=64)
    ftm = shared_table_map(3, adjacent=True)
    module = counter_module(shapes, ftm, mode, fields)
    rows = [shapes[t][0] for t in ftm]
    theirs = definition_kwargs(mode, fields, fbgemm=True)
    run_side_by_side(fbgemm_ops, module, irregular_batches(gen, rows), fbgemm_kwargs=theirs)
    assert int(module.iter) == 20
    last_updates = torch.cat([states[1] for states in module.split_optimizer_states()])
    assert last_updates.unique().numel() > 3  # rows last updated at many different steps


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("config", [CONFIGS[0], CONFIGS[5], CONFIGS[6]], ids=lambda c: c[0])
def test_fp16_and_weighted_match_fbgemm(fbgemm_ops, config, weighted):
    _, mode, fields = config
    gen = torch.Generator().manual_seed(40 + weighted)
    shapes = make_tables(gen, 2, PoolingMode.SUM, max_dim=32)
    module = counter_module(shapes, [0, 1], mode, fields, precision=SparseType.FP16)
    rows = [rows for rows, _ in shapes]
    theirs = definition_kwargs(mode, fields, fbgemm=True)
    run_side_by_side(fbgemm_ops, module, irregular_batches(gen, rows, 8), weighted, theirs)


@pytest.mark.parametrize("config", [CONFIGS[1], CONFIGS[3], CONFIGS[6]], ids=lambda c: c[0])
def test_variable_batch_matches_fbgemm(fbgemm_ops, config):
    """FBGEMM's variable batch size per feature (its CPU module has it for this optimizer)."""
    _, mode, fields = config
    ours = counter_module(VBE_SHAPES, VBE_FTM, mode, fields)
    theirs = fbgemm_module(fbgemm_ops, ours, **definition_kwargs(mode, fields, fbgemm=True))
    steps = []
    for indices, offsets, sizes, _ in vbe_steps(22, 20):

        def call(_, indices=indices, offsets=offsets, sizes=sizes):
            out = theirs(indices, offsets, batch_size_per_feature_per_rank=sizes)
            return out, out

        kwargs = dict(batch_size_per_feature_per_rank=sizes)
        steps.append((indices, offsets, kwargs, None, call, lambda grad: grad))
    compare_steps(ours, theirs, steps, torch.float32)


def test_optimizer_state_matches_fbgemm(fbgemm_ops):
    """Names and layout of the state (FBGEMM lists the step count under ADAGRADW only), and the
    state_dict loads from FBGEMM's module."""
    shapes = [(12, 8), (7, 4)]
    for mode, fields in ((COUNTER, CONFIGS[3][2]), (COUNTER, CONFIGS[0][2]), (COWCLIP, {})):
        ours = counter_module(shapes, None, mode, fields)
        theirs = fbgemm_module(fbgemm_ops, ours, **definition_kwargs(mode, fields, fbgemm=True))
        their_state, our_state = theirs.get_optimizer_state(), ours.get_optimizer_state()
        assert [list(s) for s in our_state] == [list(s) for s in their_state]
        for mine, expected in zip(our_state, their_state, strict=True):
            for name, value in expected.items():
                assert mine[name].shape == value.shape, name
        indices, offsets = torch.tensor([1, 3, 1, 2]), torch.tensor([0, 2, 4])
        theirs(indices, offsets).sum().backward()
        state = {k: v for k, v in theirs.state_dict().items() if k in ours.state_dict()}
        assert {"max_counter", "prev_iter_host", "row_counter_host"} <= set(state)
        ours.load_state_dict(state, strict=False)
        for mine, expected in zip(
            ours.split_optimizer_states(), theirs.split_optimizer_states(), strict=True
        ):
            for a, b in zip(mine, expected, strict=True):
                assert torch.equal(a, b)


# --------------------------------------------------------------------------- vs reference
class CounterReference(Reference):
    """Reference with the counter update of docs/embedding.md, in float64, and max_counter
    following the counts every max_counter_update_freq steps under COUNTER."""

    def __init__(self, module, mode, fields):
        super().__init__(module)
        kind = CounterBasedRegularizationDefinition if mode == COUNTER else CowClipDefinition
        definition = kind(**fields)
        self.mode, self.definition = mode, definition
        self.counter_decay = definition.counter_weight_decay_mode
        self.max_counter = 1.0

    def step(self, indices, offsets, grad_output, psw=None):
        freq = getattr(self.definition, "max_counter_update_freq", -1)
        if self.mode == COUNTER and freq > 0 and (self.iter + 1) % freq == 0:
            self.max_counter = max(float(states[2].max()) for states in self.states) + 1
        return super().step(indices, offsets, grad_output, psw)

    def update(self, t, rows, g):
        d, it = self.definition, float(self.iter)
        w, (sums, prev_iter, counts) = self.weights[t][rows], self.states[t]
        gap = torch.where(prev_iter[rows] == 0, 1.0, it - prev_iter[rows])
        halflife = d.counter_halflife
        if halflife > 0:
            counts[rows] = 1 + torch.exp(-gap * math.log(2) / halflife) * counts[rows]
        elif halflife == 0:
            counts[rows] = 1.0
        else:
            counts[rows] += 1
        n = counts[rows]
        decayed = g + WD * w if self.counter_decay == Decay.L2 else g
        sums[rows] += (decayed * decayed).mean(dim=1)
        base = LR / (sums[rows].sqrt() + EPS)
        adjust_after = getattr(d, "adjustment_iter", -1)  # CowClip's is FBGEMM's default
        adjusting = adjust_after <= 0 or it > adjust_after
        keep = torch.ones_like(base)
        if self.mode == COWCLIP:
            clip = n * (d.weight_norm_coefficient * w.norm(dim=1)).clamp(min=d.lower_bound)
            rate = torch.fmin(torch.ones_like(base), clip / decayed.norm(dim=1)) * base
            if self.counter_decay == Decay.DECOUPLE:
                keep = keep * (1 - LR * WD)
            elif self.counter_decay == Decay.L2:
                keep = 1 - WD * rate
        else:
            rate = base.clone()
            threshold = d.tail_id_threshold.val
            if d.tail_id_threshold.is_ratio:
                threshold = math.floor(threshold * self.max_counter)
            if d.learning_rate_mode != Rate.EQUAL and adjusting:
                ub, top = d.adjustment_ub, self.max_counter
                adjusted = {
                    Rate.TAIL_ID_LR_INCREASE: base * ((top / (n + 1)) ** ub).clamp(1, 10),
                    Rate.TAIL_ID_LR_DECREASE: base * (((n + 1) / top) ** ub).clamp(0.1, 1),
                    Rate.COUNTER_SGD: LR / ((ub * n).sqrt() + EPS),
                }[d.learning_rate_mode]
                rate = torch.where(n > threshold, adjusted, base)
            if adjusting:
                if self.counter_decay == Decay.ADAGRADW:
                    if halflife == -1:
                        rate = base * n.sqrt()
                    elif halflife == -2:
                        rate = (LR * n).clamp(max=d.adjustment_ub) / (sums[rows].sqrt() + EPS)
                    lazy = (1 - WD * LR) ** (gap.clamp(max=it - adjust_after) - 1)
                    rate, keep = rate * lazy, (1 - WD * LR) * lazy
                elif self.counter_decay == Decay.DECOUPLE:
                    keep = 1 - halflife / n * WD * LR
                elif self.counter_decay == Decay.L2:
                    keep = 1 - halflife / n * WD * base
        prev_iter[rows] = it
        new = keep[:, None] * w - rate[:, None] * g
        self.weights[t][rows] = new.to(self.dtype).double()


def check_counter_reference(module, mode, fields, batches):
    reference = CounterReference(module, mode, fields)
    check_against_reference(module, batches, reference=reference)
    return reference


@pytest.mark.parametrize("config", CONFIGS, ids=CONFIG_IDS)
def test_bf16_mean_pooling_matches_reference(config):
    _, mode, fields = config
    gen = torch.Generator().manual_seed(60 + CONFIG_IDS.index(config[0]))
    shapes = make_tables(gen, 2, PoolingMode.MEAN, max_dim=32)
    ftm = shared_table_map(2, adjacent=False)
    module = counter_module(shapes, ftm, mode, fields, PoolingMode.MEAN, SparseType.BF16)
    rows = [shapes[t][0] for t in ftm]
    check_counter_reference(module, mode, fields, irregular_batches(gen, rows, 10))


@pytest.mark.parametrize("rate_mode", [Rate.TAIL_ID_LR_INCREASE, Rate.TAIL_ID_LR_DECREASE], ids=str)
def test_max_counter_follows_the_counts(rate_mode):
    """Every max_counter_update_freq steps max_counter becomes the largest count + 1, which the
    learning-rate modes and a ratio threshold read (FBGEMM's GPU module does this; its CPU module
    keeps 1)."""
    fields = dict(
        counter_halflife=-1,
        learning_rate_mode=rate_mode,
        adjustment_ub=0.7,
        tail_id_threshold=TailIdThreshold(0.3, is_ratio=True),
        max_counter_update_freq=3,
    )
    gen = torch.Generator().manual_seed(71)
    module = counter_module([(20, 8), (9, 4)], [0, 1], COUNTER, fields)
    batches = irregular_batches(gen, [20, 9], 12)
    reference = check_counter_reference(module, COUNTER, fields, batches)
    assert float(module.max_counter) == reference.max_counter > 3  # set at step 12


def test_empty_batch_and_empty_table_change_nothing():
    module = counter_module([(0, 4), (6, 8)], [0, 1], COUNTER, CONFIGS[0][2])
    snapshot = state_snapshot(module)
    offsets = torch.zeros(2 * 3 + 1, dtype=torch.long)
    module(torch.empty(0, dtype=torch.long), offsets).sum().backward()
    assert_state_unchanged(module, snapshot)


# --------------------------------------------------------------------------- settings and bad input
@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(weight_decay_mode=COUNTER), ValueError, "counter_based_regularization"),
        (dict(weight_decay_mode=COWCLIP), ValueError, "cowclip_regularization"),
        (
            dict(counter_based_regularization=CounterBasedRegularizationDefinition()),
            ValueError,
            "weight_decay_mode=COUNTER",
        ),
        (
            dict(weight_decay_mode=COUNTER, cowclip_regularization=CowClipDefinition()),
            ValueError,
            "counter_based_regularization",
        ),
        (
            dict(
                optimizer=OptimType.EXACT_SGD,
                weight_decay_mode=COUNTER,
                counter_based_regularization=CounterBasedRegularizationDefinition(),
            ),
            NotImplementedError,
            "EXACT_ROWWISE_ADAGRAD",
        ),
        (
            dict(
                weight_decay_mode=COUNTER,
                counter_based_regularization=CounterBasedRegularizationDefinition(
                    learning_rate_mode=5
                ),
            ),
            NotImplementedError,
            "learning_rate_mode",
        ),
    ],
)
def test_settings_fbgemm_refuses_are_refused(kwargs, error, match):
    kwargs = {"optimizer": OptimType.EXACT_ROWWISE_ADAGRAD} | kwargs
    with pytest.raises(error, match=match):
        make_module([(5, 4)], None, pooling=PoolingMode.SUM, **kwargs)


def update_call(module):
    """The module's update op and its arguments for a one-index batch."""
    state = {}
    for name in module._optimizer_spec.state_buffers:
        state[name] = getattr(module, f"{name}_host")
        state[f"{name}_offsets"] = getattr(module, f"{name}_offsets")
    state.update(module._hyper_parameters(1))
    args = (
        torch.ones(1, 12),
        module.weights_host.detach(),
        module.weights_offsets,
        module.D_offsets,
        module.rows_per_table,
        torch.tensor([1, 2]),
        torch.tensor([0, 1, 2]),
        0,
    )
    kwargs = dict(
        learning_rate_tensor=module.learning_rate_tensor,
        weight_decay=WD,
        weight_decay_mode=module._op_weight_decay_mode,
        **state,
    )
    return ops.backward_codegen_rowwise_adagrad_with_counter_unweighted_exact, args, kwargs


@pytest.mark.parametrize(
    "bad, error, match",
    [
        (dict(max_counter=0.0), ValueError, "max_counter must not be 0"),
        (dict(max_counter=math.inf), ValueError, "max_counter"),
        (dict(regularization_mode=2), ValueError, "regularization_mode must be 3"),
        (dict(learning_rate_mode=3), ValueError, "learning_rate_mode must be -1"),
        (dict(counter_halflife=2**30), ValueError, "counter_halflife must be within"),
        (dict(adjustment_ub=math.nan), ValueError, "adjustment_ub"),
        (dict(weight_decay_mode=4), RuntimeError, "weight_decay_mode must be 0"),
        (dict(row_counter_offsets=torch.tensor([0, 5])), RuntimeError, "row_counter"),
    ],
)
def test_bad_arguments_raise_before_any_update(bad, error, match):
    module = counter_module([(6, 4), (5, 8)], [0, 1], COUNTER, CONFIGS[0][2])
    update, args, kwargs = update_call(module)
    snapshot = state_snapshot(module)
    with pytest.raises(error, match=match):
        update(*args, **(kwargs | bad))
    assert_state_unchanged(module, snapshot)
    update(*args, **kwargs)  # the same call with good arguments updates
    assert float(module.split_optimizer_states()[0][2][1]) == 1.0


def test_fatal_bounds_check_leaves_every_state_untouched():
    module = counter_module([(6, 4)], None, COUNTER, CONFIGS[3][2])
    module.bounds_check_mode = BoundsCheckMode.FATAL
    module(torch.tensor([1, 2]), torch.tensor([0, 2])).sum().backward()
    snapshot = state_snapshot(module)
    with pytest.raises(IndexError):
        module(torch.tensor([1, 6]), torch.tensor([0, 2]))
    assert_state_unchanged(module, snapshot)
    assert int(module.iter) == 1
