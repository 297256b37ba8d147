"""Keyed-tensor ops (docs/keyed.md): recops vs FBGEMM's CPU kernels vs the PyTorch composition
torchrec runs without them.

The inputs are torchrec's KeyedTensor regroup (KeyedTensor.regroup / regroup_as_dict, as
EmbeddingBagCollection outputs are split between the towers of a model): two keyed tensors, 26
sparse features of width 64 and 8 features of width 128 (fp32), regrouped into three groups, at
B = 512 (in cache) and 4096 (out of cache). The torch column is torchrec's pure-PyTorch path,
``_regroup_keyed_tensors`` (torchrec/sparse/jagged_tensor.py): the values split per key (views),
one torch.cat of the picked keys, split per group (views), so it materialises only the output
like the ops. For the backward (permute_multi_embedding_function with reverse=True, what
FBGEMM's autograd runs) the torch column is what autograd runs for that path: zeros, then each
output gradient slice added into its key's columns. kt_regroup_arguments is timed against a
Python version of torchrec's ``_kt_regroup_arguments``, and merge_pooled_embeddings (FBGEMM's
cat of pooled embeddings, cat_dim=1) against torch.cat.

Every case checks once that all three agree exactly, then times them interleaved.
"""

from dataclasses import dataclass

import torch
from harness import Row, measure_case, print_speedups

SUITE = "keyed"
R = torch.ops.recops
FB = torch.ops.fbgemm
IMPLS = ("recops", "fbgemm", "torch")


@dataclass
class Case:
    name: str
    fns: dict  # impl name -> zero-argument callable running the op once
    bytes_moved: float


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _same(a, b, where):
    if isinstance(a, list | tuple):
        assert isinstance(b, list | tuple) and len(a) == len(b), f"{where}: structure differs"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{where}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, f"{where}: {a.shape} vs {b.shape}"
        assert torch.equal(a, b), f"{where}: values differ"
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def verify(case: Case) -> None:
    """Exact agreement with FBGEMM, once per case: a wrong fast kernel must never be reported."""
    outs = {name: fn() for name, fn in case.fns.items()}
    for name, out in outs.items():
        if name != "fbgemm":
            _same(out, outs["fbgemm"], f"{case.name}: {name} vs fbgemm")


# --------------------------------------------------------------------------- torchrec's inputs
def keyed_tensors(batch, gen, widths=((26, 64), (8, 128))):
    keys, lengths, values = [], [], []
    for t, (features, dim) in enumerate(widths):
        keys.append([f"t{t}_f{f}" for f in range(features)])
        lengths.append([dim] * features)
        values.append(torch.randn(batch, features * dim, generator=gen))
    return keys, lengths, values


def torchrec_groups(keys, gen, repeat=False):
    """Three groups over all keys in a random order; with `repeat`, the first group's keys again
    in a fourth (a feature shared by two towers)."""
    flat = [k for ks in keys for k in ks]
    order = [flat[i] for i in torch.randperm(len(flat), generator=gen).tolist()]
    third = len(order) // 3
    groups = [order[:third], order[third : 2 * third], order[2 * third :]]
    return [*groups, groups[0]] if repeat else groups


def torch_regroup(keys, lengths, values, groups):
    """torchrec's _regroup_keyed_tensors on desugared keyed tensors: per-key views, one cat,
    per-group views."""
    columns = {}
    for tensor_keys, widths, value in zip(keys, lengths, values, strict=True):
        for key, piece in zip(tensor_keys, value.split(widths, dim=1), strict=True):
            columns[key] = piece
    width = {k: c.shape[1] for k, c in columns.items()}
    joined = torch.cat([columns[k] for group in groups for k in group], dim=1)
    return list(joined.split([sum(width[k] for k in group) for group in groups], dim=1))


def torch_regroup_backward(keys, lengths, grads, groups, rows):
    """The gradient autograd forms for torch_regroup: zeros, each group slice added in place."""
    place = {}
    for t, (tensor_keys, widths) in enumerate(zip(keys, lengths, strict=True)):
        offset = 0
        for key, w in zip(tensor_keys, widths, strict=True):
            place[key] = (t, offset, w)
            offset += w
    outs = [grads[0].new_zeros((rows, sum(w))) for w in lengths]
    for grad, group in zip(grads, groups, strict=True):
        offset = 0
        for key in group:
            t, column, w = place[key]
            outs[t][:, column : column + w] += grad[:, offset : offset + w]
            offset += w
    return outs


