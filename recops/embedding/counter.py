"""Rowwise Adagrad with counter: FBGEMM's counter-based regularization and CowClip settings (its
enums and frozen dataclasses, with its names, values and defaults), and the hyper-parameters of
the ``rowwise_adagrad_with_counter`` ops they set. The update itself is documented at its kernel
(csrc/recops/embedding/kernels/optimizers.h) and in docs/embedding.md."""

import dataclasses
import enum

from recops.embedding.config import WeightDecayMode, coerce


class CounterWeightDecayMode(enum.IntEnum):
    NONE = 0
    L2 = 1
    DECOUPLE = 2
    ADAGRADW = 3


class LearningRateMode(enum.IntEnum):
    EQUAL = -1
    TAIL_ID_LR_INCREASE = 0
    TAIL_ID_LR_DECREASE = 1
    COUNTER_SGD = 2


class GradSumDecay(enum.IntEnum):
    NO_DECAY = -1
    CTR_DECAY = 0


@dataclasses.dataclass(frozen=True)
class TailIdThreshold:
    val: float = 0
    is_ratio: bool = False  # val is a fraction of max_counter


@dataclasses.dataclass(frozen=True)
class CounterBasedRegularizationDefinition:
    counter_weight_decay_mode: CounterWeightDecayMode = CounterWeightDecayMode.NONE
    counter_halflife: int = -1
    adjustment_iter: int = -1
    adjustment_ub: float = 1.0
    learning_rate_mode: LearningRateMode = LearningRateMode.EQUAL
    # Read by no FBGEMM kernel, CPU or GPU; accepted and ignored.
    grad_sum_decay: GradSumDecay = GradSumDecay.NO_DECAY
    tail_id_threshold: TailIdThreshold = dataclasses.field(default_factory=TailIdThreshold)
    # Every this many steps (<= 0: never) max_counter becomes the largest count + 1.
    max_counter_update_freq: int = 1000


@dataclasses.dataclass(frozen=True)
class CowClipDefinition:
    counter_weight_decay_mode: CounterWeightDecayMode = CounterWeightDecayMode.NONE
    counter_halflife: int = -1
    weight_norm_coefficient: float = 0.0
    lower_bound: float = 0.0


COUNTER_MODES = (WeightDecayMode.COUNTER, WeightDecayMode.COWCLIP)


@dataclasses.dataclass(frozen=True)
class CounterSettings:
    """What the module passes the counter ops: their weight_decay_mode (the counter's own), their
    other hyper-parameters but ``iter`` and ``max_counter``, and how often max_counter follows
    the counts."""

    weight_decay_mode: CounterWeightDecayMode
    hyper_parameters: dict
    max_counter_update_freq: int


def counter_settings(weight_decay_mode, counter_based_regularization, cowclip_regularization):
    """The settings of rowwise Adagrad with counter for ``weight_decay_mode`` COUNTER or COWCLIP,
    from FBGEMM's definition objects (or recops' above; fields are read by name). As in FBGEMM,
    each object is given exactly when its mode is chosen."""
    for mode, value, arg in (
        (WeightDecayMode.COUNTER, counter_based_regularization, "counter_based_regularization"),
        (WeightDecayMode.COWCLIP, cowclip_regularization, "cowclip_regularization"),
    ):
        if (weight_decay_mode == mode) != (value is not None):
            raise ValueError(
                f"weight_decay_mode={mode.name} and {arg} go together (FBGEMM's rule): "
                f"got weight_decay_mode={weight_decay_mode.name}, {arg}={value!r}"
            )
    counter = counter_based_regularization or CounterBasedRegularizationDefinition()
    cowclip = cowclip_regularization or CowClipDefinition()
    chosen = counter if weight_decay_mode == WeightDecayMode.COUNTER else cowclip
    decay_mode = coerce(
        CounterWeightDecayMode, chosen.counter_weight_decay_mode, "counter_weight_decay_mode"
    )
    coerce(GradSumDecay, counter.grad_sum_decay, "grad_sum_decay")
    threshold = counter.tail_id_threshold
    hyper_parameters = {
        "counter_halflife": int(chosen.counter_halflife),
        "adjustment_iter": int(counter.adjustment_iter),
        "adjustment_ub": float(counter.adjustment_ub),
        "learning_rate_mode": int(
            coerce(LearningRateMode, counter.learning_rate_mode, "learning_rate_mode")
        ),
        "tail_id_threshold": float(threshold.val),
        "is_tail_id_thresh_ratio": int(bool(threshold.is_ratio)),
        "regularization_mode": int(weight_decay_mode),
        "weight_norm_coefficient": float(cowclip.weight_norm_coefficient),
        "lower_bound": float(cowclip.lower_bound),
    }
    # FBGEMM updates max_counter under COUNTER only.
    freq = counter.max_counter_update_freq if weight_decay_mode == WeightDecayMode.COUNTER else -1
    return CounterSettings(decay_mode, hyper_parameters, int(freq))
