"""torchrec's variable-batch path (VBE KeyedJaggedTensors through a sharded
EmbeddingBagCollection with a fused optimizer, tests/torchrec_vbe.py) on 1 and 2 local gloo
processes: recops' TBE receives torchrec's batch_size_per_feature_per_rank and trains exactly as
FBGEMM's does (outputs and table shards every step). Skipped where torchrec is not installed
(`make setup-torchrec`)."""

import pytest
import torch

pytest.importorskip("torchrec")

import torchrec_vbe as vbe  # noqa: E402  (tests/ is on sys.path, and so on the workers')
from test_torchrec_sharded import _launch  # noqa: E402


def _run(world, kernels, out_dir):
    _launch(world, kernels, out_dir, worker=vbe.worker)
    return [torch.load(out_dir / f"{kernels}-w{world}-rank{r}.pt") for r in range(world)]


@pytest.mark.parametrize("world", (1, 2))
def test_variable_batch_kjt_trains_as_on_fbgemm(tmp_path, world):
    ours = _run(world, "recops", tmp_path)
    theirs = _run(world, "fbgemm", tmp_path)
    assert any(rank["tbe_classes"] for rank in ours)
    for rank_ours, rank_theirs in zip(ours, theirs, strict=True):
        assert all(c.startswith("recops.embedding") for c in rank_ours["tbe_classes"])
        for a, b in zip(rank_ours["outputs"], rank_theirs["outputs"], strict=True):
            assert a.shape == (vbe.FINAL_BATCH, 3 * 8)  # expanded by the inverse indices
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        assert rank_ours["shards"].keys() == rank_theirs["shards"].keys()
        for key, shards in rank_ours["shards"].items():
            for a, b in zip(shards, rank_theirs["shards"][key], strict=True):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
