"""The hashing family and the torchrec utility ops: FBGEMM's zero-collision hashing
(create_zch_buffer, zero_collision_hash, read-only as FBGEMM's CPU kernel computes it),
check_feature_gate_key and is_uvm_tensor; against FBGEMM's CPU kernels and the plain-PyTorch
reference in op_cases (ref_zero_collision_hash, murmur_hash3_2x64)."""

import pytest
import torch
from op_cases import (
    make_zero_collision_hash,
    murmur_hash3_2x64,
    ref_create_zch_buffer,
    ref_zero_collision_hash,
    seeded_draw,
)

import recops  # noqa: F401

ops = torch.ops.recops


def _hash(ids, identities, **kwargs):
    kwargs.setdefault("circular_probe", True)
    kwargs.setdefault("readonly", True)
    return ops.zero_collision_hash(ids, identities, kwargs.pop("max_probe", 8), **kwargs)


@pytest.mark.parametrize("seed", range(40))
def test_zero_collision_hash_matches_reference_and_fbgemm(seed, fbgemm_ops):
    args = make_zero_collision_hash(seeded_draw(seed))
    slots, evicted = ops.zero_collision_hash(**args)
    expected, _ = ref_zero_collision_hash(dict(args))
    torch.testing.assert_close(slots, expected)
    assert evicted is None
    fbgemm_slots, fbgemm_evicted = fbgemm_ops.zero_collision_hash(**args)
    torch.testing.assert_close(slots, fbgemm_slots)
    assert fbgemm_evicted is None


def _trained_table(ids, rows, max_probe, dtype=torch.int64):
    """The identity table a training pass would leave: each id at the first free slot from its
    home slot (at most max_probe probes); 64-bit ids in 32-bit identities as id % INT32_MAX."""
    identities = torch.full((rows, 1), -1, dtype=dtype)
    for item in ids.tolist():
        slot = murmur_hash3_2x64(item) % rows
        identity = item % (2**31 - 1) if dtype == torch.int32 else item
        for _ in range(max_probe):
            if identities[slot, 0] in (-1, identity):
                identities[slot, 0] = identity
                break
            slot = (slot + 1) % rows
    return identities


def test_inserted_ids_are_found_where_training_put_them():
    ids = torch.arange(100, 140)
    identities = _trained_table(ids, 64, 8)
    slots, _ = _hash(ids, identities, max_probe=8, disable_fallback=True)
    found = slots >= 0
    assert found.sum() >= 38  # a few may not fit within 8 probes
    assert torch.equal(identities[slots[found], 0], ids[found])
    # 64-bit ids in 32-bit identities: stored as id % INT32_MAX.
    big = ids + (2**31 - 1) * 3
    identities32 = _trained_table(big, 64, 8, torch.int32)
    slots32, _ = _hash(big, identities32, max_probe=8, disable_fallback=True)
    found32 = slots32 >= 0
    assert found32.sum() >= 38
    assert torch.equal(identities32[slots32[found32], 0].long(), ids[found32])


def test_empty_noncontiguous_and_large(fbgemm_ops):
    identities = torch.full((10, 1), -1, dtype=torch.int64)
    slots, evicted = _hash(torch.empty(0, dtype=torch.int64), identities)
    assert slots.shape == (0,) and slots.dtype == torch.int64 and evicted is None
    ids = torch.randint(0, 1000, (64,))[::2]
    torch.testing.assert_close(_hash(ids, identities)[0], _hash(ids.contiguous(), identities)[0])
    wide = torch.full((10, 3), 7, dtype=torch.int64)
    wide[:, 0] = -1  # only column 0 holds identities
    torch.testing.assert_close(_hash(ids, wide)[0], _hash(ids, identities)[0])
    many = torch.randint(-(2**40), 2**40, (50_000,))
    table = torch.randint(0, 50, (4096, 1))
    kwargs = dict(circular_probe=True, readonly=True)
    torch.testing.assert_close(
        ops.zero_collision_hash(many, table, 16, **kwargs)[0],
        fbgemm_ops.zero_collision_hash(many, table, 16, **kwargs)[0],
    )


