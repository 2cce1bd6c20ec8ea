"""The memory plan: bytes per device for every preset and its shipped layout, and refusals naming the knob."""

from __future__ import annotations

import math
import re
from dataclasses import replace

import pytest

from pipeline.train.model.config import PRESETS, ModelConfig
from pipeline.train.model.memory_plan import (
    PRESET_LAYOUTS,
    GiB,
    Layout,
    check_layout,
    param_shapes,
    plan,
    require_fit,
    sharded_and_replicated_params,
)


def test_every_preset_has_a_layout():
    assert set(PRESET_LAYOUTS) == set(PRESETS)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_shipped_layout_fits_64gb_devices(name):
    cfg, layout = ModelConfig.from_preset(name), PRESET_LAYOUTS[name]
    p = require_fit(cfg, layout, 64)
    assert p.fits and 0 < p.total <= 0.9 * 64 * GiB
    assert p.weights > 0 and p.gradients > 0 and p.optimizer > 0 and p.activations > 0 and p.logits > 0


def test_70b_fits_with_the_distributed_optimizer_and_not_without():
    """16-bit weights and gradients split by TP 8 (8 KV heads: TP cannot go higher), fp32 master weights and moments
    split by TP 8 x DP 16, the gradients reduced in fp32: 49.96 GiB of the 57.60 usable. With fp32 weights (ZeRO-1
    only) it needs 106 GiB, and the refusal names the distributed optimizer."""
    cfg, layout = ModelConfig.from_preset("70b"), PRESET_LAYOUTS["70b"]
    assert (layout.tp, layout.dp, layout.zero, layout.distributed_optimizer) == (8, 16, True, True)
    assert layout.micro_batch * layout.grad_accum * layout.dp * layout.seq_len == 1 << 20  # 1M tokens per step
    p = require_fit(cfg, layout, 64)
    n_rank = sum(math.prod(s) for _, s, _ in param_shapes(cfg, 8))
    assert p.weights == 2 * n_rank
    assert p.gradients == 2 * n_rank + 4 * n_rank // 16  # + this rank's fp32 accumulation blocks
    assert layout.grad_reduce == "micro_batch"          # one reduction per step would need the whole fp32 buffer:
    step = plan(cfg, replace(layout, grad_reduce="step"), 64)
    assert step.gradients == 2 * n_rank + 4 * n_rank and not step.fits
    with pytest.raises(ValueError, match=r"plan needs .* set train\.grad_reduce: micro_batch \(accumulates only"):
        require_fit(cfg, replace(layout, grad_reduce="step"), 64)
    assert p.master * 2 == p.optimizer == 8 * n_rank // 16  # every row count of the 70b shards divides by 16
    assert f"{p.total / GiB:.2f}" == "49.96" and p.total < 0.9 * 64 * GiB
    whole = plan(cfg, replace(layout, distributed_optimizer=False, precision="bf16"), 64)  # ZeRO-1: whole buffers
    assert whole.gradients == 4 * n_rank + 4 * n_rank and not whole.fits
    largest = max(math.prod(s) for _, s, _ in param_shapes(cfg, 8))  # the LM head's or embedding's shard
    assert p.host_init == 2 * n_rank + 8 * largest + (4 << 20)  # its 16-bit shard, one fp32 draw twice, a chunk
    assert p.host_init < 19 * GiB  # was 289 GiB when each rank built the whole fp32 model to slice it
    with pytest.raises(ValueError) as e:
        require_fit(cfg, replace(layout, distributed_optimizer=False), 64)
    msg = str(e.value)
    assert msg.startswith("TrainJob.device_memory_gb=64: plan needs 138.37 GiB per device of 57.60 usable")
    assert msg.endswith("set TrainJob.zero=true and TrainJob.distributed_optimizer=true (16-bit weights and "
                        "gradients, fp32 master weights sharded over the data-parallel ranks)")


def test_param_shapes_count_every_parameter_split_by_tp():
    for name in PRESETS:
        cfg = ModelConfig.from_preset(name)
        assert sum(math.prod(s) for _, s, _ in param_shapes(cfg)) == cfg.num_params()
        sharded, replicated = sharded_and_replicated_params(cfg)
        t = 8 if name in ("13b", "70b") else 2
        assert sum(math.prod(s) for _, s, _ in param_shapes(cfg, t)) == sharded // t + replicated


def test_param_shapes_equal_the_built_model():
    pytest.importorskip("mindspore")
    from pipeline.train.model.model import Transformer

    cfg = ModelConfig.from_preset("debug")
    built = {p.name: tuple(p.shape) for p in Transformer(cfg).trainable_params()}
    assert built == {n: s for n, s, _ in param_shapes(cfg)}


def test_zero_shards_only_parameters_whose_rows_divide():
    """Per parameter, as ZeroShard does: vocab 260 rows do not divide by 8, so embedding and head stay whole."""
    cfg = ModelConfig.from_preset("debug", vocab_size=260, dim=64, n_layers=2, n_heads=4, n_kv_heads=2)
    full = plan(cfg, Layout(seq_len=32))
    z8 = plan(cfg, Layout(dp=8, zero=True, seq_len=32, device="CPU"))
    emb = 260 * 64
    assert z8.optimizer == 8 * 2 * emb + (full.optimizer - 8 * 2 * emb) // 8


