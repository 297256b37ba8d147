"""block_bucketize_sparse_features (docs/ops.md section 1): torchrec's row-wise input
distribution, against the contract's reference (op_cases.ref_block_bucketize, written from the
rules, with Python integers) and against fbgemm-gpu-cpu where it is installed."""

import pytest
import torch
from op_cases import (
    Invalid,
    make_block_bucketize,
    make_block_bucketize_inference,
    ref_block_bucketize,
    ref_block_bucketize_inference,
    seeded_draw,
)
from threads import num_threads

import recops
from recops import _fbgemm

ops = torch.ops.recops
OUTPUTS = ("new_lengths", "new_indices", "new_weights", "new_pos", "unbucketize_permute")


def assert_same(got, want):
    for name, g, w in zip(OUTPUTS, got, want, strict=True):
        if w is None:
            assert g is None, name
        else:
            assert g.dtype == w.dtype, name
            torch.testing.assert_close(g, w, rtol=0, atol=0, msg=name)


def call(op, a):
    return op(**a)


@pytest.mark.parametrize("seed", range(60))
def test_matches_reference(seed):
    a = make_block_bucketize(seeded_draw(seed))
    assert_same(call(ops.block_bucketize_sparse_features, a), ref_block_bucketize(a))


@pytest.mark.parametrize("threads", [1, 2])
def test_large_batch_on_threads_matches_reference(threads):
    """Many bags, so that both passes split the bags over threads."""
    torch.manual_seed(0)
    T, B, my_size = 3, 700, 4
    lengths = torch.randint(0, 5, (T * B,))
    ids = torch.randint(-2, 40, (int(lengths.sum()),))
    a = dict(
        lengths=lengths,
        indices=ids,
        bucketize_pos=True,
        sequence=True,
        block_sizes=torch.tensor([5, 8, 0]),
        my_size=my_size,
        weights=torch.rand(ids.numel()),
    )
    with num_threads(threads):
        got = call(ops.block_bucketize_sparse_features, a)
    assert_same(got, ref_block_bucketize(a))


def test_empty_batch_and_zero_length_bags():
    for lengths in (torch.zeros(0, dtype=torch.long), torch.zeros(4, dtype=torch.long)):
        a = dict(
            lengths=lengths,
            indices=torch.zeros(0, dtype=torch.long),
            bucketize_pos=True,
            sequence=True,
            block_sizes=torch.tensor([3, 3]),
            my_size=3,
        )
        got = call(ops.block_bucketize_sparse_features, a)
        assert got[0].tolist() == [0] * (3 * lengths.numel())
        assert_same(got, ref_block_bucketize(a))


@pytest.mark.skipif(not recops.fbgemm_loaded, reason="fbgemm-gpu-cpu is not installed")
@pytest.mark.parametrize("seed", range(60))
def test_matches_fbgemm(seed):
    a = make_block_bucketize(seeded_draw(seed))
    want = call(torch.ops.fbgemm.block_bucketize_sparse_features, a)
    assert_same(call(ops.block_bucketize_sparse_features, a), want)


def test_fbgemm_schema_is_the_twins():
    assert "block_bucketize_sparse_features" in _fbgemm.FBGEMM_OPS
    if recops.fbgemm_loaded:
        fbgemm = torch.ops.fbgemm.block_bucketize_sparse_features.default._schema
        assert str(fbgemm).split("::", 1)[1] == _fbgemm.recops_schema(
            "block_bucketize_sparse_features"
        )


def base_call():
    return dict(
        lengths=torch.tensor([2, 1, 0, 3]),
        indices=torch.tensor([1, 7, 3, 0, 9, 5]),
        bucketize_pos=False,
        sequence=True,
        block_sizes=torch.tensor([4, 4]),
        my_size=2,
    )


