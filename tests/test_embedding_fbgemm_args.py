"""FBGEMM's CPU-module settings recops' TBE accepts with FBGEMM's meaning (docs/ops.md section 7):
cache, UVM, prefetch and reporting arguments and streaming-only forward arguments, which change
nothing on the host; configuration objects at their defaults; SGD's writeback pre-hook. Each is
run side by side with fbgemm_gpu's CPU module for 20 steps."""

import pytest
import torch
from test_embedding import FBGEMM_OPTIMIZERS, HOST, fbgemm_module, make_batch, make_module
from test_embedding_vbe import compare_steps

from recops import OptimType, PoolingMode, SplitTableBatchedEmbeddingBagsCodegen
from recops.embedding.writeback import kept_rows

HOST_SPECS = [(20, 8), (30, 4)]
FTM = [0, 0, 1]


def fbgemm_classes():
    import fbgemm_gpu.split_table_batched_embeddings_ops_training as training
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import CacheAlgorithm

    return training, CacheAlgorithm


def fixed_batch_steps(module, theirs, seed, num_steps=20, rows=None, batch_size=6, max_bag=5, **kw):
    """Steps for compare_steps: one random batch each, the same forward keyword arguments (kw) on
    both sides."""
    gen = torch.Generator().manual_seed(seed)
    rows = rows or [module.embedding_specs[t][0] for t in module.feature_table_map]
    steps = []
    for _ in range(num_steps):
        indices, offsets = make_batch(gen, rows, batch_size, max_bag)

        def call(psw, indices=indices, offsets=offsets):
            out = theirs(indices, offsets, psw, **kw)
            return out, out

        steps.append((indices, offsets, kw, None, call, lambda g: g))
    return steps


@pytest.mark.parametrize("optimizer", FBGEMM_OPTIMIZERS, ids=lambda o: o.name)
def test_cpu_no_op_arguments_match_fbgemm(fbgemm_ops, optimizer):
    training, CacheAlgorithm = fbgemm_classes()
    ignored = dict(
        cache_algorithm=CacheAlgorithm.LFU,
        cache_load_factor=0.5,
        cache_sets=4,
        cache_reserved_memory=1.0,
        enforce_hbm=True,
        gather_uvm_cache_stats=True,
        max_norm=0.5,  # FBGEMM's CPU kernels never renormalise
        # FBGEMM's CPU module refuses UVM momentum for the elementwise state of Adagrad.
        uvm_non_rowwise_momentum=optimizer != OptimType.EXACT_ADAGRAD,
        use_experimental_tbe=True,
        uvm_host_mapped=True,
    )
    default_configs = dict(
        extra_optimizer_config=training.UserEnabledConfigDefinition(),
        global_weight_decay=training.GlobalWeightDecayDefinition(),
        ensemble_mode=training.EnsembleModeDefinition(),
        emainplace_mode=training.EmainplaceModeDefinition(),
        stats_reporter_config=training.TBEStatsReporterConfig(),
        tbe_input_multiplexer_config=training.TBEInputMultiplexerConfig(),
    )
    kwargs = {**ignored, **default_configs}
    ours = make_module(HOST_SPECS, FTM, optimizer, PoolingMode.SUM, **kwargs)
    ours.init_embedding_weights_uniform(-3.0, 3.0)  # rows of norm above max_norm
    theirs = fbgemm_module(fbgemm_ops, ours, **kwargs)
    identities = torch.arange(6 * len(FTM) * 5).view(-1, 1)
    steps = fixed_batch_steps(ours, theirs, seed=41)
    # The streaming-only forward arguments, ignored by both (streaming is off).
    for i, step in enumerate(steps):
        indices = step[0]
        if i % 2:
            extra = dict(
                hash_zch_identities=identities[: indices.numel()],
                hash_zch_runtime_meta=torch.zeros(indices.numel(), 1),
            )
            steps[i] = (step[0], step[1], extra, None, _with_kwargs(theirs, step, extra), step[5])
    compare_steps(ours, theirs, steps, torch.float32)


def _with_kwargs(theirs, step, extra):
    indices, offsets = step[0], step[1]

    def call(psw):
        out = theirs(indices, offsets, psw, **extra)
        return out, out

    return call


