"""``TrainJob``: the JSON contract between the orchestrator (Airflow operator) and a training process.

Why a plain dataclass + JSON: the operator runs in the Airflow venv, the trainer in the MindSpore venv (possibly
under ``msrun`` on another host), so the job must be a file both sides can read without sharing Python objects.
Validation happens on construction and names the offending field, so a bad DAG parameter fails before any compile.
This module imports no MindSpore.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields

from pipeline.io import write_json

from .config import TrainConfig
from .documents import FLASH_MAX_SEGMENTS
from .model.config import ModelConfig, check_layout
from .optim.precision import check_precision

MODES = ("graph", "pynative")
INIT_MODES = ("weights", "continue")
_RECIPE_DEFAULTS = {f.name: f.default for f in fields(TrainConfig)}


def _recipe(name: str):
    """The default of ``train.<name>`` (``TrainConfig``): one default per field, whichever side builds the job."""
    return _RECIPE_DEFAULTS[name]


@dataclass
class TrainJob:
    """One training stage. Paths may be relative (to the current directory of the trainer process)."""

    stage: str
    data_dir: str  # directory holding <name>.mindrecord<N> + <name>.mindrecord<N>.db, column input_ids int32
    out_dir: str  # metrics.jsonl, status.json, summary.json, eval.json, checkpoints/
    model: dict = field(default_factory=lambda: {"preset": _recipe("preset")})  # {"preset": name, **overrides}
    init_from: str | None = None  # checkpoint file of a previous stage (see init_mode)
    init_mode: str = "weights"  # "weights" | "continue" (+ Adam moments and data position; new step count / LR)
    steps: int = _recipe("steps")
    micro_batch: int = _recipe("batch_size")  # rows per micro-batch per data-parallel rank (train.batch_size is
    # the global batch: build_job sets micro_batch = batch_size / (world_size x grad_accum))
    grad_accum: int = _recipe("grad_accum")  # global batch = micro_batch * grad_accum * world
    world_size: int = 0  # ranks the job was planned for (0: whatever the launcher starts); checked at start
    seq_len: int = 0  # 0: rows as stored; else rows re-packed from consecutive stored rows (repack.py)
    lr: float = _recipe("lr")
    min_lr: float = _recipe("min_lr")
    warmup_steps: int = _recipe("warmup_steps")
    weight_decay: float = _recipe("weight_decay")
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = _recipe("grad_clip")  # global-norm clip; <= 0 disables
    precision: str = _recipe("precision")  # "fp32" | "bf16" | "fp16" (see precision.py for the device/mode table)
    loss_scale: float = _recipe("loss_scale")  # initial dynamic loss scale (fp16 only)
    loss_scale_window: int = _recipe("loss_scale_window")  # good steps before the scale doubles (fp16 only)
    seed: int = 1234
    mode: str = _recipe("mode")  # "graph" (jitted step, default) | "pynative" (eager, for debugging)
    device: str = _recipe("device")  # "CPU" | "Ascend" | "GPU"
    threads: int = _recipe("threads")  # CPU intra-op threads; set to the cores the job owns
    checkpoint_every: int = _recipe("checkpoint_every")
    keep_checkpoints: int = _recipe("keep_checkpoints")
    stall_timeout_min: float = _recipe("stall_timeout_min")  # no step for this long: the job fails (0: never)
    log_every: int = 10  # log line period; status.json refreshes at each metrics fetch (metrics.jsonl: every step)
    peak_flops: float = 0.0  # peak FLOP/s of ONE device at this precision, for MFU; 0: MFU not reported
    replay_files: list = field(default_factory=list)  # MindRecord files of earlier releases read with data_dir
    eval_data: dict = field(default_factory=dict)  # {domain: MindRecord dir} evaluated at the end of the stage
    eval_tokens: int = _recipe("eval_tokens")  # tokens per domain evaluated (first rows in corpus order); 0: none
    tensor_parallel: int = _recipe("tensor_parallel")  # ranks per tensor-parallel group (inside a node)
    zero: bool = _recipe("zero")  # ZeRO-1: shard the Adam moments over the data-parallel ranks
    distributed_optimizer: bool = _recipe("distributed_optimizer")  # 16-bit weights, fp32 master shards (zero)
    grad_reduce: str = _recipe("grad_reduce")  # distributed optimizer + accumulation: "step" | "micro_batch"
    device_memory_gb: float = _recipe("device_memory_gb")  # > 0: refuse a layout whose memory plan exceeds it
    metrics_every: int = _recipe("metrics_every")  # host sync period: loss/metrics fetched every N steps
    fail_at_step: int | None = None  # tests only: crash after this step's checkpoint (see testing_hooks.py)
    fail_mode: str = "raise"  # tests only: "raise" | "kill" (SIGKILL) | "kill_between_saves" | "pause_after_fence"

    def __post_init__(self) -> None:
        # Long on purpose: one check per field (or group of like fields), each naming its field, in one place; the
        # model and layout checks come last because they need the fields checked above.
        def bad(name: str, why: str) -> ValueError:
            return ValueError(f"TrainJob.{name}={getattr(self, name)!r}: {why}")

        for name in ("stage", "data_dir", "out_dir"):
            v = getattr(self, name)
            if not isinstance(v, str) or not v:
                raise bad(name, "must be a non-empty string")
        if self.init_from is not None and (not isinstance(self.init_from, str) or not self.init_from):
            raise bad("init_from", "must be a checkpoint path or null")
        for name in ("init_mode", "precision", "mode", "device", "fail_mode"):
            if not isinstance(getattr(self, name), str):
                raise bad(name, "must be a string")
        if not isinstance(self.replay_files, list) or not all(isinstance(f, str) and f for f in self.replay_files):
            raise bad("replay_files", "must be a list of MindRecord file paths")
        if self.replay_files and self.seq_len:
            raise bad("replay_files", "a stage that re-packs to another seq_len reads its corpus alone")
        if not isinstance(self.model, dict):
            raise bad("model", "must be a dict like {'preset': 'debug', 'vocab_size': 32000}")
        for name in ("steps", "micro_batch", "grad_accum", "threads", "checkpoint_every", "keep_checkpoints",
                     "log_every", "loss_scale_window", "tensor_parallel", "metrics_every"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise bad(name, "must be a positive integer")
        for name in ("warmup_steps", "seed", "world_size", "seq_len", "eval_tokens"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise bad(name, "must be a non-negative integer")
        for name in ("lr", "min_lr", "weight_decay", "eps", "grad_clip", "beta1", "beta2", "loss_scale",
                     "peak_flops", "device_memory_gb"):
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
        if self.init_mode not in INIT_MODES:
            raise bad("init_mode", f"must be one of {INIT_MODES}")
        if not self.loss_scale >= 1:
            raise bad("loss_scale", "must be >= 1")
        if not isinstance(self.zero, bool):
            raise bad("zero", "must be true or false")
        if not isinstance(self.distributed_optimizer, bool):
            raise bad("distributed_optimizer", "must be true or false")
        if self.grad_reduce not in ("step", "micro_batch"):
            raise bad("grad_reduce", f"must be 'step' or 'micro_batch', got {self.grad_reduce!r}")
        if self.distributed_optimizer and (not self.zero or self.precision == "fp32"):
            raise bad("distributed_optimizer", "needs zero=true and precision fp16 or bf16 (16-bit weights)")
        if self.device_memory_gb < 0:
            raise bad("device_memory_gb", "must be >= 0 (0: no memory check)")
        if self.world_size and self.world_size % self.tensor_parallel:
            raise bad("tensor_parallel", f"must divide world_size={self.world_size}")
        if self.peak_flops < 0:
            raise bad("peak_flops", "must be >= 0 (0: no MFU)")
        if self.seq_len == 1:
            raise bad("seq_len", "must be 0 (as stored) or >= 2")
        if not isinstance(self.eval_data, dict) or not all(
                isinstance(k, str) and k and isinstance(v, str) and v for k, v in self.eval_data.items()):
            raise bad("eval_data", "must map domain names to MindRecord directories")
        if self.fail_mode not in ("raise", "kill", "kill_between_saves", "pause_after_fence"):
            raise bad("fail_mode", "must be 'raise', 'kill', 'kill_between_saves' or 'pause_after_fence'")
        check_precision(self.device, self.mode, self.precision)
        if self.fail_at_step is not None and (
            not isinstance(self.fail_at_step, int) or isinstance(self.fail_at_step, bool) or self.fail_at_step <= 0
        ):
            raise bad("fail_at_step", "must be a positive integer or null")
        if self.init_mode == "continue" and not self.init_from:
            raise bad("init_mode", "'continue' needs init_from (the previous stage's checkpoint)")
        cfg = self.model_config()  # validates the model dict; its error names the ModelConfig field
        check_layout(cfg, self.tensor_parallel)
        if self.seq_len > cfg.max_seq_len:
            raise bad("seq_len", f"exceeds the model's max_seq_len={cfg.max_seq_len}")
        segments = self.micro_batch * min(cfg.max_documents_per_row, self.seq_len or cfg.max_seq_len)
        if self.device == "Ascend" and cfg.eod_id >= 0 and segments > FLASH_MAX_SEGMENTS:
            raise bad("micro_batch", f"x model.max_documents_per_row = {segments} segments per flash-attention call, "
                      f"over the kernel's {FLASH_MAX_SEGMENTS}: lower either")

    def layout(self, world: int | None = None):
        """This job's parallel layout over ``world`` ranks (default: the ``world_size`` it was planned for)."""
        from .model.layout import ParallelLayout

        world = world or self.world_size or 1
        return ParallelLayout(tp=self.tensor_parallel, dp=max(1, world // self.tensor_parallel), zero=self.zero,
                              distributed_optimizer=self.distributed_optimizer)

    def global_batch(self, dp: int) -> int:
        """Rows per optimizer step over ``dp`` data-parallel replicas (each reads ``micro_batch x grad_accum``)."""
        return self.micro_batch * self.grad_accum * dp

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
        write_json(path, self.to_dict())

