"""The Python side of the embedding ops (csrc/recops/embedding, named by its
``m.set_python_module``): their fake kernels, and the autograd formula of the
``split_embedding_codegen_lookup_<optimizer>_function`` ops, whose backward is the fused
``backward_codegen_<optimizer>_<weighting>_exact`` update."""

import torch
from torch.library import register_autograd

from recops._autograd import input_grads, named_arguments
from recops._fake import register_fake
from recops.embedding.config import PoolingMode
from recops.embedding.optimizers import ALL_ROWS

ops = torch.ops.recops


_OUTPUT_DTYPES = {0: torch.float32, 1: torch.float16, 5: torch.bfloat16}


def index_as(t: torch.Tensor, dtype: torch.dtype, name: str) -> torch.Tensor:
    """Index tensor ``t`` (int32 or int64) in index dtype ``dtype``. Narrowing to int32 is checked
    (a value of 2^32 raises IndexError naming ``name`` instead of becoming 0); tensors of other
    dtypes, or other target dtypes, are returned as they are, for the ops to reject."""
    if t.dtype == torch.int64 and dtype == torch.int32:
        return ops.index_to_int32(t, name)
    if t.dtype == torch.int32 and dtype == torch.int64:
        return t.long()
    return t


# --------------------------------------------------------------------------- fake kernels
def _forward_fake(
    weights,
    D_offsets,
    total_D,
    max_D,
    indices,
    offsets,
    pooling_mode,
    output_dtype,
    batch_size_per_feature_per_rank=None,
    vbe_output_size=-1,
):
    torch._check(output_dtype in _OUTPUT_DTYPES, lambda: "output_dtype must be 0, 1 or 5")
    dtype = _OUTPUT_DTYPES[output_dtype]
    if batch_size_per_feature_per_rank is not None:
        return weights.new_empty((vbe_output_size,), dtype=dtype)
    if pooling_mode == PoolingMode.NONE:
        return weights.new_empty((indices.shape[0], max_D), dtype=dtype)
    num_features = D_offsets.shape[0] - 1
    return weights.new_empty(((offsets.shape[0] - 1) // num_features, total_D), dtype=dtype)


@register_fake("recops::split_embedding_codegen_forward")
def _split_embedding_codegen_forward_fake(
    weights,
    weights_offsets,
    D_offsets,
    total_D,
    max_D,
    rows_per_table,
    indices,
    offsets,
    pooling_mode,
    indice_weights=None,
    output_dtype=0,
    batch_size_per_feature_per_rank=None,
    vbe_output_size=-1,
):
    return _forward_fake(
        weights,
        D_offsets,
        total_D,
        max_D,
        indices,
        offsets,
        pooling_mode,
        output_dtype,
        batch_size_per_feature_per_rank,
        vbe_output_size,
    )


@register_fake("recops::int_nbit_split_embedding_codegen_lookup_function")
def _int_nbit_lookup_fake(
    dev_weights,
    uvm_weights,
    weights_placements,
    weights_offsets,
    weights_tys,
    D_offsets,
    total_D,
    max_int2_D,
    max_int4_D,
    max_int8_D,
    max_float16_D,
    max_float32_D,
    indices,
    offsets,
    pooling_mode,
    indice_weights,
    output_dtype=1,
    lxu_cache_weights=None,
    lxu_cache_locations=None,
    row_alignment=None,
    max_float8_D=0,
    fp8_exponent_bits=-1,
    fp8_exponent_bias=-1,
):
    torch._check(output_dtype in _OUTPUT_DTYPES, lambda: "output_dtype must be 0, 1 or 5")
    dtype = _OUTPUT_DTYPES[output_dtype]
    if pooling_mode == PoolingMode.NONE:
        # Every table is read with the one dim max(max_*_D), as FBGEMM's nobag kernel does.
        dims = (max_int2_D, max_int4_D, max_int8_D, max_float16_D, max_float32_D, max_float8_D or 0)
        return dev_weights.new_empty((indices.shape[0], max(dims)), dtype=dtype)
    num_tables = D_offsets.shape[0] - 1
    return dev_weights.new_empty(((offsets.shape[0] - 1) // num_tables, total_D), dtype=dtype)


@register_fake("recops::split_embedding_codegen_grad_indice_weights")
def _grad_indice_weights_fake(
    grad_output,
    weights,
    weights_offsets,
    D_offsets,
    rows_per_table,
    indices,
    offsets,
    pooling_mode,
    feature_requires_grad=None,
    gradient_clipping=False,
    max_gradient=1.0,
    batch_size_per_feature_per_rank=None,
):
    return grad_output.new_empty((indices.shape[0],), dtype=torch.float32)


@register_fake("recops::embedding_host_zeros")
def _embedding_host_zeros_fake(numel, dtype):
    return torch.empty(numel, dtype=dtype)


@register_fake("recops::index_to_int32")
def _index_to_int32_fake(t, name):
    torch._check(t.dtype == torch.int64, lambda: f"{name} must be int64 to be narrowed to int32")
    return torch.empty_like(t, dtype=torch.int32, memory_format=torch.contiguous_format)


@register_fake("recops::bounds_check_indices")
def _bounds_check_indices_fake(rows_per_table, indices, offsets, bounds_check_mode, warning, *rest):
    return None


def _make_lookup_fake(lookup):
    def fake(*args, **kwargs):
        a = named_arguments(lookup, args, kwargs)
        return _forward_fake(
            a["weights"],
            a["D_offsets"],
            a["total_D"],
            a["max_D"],
            a["indices"],
            a["offsets"],
            a["pooling_mode"],
            a["output_dtype"],
            a["batch_size_per_feature_per_rank"],
            a["vbe_output_size"],
        )

    return fake


def _backward_fake(*args, **kwargs):
    return None


# --------------------------------------------------------------------------- autograd
def _schema_args(op_name):
    return getattr(ops, op_name).default._schema.arguments


_lookup_ops = {
    spec.name: getattr(ops, f"split_embedding_codegen_lookup_{spec.name}_function").default
    for spec in ALL_ROWS
}


def _make_lookup_autograd(suffix):
    lookup = _lookup_ops[suffix]
    names = [a.name for a in lookup._schema.arguments]
    sample_weights_index = names.index("indice_weights")
    updates = {
        weighted: (
            getattr(ops, f"backward_codegen_{suffix}_{weighted}_exact"),
            [a.name for a in _schema_args(f"backward_codegen_{suffix}_{weighted}_exact")][1:],
        )
        for weighted in ("weighted", "unweighted")
    }

    def setup_context(ctx, inputs, output):
        ctx.args = named_arguments(lookup, inputs)

    def backward(ctx, grad_output):
        a = ctx.args
        weighted = a["indice_weights"] is not None
        grad_sample_weights = None
        if weighted and ctx.needs_input_grad[sample_weights_index]:
            # The gradient at the weights of the forward: taken before the update below.
            grad_sample_weights = ops.split_embedding_codegen_grad_indice_weights(
                grad_output,
                a["weights"],
                a["weights_offsets"],
                a["D_offsets"],
                a["rows_per_table"],
                a["indices"],
                a["offsets"],
                a["pooling_mode"],
                a["feature_requires_grad"],
                a["gradient_clipping"],
                a["max_gradient"],
                a["batch_size_per_feature_per_rank"],
            )
        update, update_args = updates["weighted" if weighted else "unweighted"]
        update(grad_output, *(a[name] for name in update_args))
        grads = [None] * len(names)
        grads[sample_weights_index] = grad_sample_weights
        return input_grads(ctx, *grads)

    return setup_context, backward


for _suffix in (spec.name for spec in ALL_ROWS):
    register_fake(f"recops::split_embedding_codegen_lookup_{_suffix}_function")(
        _make_lookup_fake(_lookup_ops[_suffix])
    )
    for _weighted in ("weighted", "unweighted"):
        register_fake(f"recops::backward_codegen_{_suffix}_{_weighted}_exact")(_backward_fake)
    _setup, _backward = _make_lookup_autograd(_suffix)
    register_autograd(
        f"recops::split_embedding_codegen_lookup_{_suffix}_function",
        _backward,
        setup_context=_setup,
    )