def test_prefetch_pipeline_is_accepted_with_lru_only(fbgemm_ops):
    training, CacheAlgorithm = fbgemm_classes()
    ours = make_module(
        HOST_SPECS, FTM, OptimType.EXACT_SGD, PoolingMode.SUM, prefetch_pipeline=True
    )
    theirs = fbgemm_module(fbgemm_ops, ours, prefetch_pipeline=True)
    compare_steps(ours, theirs, fixed_batch_steps(ours, theirs, seed=42), torch.float32)
    lfu = dict(prefetch_pipeline=True, cache_algorithm=CacheAlgorithm.LFU)
    with pytest.raises(AssertionError, match="LRU"):
        fbgemm_module(fbgemm_ops, ours, **lfu)
    with pytest.raises(ValueError, match="prefetch_pipeline needs cache_algorithm LRU"):
        make_module(HOST_SPECS, FTM, OptimType.EXACT_SGD, PoolingMode.SUM, **lfu)


def test_non_default_extra_optimizer_config_fields_raise(fbgemm_ops):
    training, _ = fbgemm_classes()
    config = training.UserEnabledConfigDefinition(use_rowwise_bias_correction=True)
    with pytest.raises(NotImplementedError, match="use_rowwise_bias_correction"):
        SplitTableBatchedEmbeddingBagsCodegen(
            [(5, 4, *HOST)], optimizer=OptimType.ADAM, extra_optimizer_config=config
        )
    writeback = training.UserEnabledConfigDefinition(use_writeback_bwd_prehook=True)
    with pytest.raises(ValueError, match="use_writeback_bwd_prehook.*EXACT_SGD"):
        make_module(
            [(5, 4)],
            [0],
            OptimType.EXACT_ADAGRAD,
            PoolingMode.SUM,
            extra_optimizer_config=writeback,
        )
    module = make_module(
        [(5, 4)], [0], OptimType.EXACT_SGD, PoolingMode.SUM, extra_optimizer_config=writeback
    )
    with pytest.raises(NotImplementedError, match="batch_size_per_feature_per_rank"):
        module(torch.tensor([1]), torch.tensor([0, 1]), batch_size_per_feature_per_rank=[[1]])


def single_index_batch(gen, rows, num_features, batch_size, empty_every=4):
    """Bags of one index (some empty) drawn from few rows: the writeback use, an assignment per
    bag, with duplicates within and across features."""
    lengths = (torch.arange(num_features * batch_size) % empty_every != 1).long()
    indices = torch.randint(0, min(rows, 6), (int(lengths.sum()),), generator=gen)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    return indices, offsets


@pytest.mark.parametrize(
    "pooling, first_feature_only, num_features",
    [
        (PoolingMode.SUM, False, 1),
        (PoolingMode.MEAN, False, 1),
        (PoolingMode.SUM, True, 2),
        (PoolingMode.NONE, False, 2),
        (PoolingMode.NONE, True, 2),
    ],
)
def test_writeback_matches_fbgemm(fbgemm_ops, pooling, first_feature_only, num_features):
    training, _ = fbgemm_classes()
    config = training.UserEnabledConfigDefinition(
        use_writeback_bwd_prehook=True, writeback_first_feature_only=first_feature_only
    )
    ours = make_module(
        [(12, 4)], [0] * num_features, OptimType.EXACT_SGD, pooling, extra_optimizer_config=config
    )
    theirs = fbgemm_module(fbgemm_ops, ours, extra_optimizer_config=config)
    gen = torch.Generator().manual_seed(43 + num_features)
    steps = []
    for _ in range(20):
        indices, offsets = single_index_batch(gen, 12, num_features, batch_size=7)

        def call(psw, indices=indices, offsets=offsets):
            out = theirs(indices, offsets, psw)
            return out, out

        steps.append((indices, offsets, {}, None, call, lambda g: g))
    compare_steps(ours, theirs, steps, torch.float32)


def test_writeback_keeps_only_first_occurrences():
    """Independent of FBGEMM: bags of one index in one feature; a duplicated index keeps only its
    first bag's gradient, so SGD moves its row once."""
    indices = torch.tensor([3, 5, 3, 3, 7])
    offsets = torch.tensor([0, 1, 2, 3, 3, 4, 5])  # bag 3 is empty
    assert kept_rows(indices, offsets, 1, False, nobag=False).tolist() == [0, 1, 5]
    assert kept_rows(indices, offsets, 1, False, nobag=True).tolist() == [0, 1, 4]
    assert kept_rows(indices, offsets, 1, True, nobag=False).tolist() == [0, 1, 4]
    assert kept_rows(indices[:0], offsets[:1] * 0, 1, False, nobag=False).numel() == 0
