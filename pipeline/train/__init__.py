"""MindSpore pretraining library of mindloom: LLaMA-style model, TrainJob contract, resumable staged trainer.

Modules: ``config`` (TrainConfig/StageConfig recipe, ModelConfig, presets, closed-form parameter count, RoPE tables),
``job`` (TrainJob JSON contract), ``precision`` (device x mode x precision table), ``launch`` (process / msrun argv)
and ``launcher`` (multi-node msrun, ``python -m pipeline.train.launcher``) import no MindSpore and are usable from
the Airflow side. ``model``, ``optim`` (AdamW, schedule, loss scaling, gradient accumulation), ``data``
(rank-count-independent MindDataset stream), ``repack`` (other context lengths), ``evaluate`` (per-domain
held-out loss), ``checkpoint``, ``metrics`` and ``trainer`` need the training venv (mindspore 2.10, numpy 1.26);
``testing_hooks`` holds the trainer's test switches (``fail_at_step``).
"""

from .config import PRESETS, ModelConfig
from .job import TrainJob

__all__ = ["PRESETS", "ModelConfig", "TrainJob", "run_training"]


def run_training(job: TrainJob) -> dict:
    """Lazy wrapper so ``import pipeline.train`` stays MindSpore-free."""
    from .trainer import run_training as _run

    return _run(job)
