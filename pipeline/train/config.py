"""Training settings with no MindSpore import: the model architecture (``ModelConfig``, presets, closed-form
parameter count, RoPE tables) and the recipe of the composite config (``TrainConfig``, ``StageConfig``).

Kept apart from ``model.py`` so job validation (and DAG-side code in the Airflow venv) can check a model config
without importing MindSpore.  ``TrainConfig`` holds the one default of every recipe field; the per-stage
``TrainJob`` (``job.py``) is derived from it by :func:`pipeline.tasks.pretrain.build_job`.
"""

from __future__ import annotations

import copy
import dataclasses
import re
import typing
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING

from pipeline.configkit import ConfigError, _convert, _f

from .optim.precision import check_precision

if TYPE_CHECKING:                # numpy loads with the model code, not with the config every task imports
    import numpy as np

ROPE_SCALING_TYPES = ("none", "ntk", "linear")


def llama_ffn_hidden(dim: int, multiple_of: int, ffn_dim_multiplier: float | None = None) -> int:
    """SwiGLU hidden size as in Meta's LLaMA: 2/3 of 4*dim (same FLOPs as a 4*dim GELU MLP), rounded up."""
    hidden = int(2 * (4 * dim) / 3)
    if ffn_dim_multiplier:
        hidden = int(ffn_dim_multiplier * hidden)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


