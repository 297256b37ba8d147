"""The fused optimizers, as the C++ optimizer table lists them (one row each,
csrc/recops/embedding/kernels/optimizer_table.h, read through
``torch.ops.recops.tbe_optimizer_table()``): FBGEMM's ``OptimType`` members recops implements, and
each one's op suffix, state buffers, hyper-parameters and weight-decay rule."""

import dataclasses
import enum
import json

import torch


@dataclasses.dataclass(frozen=True)
class OptimizerSpec:
    name: str  # op suffix: split_embedding_codegen_lookup_<name>_function
    optim_type: str  # FBGEMM's OptimType member
    optim_type_value: str
    # Per state buffer: "elementwise" (D values per row) or "rowwise" (one), its name (the ops'
    # argument, the module's <buffer>_host and <buffer>_offsets, FBGEMM's: momentum1, ...), and
    # get_optimizer_state's (torch.optim's) name for it.
    state_layouts: tuple[str, ...]
    state_buffers: tuple[str, ...]
    state_names: tuple[str, ...]
    # Hyper-parameters the ops take besides the learning rate and weight decay, passed from the
    # module's attributes of these names (``iter``: the step being taken).
    hyper_parameters: tuple[str, ...]
    bias_corrected: bool  # by the step count (the Adam family): the module saves its step count
    weight_decay_mode: int | None  # the WeightDecayMode the module passes; None: its own
    decays_in_update: bool  # decays its own way, not by the shared weight_decay_mode rule
    max_weight_decay_mode: int  # the largest weight_decay_mode its ops accept
    fbgemm_cpu: bool  # FBGEMM's CPU module implements it too


def _read_table():
    rows = []
    for row in json.loads(torch.ops.recops.tbe_optimizer_table()):
        states = row.pop("states")
        mode = row.pop("weight_decay_mode")
        rows.append(
            OptimizerSpec(
                state_layouts=tuple(layout for layout, _, _ in states),
                state_buffers=tuple(buffer for _, buffer, _ in states),
                state_names=tuple(name for _, _, name in states),
                hyper_parameters=tuple(row.pop("hyper_parameters")),
                weight_decay_mode=None if mode < 0 else mode,
                **row,
            )
        )
    return rows


class _OptimTypeBase(enum.Enum):
    def __str__(self) -> str:
        return self.value


_TABLE = _read_table()
# A row repeating an optim_type is that optimizer under a weight_decay_mode of its own: rowwise
# Adagrad with counter is EXACT_ROWWISE_ADAGRAD under WeightDecayMode COUNTER or COWCLIP.
_PLAIN = {}
for _row in _TABLE:
    _PLAIN.setdefault(_row.optim_type, _row)
OptimType = _OptimTypeBase(
    "OptimType",
    [(row.optim_type, row.optim_type_value) for row in _PLAIN.values()],
    module="recops.embedding",
    qualname="OptimType",
)
EmbOptimType = OptimType

# OptimType -> its row, in the table's order.
OPTIMIZERS = {OptimType[row.optim_type]: row for row in _PLAIN.values()}
# Rowwise Adagrad with counter: the row the module uses for EXACT_ROWWISE_ADAGRAD under
# WeightDecayMode COUNTER or COWCLIP.
WITH_COUNTER = next(row for row in _TABLE if row.name == "rowwise_adagrad_with_counter")
# Every row (the lookup and update ops of each), in the table's order.
ALL_ROWS = tuple(_TABLE)
