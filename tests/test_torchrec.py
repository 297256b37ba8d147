"""recops.operators.torchrec: torchrec's fused embedding kernels on recops' TBE, and its KJT /
KeyedTensor ops on recops' kernels. Skipped where torchrec is not installed (`make
setup-torchrec`); the sharded runs are tests/test_torchrec_sharded.py."""

import importlib

import pytest
import torch

torchrec = pytest.importorskip("torchrec")

from fbgemm_gpu.split_table_batched_embeddings_ops_training import (  # noqa: E402
    SplitTableBatchedEmbeddingBagsCodegen as FbgemmTBE,
)
from torchrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection  # noqa: E402
from torchrec.optim import RowWiseAdagrad  # noqa: E402
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor  # noqa: E402

import recops  # noqa: E402
import recops.operators.torchrec  # noqa: E402

TABLES = [("t0", 40, 8, ["f0", "f1"]), ("t1", 25, 4, ["f2"])]


@pytest.fixture(autouse=True)
def _disabled_after():
    yield
    recops.operators.torchrec.disable()


def test_patch_sites_hold_fbgemm_class():
    """Fails when a torchrec upgrade moves the name recops.operators.torchrec replaces."""
    for module_name, name in recops.operators.torchrec.PATCH_SITES:
        module = importlib.import_module(module_name)
        assert getattr(module, name, None) is FbgemmTBE, f"{module_name}.{name} moved"


def test_enable_disable_is_reversible():
    bound_before = {
        k: list(v) if isinstance(v, list) else v for k, v in recops.fbgemm_bindings.items()
    }
    with recops.operators.torchrec.enabled():
        assert recops.operators.torchrec.is_enabled()
        for module_name, name in recops.operators.torchrec.PATCH_SITES:
            module = importlib.import_module(module_name)
            assert getattr(module, name) is recops.SplitTableBatchedEmbeddingBagsCodegen
        assert "CPU" in recops.fbgemm_bindings["permute_2D_sparse_data"]
        recops.operators.torchrec.enable()  # idempotent
    assert not recops.operators.torchrec.is_enabled()
    test_patch_sites_hold_fbgemm_class()
    assert recops.fbgemm_bindings == bound_before


def test_enable_refuses_a_foreign_class(monkeypatch):
    module = importlib.import_module(recops.operators.torchrec.PATCH_SITES[0][0])
    monkeypatch.setattr(module, recops.operators.torchrec.PATCH_SITES[0][1], object)
    with pytest.raises(RuntimeError, match="not FBGEMM's class"):
        recops.operators.torchrec.enable()
    assert not recops.operators.torchrec.is_enabled()


def _configs():
    return [
        torchrec.EmbeddingBagConfig(
            name=name, num_embeddings=rows, embedding_dim=dim, feature_names=features
        )
        for name, rows, dim, features in TABLES
    ]


