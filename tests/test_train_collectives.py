"""Which collectives a rank builds, chosen once from ``TrainJob.device``: native sub-group AllGather and
ReduceScatter on Ascend/GPU, the CPU emulations (zero-padded all-reduce, all-reduce + slice) on CPU.

The native ops cannot run here (mccl: AllGather in the world group only, no ReduceScatter), so these tests build
the cells on CPU (a collective primitive is constructed without ``init()``) and check the op objects; the CPU
path's numbers are checked by the equality tests in test_train_parallel / test_train_distopt."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

pytest.importorskip("mindspore")

from mindspore import nn, ops  # noqa: E402

from pipeline.train.model.tp_layers import GatherRows, native_collectives  # noqa: E402
from pipeline.train.optim.adamw import AdamW, ZeroShard  # noqa: E402


def test_native_collectives_follow_the_jobs_device():
    assert [native_collectives(d) for d in ("Ascend", "GPU", "CPU")] == [True, True, False]


def test_gather_rows_is_an_all_gather_where_native_and_a_padded_all_reduce_in_cpu_sub_groups():
    native = GatherRows(4, 2, "dp_1", native=True)
    assert not native.emulated and type(native.op) is ops.AllGather and native.op.group == "dp_1"
    emulated = GatherRows(4, 2, "dp_1", native=False)
    assert emulated.emulated and type(emulated.op) is ops.AllReduce and emulated.op.group == "dp_1"
    for flag in (True, False):  # the world group has AllGather on every device
        world = GatherRows(4, 2, None, native=flag)
        assert not world.emulated and type(world.op) is ops.AllGather


def _opt(native: bool):
    a, b = nn.Dense(3, 4, has_bias=False), nn.Dense(4, 3, has_bias=False)  # 4 rows split over DP 2; 3 rows whole
    params = [a.weight, b.weight]
    params[0].name, params[1].name = "a.weight", "b.weight"
    return AdamW([{"params": params, "weight_decay": 0.1}], 1e-3, zero=ZeroShard(1, 2, "dp_0", native),
                 master=True)


def test_distributed_optimizer_reduce_scatters_and_all_gathers_where_native():
    opt = _opt(native=True)
    assert not opt._gather.emulated and type(opt._gather.op) is ops.AllGather and opt._gather.op.group == "dp_0"
    split, whole = opt.grad_reduce_scatter().parts
    assert split.scatter and type(split.reduce) is ops.ReduceScatter
    assert (split.reduce.group, split.reduce.get_attr_dict()["op"], split.inv) == ("dp_0", "sum", 0.5)
    assert not whole.scatter and type(whole.reduce) is ops.AllReduce  # rows do not divide: the whole mean


def test_distributed_optimizer_keeps_the_cpu_emulation_off_native_devices():
    opt = _opt(native=False)
    assert opt._gather.emulated and type(opt._gather.op) is ops.AllReduce
    split, whole = opt.grad_reduce_scatter().parts
    assert not split.scatter and type(split.reduce) is ops.AllReduce and (split.lo, split.hi) == (2, 4)
    assert not whole.scatter and type(whole.reduce) is ops.AllReduce


@pytest.mark.parametrize("device, native", [("Ascend", True), ("CPU", False)])
def test_build_parallel_chooses_once_from_the_job_device_and_logs_it(device, native, caplog):
    from pipeline.train.model.config import ModelConfig
    from pipeline.train.model.layout import RankLayout
    from pipeline.train.model.parallel_setup import build_parallel

    cfg = ModelConfig.from_preset("debug", n_layers=1, vocab_size=256, dim=64, n_heads=4, n_kv_heads=2)
    job = SimpleNamespace(device=device, distributed_optimizer=True, zero=True, precision="bf16", seed=3, steps=2,
                          lr=1e-3, min_lr=1e-4, warmup_steps=1, weight_decay=0.1, beta1=0.9, beta2=0.95, eps=1e-8)
    lay = RankLayout(tp=2, dp=2, tp_rank=1, dp_rank=0, tp_group="tp_0", dp_group="dp_1")
    with caplog.at_level(logging.INFO, logger="mindloom.train"):
        net, opt, _ = build_parallel(cfg, job, lay)
    word = "native AllGather / ReduceScatter" if native else "CPU emulation"
    assert [r.getMessage() for r in caplog.records if "collectives" in r.getMessage()] == [
        f"collectives (device {device}): {word}" + (" in sub-groups" if native else ": zero-padded all-reduce for "
                                                    "sub-group gathers, all-reduce + slice for reduce-scatter")]
    from pipeline.train.model.model import CausalLMLoss

    gathers = [CausalLMLoss(net).nll.gather, opt._gather]  # the vocabulary maxes over TP, the weights over DP
    assert [(g.emulated, g.op.group) for g in gathers] == [(not native, "tp_0"), (not native, "dp_1")]
    assert {type(g.op) for g in gathers} == {ops.AllGather if native else ops.AllReduce}
    scatters = [p.scatter for p in opt.grad_reduce_scatter().parts if p.size > 1 and not p.whole]
    assert scatters and set(scatters) == {native}
