"""Bytes per device of a training layout, computed before any compile, and the refusal of a plan that cannot fit.

Why a closed form: a 70B job should fail in a second with "raise tensor_parallel", not after an hour of compile and
an out-of-memory kill. The numbers follow what this trainer actually allocates (no MindSpore import here):

* weights: fp32 parameters (mixed precision casts the compute, not the stored weights), split by TP except the
  replicated RMSNorm gains;
* gradients: fp32, same split as the weights; ``grad_accum > 1`` adds fp32 accumulation buffers of the same size;
* optimizer state: AdamW's two fp32 moments, split by TP and, with ZeRO-1, by the data-parallel ranks;
* activations: Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models") per layer,
  ``s*b*h*(10 + 24/t + 5*a*s/(h*t))`` bytes at 16-bit (x2 in fp32), or ``2*s*b*h`` with full recompute plus one
  layer being recomputed; plus the fp32 logits and their gradient ``2*b*s*V/t*4``.

A fraction ``HEADROOM`` of the device is kept free for the framework workspace and fragmentation.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .config import ModelConfig, check_layout  # noqa: F401 - check_layout is part of this module's API

GiB = 1 << 30
HEADROOM = 0.10
PRECISIONS = ("fp32", "bf16", "fp16")


@dataclass(frozen=True)
class Layout:
    """How one job is spread over devices. ``dp`` is the number of data-parallel replicas (world = tp * dp)."""

    tp: int = 1
    dp: int = 1
    zero: bool = False
    recompute: bool = False
    precision: str = "fp32"
    seq_len: int = 2048
    micro_batch: int = 1
    grad_accum: int = 1

    @property
    def world(self) -> int:
        return self.tp * self.dp


# A layout per preset that fits 64 GB devices (910B) under this trainer, 70b excepted (see README "Pretraining").
PRESET_LAYOUTS: dict[str, Layout] = {
    "debug": Layout(seq_len=256, micro_batch=8),
    "125m": Layout(dp=8, precision="bf16", seq_len=2048, micro_batch=8),
    "1b": Layout(dp=8, zero=True, precision="bf16", seq_len=2048, micro_batch=4, recompute=True),
    "7b": Layout(tp=4, dp=2, zero=True, recompute=True, precision="bf16", seq_len=4096, micro_batch=1),
    "13b": Layout(tp=8, dp=4, zero=True, recompute=True, precision="bf16", seq_len=4096, micro_batch=1),
    "70b": Layout(tp=8, dp=16, zero=True, recompute=True, precision="bf16", seq_len=4096, micro_batch=1),
}


def sharded_and_replicated_params(cfg: ModelConfig) -> tuple[int, int]:
    """(parameters split by TP, parameters every TP rank holds whole: the norm gains)."""
    replicated = (2 * cfg.n_layers + 1) * cfg.dim
    return cfg.num_params() - replicated, replicated


@dataclass(frozen=True)
class MemoryPlan:
    weights: int
    gradients: int
    optimizer: int
    activations: int
    device_bytes: int  # 0: no device limit declared

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.optimizer + self.activations

    @property
    def usable(self) -> int:
        return int(self.device_bytes * (1 - HEADROOM))

    @property
    def fits(self) -> bool:
        return self.device_bytes == 0 or self.total <= self.usable

    def to_dict(self) -> dict:
        return {**asdict(self), "total": self.total, "usable": self.usable, "fits": self.fits}

    def describe(self) -> str:
        parts = ", ".join(f"{k} {getattr(self, k) / GiB:.2f}" for k in
                          ("weights", "gradients", "optimizer", "activations"))
        limit = f" of {self.usable / GiB:.2f} usable" if self.device_bytes else ""
        return f"{self.total / GiB:.2f} GiB per device{limit} ({parts} GiB)"


def plan(cfg: ModelConfig, layout: Layout, device_memory_gb: float = 0.0) -> MemoryPlan:
    """Bytes per device of ``cfg`` trained with ``layout`` (see the module docstring for each term)."""
    if layout.precision not in PRECISIONS:
        raise ValueError(f"TrainJob.precision={layout.precision!r}: must be one of {PRECISIONS}")
    check_layout(cfg, layout.tp)
    t = layout.tp
    sharded, replicated = sharded_and_replicated_params(cfg)
    p_rank = -(-sharded // t) + replicated
    weights = 4 * p_rank
    gradients = 4 * p_rank * (2 if layout.grad_accum > 1 else 1)
    optimizer = 8 * p_rank // (layout.dp if layout.zero else 1)
    s, b, h, a = layout.seq_len, layout.micro_batch, cfg.dim, cfg.n_heads
    scale = 2 if layout.precision == "fp32" else 1
    full_layer = int(s * b * h * (10 + 24 / t + 5 * a * s / (h * t))) * scale
    if layout.recompute:
        act = cfg.n_layers * 2 * s * b * h * scale + full_layer
    else:
        act = cfg.n_layers * full_layer
    act += 2 * b * s * (cfg.vocab_size // t) * 4
    return MemoryPlan(weights, gradients, optimizer, act, int(device_memory_gb * GiB))


def knob_to_change(p: MemoryPlan, layout: Layout) -> str:
    """The setting that removes the largest term of an over-budget plan."""
    state = p.weights + p.gradients
    if p.activations >= max(state, p.optimizer):
        if not layout.recompute:
            return "enable model.recompute (activations are the largest term)"
        return "lower TrainJob.micro_batch (train.batch_size) or TrainJob.seq_len (activations are the largest term)"
    if p.optimizer >= state and not layout.zero and layout.dp > 1:
        return "set TrainJob.zero=true (shards the Adam moments over the data-parallel ranks)"
    return "raise TrainJob.tensor_parallel (weights and gradients are split only by tensor parallel)"


def require_fit(cfg: ModelConfig, layout: Layout, device_memory_gb: float) -> MemoryPlan:
    """The plan, or ValueError naming ``TrainJob.device_memory_gb`` and the knob to change when it does not fit."""
    p = plan(cfg, layout, device_memory_gb)
    if not p.fits:
        raise ValueError(f"TrainJob.device_memory_gb={device_memory_gb}: plan needs {p.describe()} with "
                         f"tp={layout.tp} dp={layout.dp} zero={layout.zero} recompute={layout.recompute} "
                         f"precision={layout.precision}; {knob_to_change(p, layout)}")
    return p


def job_layout(job, world: int, seq_len: int, recompute: bool) -> Layout:
    """The layout a started ``TrainJob`` runs with (``world`` ranks from the launcher)."""
    tp = job.tensor_parallel
    return Layout(tp=tp, dp=max(1, world // tp), zero=job.zero, recompute=recompute, precision=job.precision,
                  seq_len=seq_len, micro_batch=job.micro_batch, grad_accum=job.grad_accum)
