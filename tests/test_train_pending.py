"""Host-sync points of the training loop: metrics are fetched every ``metrics_every`` steps, never lost."""

from __future__ import annotations

import types

from pipeline.train.pending_steps import PendingSteps, is_sync_point


def test_sync_points_are_first_step_period_checkpoints_and_end():
    job = types.SimpleNamespace(metrics_every=10, checkpoint_every=15, steps=40, fail_at_step=None, log_every=1)
    assert [s for s in range(1, 41) if is_sync_point(job, s, 0)] == [1, 10, 15, 20, 30, 40]
    assert [s for s in range(21, 41) if is_sync_point(job, s, 20)] == [21, 30, 40]  # resumed at 20
    job.fail_at_step = 7
    assert is_sync_point(job, 7, 0)


def test_fetch_returns_every_step_in_order_with_the_window_time_shared():
    w = PendingSteps()
    for step in (1, 2, 3, 4):
        w.add(step, {"loss": step}, 0.5, f"pos{step}", f"d{step}", t_launch=100.0 if step == 1 else 999.0)
    rows = w.fetch(lambda out: {"loss": float(out["loss"])})
    assert [(r[0], r[1]["loss"], r[3], r[4], r[5]) for r in rows] == [
        (s, float(s), 0.5, f"pos{s}", f"d{s}") for s in (1, 2, 3, 4)]
    assert len({r[2] for r in rows}) == 1 and rows[0][2] > 0  # one shared step time from the first launch
    assert w.fetch(lambda out: out) == []
