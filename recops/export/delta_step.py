"""The cached recommender's delta step (recops.serving.DeltaStep) exported and packaged: the pages
of the key / value cache (one pool per layer) are inputs that the graph writes in place, the new
rows' states its output; the cache's bookkeeping (which pages a user holds, eviction) stays in the
server."""

from __future__ import annotations

import os

import torch
from torch.export import Dim
from torch.export.pt2_archive._package import load_pt2
from torch.utils import _pytree as pytree

from recops.serving.delta_attention import delta_attention
from recops.serving.paged_cache import PageTables


def example_step_inputs(served) -> tuple[torch.Tensor, ...]:
    """A step of three users (0, page_rows + 1 and 5 cached rows; 2, 3 and 2 new ones) over a
    scratch pool of six pages of the server's layout: every size differs from every other."""
    layout = served.cache.layout
    page_rows, pool_pages = layout.page_rows, 6
    lengths = torch.tensor([0, page_rows + 1, min(5, page_rows - 2)])
    new_rows = torch.tensor([2, 3, 2])
    pages = torch.tensor([[0, -1], [1, 2], [3, -1]], dtype=torch.int32)
    rows = int(new_rows.sum())
    slots = served.cache.slots(PageTables(pages, lengths, new_rows))  # reads page_rows only
    pool = (pool_pages, page_rows, layout.num_heads)
    layers = range(layout.num_layers)
    return (
        torch.randint(1, served.config.num_items + 1, (rows,)),
        torch.arange(rows) * 100,
        torch.cat([n + torch.arange(c) for n, c in zip(lengths, new_rows, strict=True)]),
        slots,
        pages,
        lengths,
        new_rows,
        [torch.randn(*pool, layout.key_dim).to(layout.dtype) for _ in layers],
        [torch.randn(*pool, layout.value_dim).to(layout.dtype) for _ in layers],
        torch.randn(pool_pages, page_rows, dtype=torch.float64),
    )


def _dynamic_shapes(num_layers: int) -> tuple:
    rows, users = Dim("new_rows", min=1), Dim("users", min=1)
    width, pool_pages = Dim("max_pages", min=1), Dim("pool_pages", min=1)
    per_layer = [{0: pool_pages}] * num_layers
    return (
        {0: rows}, {0: rows}, {0: rows}, {0: rows},
        {0: users, 1: width}, {0: users}, {0: users},
        per_layer, per_layer, {0: pool_pages},
    )  # fmt: skip


def export_delta_step(served) -> torch.export.ExportedProgram:
    """``served`` (a CachedRecommender)'s DeltaStep as an ExportedProgram: dynamic rows, users,
    page-table width and pool size; the pages written in place."""
    if served.step.attention is not delta_attention:
        raise ValueError("only a server on recops' delta op (attention='recops') exports its step")
    with torch.no_grad():
        return torch.export.export(
            served.step,
            example_step_inputs(served),
            dynamic_shapes=_dynamic_shapes(served.cache.layout.num_layers),
            strict=False,
        )


def package_delta_step(served, path) -> str:
    """export_delta_step compiled with AOTInductor into the package ``path`` (``.pt2``)."""
    return torch._inductor.aoti_compile_and_package(
        export_delta_step(served), package_path=os.fspath(path)
    )


class PackagedStep:
    """A packaged delta step called as DeltaStep.forward is, its runner given the tensors as one
    flat list. The package's own callable parses its input and output tree specs from JSON and
    flattens the arguments through pytree on every call: at a short request's size (ML-100K's
    lengths) that cost a third as much as the step."""

    def __init__(self, compiled, num_layers: int):
        specs = compiled.loader.get_call_spec()
        in_spec, out_spec = (pytree.treespec_loads(spec) for spec in specs)
        expected = 8 + 2 * num_layers  # seven tensors, keys and values per layer, timestamps
        if in_spec.num_leaves != expected or out_spec.num_leaves != 1:
            raise ValueError(
                f"the package's step takes {in_spec.num_leaves} tensors and returns "
                f"{out_spec.num_leaves}; a delta step of {num_layers} layers takes {expected} "
                "and returns 1 (was it packaged from a server of this model?)"
            )
        self._run = compiled.loader.boxed_run

    def __call__(
        self, items, times, positions, slots, pages, lengths, new_rows, keys, values, timestamps
    ) -> torch.Tensor:
        step_inputs = [items, times, positions, slots, pages, lengths, new_rows]
        return self._run([*step_inputs, *keys, *values, timestamps])[0]


def load_delta_step(served, path, runners: int = 1) -> None:
    """Makes ``served`` run its delta step from the package ``path`` (package_delta_step of a
    server of the same model and cache layout)."""
    compiled = load_pt2(os.fspath(path), num_runners=runners).aoti_runners["model"]
    served.set_step(PackagedStep(compiled, served.config.num_layers))