def test_huge_max_probe_terminates():
    identities = torch.full((8, 1), -1, dtype=torch.int64)
    slots, _ = _hash(torch.tensor([3, 5]), identities, max_probe=2**62, disable_fallback=True)
    assert slots.tolist() == [-1, -1]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(readonly=False), "readonly must be True on CPU"),
        (dict(circular_probe=False), "circular_probe must be True"),
        (dict(exp_hours=3), "exp_hours must be -1"),
        (dict(eviction_threshold=5), "eviction_threshold must be -1"),
        (dict(opt_in_prob=50), "num_reserved_slots must be > 0"),
        (dict(num_reserved_slots=2), "num_reserved_slots must be -1 unless opt_in_prob"),
        (dict(opt_in_prob=101, num_reserved_slots=2), r"opt_in_prob must be -1 or in \[1, 100\]"),
        (dict(local_sizes=torch.tensor([4, 4])), "offsets must be given with local_sizes"),
        (
            dict(local_sizes=torch.tensor([4, 4]), offsets=torch.tensor([0, 7])),
            r"offsets\[1\] = 7 with local_sizes\[1\] = 4 addresses rows outside identities",
        ),
        (dict(local_sizes=torch.tensor([0, 4]), offsets=torch.tensor([0, 0])), "local_sizes must"),
        (dict(local_sizes=torch.tensor([4]), offsets=torch.tensor([0])), "one entry per input id"),
    ],
)
def test_zero_collision_hash_bad_input(kwargs, match):
    identities = torch.full((8, 1), -1, dtype=torch.int64)
    with pytest.raises((RuntimeError, ValueError), match=match):
        _hash(torch.tensor([3, 5]), identities, **kwargs)


def test_zero_collision_hash_bad_tables():
    with pytest.raises(RuntimeError, match="identities must be int32 when input is int32"):
        _hash(torch.tensor([1], dtype=torch.int32), torch.full((4, 1), -1))
    with pytest.raises(RuntimeError, match="identities must be 2-D"):
        _hash(torch.tensor([1]), torch.full((4,), -1))
    with pytest.raises(RuntimeError, match="identities must have at least one column"):
        _hash(torch.tensor([1]), torch.empty(4, 0, dtype=torch.int64))
    with pytest.raises(ValueError, match="identities must have more than 0 rows"):
        _hash(torch.tensor([1]), torch.empty(0, 1, dtype=torch.int64))
    with pytest.raises(RuntimeError, match="input must be int32 or int64"):
        _hash(torch.tensor([1.0]), torch.full((4, 1), -1))


@pytest.mark.parametrize("support_evict", [False, True])
@pytest.mark.parametrize("long_type", [False, True])
def test_create_zch_buffer(support_evict, long_type, fbgemm_ops):
    args = dict(size=5, support_evict=support_evict, device=None, long_type=long_type)
    ours = ops.create_zch_buffer(**args)
    expected = ref_create_zch_buffer(args)
    theirs = fbgemm_ops.create_zch_buffer(**args)
    for got in (ours, theirs):
        torch.testing.assert_close(got[0], expected[0])
        if support_evict:
            torch.testing.assert_close(got[1], expected[1])
        else:
            assert got[1] is None
    with pytest.raises(ValueError, match="size must be >= 0"):
        ops.create_zch_buffer(-1)
    assert ops.create_zch_buffer(3, device=torch.device("meta"))[0].device.type == "meta"


def test_is_uvm_tensor_opcheck():
    # zero_collision_hash's opcheck runs on op_cases' calls (test_opcheck.py).
    identities = torch.full((16, 1), -1, dtype=torch.int64)
    torch.library.opcheck(ops.is_uvm_tensor.default, (identities,))


def test_utility_ops(monkeypatch, fbgemm_ops):
    t = torch.ones(3)
    assert ops.is_uvm_tensor(t) is False
    assert fbgemm_ops.is_uvm_tensor(t) is False
    monkeypatch.setenv("FBGEMM_RECOPS_TEST_GATE_ON", "1")
    monkeypatch.setenv("FBGEMM_RECOPS_TEST_GATE_TEXT", "yes")
    monkeypatch.setenv("FBGEMM_RECOPS_TEST_GATE_TWO", "2")
    for op in (ops, fbgemm_ops):
        assert op.check_feature_gate_key("RECOPS_TEST_GATE_ON") is True
        assert op.check_feature_gate_key("RECOPS_TEST_GATE_TEXT") is False
        assert op.check_feature_gate_key("RECOPS_TEST_GATE_TWO") is False
        assert op.check_feature_gate_key("RECOPS_TEST_GATE_UNSET") is False
    # Read once per key, as FBGEMM caches it.
    monkeypatch.setenv("FBGEMM_RECOPS_TEST_GATE_ON", "0")
    assert ops.check_feature_gate_key("RECOPS_TEST_GATE_ON") is True


def test_routed_through_fbgemm_names():
    recops.use_for_fbgemm(["zero_collision_hash", "create_zch_buffer", "check_feature_gate_key"])
    try:
        from recops import _fbgemm

        for name in ("zero_collision_hash", "create_zch_buffer", "check_feature_gate_key"):
            assert _fbgemm.serves(name)
        ids, _ = torch.ops.fbgemm.create_zch_buffer(8, long_type=True)
        slots, _ = torch.ops.fbgemm.zero_collision_hash(
            torch.tensor([1, 2]), ids, 4, circular_probe=True, readonly=True
        )
        assert slots.shape == (2,)
    finally:
        if recops.fbgemm_loaded:
            recops.use_for_fbgemm(
                ["zero_collision_hash", "create_zch_buffer", "check_feature_gate_key"],
                enable=False,
            )
