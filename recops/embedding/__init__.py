"""Table-batched embedding bags with the optimizer fused into backward (docs/ops.md section 7).

``SplitTableBatchedEmbeddingBagsCodegen`` is FBGEMM's module of that name for CPU training: many
tables looked up in one call, and a backward that sums the gradient of every unique row (across
bags and the features sharing a table) and applies the optimizer to it in place, never building a
dense gradient. Kernels live in csrc/recops/embedding. One job per file here:

- ``config``: FBGEMM's enums and the constructor arguments recops accepts only at their defaults;
- ``counter``: the settings of rowwise Adagrad with counter (FBGEMM's regularization objects);
- ``optimizers``: the fused optimizers (and ``OptimType``), read from the C++ optimizer table;
- ``layout``: the table layout arithmetic (flat buffers, per-feature offsets, per-table views);
- ``ops``: the ops' fake kernels and the lookup ops' autograd;
- ``module``: the module class;
- ``quantized_layout``, ``quantized_module``: FBGEMM's quantized inference module
  ``IntNBitTableBatchedEmbeddingBagsCodegen`` (INT8 / INT4 / INT2 / FP8 / FP16 / FP32 rows, looked
  up only) and its byte layout.
"""

from recops.embedding import ops  # noqa: F401  (registers the ops' fake kernels and autograd)
from recops.embedding.config import (
    BoundsCheckMode,
    ComputeDevice,
    EmbeddingLocation,
    PoolingMode,
    SparseType,
    WeightDecayMode,
)
from recops.embedding.counter import (
    CounterBasedRegularizationDefinition,
    CounterWeightDecayMode,
    CowClipDefinition,
    GradSumDecay,
    LearningRateMode,
    TailIdThreshold,
)
from recops.embedding.module import SplitTableBatchedEmbeddingBagsCodegen
from recops.embedding.optimizers import EmbOptimType, OptimType
from recops.embedding.quantized_module import IntNBitTableBatchedEmbeddingBagsCodegen

__all__ = [
    "BoundsCheckMode",
    "ComputeDevice",
    "CounterBasedRegularizationDefinition",
    "CounterWeightDecayMode",
    "CowClipDefinition",
    "EmbOptimType",
    "EmbeddingLocation",
    "GradSumDecay",
    "IntNBitTableBatchedEmbeddingBagsCodegen",
    "LearningRateMode",
    "OptimType",
    "PoolingMode",
    "SparseType",
    "SplitTableBatchedEmbeddingBagsCodegen",
    "TailIdThreshold",
    "WeightDecayMode",
]

# The public classes keep the module path they are imported from (in reprs, pickles and the
# module name torchrec sharding reports).
for _name in __all__:
    globals()[_name].__module__ = __name__
del _name
