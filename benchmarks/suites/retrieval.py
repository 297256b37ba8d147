"""The catalogue's top-k (recops.mips_topk) against the composition the recommenders ran before
it and the torch backend still runs (TorchBackend.top_items): generative-recommenders'
MIPSBruteForceTopK (generative_recommenders/indexing/mips_top_k.py: `torch.mm` of the queries
with the transposed item embeddings, then `torch.topk`) with the [M, N] scores of the seen items
set to -inf by an index_put before the top-k, as the recommenders exclude them. Checked against
upstream's forward by reading it: the same two ops on the same shapes, plus the exclusion.

Cases: a served request (one user, and a batch of 8, a catalogue of 10,001 items as in
benchmarks/serving.py, 200 seen items each), an evaluation batch (256 users), and a larger
catalogue (200,000 items, 64 users). d = 64, k = 10. GB/s counts the catalogue read once; GFLOP/s
the M N d products. FBGEMM has no such op.
"""

import functools

import torch
from harness import measure_case

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
        fns = {
            "reference": functools.partial(torch_backend.top_items, states, catalogue, K, seen),
            "recops": functools.partial(recops_backend.top_items, states, catalogue, K, seen),
        }
        with torch.no_grad():
            want, got = fns["reference"](), fns["recops"]()
        assert torch.equal(want[0], got[0]), label
        torch.testing.assert_close(want[1], got[1], rtol=1e-5, atol=1e-5)
        case = f"{label} M={queries} N={items} d={DIM} k={K}"
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