def _batches(steps, batch_size=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    keys = [f for *_, features in TABLES for f in features]
    rows = [r for _, r, _, features in TABLES for _ in features]
    for _ in range(steps):
        lengths = torch.randint(0, 4, (len(keys) * batch_size,), generator=g)  # empty bags too
        per_feature = lengths.view(len(keys), batch_size).sum(1)
        values = torch.cat(
            [
                torch.randint(0, r, (int(n),), generator=g)
                for r, n in zip(rows, per_feature, strict=True)
            ]
        )
        yield KeyedJaggedTensor.from_lengths_sync(keys=keys, values=values, lengths=lengths)


def _train(module, steps):
    outputs = []
    for kjt in _batches(steps):
        out = module(kjt).values()
        (out * torch.arange(out.shape[1], dtype=out.dtype)).sum().backward()
        outputs.append(out.detach())
    return outputs


def _fused_ebc(optimizer_type, **kwargs):
    return FusedEmbeddingBagCollection(
        tables=_configs(), optimizer_type=optimizer_type, optimizer_kwargs=kwargs
    )


@pytest.mark.parametrize(
    "optimizer_type, kwargs",
    [
        (torch.optim.SGD, {"lr": 0.1}),
        (torch.optim.Adagrad, {"lr": 0.1, "eps": 1e-8}),
        (RowWiseAdagrad, {"lr": 0.1, "eps": 1e-8}),
    ],
)
def test_fused_embedding_bag_collection_matches_fbgemm(optimizer_type, kwargs):
    fbgemm = _fused_ebc(optimizer_type, **kwargs)
    with recops.operators.torchrec.enabled():
        ours = _fused_ebc(optimizer_type, **kwargs)
    tbe = ours._emb_modules[0]._emb_module
    assert isinstance(tbe, recops.SplitTableBatchedEmbeddingBagsCodegen)
    ours.load_state_dict(fbgemm.state_dict())
    for a, b in zip(_train(fbgemm, 4), _train(ours, 4), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    for key, value in fbgemm.state_dict().items():
        torch.testing.assert_close(ours.state_dict()[key], value, rtol=1e-5, atol=1e-6)
    fbgemm_states = fbgemm.fused_optimizer().state_dict()["state"]
    ours_states = ours.fused_optimizer().state_dict()["state"]
    assert fbgemm_states.keys() == ours_states.keys()
    for key in fbgemm_states:
        for name, value in fbgemm_states[key].items():
            torch.testing.assert_close(ours_states[key][name], value, rtol=1e-5, atol=1e-6)


def test_the_kernels_that_run_are_recops():
    with recops.operators.torchrec.enabled():
        module = _fused_ebc(RowWiseAdagrad, lr=0.1)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            _train(module, 1)
    names = {e.name for e in prof.events()}
    assert "recops::split_embedding_codegen_lookup_rowwise_adagrad_function" in names
    assert "recops::backward_codegen_rowwise_adagrad_unweighted_exact" in names
    assert not [n for n in names if n.startswith("fbgemm::split_embedding")]


def test_adam_runs_on_recops_and_matches_torch():
    """FBGEMM has no CPU Adam; under recops FusedEmbeddingBagCollection(torch.optim.Adam) trains,
    and equals torchrec's unfused collection with torch.optim.SparseAdam (both update only the
    rows a batch touches, bias-corrected by the step count). SparseAdam adds eps before the
    second-moment correction (eps / sqrt(1 - beta2^t) in FBGEMM's terms): a small eps makes that
    immaterial."""
    with recops.operators.torchrec.enabled():
        fused = _fused_ebc(torch.optim.Adam, lr=0.05, eps=1e-6)
    reference = torchrec.EmbeddingBagCollection(tables=_configs())
    reference.load_state_dict(fused.state_dict())
    for table in reference.embedding_bags.values():
        table.sparse = True
    sparse_adam = torch.optim.SparseAdam(reference.parameters(), lr=0.05, eps=1e-6)
    for kjt in _batches(4):
        out = fused(kjt).values()
        (out * torch.arange(out.shape[1], dtype=out.dtype)).sum().backward()
        sparse_adam.zero_grad()
        ref = reference(kjt).values()
        (ref * torch.arange(ref.shape[1], dtype=ref.dtype)).sum().backward()
        sparse_adam.step()
        # Both in float32: Adam's normalised step magnifies rounding where v is small.
        torch.testing.assert_close(out.detach(), ref.detach(), rtol=1e-4, atol=1e-5)
    for key, value in reference.state_dict().items():
        torch.testing.assert_close(fused.state_dict()[key], value, rtol=1e-4, atol=1e-5)


# --------------------------------------------------------------------------- torchrec's CPU paths
import torchrec_trace as trace  # noqa: E402  (tests/ is on sys.path)

from recops import _fbgemm  # noqa: E402

CPU_PATHS = [name for name in trace.PATHS if "train (insert)" not in name]


def _route_of(name: str, key: str) -> bool:
    """Whether fbgemm::<name>'s kernel at `key` is recops' route (binding/fbgemm_route.cpp)."""
    if key == "CompositeImplicitAutograd":  # a call with no tensor argument dispatches here
        key = "Undefined"
    table = torch._C._dispatch_dump_table(f"fbgemm::{name}")
    line = next((x for x in table.splitlines() if x.startswith(f"{key}:")), "")
    return "fbgemm_route.cpp" in line


@pytest.mark.parametrize("path", CPU_PATHS)
def test_torchrec_cpu_path_runs_fbgemm_ops_on_recops(path):
    """Each CPU path of tests/torchrec_trace.py (KJT permute / split / to_dict / concat, VBE,
    KeyedTensor.regroup, EBC with and without inverse indices, EC, fused EBC, managed collision,
    the quantized EBC / EC) with recops.operators.torchrec enabled: every FBGEMM op it calls that
    recops implements (recops._fbgemm.FBGEMM_OPS) ran on recops' kernel, it calls no other, and no
    FBGEMM TBE training op runs."""
    with recops.operators.torchrec.enabled():
        called, error = trace._profiled(trace.PATHS[path])
        assert error is None, error
        # A composite (jagged_to_padded_dense) runs its _forward op, checked in its place.
        for name in called & set(_fbgemm.FBGEMM_OPS) - set(_fbgemm.COMPOSITES):
            assert _fbgemm.serves(name), f"{name} is not routed to recops"
            for key in _fbgemm._route_keys(name, "CPU"):
                assert _route_of(name, key), f"fbgemm::{name} at {key} is not recops' kernel"
    # Every FBGEMM op torchrec's CPU paths call is served by recops (docs/jagged_sparse.md).
    assert called <= set(_fbgemm.FBGEMM_OPS), called - set(_fbgemm.FBGEMM_OPS)
    assert not [n for n in called if n.startswith(("split_embedding", "get_infos_metadata"))]


def test_hash_zch_module_in_eval_runs_on_recops():
    """torchrec's HashZchManagedCollisionModule in eval mode (read-only lookups: what FBGEMM's
    CPU kernel computes) remaps ids on recops' zero_collision_hash to FBGEMM's slots; training
    mode (insertion) has no CPU kernel in FBGEMM or recops."""
    from torchrec.modules.hash_mc_modules import HashZchManagedCollisionModule
    from torchrec.sparse.jagged_tensor import JaggedTensor

    def remap():
        torch.manual_seed(0)
        module = HashZchManagedCollisionModule(
            zch_size=32, device=torch.device("cpu"), total_num_buckets=2, max_probe=4, name="t"
        )
        identities = module._hash_zch_identities.data
        identities[::3, 0] = torch.arange(0, 32, 3)  # a trained table, some slots filled
        module.eval()
        jt = JaggedTensor(values=torch.arange(40), lengths=torch.tensor([10, 30]))
        return module.remap({"f": jt})["f"].values()

    expected = remap()
    with recops.operators.torchrec.enabled():
        assert _route_of("zero_collision_hash", "CPU")
        actual = remap()
    torch.testing.assert_close(actual, expected)


def test_kjt_and_keyed_tensor_ops_match_fbgemm():
    """KJT permute / split / to_dict and KeyedTensor.regroup give the same tensors on recops'
    kernels as on FBGEMM's."""
    from torchrec.sparse.jagged_tensor import KeyedTensor

    def run():
        torch.manual_seed(0)
        kjt = trace._kjt(weighted=True)
        permuted = kjt.permute([2, 0, 1])
        parts = kjt.split([1, 2])
        kts = [
            KeyedTensor(keys=["a", "b"], length_per_key=[3, 4], values=torch.randn(2, 7)),
            KeyedTensor(keys=["c"], length_per_key=[5], values=torch.randn(2, 5)),
        ]
        regrouped = KeyedTensor.regroup(kts, [["a", "c"], ["b"]])
        tensors = [permuted.values(), permuted.lengths(), permuted.weights(), *regrouped]
        for part in parts:
            tensors += [part.values(), part.lengths()]
        for jt in permuted.to_dict().values():
            tensors += [jt.values(), jt.offsets()]
        return tensors

    expected = run()
    with recops.operators.torchrec.enabled():
        actual = run()
    for a, e in zip(actual, expected, strict=True):
        torch.testing.assert_close(a, e, rtol=0, atol=0)


# --------------------------------------------------------------------------- quantized inference
QUANT_LOOKUP_OPS = ("bounds_check_indices", "int_nbit_split_embedding_codegen_lookup_function")


def _quantized_ebc(dtype, output_dtype, per_table_weight_dtype=None):
    """torchrec's quantized EmbeddingBagCollection (FBGEMM's IntNBitTableBatchedEmbeddingBagsCodegen
    inside: one per pooling type) of TABLES plus a MEAN-pooled table."""
    from torchrec.inference.modules import quantize_embeddings

    torch.manual_seed(0)
    configs = [
        *_configs(),
        torchrec.EmbeddingBagConfig(
            name="t2",
            num_embeddings=30,
            embedding_dim=16,
            feature_names=["f3"],
            pooling=torchrec.PoolingType.MEAN,
        ),
    ]
    ebc = torchrec.EmbeddingBagCollection(tables=configs)
    return quantize_embeddings(
        torch.nn.Sequential(ebc),
        dtype=dtype,
        inplace=False,
        output_dtype=output_dtype,
        per_table_weight_dtype=per_table_weight_dtype,
    )[0]


def _quant_batches(steps):
    """_batches' KJTs with a fourth feature f3 (table t2)."""
    g = torch.Generator().manual_seed(1)
    for kjt in _batches(steps):
        lengths = torch.randint(0, 4, (kjt.stride(),), generator=g)
        values = torch.randint(0, 30, (int(lengths.sum()),), generator=g)
        yield KeyedJaggedTensor.from_lengths_sync(
            keys=[*kjt.keys(), "f3"],
            values=torch.cat([kjt.values(), values]),
            lengths=torch.cat([kjt.lengths(), lengths]),
        )


@pytest.mark.parametrize(
    "dtype, per_table",
    [
        (torch.qint8, None),
        (torch.quint4x2, None),
        # FBGEMM's quantizer packs INT2 rows in whole 2-byte words: t1 (dim 4) cannot be INT2.
        (torch.quint2x4, {"t1": torch.quint4x2}),
        (torch.float16, None),
        (torch.float32, None),
        (torch.qint8, {"t0": torch.quint4x2, "t1": torch.float16, "t2": torch.quint2x4}),
    ],
)
@pytest.mark.parametrize("output_dtype", [torch.float32, torch.float16])
def test_quantized_ebc_runs_on_recops_and_matches_fbgemm(dtype, per_table, output_dtype):
    """torchrec's quantized EBC keeps FBGEMM's module class (see docs/torchrec.md); with
    recops.operators.torchrec enabled the ops its forward calls, bounds_check_indices and the
    quantized lookup, run on recops' kernels (the profiler sees FBGEMM's ops called, and their CPU
    kernel is recops' route), and the output equals the one on FBGEMM's kernels."""
    from fbgemm_gpu.split_table_batched_embeddings_ops_inference import (
        IntNBitTableBatchedEmbeddingBagsCodegen,
    )

    module = _quantized_ebc(dtype, output_dtype, per_table)
    assert all(type(m) is IntNBitTableBatchedEmbeddingBagsCodegen for m in module._emb_modules)
    batches = list(_quant_batches(3))
    expected = [module(kjt).values() for kjt in batches]
    with recops.operators.torchrec.enabled():
        for name in QUANT_LOOKUP_OPS:
            assert all(_route_of(name, key) for key in _fbgemm._route_keys(name, "CPU")), name
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            actual = [module(kjt).values() for kjt in batches]
    called = {e.name for e in prof.events()}
    assert {f"fbgemm::{name}" for name in QUANT_LOOKUP_OPS} <= called
    for a, e in zip(actual, expected, strict=True):
        assert a.dtype == e.dtype == output_dtype and a.shape == e.shape
        torch.testing.assert_close(a, e, rtol=0, atol=0)


def test_recops_quantized_module_stands_in_for_fbgemms():
    """recops.IntNBitTableBatchedEmbeddingBagsCodegen built from the arguments of the FBGEMM
    modules torchrec's quantized EBC holds, with their bytes, gives the same collection output when
    put in their place (torchrec calls it as it calls FBGEMM's)."""
    per_table = {"t0": torch.quint4x2, "t1": torch.float16, "t2": torch.quint2x4}
    module = _quantized_ebc(torch.qint8, torch.float16, per_table)
    batches = list(_quant_batches(2))
    expected = [module(kjt).values() for kjt in batches]
    for i, fbgemm in enumerate(module._emb_modules):
        ours = recops.IntNBitTableBatchedEmbeddingBagsCodegen(
            fbgemm.embedding_specs,
            feature_table_map=fbgemm.feature_table_map,
            pooling_mode=fbgemm.pooling_mode,
            output_dtype=fbgemm.output_dtype,
            row_alignment=fbgemm.row_alignment,
        )
        ours.initialize_weights()
        ours.weights_host.copy_(fbgemm.weights_host)
        module._emb_modules[i] = ours
    for kjt, e in zip(batches, expected, strict=True):
        torch.testing.assert_close(module(kjt).values(), e, rtol=0, atol=0)
