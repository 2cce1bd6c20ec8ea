"""Metric logging through one small interface, the job's status file, and MFU.

``MetricLogger`` is torchtitan's shape: ``log(metrics, step)`` and ``close()``. The trainer knows nothing else, so a
TensorBoard or W&B logger is one more class (and ``MultiLogger`` fans out). Only rank 0 gets a real logger; other
ranks get ``NullLogger``. ``JsonlLogger`` is what the Airflow operator tails (from a byte offset): one complete line
per step with the job id, flushed, and on resume the lines past the restored step are dropped so every step appears
exactly once.  Both it and ``StatusFile`` call the job's fence (``Lease.fence``) before each write, so a job that
lost its lease, or a second trainer that never got it, writes nothing.

MFU (model FLOPs utilisation) uses the standard ``6 * N`` training FLOPs per token (forward 2N + backward 4N, N =
all parameters; attention's sequence-length term is left out, as in the PaLM paper's simple form):
``mfu = 6 * N * tokens_per_s / (peak_flops_per_device * devices)``, where ``tokens_per_s`` is the job's global
throughput and ``devices`` every rank of the job (TP x DP: a TP group of t devices processes one data-parallel
replica's tokens, so dividing by DP ranks alone would overstate MFU t-fold). ``peak_flops`` is configured per job
because it depends on the chip and the precision; with 0 no MFU is reported.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import Protocol

from ..job import TrainJob
from . import fenced


class MetricLogger(Protocol):
    def log(self, metrics: dict, step: int) -> None: ...

    def close(self) -> None: ...


class NullLogger:
    def log(self, metrics: dict, step: int) -> None:
        pass

    def close(self) -> None:
        pass


def _no_fence() -> None:
    pass


class JsonlLogger:
    """Appends ``{"step": step, "job_id": job_id, **metrics}`` per call to ``path``, after ``fence()``."""

    def __init__(self, path: str, job_id: str | None = None, fence: Callable[[], None] = _no_fence,
                 generation: Callable[[], int | None] = lambda: None):
        self.path, self.job_id, self.fence, self.generation = path, job_id, fence, generation
        self._fh = None

    def truncate_after(self, last_step: int) -> None:
        """Drop lines of steps > last_step (written after the checkpoint being resumed) and any torn last line."""
        if not os.path.exists(self.path):
            return
        keep = [r for r in read_jsonl(self.path) if r.get("step", 0) <= last_step]
        self.fence()
        tmp = self.path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in keep)
        os.replace(tmp, self.path)

    def log(self, metrics: dict, step: int) -> None:
        self.fence()
        if self._fh is None:
            self._fh = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self._fh.write(json.dumps({"step": step, "job_id": self.job_id, "generation": self.generation(),
                                   **metrics}) + "\n")
        self._fh.flush()  # the Airflow operator tails this file

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


class MultiLogger:
    def __init__(self, *loggers: MetricLogger):
        self.loggers = loggers

    def log(self, metrics: dict, step: int) -> None:
        for lg in self.loggers:
            lg.log(metrics, step)

    def close(self) -> None:
        for lg in self.loggers:
            lg.close()


def read_jsonl(path: str) -> list[dict]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for ln in f:
            ln = ln.strip()
            if ln:
                try:
                    rows.append(json.loads(ln))
                except json.JSONDecodeError:  # torn last line of a killed run
                    pass
    return rows


def mfu(params: int, tokens_per_s: float, peak_flops: float, devices: int) -> float | None:
    """Model FLOPs utilisation of ``devices`` devices (all ranks, TP x DP) at global ``tokens_per_s``."""
    if peak_flops <= 0 or tokens_per_s <= 0:
        return None
    return 6.0 * params * tokens_per_s / (peak_flops * devices)


class StatusFile:
    """``status.json`` (atomic) of rank 0: state, step, loss, error, pid, job id; other ranks write nothing."""

    def __init__(self, job: TrainJob, enabled: bool, job_id: str | None = None,
                 fence: Callable[[], None] = _no_fence, generation: Callable[[], int | None] = lambda: None):
        self.job, self.enabled, self.job_id, self.fence = job, enabled, job_id, fence
        self.generation = generation
        self.last_step, self.last_loss = 0, None  # progress, for the FAILED status of an exception

    def write(self, state: str, step: int, loss: float | None = None, error: str | None = None, **extra) -> None:
        self.last_step, self.last_loss = step, loss if loss is not None else self.last_loss
        if self.enabled:
            fenced.write_json(os.path.join(self.job.out_dir, "status.json"), {
                "state": state, "step": step, "total_steps": self.job.steps, "pid": os.getpid(),
                "job_id": self.job_id, "generation": self.generation(),
                "loss": self.last_loss, "error": error, "stage": self.job.stage, "updated_at": time.time(), **extra},
                self.fence)
