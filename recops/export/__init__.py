"""Deployment without Python (docs/deploy.md): a trained recommender exported with torch.export as
one graph from user histories to top-k items, compiled ahead of time with AOTInductor into a
package that a C++ process (examples/cpp_serving) or Python serves."""

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
    "export_recommender",
    "graph_inputs",
    "package_metadata",
    "package_recommender",
    "read_answers",
    "write_requests",
]