def torch_kt_regroup_arguments(value, keys, key_lengths, groups):
    """torchrec's _kt_regroup_arguments (the Python fallback of kt_regroup_arguments)."""
    key_map = {key: (t, k) for t, tensor in enumerate(keys) for k, key in enumerate(tensor)}
    in_offsets = []
    for tensor in key_lengths:
        offsets = [0]
        for w in tensor:
            offsets.append(offsets[-1] + w)
        in_offsets.append(offsets)
    in_lengths = [sum(tensor) for tensor in key_lengths]
    total = sum(len(g) for g in groups)
    out_lengths = [0] * len(groups)
    permutes = [[0] * 6 for _ in range(total)]
    last_seen, index = {}, 0
    for out_t, group in enumerate(groups):
        start = 0
        for key in group:
            in_t, in_k = key_map[key]
            length = key_lengths[in_t][in_k]
            if key not in last_seen:
                jump = 0
                last_seen[key] = index
            else:
                prev = last_seen[key]
                if prev >= 0:
                    permutes[prev][5] = index
                else:
                    permutes[-prev][5] = -index
                last_seen[key] = -index
                jump = -total
            permutes[index][:] = [in_t, out_t, in_offsets[in_t][in_k], start, length, jump]
            index += 1
            start += length
        out_lengths[out_t] = start
    return (
        torch.tensor(permutes, dtype=torch.int32),
        torch.tensor(in_lengths, dtype=torch.int32),
        torch.tensor(out_lengths, dtype=torch.int32),
        out_lengths,
    )


# --------------------------------------------------------------------------- cases
def regroup_cases(batch, gen) -> list[Case]:
    keys, lengths, values = keyed_tensors(batch, gen)
    cases = []
    for repeat in (False, True):
        groups = torchrec_groups(keys, gen, repeat)
        args = R.kt_regroup_arguments(values[0], keys, lengths, groups)
        out_bytes = _nbytes(R.permute_multi_embedding(values, *args))
        tag = f"B={batch} 26x64+8x128 fp32{' repeated keys' if repeat else ''}"
        cases.append(
            Case(
                f"permute_multi_embedding {tag}",
                {
                    "recops": lambda v=values, a=args: R.permute_multi_embedding(v, *a),
                    "fbgemm": lambda v=values, a=args: FB.permute_multi_embedding(v, *a),
                    "torch": lambda v=values, g=groups: torch_regroup(keys, lengths, v, g),
                },
                2 * out_bytes,
            )
        )
        cases.append(
            Case(
                f"regroup_keyed_tensor {tag}",
                {
                    "recops": lambda v=values, g=groups: R.regroup_keyed_tensor(
                        v, keys, lengths, g
                    ),
                    "fbgemm": lambda v=values, g=groups: FB.regroup_keyed_tensor(
                        v, keys, lengths, g
                    ),
                    "torch": lambda v=values, g=groups: torch_regroup(keys, lengths, v, g),
                },
                2 * out_bytes,
            )
        )
        if repeat:
            permutes, in_shapes, out_shapes, out_lengths = args
            grads = [torch.randn(batch, w, generator=gen) for w in out_lengths]
            in_lengths = [v.shape[1] for v in values]
            back = (grads, permutes, out_shapes, in_shapes, in_lengths, True)
            cases.append(
                Case(
                    f"permute_multi_embedding_function reverse {tag}",
                    {
                        "recops": lambda b=back: R.permute_multi_embedding_function(*b),
                        "fbgemm": lambda b=back: FB.permute_multi_embedding_function(*b),
                        "torch": lambda g=grads, gr=groups: torch_regroup_backward(
                            keys, lengths, g, gr, batch
                        ),
                    },
                    2 * _nbytes(grads) + _nbytes(values),
                )
            )
    return cases


def kt_regroup_arguments_case(gen) -> Case:
    keys, lengths, values = keyed_tensors(2, gen)
    groups = torchrec_groups(keys, gen, repeat=True)
    return Case(
        "kt_regroup_arguments 34 keys, 4 groups",
        {
            "recops": lambda: R.kt_regroup_arguments(values[0], keys, lengths, groups),
            "fbgemm": lambda: FB.kt_regroup_arguments(values[0], keys, lengths, groups),
            "torch": lambda: torch_kt_regroup_arguments(values[0], keys, lengths, groups),
        },
        0.0,
    )


def merge_case(batch, gen) -> Case:
    tensors = [torch.randn(batch, width, generator=gen) for width in (832, 832, 512, 512)]
    cpu = torch.device("cpu")
    return Case(
        f"merge_pooled_embeddings B={batch} 4 tensors cat_dim=1 fp32",
        {
            "recops": lambda: R.merge_pooled_embeddings(tensors, batch, cpu, 1),
            "fbgemm": lambda: FB.merge_pooled_embeddings(tensors, batch, cpu, 1),
            "torch": lambda: torch.cat(tensors, dim=1),
        },
        2 * _nbytes(tensors),
    )


def cases(batches=(512, 4096), seed=0):
    """Every case, built lazily one batch at a time (one group's inputs live at a time)."""
    gen = torch.Generator().manual_seed(seed)
    yield kt_regroup_arguments_case(gen)
    for batch in batches:
        yield from regroup_cases(batch, gen)
        yield merge_case(batch, gen)


def run(limits) -> list[Row]:
    rows = []
    for case in cases():
        verify(case)
        rows += measure_case(SUITE, case.name, case.fns, case.bytes_moved, IMPLS)
    print_speedups(SUITE, rows)
    return rows
