"""Deployment without Python (docs/deploy.md): a trained recommender exported with torch.export as
one graph from user histories to top-k items, compiled ahead of time with AOTInductor into a
package that a C++ process (examples/cpp_serving) or Python serves; and the cached server's delta
step, exported and packaged with the key / value pages as inputs it writes."""

from recops.export.delta_step import export_delta_step, load_delta_step, package_delta_step
from recops.export.graph import RecommenderGraph
from recops.export.inputs import graph_inputs, read_answers, write_requests
from recops.export.package import (
    PackagedRecommender,
    export_recommender,
    package_metadata,
    package_recommender,
)

__all__ = [
    "PackagedRecommender",
    "RecommenderGraph",
    "export_delta_step",
    "export_recommender",
    "graph_inputs",
    "load_delta_step",
    "package_delta_step",
    "package_metadata",
    "package_recommender",
    "read_answers",
    "write_requests",
]