def test_debug_weights_are_exactly_four_bytes_per_parameter():
    cfg = ModelConfig.from_preset("debug")
    p = plan(cfg, Layout(seq_len=256, micro_batch=8))
    assert p.weights == p.gradients == 4 * cfg.num_params() == 4 * 1_787_008
    assert p.optimizer == 8 * cfg.num_params() and p.master == 0
    acc = plan(cfg, Layout(seq_len=256, micro_batch=8, grad_accum=2))
    assert acc.gradients == 2 * p.gradients  # + the accumulation buffers
    assert p.device_bytes == 0 and p.fits  # no declared limit: never refused


def test_tp_splits_weights_and_tp_times_dp_splits_optimizer_state():
    cfg = ModelConfig.from_preset("7b")
    one, tp2 = plan(cfg, Layout(seq_len=4096)), plan(cfg, Layout(tp=2, seq_len=4096))
    tp2z = plan(cfg, Layout(tp=2, dp=2, zero=True, seq_len=4096))
    replicated = (2 * cfg.n_layers + 1) * cfg.dim * 4
    assert tp2.weights == (one.weights - replicated) // 2 + replicated
    assert tp2z.weights == tp2.weights and tp2z.optimizer == tp2.optimizer // 2


@pytest.mark.parametrize("layout, knob", [
    (Layout(seq_len=4096, recompute=True, precision="bf16"), "raise TrainJob.tensor_parallel"),
    (Layout(tp=8, dp=8, seq_len=4096, micro_batch=1, recompute=True, precision="bf16", grad_accum=1),
     None),
    (Layout(tp=8, seq_len=4096, micro_batch=16, precision="bf16"), "enable model.recompute"),
    (Layout(tp=8, seq_len=4096, micro_batch=64, precision="bf16", recompute=True),
     "lower TrainJob.micro_batch (train.batch_size) or TrainJob.seq_len"),
])
def test_refusal_names_the_knob(layout, knob):
    cfg = ModelConfig.from_preset("7b")
    if knob is None:
        assert require_fit(cfg, layout, 64).fits
        return
    with pytest.raises(ValueError, match=r"^TrainJob\.device_memory_gb=64: plan needs .*" + re.escape(knob)):
        require_fit(cfg, layout, 64)


def test_zero_is_the_knob_when_moments_dominate_and_dp_is_unused():
    cfg = ModelConfig.from_preset("1b")
    with pytest.raises(ValueError, match=r"set TrainJob\.zero=true"):
        require_fit(cfg, Layout(dp=8, seq_len=512, micro_batch=1, recompute=True), 16)
    assert require_fit(cfg, Layout(dp=8, zero=True, seq_len=512, micro_batch=1, recompute=True), 16).fits


@pytest.mark.parametrize("tp, field", [(3, "n_heads"), (16, "n_kv_heads")])
def test_tp_must_divide_heads(tp, field):
    with pytest.raises(ValueError, match=rf"TrainJob\.tensor_parallel={tp}: must divide ModelConfig\.{field}"):
        check_layout(ModelConfig.from_preset("70b"), tp)


def test_training_job_refuses_a_plan_over_the_declared_memory_before_building_anything(tmp_path):
    pytest.importorskip("mindspore")
    from pipeline.train.job import TrainJob
    from pipeline.train.trainer import run_training

    job = TrainJob(stage="s", data_dir=str(tmp_path / "no-data"), out_dir=str(tmp_path / "out"),
                   model={"preset": "debug"}, micro_batch=8, device_memory_gb=0.01)
    with pytest.raises(ValueError, match=r"^TrainJob\.device_memory_gb=0\.01: plan needs 0\.28 GiB per device of "
                                         r"0\.01 usable .*; enable model\.recompute"):
        run_training(job)


def test_the_plan_counts_the_attention_mask():
    """#50: flash attention takes no [S, S] mask: its compressed 2048 x 2048 causal mask, and by document the int64
    cumulative ends of its variable-length form (B x max_documents_per_row); the math path keeps its fp32 causal
    constant, plus the fp32 [B, S, S] document mask (4 GiB per row at 32k)."""
    from pipeline.train.model.memory_plan import FLASH_MASK, mask_bytes

    layout = replace(PRESET_LAYOUTS["7b"], seq_len=32768)
    causal, by_doc = ModelConfig.from_preset("7b", max_seq_len=32768), ModelConfig.from_preset("7b", max_seq_len=32768,
                                                                                                  eod_id=2)
    s, b = 32768, layout.micro_batch
    assert plan(by_doc, layout).activations - plan(causal, layout).activations == 8 * b * 128
    assert mask_bytes(causal, layout) == FLASH_MASK == 4 * 2**20
    cpu = replace(layout, device="CPU")
    assert plan(by_doc, cpu).activations - plan(causal, cpu).activations == 4 * s * s == 4 * GiB
    debug = ModelConfig.from_preset("debug")
    assert mask_bytes(debug, replace(PRESET_LAYOUTS["debug"], device="CPU")) == 4 * debug.max_seq_len ** 2
