"""The training recipe of the composite config (``train:`` in the YAML) with no MindSpore import: ``TrainConfig``
and ``StageConfig``.  The architecture they name is ``model/config.py``'s ``ModelConfig``.

``TrainConfig`` holds the one default of every recipe field; the per-stage ``TrainJob`` (``job.py``) is derived from
it by :func:`pipeline.tasks.pretrain.build_job`.
"""

from __future__ import annotations

import copy
import dataclasses
import re
import typing
from dataclasses import dataclass

from pipeline.configkit import ConfigError, _convert, _f

from .model.config import ModelConfig, check_layout
from .optim.precision import check_precision


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
