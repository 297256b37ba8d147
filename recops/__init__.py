"""recops: fast C++ operators for recommendation-model training in PyTorch.

Importing recops loads its operator library (``torch.ops.recops.*``), registers fake kernels and
autograd formulas, and binds the FBGEMM-compatible ops to ``torch.ops.fbgemm.*``.
"""

import torch

from recops import _fbgemm, _library
from recops._version import __version__

fbgemm_loaded = _fbgemm.import_fbgemm()
library_path = _library.load()

from recops import embedding  # noqa: E402  (registers fake kernels and autograd)
from recops.embedding import (  # noqa: E402
    BoundsCheckMode,
    ComputeDevice,
    EmbeddingLocation,
    EmbOptimType,
    IntNBitTableBatchedEmbeddingBagsCodegen,
    OptimType,
    PoolingMode,
    SparseType,
    SplitTableBatchedEmbeddingBagsCodegen,
    WeightDecayMode,
)
from recops.operators import (  # noqa: E402  (registers fake kernels and autograd)
    deberta,
    fuxi,
    gather,
    hashing,
    hstu,
    jagged,
    keyed,
    layer,
    loss,
    quantize,
    relative_bias,
    retrieval,
    sparse,
    utility,
)
from recops.operators.deberta import DisentangledSelfAttention, disentangled_attention  # noqa: E402
from recops.operators.fuxi import delta_fuxi_attention, fuxi_attention  # noqa: E402
from recops.operators.hstu import delta_hstu_mha, hstu_attention  # noqa: E402
from recops.operators.keyed import PermutePooledEmbeddings, PermutePooledEmbeddingsSplit  # noqa: E402
from recops.operators.layer import (  # noqa: E402
    counter_dropout,
    fuxi_layer_ffn,
    hstu_layer_input,
    hstu_layer_output,
    l2_normalize,
    positional_input_features,
)
from recops.operators.loss import sampled_softmax_loss  # noqa: E402
from recops.operators.relative_bias import RelativeBucketedTimeAndPositionBasedBias  # noqa: E402
from recops.operators.retrieval import mips_topk  # noqa: E402

fbgemm_bindings = _fbgemm.bind()
use_for_fbgemm = _fbgemm.use_for_fbgemm

ops = torch.ops.recops

__all__ = [
    "__version__",
    "BoundsCheckMode",
    "ComputeDevice",
    "DisentangledSelfAttention",
    "EmbOptimType",
    "EmbeddingLocation",
    "IntNBitTableBatchedEmbeddingBagsCodegen",
    "OptimType",
    "PermutePooledEmbeddings",
    "PermutePooledEmbeddingsSplit",
    "PoolingMode",
    "RelativeBucketedTimeAndPositionBasedBias",
    "SparseType",
    "SplitTableBatchedEmbeddingBagsCodegen",
    "WeightDecayMode",
    "counter_dropout",
    "deberta",
    "delta_fuxi_attention",
    "delta_hstu_mha",
    "disentangled_attention",
    "embedding",
    "fbgemm_bindings",
    "fbgemm_loaded",
    "fuxi",
    "fuxi_attention",
    "fuxi_layer_ffn",
    "gather",
    "hashing",
    "hstu",
    "hstu_attention",
    "hstu_layer_input",
    "hstu_layer_output",
    "jagged",
    "keyed",
    "l2_normalize",
    "layer",
    "library_path",
    "loss",
    "mips_topk",
    "ops",
    "positional_input_features",
    "quantize",
    "relative_bias",
    "retrieval",
    "sampled_softmax_loss",
    "sparse",
    "use_for_fbgemm",
    "utility",
]