@dataclass
class ModelConfig:
    """Architecture hyper-parameters. ``ffn_hidden=0`` means "derive llama-style from ``multiple_of``"."""

    vocab_size: int = 32000
    dim: int = 768
    n_layers: int = 12
    n_heads: int = 12
    n_kv_heads: int = 0  # 0 -> n_heads (plain MHA); < n_heads -> grouped-query attention
    ffn_hidden: int = 0
    multiple_of: int = 256
    ffn_dim_multiplier: float | None = None
    max_seq_len: int = 2048
    rope_theta: float = 10000.0
    rope_scaling_type: str = "none"
    rope_scaling_factor: float = 1.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = False
    recompute: bool = False
    init_std: float = 0.02
    pad_id: int = -100  # label id excluded from the loss; -100 (never a real token) disables padding
    eod_id: int = -1  # >= 0: a token attends only within its document, which ends at this id; -1: causal only
    reset_positions: bool = False  # RoPE positions count from each document's start (needs eod_id >= 0)
    max_documents_per_row: int = 128  # flash attention's variable-length form: boundaries kept per row (Ascend)

    def __post_init__(self) -> None:
        def bad(name: str, why: str) -> ValueError:
            return ValueError(f"ModelConfig.{name}={getattr(self, name)!r}: {why}")

        for name in ("vocab_size", "dim", "n_layers", "n_heads", "max_seq_len", "multiple_of"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise bad(name, "must be a positive integer")
        for name in ("n_kv_heads", "ffn_hidden"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise bad(name, "must be a non-negative integer (0 = derive)")
        if self.n_kv_heads == 0:
            self.n_kv_heads = self.n_heads
        if self.dim % self.n_heads:
            raise bad("dim", f"must be divisible by n_heads={self.n_heads}")
        if (self.dim // self.n_heads) % 2:
            raise bad("n_heads", "head_dim = dim // n_heads must be even for RoPE")
        if self.n_kv_heads > self.n_heads or self.n_heads % self.n_kv_heads:
            raise bad("n_kv_heads", f"must divide n_heads={self.n_heads}")
        if self.ffn_hidden == 0:
            self.ffn_hidden = llama_ffn_hidden(self.dim, self.multiple_of, self.ffn_dim_multiplier)
        if not self.rope_theta > 0:
            raise bad("rope_theta", "must be > 0")
        if self.rope_scaling_type not in ROPE_SCALING_TYPES:
            raise bad("rope_scaling_type", f"must be one of {ROPE_SCALING_TYPES}")
        if not self.rope_scaling_factor >= 1.0:
            raise bad("rope_scaling_factor", "must be >= 1.0")
        if not 0 < self.norm_eps < 1:
            raise bad("norm_eps", "must be in (0, 1)")
        if not self.init_std > 0:
            raise bad("init_std", "must be > 0")
        if not isinstance(self.pad_id, int) or self.pad_id >= self.vocab_size:
            raise bad("pad_id", f"must be an int < vocab_size={self.vocab_size} (negative = no padding)")
        if (not isinstance(self.eod_id, int) or isinstance(self.eod_id, bool)
                or not -1 <= self.eod_id < self.vocab_size):
            raise bad("eod_id", f"must be -1 (causal mask only) or a token id < vocab_size={self.vocab_size}")
        if not isinstance(self.reset_positions, bool):
            raise bad("reset_positions", "must be true or false")
        if self.reset_positions and self.eod_id < 0:
            raise bad("reset_positions", "needs document boundaries: eod_id >= 0 (train.document_attention on a "
                      "corpus whose manifest names its eos_id)")
        if (not isinstance(self.max_documents_per_row, int) or isinstance(self.max_documents_per_row, bool)
                or self.max_documents_per_row < 1):
            raise bad("max_documents_per_row", "must be a positive integer")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @classmethod
    def from_preset(cls, name: str, **overrides) -> ModelConfig:
        """Preset + overrides; unknown override keys raise ValueError naming them."""
        if name not in PRESETS:
            raise ValueError(f"ModelConfig preset={name!r}: unknown, choose from {sorted(PRESETS)}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise ValueError(f"ModelConfig.{unknown[0]}: unknown field (known: {sorted(known)})")
        base = dict(PRESETS[name])
        if "multiple_of" in overrides or "dim" in overrides or "ffn_dim_multiplier" in overrides:
            base.pop("ffn_hidden", None)  # let it be re-derived unless overridden explicitly
        base.update(overrides)
        return cls(**base)

    def to_dict(self) -> dict:
        return asdict(self)

    def num_params(self) -> int:
        """Closed-form parameter count; equals the built Cell's count (checked in tests)."""
        d, hd = self.dim, self.head_dim
        attn = d * self.n_heads * hd + 2 * d * self.n_kv_heads * hd + self.n_heads * hd * d
        mlp = 3 * d * self.ffn_hidden
        per_layer = attn + mlp + 2 * d  # + attention_norm, ffn_norm
        emb = self.vocab_size * d
        head = 0 if self.tie_embeddings else self.vocab_size * d
        return emb + self.n_layers * per_layer + d + head


# Sizes follow published LLaMA-family models (125m: GPT-3 small shape; 1b: TinyLlama-1.1B; 7b/13b: LLaMA-1/2;
# 70b: LLaMA-2-70B with GQA). "debug" is ~2M params so GRAPH compile + a few steps fit a 2-core CPU.
PRESETS: dict[str, dict] = {
    "debug": dict(vocab_size=4096, dim=128, n_layers=4, n_heads=4, n_kv_heads=2, multiple_of=32, max_seq_len=256),
    "125m": dict(vocab_size=32000, dim=768, n_layers=12, n_heads=12, n_kv_heads=12, max_seq_len=2048),
    "1b": dict(vocab_size=32000, dim=2048, n_layers=22, n_heads=32, n_kv_heads=4, ffn_hidden=5632, max_seq_len=2048),
    "7b": dict(vocab_size=32000, dim=4096, n_layers=32, n_heads=32, n_kv_heads=32, ffn_hidden=11008,
               max_seq_len=4096),
    "13b": dict(vocab_size=32000, dim=5120, n_layers=40, n_heads=40, n_kv_heads=40, ffn_hidden=13824,
                max_seq_len=4096),
    "70b": dict(vocab_size=32000, dim=8192, n_layers=80, n_heads=64, n_kv_heads=8, ffn_hidden=28672,
                max_seq_len=4096),
}


def rope_tables(cfg: ModelConfig) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin tables ``[max_seq_len, head_dim]`` (half-split layout, matching ``rotate_half``).

    NTK-aware scaling raises the base: ``theta * factor ** (d / (d - 2))`` (keeps high frequencies, stretches low
    ones); linear scaling (position interpolation) divides positions by ``factor``.
    """
    import numpy as np

    d = cfg.head_dim
    theta = cfg.rope_theta
    pos = np.arange(cfg.max_seq_len, dtype=np.float64)
    if cfg.rope_scaling_type == "ntk":
        theta = theta * cfg.rope_scaling_factor ** (d / (d - 2))
    elif cfg.rope_scaling_type == "linear":
        pos = pos / cfg.rope_scaling_factor
    inv_freq = 1.0 / theta ** (np.arange(0, d, 2, dtype=np.float64) / d)
    ang = np.outer(pos, inv_freq)
    ang = np.concatenate([ang, ang], axis=-1)
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def causal_mask(n: int) -> np.ndarray:
    """Additive mask: 0 on/below the diagonal, -1e9 above (finite, so fp32 softmax never sees inf - inf)."""
    import numpy as np

    return np.triu(np.full((n, n), -1e9, dtype=np.float32), k=1)


# --------------------------------------------------------------------------------------------------------------
# The training recipe of the composite config (``train:`` in the YAML); pipeline/tasks/pretrain.py derives each
# stage's TrainJob from it.


@dataclass
class StageConfig:
    """One named training stage (``mindloom train --stage NAME``); unset values inherit ``train.*``."""

    name: str = _f(desc="Stage name: its folder <data_root>/train/<run id>/<name> and its DAG task.")
    seq_len: int = _f(0, desc="Context length of this stage; 0: the corpus rows. Otherwise a multiple or divisor of "
                      "the corpus seq_len: rows are re-packed from consecutive corpus rows.", ge=0)
    init: str = _f("previous", desc="previous: weights of the preceding stage's final checkpoint (the first stage "
                   "starts fresh); continue: also its Adam moments and data position (same global batch and "
                   "seq_len); scratch: fresh weights.", choices=("previous", "continue", "scratch"))
    overrides: dict = _f(factory=dict, desc="train.* fields for this stage only, e.g. {steps: 200, lr: 3e-4}.")
    model_overrides: dict = _f(factory=dict, desc="ModelConfig fields for this stage only, e.g. "
                               "{rope_scaling_type: ntk, rope_scaling_factor: 4.0}; shapes must not change.")


@dataclass
class TrainConfig:
    """Recipe of the pretraining job; ``stages`` run in order, each overriding what it needs."""

    preset: str = _f("debug", desc="Model preset.", choices=("debug", "125m", "1b", "7b", "13b", "70b"))
    model_overrides: dict = _f(factory=dict, desc="ModelConfig fields overriding the preset (e.g. dim, n_layers).")
    steps: int = _f(30, desc="Optimizer steps of a stage (stages may override).", ge=1)
    batch_size: int = _f(8, desc="Rows per optimizer step (global: split over workers and grad_accum).", ge=1)
    grad_accum: int = _f(1, desc="Micro-batches accumulated per optimizer step.", ge=1)
    lr: float = _f(3e-3, desc="Peak learning rate.", ge=0)
    min_lr: float = _f(3e-4, desc="Learning rate at the end of the cosine decay.", ge=0)
    warmup_steps: int = _f(5, desc="Linear warmup steps.", ge=0)
    weight_decay: float = _f(0.1, desc="AdamW weight decay (not applied to norms and embeddings).", ge=0)
    grad_clip: float = _f(1.0, desc="Global gradient-norm clip.", ge=0)
    device: str = _f("CPU", desc="MindSpore device target.", choices=("CPU", "Ascend", "GPU"))
    precision: str = _f("fp32", desc="fp32, bf16, or fp16 with dynamic loss scaling (CPU: fp32, fp16 in graph "
                        "mode only; Ascend: bf16 recommended).", choices=("fp32", "bf16", "fp16"))
    loss_scale: float = _f(65536.0, desc="Initial dynamic loss scale (fp16 only).", ge=1)
    loss_scale_window: int = _f(1000, desc="Overflow-free steps before the loss scale doubles (fp16 only).", ge=1)
    recompute: bool = _f(False, desc="Recompute each decoder block in the backward pass (less activation memory).")
    document_attention: bool = _f(True, desc="A token attends only within its own document of a packed row (the "
                                  "corpus' end-of-document token ends it; it survives re-packing). false: causal "
                                  "attention across the whole row.")
    reset_positions: bool = _f(False, desc="RoPE positions restart at 0 in each document of a packed row "
                               "(Megatron's reset_position_ids); needs document_attention.")
    mode: str = _f("graph", desc="MindSpore execution mode.", choices=("graph", "pynative"))
    threads: int = _f(2, desc="CPU threads per worker.", ge=1)
    workers: int = _f(1, desc="Ranks launched in all, over every node (msrun or srun tasks when > 1): "
                      "tensor_parallel x data-parallel ranks.", ge=1)
    max_workers: int = _f(8, desc="Most ranks one node of this deployment runs (its devices); workers / nodes "
                          "may not exceed it, and the trigger form cannot ask for more. Deployment config only.", ge=1)
    backend: str = _f("local", desc="Where a stage's job runs: local (msrun on the Airflow worker's host, one "
                      "node) or slurm (one sbatch job over train.nodes nodes, one srun task per rank; the DAG "
                      "polls Slurm and scancels on a stop).", choices=("local", "slurm"))
    nodes: int = _f(1, desc="Nodes of a stage's job (backend slurm; local runs one). Must divide workers; each "
                    "node runs workers / nodes ranks.", ge=1)
    slurm_partition: str = _f("", desc="sbatch --partition of the jobs (empty: the cluster's default).")
    slurm_args: list[str] = _f(factory=list, desc="Extra sbatch options, one per item, e.g. ['--account=llm', "
                               "'--time=72:00:00', '--gpus-per-node=8'].")
    slurm_setup: list[str] = _f(factory=list, desc="Shell lines the Slurm batch script runs before srun, in the "
                                "job's clean environment, e.g. ['source /usr/local/Ascend/ascend-toolkit/set_env.sh', "
                                "'module load cann']. Their exports reach every rank.")
    slurm_container: str = _f("", desc="Container image every rank runs in (srun --container-image, pyxis/enroot "
                              "sites); empty: none.")
    slurm_cpus_per_task: int = _f(0, desc="srun --cpus-per-task of each rank (and SRUN_CPUS_PER_TASK); 0: Slurm's "
                                  "default.", ge=0)
    python: str = _f("", desc="Interpreter the ranks run on the compute nodes (backend slurm), e.g. a venv's "
                     "bin/python or a wrapper script; empty: the one running the Airflow task.")
    env: list[str] = _f(factory=list, desc="KEY=VALUE pairs passed to every rank of a Slurm job, e.g. "
                        "['HCCL_CONNECT_TIMEOUT=1800', 'HCCL_SOCKET_IFNAME=eth0', 'MS_TOPO_TIMEOUT=3600']. The job "
                        "starts from an empty environment (sbatch --export=NONE) plus these and the few the "
                        "trainer needs: nothing else of the Airflow worker's.")
    tensor_parallel: int = _f(1, desc="Ranks per tensor-parallel group (inside one node); must divide workers.",
                              ge=1)
    zero: bool = _f(False, desc="ZeRO-1: shard the Adam moments over the data-parallel ranks.")
    distributed_optimizer: bool = _f(False, desc="Megatron's distributed optimizer (needs zero: true and precision "
                                     "fp16 or bf16): 16-bit weights and gradients on each rank, fp32 master "
                                     "weights and Adam moments sharded over the data-parallel ranks.")
    grad_reduce: str = _f("step", desc="Under the distributed optimizer with grad_accum > 1: step: each rank "
                          "adds its micro-batches' gradients into a whole fp32 buffer (4 bytes per parameter of "
                          "the rank) and they are reduce-scattered once per optimizer step (Megatron's); "
                          "micro_batch: each micro-batch's gradients are reduce-scattered at once and only the "
                          "rank's fp32 blocks accumulate (1/DP of that buffer, grad_accum times the traffic: what "
                          "the 70b layout needs to fit). Otherwise gradients are reduced once per step.",
                          choices=("step", "micro_batch"))
    device_memory_gb: float = _f(0.0, desc="Memory of one device in GB; > 0: refuse a layout whose memory plan "
                                 "exceeds it (0: no check).", ge=0)
    metrics_every: int = _f(10, desc="Fetch loss and metrics from the device every N steps (fewer host syncs).",
                            ge=1)
    checkpoint_every: int = _f(10, desc="Checkpoint every N steps.", ge=1)
    keep_checkpoints: int = _f(3, desc="Checkpoints kept per stage.", ge=1)
    stall_timeout_min: float = _f(30.0, desc="Fail a stage's job when no optimizer step finishes for this many "
                                  "minutes (the first step includes the graph compile), with its last log lines; "
                                  "0: never.", ge=0)
    stage_timeout_h: float = _f(0.0, desc="Airflow execution_timeout of each training stage task, in hours "
                                "(0: none). A timeout kills the task, which cancels its job.", ge=0)
    peak_tflops: float = _f(0.0, desc="Peak TFLOP/s of one device at this precision, for MFU (0: no MFU).", ge=0)
    eval_tokens: int = _f(65536, desc="Validation tokens per domain scored after each stage (0: no evaluation).",
                          ge=0)
    from_release: str = _f("scratch", desc="On a corpus that extends an earlier release (an incremental refresh): "
                           "weights: the first stage starts from the final committed checkpoint of the newest "
                           "training run on that release (its last stage), the model continues on the delta; "
                           "scratch: fresh weights.", choices=("scratch", "weights"))
    replay_share: float = _f(0.0, desc="On a corpus that extends an earlier release: the share of training rows "
                             "drawn from the releases before it (whole MindRecord files, chosen by seed; the "
                             "achieved share is reported), mixed with the delta against forgetting. Stages that "
                             "re-pack to another seq_len read the delta alone. 0: the delta alone.", ge=0.0, le=0.9)
    stages: list[StageConfig] = _f(factory=list, desc="Named stages run in order (empty: one stage 'main').")

    def __post_init__(self) -> None:
        try:
            ModelConfig.from_preset(self.preset, **self.model_overrides)
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"train.model_overrides: {exc}") from None
        try:
            check_precision(self.device, self.mode, self.precision)
        except ValueError as exc:
            raise ConfigError(f"train.precision: {str(exc).split(': ', 1)[1]}") from None
        if self.backend == "local" and self.nodes != 1:
            raise ConfigError(f"train.nodes: the local backend runs one node, got {self.nodes} (set train.backend: "
                              f"slurm for several)")
        if self.workers % self.nodes:
            raise ConfigError(f"train.nodes: must divide train.workers ({self.workers}), got {self.nodes}")
        if self.workers // self.nodes > self.max_workers:
            over = "" if self.nodes == 1 else (f" over {self.nodes} nodes ({self.workers // self.nodes} per node, "
                                               f"more than one node runs)")
            raise ConfigError(f"train.workers: {self.workers} is more than this deployment launches{over} "
                              f"(train.max_workers = {self.max_workers})")
        if (self.workers // self.nodes) % self.tensor_parallel:
            raise ConfigError(f"train.tensor_parallel: must divide the ranks of one node (train.workers / "
                              f"train.nodes = {self.workers // self.nodes}), got {self.tensor_parallel}")
        bad = [a for a in self.slurm_args if not isinstance(a, str) or not a.startswith("--") or "\n" in a]
        if bad:
            raise ConfigError(f"train.slurm_args: each item must be one '--option[=value]' string, got {bad[0]!r}")
        bad = [line for line in self.slurm_setup if "\n" in line or "\r" in line]
        if bad:
            raise ConfigError(f"train.slurm_setup: one shell line per item, got {bad[0]!r}")
        for i, pair in enumerate(self.env):
            key = pair.split("=", 1)[0]
            if "=" not in pair or not key.replace("_", "a").isalnum() or key[0].isdigit() or "\n" in pair:
                raise ConfigError(f"train.env[{i}]: must be KEY=VALUE with KEY a shell variable name, got {pair!r}")
        try:
            check_layout(ModelConfig.from_preset(self.preset, **self.model_overrides), self.tensor_parallel,
                         where="train.tensor_parallel")
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if self.distributed_optimizer and not self.zero:
            raise ConfigError("train.distributed_optimizer: needs train.zero=true (it shards the ZeRO-1 state "
                              "further: fp32 master weights too)")
        if self.distributed_optimizer and self.precision == "fp32":
            raise ConfigError("train.distributed_optimizer: needs train.precision fp16 or bf16 (16-bit weights), "
                              "got fp32")
        if self.min_lr > self.lr:  # the pair checks of _check_cross_fields, before the stages inherit them
            raise ConfigError(f"train.min_lr: must be <= train.lr ({self.lr}), got {self.min_lr}")
        if self.warmup_steps >= self.steps:
            raise ConfigError(f"train.warmup_steps: must be < train.steps ({self.steps}), got {self.warmup_steps}")
        self._check_stages()

    def _check_stages(self) -> None:
        """``train.stages``: names, per-stage overrides (converted in place to the field's type), and the pair checks
        on each stage's effective settings, blaming the override that broke the pair."""
        hints = typing.get_type_hints(TrainConfig)
        known = {f.name: f for f in dataclasses.fields(TrainConfig) if f.name not in _NOT_PER_STAGE}
        seen: set[str] = set()
        for i, st in enumerate(self.stages):
            where = f"train.stages[{i}]"
            if not re.fullmatch(r"[a-z0-9][a-z0-9_-]{0,63}", st.name or ""):
                raise ConfigError(f"{where}.name: must be 1-64 of a-z 0-9 _ - (starting alphanumeric), "
                                  f"got {st.name!r}")
            if st.name in seen:
                raise ConfigError(f"{where}.name: duplicate stage name {st.name!r}")
            seen.add(st.name)
            for key, value in list(st.overrides.items()):
                if key not in known:
                    raise ConfigError(f"{where}.overrides.{key}: not a per-stage train field "
                                      f"(allowed: {', '.join(sorted(known))})")
                st.overrides[key] = _convert(value, hints[key], f"{where}.overrides.{key}", dict(known[key].metadata))
            eff = self.stage_settings(st.name)

            def blame(a: str, b: str, _st=st, _where=where) -> str:  # the override that broke the pair
                return f"{_where}.overrides.{a if a in _st.overrides or b not in _st.overrides else b}"

            if eff["min_lr"] > eff["lr"]:
                raise ConfigError(f"{blame('min_lr', 'lr')}: min_lr must be <= lr ({eff['lr']}), "
                                  f"got {eff['min_lr']}")
            if eff["warmup_steps"] > eff["steps"]:
                raise ConfigError(f"{blame('warmup_steps', 'steps')}: warmup_steps must be <= steps "
                                  f"({eff['steps']}), got {eff['warmup_steps']}")
            try:
                check_precision(eff["device"], eff["mode"], eff["precision"])
            except ValueError as exc:
                raise ConfigError(f"{where}.overrides.precision: {str(exc).split(': ', 1)[1]}") from None
            if i == 0 and st.init == "continue":
                raise ConfigError(f"{where}.init: 'continue' needs a preceding stage")
            if i > 0 and st.init == "continue" and st.seq_len != self.stages[i - 1].seq_len:
                raise ConfigError(f"{where}.init: 'continue' keeps the data position, so seq_len must equal the "
                                  f"preceding stage's ({self.stages[i - 1].seq_len})")
            try:
                ModelConfig.from_preset(self.preset, **{**self.model_overrides, **st.model_overrides})
            except (ValueError, TypeError) as exc:
                raise ConfigError(f"{where}.model_overrides: {exc}") from None

    def layout(self, stage: str | None = None):
        """The parallel layout of ``stage`` (default: ``train.*``): the one the job, the memory plan and the
        launchers use."""
        from .model.layout import ParallelLayout

        st = self.stage_settings(stage) if stage else {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return ParallelLayout(tp=st["tensor_parallel"], dp=st["workers"] // st["tensor_parallel"], zero=st["zero"],
                              distributed_optimizer=st["distributed_optimizer"], nodes=self.nodes)

    def stage_list(self) -> list[StageConfig]:
        """The stages in order (one implicit stage ``main`` when none are configured)."""
        return list(self.stages) or [StageConfig(name="main")]

    def stage_settings(self, name: str) -> dict:
        """Effective train.* values of stage ``name`` plus ``name``, ``index``, ``seq_len``, ``init``,
        ``previous`` (name or None) and ``model_overrides`` (train's, then the stage's)."""
        stages = self.stage_list()
        idx = next((i for i, s in enumerate(stages) if s.name == name), None)
        if idx is None:
            raise ConfigError(f"train.stages: no stage named {name!r} (configured: {[s.name for s in stages]})")
        st = stages[idx]
        eff = {f.name: copy.deepcopy(getattr(self, f.name)) for f in dataclasses.fields(self)
               if f.name not in _NOT_PER_STAGE}
        eff.update(copy.deepcopy(st.overrides))
        eff.update(name=st.name, index=idx, seq_len=st.seq_len, init=st.init, preset=self.preset,
                   previous=stages[idx - 1].name if idx else None,
                   model_overrides={**self.model_overrides, **st.model_overrides})
        return eff


_NOT_PER_STAGE = ("preset", "model_overrides", "stages", "from_release", "replay_share", "backend", "nodes",
                  "slurm_partition", "slurm_args", "slurm_setup", "slurm_container", "slurm_cpus_per_task", "python",
                  "env")


def check_layout(cfg: ModelConfig, tp: int, where: str = "TrainJob.tensor_parallel") -> None:
    """The head/vocab/FFN splits tensor parallel needs; the error names the field."""
    if tp < 1:
        raise ValueError(f"{where}={tp}: must be >= 1")
    for name, n in (("n_heads", cfg.n_heads), ("n_kv_heads", cfg.n_kv_heads), ("vocab_size", cfg.vocab_size),
                    ("ffn_hidden", cfg.ffn_hidden)):
        if n % tp:
            raise ValueError(f"{where}={tp}: must divide ModelConfig.{name}={n}")
