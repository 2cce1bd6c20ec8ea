"""``TrainJob``: the JSON contract between the orchestrator (Airflow operator) and a training process.

Why a plain dataclass + JSON: the operator runs in the Airflow venv, the trainer in the MindSpore venv (possibly
under ``msrun`` on another host), so the job must be a file both sides can read without sharing Python objects.
Validation happens on construction and names the offending field, so a bad DAG parameter fails before any compile.
This module imports no MindSpore.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from .config import ModelConfig

MODES = ("graph", "pynative")


@dataclass
class TrainJob:
    """One training stage. Paths may be relative (to the current directory of the trainer process)."""

    stage: str
    data_dir: str  # directory holding <name>.mindrecord<N> + <name>.mindrecord<N>.db, column input_ids int32
    out_dir: str  # metrics.jsonl, status.json, summary.json, checkpoints/
    model: dict = field(default_factory=lambda: {"preset": "debug"})  # {"preset": name, **ModelConfig overrides}
    init_from: str | None = None  # checkpoint file of a previous stage: weights only
    steps: int = 1000
    batch_size: int = 8  # per data-parallel rank
    lr: float = 3e-4
    min_lr: float = 3e-5
    warmup_steps: int = 100
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0  # global-norm clip; <= 0 disables
    seed: int = 1234
    mode: str = "graph"  # "graph" (jitted step, default) | "pynative" (eager, for debugging)
    device: str = "CPU"  # "CPU" | "Ascend" | "GPU"
    threads: int = 2  # CPU intra-op threads; set to the cores the job owns
    checkpoint_every: int = 500
    keep_checkpoints: int = 3
    log_every: int = 10  # status.json refresh + log line period (metrics.jsonl gets every step)
    fail_at_step: int | None = None  # tests only: raise after this step's checkpoint (simulated crash)

    def __post_init__(self) -> None:
        def bad(name: str, why: str) -> ValueError:
            return ValueError(f"TrainJob.{name}={getattr(self, name)!r}: {why}")

        for name in ("stage", "data_dir", "out_dir"):
            v = getattr(self, name)
            if not isinstance(v, str) or not v:
                raise bad(name, "must be a non-empty string")
        if self.init_from is not None and (not isinstance(self.init_from, str) or not self.init_from):
            raise bad("init_from", "must be a checkpoint path or null")
        if not isinstance(self.model, dict):
            raise bad("model", "must be a dict like {'preset': 'debug', 'vocab_size': 32000}")
        for name in ("steps", "batch_size", "threads", "checkpoint_every", "keep_checkpoints", "log_every"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise bad(name, "must be a positive integer")
        for name in ("warmup_steps", "seed"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise bad(name, "must be a non-negative integer")
        for name in ("lr", "min_lr", "weight_decay", "eps", "grad_clip", "beta1", "beta2"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool):
                raise bad(name, "must be a number")
        if not self.lr > 0:
            raise bad("lr", "must be > 0")
        if not 0 <= self.min_lr <= self.lr:
            raise bad("min_lr", f"must be in [0, lr={self.lr}]")
        if self.weight_decay < 0:
            raise bad("weight_decay", "must be >= 0")
        for name in ("beta1", "beta2"):
            if not 0 <= getattr(self, name) < 1:
                raise bad(name, "must be in [0, 1)")
        if not self.eps > 0:
            raise bad("eps", "must be > 0")
        if self.mode not in MODES:
            raise bad("mode", f"must be one of {MODES}")
        if self.device not in ("CPU", "Ascend", "GPU"):
            raise bad("device", "must be CPU, Ascend or GPU")
        if self.fail_at_step is not None and (
            not isinstance(self.fail_at_step, int) or isinstance(self.fail_at_step, bool) or self.fail_at_step <= 0
        ):
            raise bad("fail_at_step", "must be a positive integer or null")
        self.model_config()  # validates the model dict; its error names the ModelConfig field

    def model_config(self) -> ModelConfig:
        spec = dict(self.model)
        preset = spec.pop("preset", "debug")
        try:
            return ModelConfig.from_preset(preset, **spec)
        except ValueError as e:
            raise ValueError(f"TrainJob.model: {e}") from None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> TrainJob:
        if not isinstance(d, dict):
            raise ValueError(f"TrainJob: expected a JSON object, got {type(d).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"TrainJob.{unknown[0]}: unknown field (known: {sorted(known)})")
        missing = [f.name for f in fields(cls) if f.name in ("stage", "data_dir", "out_dir") and f.name not in d]
        if missing:
            raise ValueError(f"TrainJob.{missing[0]}: required field missing")
        return cls(**d)

    @classmethod
    def from_json(cls, path: str | os.PathLike) -> TrainJob:
        with open(path, encoding="utf-8") as f:
            try:
                d = json.load(f)
            except json.JSONDecodeError as e:
                raise ValueError(f"TrainJob: {path} is not valid JSON: {e}") from None
        return cls.from_dict(d)

    def to_json(self, path: str | os.PathLike) -> None:
        write_json_atomic(path, self.to_dict())


def write_json_atomic(path: str | os.PathLike, obj: dict) -> None:
    """Write JSON via a temp file in the same directory + ``os.replace``: readers never see a half-written file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=2, sort_keys=True)
            f.write("\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
