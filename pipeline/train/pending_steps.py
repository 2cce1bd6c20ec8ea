"""Steps launched but not yet read back: the trainer fetches loss and metrics every N steps, not every step.

Why: reading a loss (``asnumpy``) blocks the host until the device has finished the step, so the host cannot prepare
the next batch or enqueue the next step meanwhile. Launching N steps and then reading all N outputs keeps the device
busy; metrics.jsonl still gets one row per step, with the window's wall time shared equally among its steps.
"""

from __future__ import annotations

import time


class PendingSteps:
    """Collects ``(step, device outputs, data seconds, data position, digest)`` until ``fetch``."""

    def __init__(self):
        self._items: list[tuple] = []
        self._t0 = 0.0

    def add(self, step: int, outputs, data_s: float, pos, digest: str, t_launch: float) -> None:
        """``t_launch``: when this step was launched; the window's clock starts at its first step (so time spent
        between windows, e.g. saving a checkpoint, is not counted as step time)."""
        if not self._items:
            self._t0 = t_launch
        self._items.append((step, outputs, data_s, pos, digest))

    def fetch(self, to_host) -> list[tuple]:
        """``[(step, host metrics, step seconds, data seconds, pos, digest)]``; ``to_host`` does the sync."""
        host = [to_host(out) for _, out, *_ in self._items]  # the first asnumpy waits for the device
        now = time.time()
        dt = (now - self._t0) / max(1, len(self._items))
        rows = [(st, h, dt, data_s, pos, digest) for (st, _, data_s, pos, digest), h in
                zip(self._items, host, strict=True)]
        self._items = []
        return rows


def is_sync_point(job, step: int, start_step: int) -> bool:
    """Steps whose metrics must be on the host: the first of a process (its time is the compile), every
    ``metrics_every``-th, and every step that checkpoints, ends the stage or is a test's crash point. status.json and
    the log line follow the sync points (``log_every`` cannot ask for more host syncs than ``metrics_every``)."""
    return (step == start_step + 1 or step % job.metrics_every == 0 or step % job.checkpoint_every == 0
            or step == job.steps or step == job.fail_at_step)
