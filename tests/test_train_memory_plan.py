"""The memory plan: bytes per device for every preset and its shipped layout, and refusals naming the knob."""

from __future__ import annotations

import re

import pytest

from pipeline.train.config import PRESETS, ModelConfig
from pipeline.train.memory_plan import PRESET_LAYOUTS, GiB, Layout, check_layout, plan, require_fit


def test_every_preset_has_a_layout():
    assert set(PRESET_LAYOUTS) == set(PRESETS)


@pytest.mark.parametrize("name", sorted(set(PRESETS) - {"70b"}))
def test_shipped_layout_fits_64gb_devices(name):
    cfg, layout = ModelConfig.from_preset(name), PRESET_LAYOUTS[name]
    p = require_fit(cfg, layout, 64)
    assert p.fits and 0 < p.total <= 0.9 * 64 * GiB
    assert p.weights > 0 and p.gradients > 0 and p.optimizer > 0 and p.activations > 0


def test_70b_does_not_fit_with_tp8_and_zero1_and_says_so():
    """fp32 weights + gradients are split only by TP: 69e9 * 8 B / 8 = 64 GiB before moments and activations.
    This trainer has no pipeline parallel (fails on CPU) nor ZeRO-2/3, so 70b is refused, naming the knob."""
    cfg = ModelConfig.from_preset("70b")
    with pytest.raises(ValueError) as e:
        require_fit(cfg, PRESET_LAYOUTS["70b"], 64)
    msg = str(e.value)
    assert msg.startswith("TrainJob.device_memory_gb=64: plan needs 74.42 GiB per device of 57.60 usable")
    assert msg.endswith("raise TrainJob.tensor_parallel (weights and gradients are split only by tensor parallel)")


def test_debug_weights_are_exactly_four_bytes_per_parameter():
    cfg = ModelConfig.from_preset("debug")
    p = plan(cfg, Layout(seq_len=256, micro_batch=8))
    assert p.weights == p.gradients == 4 * cfg.num_params() == 4 * 1_787_008
    assert p.optimizer == 8 * cfg.num_params()
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
    with pytest.raises(ValueError, match=r"^TrainJob\.device_memory_gb=0\.01: plan needs 0\.23 GiB per device of "
                                         r"0\.01 usable .*; enable model\.recompute"):
        run_training(job)