BAD = [
    ("my_size", dict(my_size=0), "my_size must be >= 1"),
    ("no features", dict(block_sizes=torch.tensor([], dtype=torch.long)), "block_sizes"),
    ("lengths sum", dict(indices=torch.tensor([1, 2])), "lengths must sum"),
    ("negative length", dict(lengths=torch.tensor([2, -1, 2, 3])), "lengths must be >= 0"),
    ("lengths not T * B", dict(lengths=torch.tensor([2, 1, 3])), "multiple of the number"),
    ("negative block", dict(block_sizes=torch.tensor([4, -1])), "block_sizes must be >= 0"),
    ("block dtype", dict(block_sizes=torch.tensor([4, 4], dtype=torch.int32)), "share one dtype"),
    (
        "total not a multiple",
        dict(total_num_blocks=torch.tensor([3, 4])),
        "multiples of my_size",
    ),
    ("total zero", dict(total_num_blocks=torch.tensor([0, 4])), "multiples of my_size"),
    (
        "total zero spreading bounds",
        dict(
            block_sizes=torch.tensor([0, 4]),
            block_bucketize_pos=[torch.tensor([0, 4, 8]), torch.tensor([0, 4, 8])],
            total_num_blocks=torch.tensor([0, 3]),
        ),
        r"total_num_blocks must be > 0 where block_bucketize_pos\[0\] spreads",
    ),
    (
        "bounds from 1",
        dict(block_bucketize_pos=[torch.tensor([1, 4, 8]), torch.tensor([0, 4, 8])]),
        "must start at 0",
    ),
    (
        "bounds decrease",
        dict(block_bucketize_pos=[torch.tensor([0, 5, 4]), torch.tensor([0, 4, 8])]),
        "non-decreasing",
    ),
    ("bounds count", dict(block_bucketize_pos=[torch.tensor([0, 4, 8])]), "one tensor per"),
    (
        "batch sizes sum",
        dict(batch_size_per_feature=torch.tensor([1, 2])),
        "batch_size_per_feature must sum",
    ),
    ("weights count", dict(weights=torch.ones(5)), "one entry per index"),
    ("weights dtype", dict(weights=torch.ones(6, dtype=torch.float16)), "float32 or float64"),
    (
        "keep flags",
        dict(keep_orig_idx_per_feature=torch.tensor([1, 0])),
        "keep_orig_idx_per_feature",
    ),
    (
        "overflow",
        dict(
            indices=torch.tensor([1, 7, 3, 0, 9, 5], dtype=torch.int32),
            block_sizes=torch.tensor([2**30, 4], dtype=torch.int32),
            my_size=4,
        ),
        "overflows",
    ),
]


@pytest.mark.parametrize("label,change,match", BAD, ids=[b[0] for b in BAD])
def test_bad_input_raises_before_any_work(label, change, match):
    a = {**base_call(), **change}
    with pytest.raises(Invalid):
        ref_block_bucketize(a)
    with pytest.raises((ValueError, RuntimeError), match=match):
        call(ops.block_bucketize_sparse_features, a)


# --------------------------------------------------------------------------- total_num_blocks
def uneven_call(block_sizes, total):
    """FBGEMM's own example of block counts that are no multiple of my_size, with bounds."""
    return dict(
        lengths=torch.tensor([0, 3, 2, 0, 1, 5], dtype=torch.int32),
        indices=torch.tensor([1, 2, 10, 4, 16, 6, 7, 18, 19, 10, 0], dtype=torch.int32),
        bucketize_pos=True,
        sequence=True,
        block_sizes=torch.tensor(block_sizes, dtype=torch.int32),
        my_size=3,
        block_bucketize_pos=[
            torch.tensor(b, dtype=torch.int32) for b in ([0, 2, 5, 9], [0, 3, 6, 20], [0, 1, 4, 8])
        ],
        total_num_blocks=torch.tensor(total, dtype=torch.int32),
    )


UNEVEN = [
    ([2, 3, 4], [7, 6, 6]),  # total_num_blocks unused: bounds with block sizes
    ([2, 3, 4], [-1, 0, 5]),
    ([0, 0, 0], [7, 6, 6]),  # ids spread over the bounds in 7 steps
    ([0, 0, 0], [5, 6, 6]),
    ([0, 0, 0], [2, 6, 5]),
    ([0, 0, 0], [1, 1, 1]),
    ([0, 3, 0], [4, -2, 4]),
]


@pytest.mark.parametrize("block_sizes, total", UNEVEN, ids=str)
def test_total_num_blocks_with_bounds_need_not_be_multiples(block_sizes, total):
    a = uneven_call(block_sizes, total)
    assert_same(call(ops.block_bucketize_sparse_features, a), ref_block_bucketize(a))


