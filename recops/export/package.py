"""torch.export of a trained recommender (RecommenderGraph) and its AOTInductor package."""

from __future__ import annotations

import os

import torch
from torch.export import Dim
from torch.export.pt2_archive._package import load_pt2

import recops
from recops.export.graph import RecommenderGraph
from recops.export.inputs import graph_inputs


def _example_inputs(max_seq_len: int, num_items: int) -> tuple[torch.Tensor, ...]:
    """Inputs whose sizes are all different and above 1, each its own tensor: export would tie
    equal sizes, take 0 / 1 for constants, and fold inputs passed twice into one."""
    lengths = [2, 3, min(5, max_seq_len - 1)]
    histories = []
    for user, length in enumerate(lengths):
        items = [(user * 7 + j) % num_items + 1 for j in range(length)]
        histories.append((items, [100 * j for j in range(length)]))
    history = graph_inputs(histories, max_seq_len)
    seen = torch.arange(1, 12, dtype=torch.int64).remainder(num_items) + 1  # 11 rows
    return (*(t.clone() for t in history[:4]), seen, torch.tensor([0, 4, 4, 11]))


def _dynamic_shapes() -> tuple[dict, ...]:
    batch = Dim("batch", min=1)
    rows, seen = Dim("history_rows", min=1), Dim("seen_rows", min=0)
    return ({0: rows}, {0: rows}, {0: batch + 1}, {0: batch}, {0: seen}, {0: batch + 1})


def export_recommender(
    model, k: int = 10, item_table: str = "fp32"
) -> torch.export.ExportedProgram:
    """``model`` (a trained SequentialRecommender) as an ExportedProgram of RecommenderGraph:
    dynamic batch size, history lengths and seen items; recops' and FBGEMM's ops one node
    each."""
    graph = RecommenderGraph(model, k, item_table)
    config = model.config
    with torch.no_grad():
        return torch.export.export(
            graph,
            _example_inputs(config.max_seq_len, config.num_items),
            dynamic_shapes=_dynamic_shapes(),
            strict=False,
        )


def package_metadata(model, k: int, item_table: str) -> dict[str, str]:
    """What a program serving the package needs to know (AOTIModelPackageLoader::get_metadata)."""
    config = model.config
    return {
        "recops.model": config.model,
        "recops.max_seq_len": str(config.max_seq_len),
        "recops.num_items": str(config.num_items),
        "recops.k": str(k),
        "recops.item_table": item_table,
        "recops.version": recops.__version__,
        "recops.torch_version": torch.__version__,
    }


def package_recommender(model, path, k: int = 10, item_table: str = "fp32") -> str:
    """Exports ``model`` and compiles it ahead of time into the AOTInductor package ``path``
    (``.pt2``), with package_metadata. Returns the path. The package is bound to the torch it
    was built with and calls recops' library, which the process serving it loads."""
    program = export_recommender(model, k, item_table)
    return torch._inductor.aoti_compile_and_package(
        program,
        package_path=os.fspath(path),
        inductor_configs={"aot_inductor.metadata": package_metadata(model, k, item_table)},
    )


class PackagedRecommender:
    """A package from package_recommender, loaded in this process (``recommend`` as the eager
    ``recops.recommend`` takes its arguments, at the package's k); ``runners`` threads may call
    it at once."""

    def __init__(self, path, runners: int = 1):
        archive = load_pt2(os.fspath(path), num_runners=runners)
        self.runner = archive.aoti_runners["model"]
        metadata = self.runner.get_metadata()
        self.max_seq_len = int(metadata["recops.max_seq_len"])
        self.num_items = int(metadata["recops.num_items"])
        self.k = int(metadata["recops.k"])

    def recommend(self, user_histories, *, request_times=None, exclude_seen_items=True):
        """``(items [U, k], scores [U, k])``, best first."""
        inputs = graph_inputs(user_histories, self.max_seq_len, request_times, exclude_seen_items)
        for name, ids in (("history items", inputs[0]), ("seen items", inputs[4])):
            if ids.numel() and not (1 <= int(ids.min()) and int(ids.max()) <= self.num_items):
                raise ValueError(f"{name} must be item ids in [1, {self.num_items}]")
        return tuple(self.runner(*inputs))
