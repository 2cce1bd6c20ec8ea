"""One description of a parallel layout (pipeline/train/model/layout.py) read by the config, the job, the memory plan
and the launchers; and tensor parallel applied to a plain model by one step (pipeline/train/model/parallelize.py)."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.train.model.layout import ParallelLayout


def test_the_layout_checks_itself_and_places_every_rank():
    lay = ParallelLayout(tp=8, dp=16, zero=True, distributed_optimizer=True, nodes=16)
    assert (lay.workers, lay.per_node, lay.problem()) == (128, 8, None)
    r = lay.rank(21)
    assert (r.tp, r.dp, r.tp_rank, r.dp_rank, r.tp_group, r.dp_group) == (8, 16, 5, 2, "tp_2", "dp_5")
    assert ParallelLayout(tp=8, dp=2, nodes=4).problem() == ("tp", "a tensor-parallel group stays inside one node: "
                                                               "must divide the 4 ranks per node, got 8")
    assert ParallelLayout(tp=1, dp=6, nodes=4).problem()[0] == "nodes"
    assert ParallelLayout(distributed_optimizer=True).problem()[0] == "distributed_optimizer"
    with pytest.raises(ValueError, match="outside the layout's 4 ranks"):
        ParallelLayout(tp=2, dp=2).rank(4)


def test_config_job_and_memory_plan_describe_it_with_the_same_class():
    from pipeline.train.config import TrainConfig
    from pipeline.train.job import TrainJob
    from pipeline.train.model.memory_plan import Layout, job_layout

    cfg = TrainConfig(backend="slurm", nodes=2, workers=8, tensor_parallel=2, zero=True, model_overrides={
        "n_heads": 4, "n_kv_heads": 2})
    assert cfg.layout() == ParallelLayout(tp=2, dp=4, zero=True, nodes=2)
    job = TrainJob(stage="s", data_dir="d", out_dir="o", tensor_parallel=2, world_size=8, zero=True,
                   micro_batch=2, grad_accum=3)
    assert job.layout() == ParallelLayout(tp=2, dp=4, zero=True) and job.global_batch(4) == 24
    plan_layout = job_layout(job, 8, 128, recompute=False)
    assert isinstance(plan_layout, ParallelLayout) and isinstance(plan_layout, Layout)
    assert (plan_layout.tp, plan_layout.dp, plan_layout.world, plan_layout.grad_accum) == (2, 4, 8, 3)


def test_parallelize_turns_a_plain_model_into_this_ranks_shard():
    """Same parameter names as the plain model, each with this rank's shard shape (split_axis), and the modules'
    head counts divided; the weights then drawn by shard_init equal slices of the plain model's draws."""
    pytest.importorskip("mindspore")
    from mindspore.nn.utils import no_init_parameters

    from pipeline.train.model.config import ModelConfig
    from pipeline.train.model.model import Transformer
    from pipeline.train.model.parallel import split_axis, take_shard
    from pipeline.train.model.parallelize import parallelize
    from pipeline.train.model.shard_init import init_rank_weights
    from pipeline.train.model.tp_layers import TPGroup

    cfg = ModelConfig.from_preset("debug", n_layers=2, vocab_size=260, dim=64, n_heads=4, n_kv_heads=2)
    with no_init_parameters():
        plain = Transformer(cfg)
    init_rank_weights(plain, cfg, seed=9)
    full = {p.name: p.asnumpy() for p in plain.trainable_params()}
    for rank in (0, 1):
        with no_init_parameters():
            net = parallelize(Transformer(cfg), TPGroup(2, rank, None))
        init_rank_weights(net, cfg, seed=9, tp=2, tp_rank=rank)
        got = {p.name: p.asnumpy() for p in net.trainable_params()}
        assert sorted(got) == sorted(full)
        for name, v in got.items():
            assert np.array_equal(v, take_shard(full[name], split_axis(name), 2, rank)), name
        att = net.layers[0].attention
        assert (att.tp, att.n_heads, att.n_kv, net.tp.size) == (2, 2, 1, 2)
