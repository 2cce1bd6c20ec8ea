"""MindSpore pretraining library of mindloom: LLaMA-style model, TrainJob contract, resumable staged trainer.

At the top: ``config`` (TrainConfig/StageConfig recipe, ModelConfig, presets, closed-form parameter count, RoPE
tables), ``job`` (TrainJob JSON contract), ``trainer`` (one stage; ``pending_steps``: losses read back every N steps,
``testing_hooks``: the trainer's test switches such as ``fail_at_step``), ``data`` (rank-count-independent
MindDataset stream), ``repack`` (other context lengths) and ``evaluate`` (per-domain held-out loss); ``__main__`` is
``python -m pipeline.train --job job.json``. Four rooms: ``model/`` (the model, its tensor-parallel split, layout,
rank groups and memory plan), ``optim/`` (AdamW, schedule, loss scaling, gradient accumulation, precision table),
``checkpoint/`` (checkpoint files, cross-rank commits, resume, TP merge) and ``jobs/`` (launch, multi-node msrun,
Slurm, lease, fenced writes, metrics); each room's ``__init__`` says what it holds.

``config``, ``job``, ``optim.precision``, ``jobs.launch`` (process / msrun argv) and ``jobs.launcher`` (multi-node
msrun, ``python -m pipeline.train.jobs.launcher``) import no MindSpore and are usable from the Airflow side; the
model, the optimizer, data, repack, evaluate, checkpoint, metrics and trainer modules need the training venv
(mindspore 2.10, numpy 1.26).
"""

from .job import TrainJob
from .model.config import PRESETS, ModelConfig

__all__ = ["PRESETS", "ModelConfig", "TrainJob", "run_training"]


def run_training(job: TrainJob) -> dict:
    """Lazy wrapper so ``import pipeline.train`` stays MindSpore-free."""
    from .trainer import run_training as _run

    return _run(job)
