"""python -m recops.serve: a recops.train checkpoint served from JSON lines, answers equal to
recops.models.recommend.recommend on the whole history; bad requests answered with an error."""

import dataclasses
import io
import json

import torch

from recops import serve
from recops.models import ModelConfig, SequentialRecommender
from recops.models.recommend import recommend


def test_serves_a_checkpoint_from_json_lines(tmp_path):
    torch.manual_seed(0)
    config = ModelConfig(
        model="fuxi",
        num_items=50,
        max_seq_len=16,
        dim=8,
        num_heads=2,
        attention_dim=4,
        linear_dim=4,
        ffn_hidden_dim=8,
        dropout=0.0,
    )
    model = SequentialRecommender(config).eval()
    path = tmp_path / "run.pt"
    # recops.train's checkpoint layout (train.save_checkpoint).
    run = {"model": dataclasses.asdict(config), "ops": "recops"}
    torch.save({"run": run, "trainer": {"model": model.state_dict()}}, path)

    requests = [
        {"observe": {"users": [1, 2], "events": [[[3, 4], [10, 20]], [[5], [7]]]}},
        {"observe": {"users": [1], "events": [[[6, 7, 8], [30, 40, 50]]]}},
        {"recommend": {"users": [1, 2], "k": 3, "request_times": [60, 9]}},
        {"recommend": {"users": [9]}},
        {"observe": {"users": [2, 1], "events": [[[9], [8]], [[99], [1]]]}},
        {"bogus": {}},
        {"recommend": {"users": [2], "k": 2}},
    ]
    out = io.StringIO()
    served = serve.CachedRecommender(serve.load_model(path), cache_bytes=1 << 20)
    serve.serve(served, [json.dumps(r) for r in requests] + [""], out)
    replies = [json.loads(line) for line in out.getvalue().splitlines()]
    assert len(replies) == len(requests)
    assert replies[0] == {"observed": 2} and replies[1] == {"observed": 1}
    items, scores = recommend(
        model, [([3, 4, 6, 7, 8], [10, 20, 30, 40, 50]), ([5], [7])], 3, request_times=[60, 9]
    )
    assert replies[2]["items"] == items.tolist()
    torch.testing.assert_close(torch.tensor(replies[2]["scores"]), scores)
    assert replies[3] == {"error": "KeyError: 'user 9 has no observed events'"}
    assert "item ids must be in [1, 50]" in replies[4]["error"]
    assert "a request is" in replies[5]["error"]
    # The rejected observe changed nothing: user 2's history is still its one event.
    items, _ = recommend(model, [([5], [7])], 2)
    assert replies[6]["items"] == items.tolist()
