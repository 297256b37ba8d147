"""recops: fast C++ operators for recommendation-model training in PyTorch.

Importing recops loads its operator library (``torch.ops.recops.*``), registers fake kernels and
autograd formulas, and binds the FBGEMM-compatible ops to ``torch.ops.fbgemm.*``.
"""

import torch

from recops import _fbgemm, _library

fbgemm_loaded = _fbgemm.import_fbgemm()
library_path = _library.load()

from recops import embedding, jagged, sparse  # noqa: E402  (registers fake kernels and autograd)
from recops.embedding import (  # noqa: E402
    BoundsCheckMode,
    ComputeDevice,
    EmbeddingLocation,
    EmbOptimType,
    OptimType,
    PoolingMode,
    SparseType,
    SplitTableBatchedEmbeddingBagsCodegen,
    WeightDecayMode,
)

fbgemm_bindings = _fbgemm.bind()

ops = torch.ops.recops

__all__ = [
    "BoundsCheckMode",
    "ComputeDevice",
    "EmbOptimType",
    "EmbeddingLocation",
    "OptimType",
    "PoolingMode",
    "SparseType",
    "SplitTableBatchedEmbeddingBagsCodegen",
    "WeightDecayMode",
    "embedding",
    "fbgemm_bindings",
    "fbgemm_loaded",
    "jagged",
    "library_path",
    "ops",
    "sparse",
]
__version__ = "0.1.0"
