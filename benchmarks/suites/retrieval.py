"""The catalogue's top-k (recops.mips_topk) against what the recommenders ran before it.

Without exclusions the reference is generative-recommenders' MIPSBruteForceTopK
(generative_recommenders/indexing/mips_top_k.py) op for op: `torch.mm` of the queries with the
transposed item embeddings (a transposed view, as upstream keeps it), then `torch.topk`; recops
runs the op on the same rows. With 200 seen items a user, the reference is the torch backend's
composition (TorchBackend.top_items: the same `mm`, item 0 and the seen items set to -inf by an
index_put, `topk`), what the recommenders ran before the op and still run on the torch backend;
recops runs the recops backend's top_items (the op over items 1.., the exclusions jagged).
Upstream's forward was read, not imported: the same two ops on the same shapes. The exclusion
writes cost the composition 0-40% over upstream's two ops at these sizes, so the cases without
them give the plain comparison.

Cases: a served request (one user, and a batch of 8, a catalogue of 10,001 items as in
benchmarks/serving.py), an evaluation batch (256 users), and a larger catalogue (200,000 items,
64 users). d = 64, k = 10. GB/s counts the catalogue read once; GFLOP/s the M N d products.
FBGEMM has no such op.
"""

import functools

import torch
from harness import measure_case

import recops
from recops.models.recops_backend import RecopsBackend
from recops.models.torch_backend import TorchBackend

DIM, K, SEEN = 64, 10, 200
# (label, queries, catalogue rows)
CASES = [
    ("request", 1, 10_001),
    ("request batch", 8, 10_001),
    ("evaluation batch", 256, 10_001),
    ("large catalogue", 64, 200_001),
]


def run(limits):
    torch.manual_seed(0)
    torch_backend, recops_backend = TorchBackend(), RecopsBackend()
    rows = []
    for label, queries, items in CASES:
        catalogue = torch.nn.functional.normalize(torch.randn(items, DIM), dim=1)
        states = torch.randn(queries, DIM)
        seen = (
            torch.arange(queries + 1) * SEEN,
            torch.randint(1, items, (queries * SEEN,)),
        )
        plain = {
            "reference": functools.partial(
                lambda q, c: torch.topk(torch.mm(q, c), dim=1, k=K), states, catalogue.T
            ),
            "recops": functools.partial(recops.mips_topk, states, catalogue, K),
        }
        excluding = {
            "reference": functools.partial(torch_backend.top_items, states, catalogue, K, seen),
            "recops": functools.partial(recops_backend.top_items, states, catalogue, K, seen),
        }
        for variant, fns in (("", plain), (f", {SEEN} seen excluded", excluding)):
            with torch.no_grad():
                want, got = fns["reference"](), fns["recops"]()
            case = f"{label} M={queries} N={items} d={DIM} k={K}{variant}"
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=case)  # indices exact
            with torch.no_grad():
                case_rows = measure_case(
                    "retrieval",
                    case,
                    fns,
                    catalogue.numel() * catalogue.element_size(),
                    order=["recops", "reference"],
                )  # fmt: skip
            for r in case_rows:
                r.flops = 2 * queries * items * DIM
            rows += case_rows
    return rows