@pytest.mark.skipif(not recops.fbgemm_loaded, reason="fbgemm-gpu-cpu is not installed")
@pytest.mark.parametrize("block_sizes, total", UNEVEN, ids=str)
def test_total_num_blocks_with_bounds_matches_fbgemm(block_sizes, total):
    a = uneven_call(block_sizes, total)
    want = call(torch.ops.fbgemm.block_bucketize_sparse_features, a)
    assert_same(call(ops.block_bucketize_sparse_features, a), want)


def test_total_num_blocks_without_bounds_must_be_multiples():
    """As FBGEMM 1.9 checks: without bounds, each bucket owns total_num_blocks / my_size blocks."""
    a = uneven_call([2, 3, 4], [7, 6, 6])
    del a["block_bucketize_pos"]
    with pytest.raises(ValueError, match=r"multiples of my_size = 3 .* total_num_blocks\[0\] = 7"):
        call(ops.block_bucketize_sparse_features, a)


# --------------------------------------------------------------------------- inference
INFERENCE_OUTPUTS = (*OUTPUTS, "bucket_mapping")


def assert_same_inference(got, want):
    assert len(got) == len(want) == 6
    assert_same(got[:5], want[:5])
    if want[5] is None:
        assert got[5] is None
    else:
        torch.testing.assert_close(got[5], want[5], rtol=0, atol=0, msg="bucket_mapping")


@pytest.mark.parametrize("seed", range(60))
def test_inference_matches_reference(seed):
    a = make_block_bucketize_inference(seeded_draw(seed))
    got = call(ops.block_bucketize_sparse_features_inference, a)
    assert_same_inference(got, ref_block_bucketize_inference(a))


@pytest.mark.parametrize("seed", range(20))
def test_inference_is_block_bucketize_plus_the_mapping(seed):
    a = make_block_bucketize_inference(seeded_draw(seed))
    got = call(ops.block_bucketize_sparse_features_inference, a)
    plain = {k: v for k, v in a.items() if k != "return_bucket_mapping"}
    assert_same(got[:5], call(ops.block_bucketize_sparse_features, plain))


def test_bucket_mapping_is_each_ids_bucket():
    a = uneven_call([0, 0, 0], [7, 6, 6])
    a["return_bucket_mapping"] = True
    new_lengths, *_, unbucketize, mapping = call(ops.block_bucketize_sparse_features_inference, a)
    # Output position unbucketize[i] lies in the block of bucket mapping[i].
    bucket_ends = new_lengths.view(3, -1).sum(1).cumsum(0)
    assert torch.equal(torch.bucketize(unbucketize, bucket_ends, right=True), mapping.long())
    # Without `sequence` the mapping is still every id's bucket (FBGEMM leaves it unwritten).
    a["sequence"] = False
    assert torch.equal(call(ops.block_bucketize_sparse_features_inference, a)[5], mapping)


@pytest.mark.skipif(not recops.fbgemm_loaded, reason="fbgemm-gpu-cpu is not installed")
@pytest.mark.parametrize("seed", range(60))
def test_inference_matches_fbgemm(seed):
    a = make_block_bucketize_inference(seeded_draw(seed))
    if not a["sequence"]:  # FBGEMM's CPU kernel writes bucket_mapping only for sequences
        a["return_bucket_mapping"] = False
    want = call(torch.ops.fbgemm.block_bucketize_sparse_features_inference, a)
    assert_same_inference(call(ops.block_bucketize_sparse_features_inference, a), want)


@pytest.mark.parametrize("label,change,match", BAD[:6], ids=[b[0] for b in BAD[:6]])
def test_inference_bad_input(label, change, match):
    a = {**base_call(), **change, "return_bucket_mapping": True}
    with pytest.raises((ValueError, RuntimeError), match=match):
        call(ops.block_bucketize_sparse_features_inference, a)


def test_inference_schema_is_fbgemms():
    assert "block_bucketize_sparse_features_inference" in _fbgemm.FBGEMM_OPS
    if recops.fbgemm_loaded:
        fbgemm = torch.ops.fbgemm.block_bucketize_sparse_features_inference.default._schema
        assert str(fbgemm).split("::", 1)[1] == _fbgemm.recops_schema(
            "block_bucketize_sparse_features_inference"
        )
