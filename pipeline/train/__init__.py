"""MindSpore pretraining library of mindloom: LLaMA-style model, TrainJob contract, resumable trainer.

``config`` and ``job`` import no MindSpore (usable from the Airflow venv); ``model``, ``trainer``, ``data``,
``checkpoint`` and ``optim`` need the training venv (mindspore 2.10, numpy 1.26).
"""

from .config import PRESETS, ModelConfig
from .job import TrainJob

__all__ = ["PRESETS", "ModelConfig", "TrainJob", "run_training"]


def run_training(job: TrainJob) -> dict:
    """Lazy wrapper so ``import pipeline.train`` stays MindSpore-free."""
    from .trainer import run_training as _run

    return _run(job)
