"""The ablation's training runs: ``TrainingStageOperator`` mapped over arms x seeds.

Each mapped instance trains one proxy run exactly as a ``pretrain`` stage trains (detached job on the configured
backend, metrics in the log, a retry or a Clear of a failed run resumes from its newest checkpoint), but builds
its job from the run's arm config and seed and writes under the ablation run's folder
(``pipeline.tasks.ablation.run_config`` / ``run_dir``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from operators.training import TrainingStageOperator


class AblationTrainOperator(TrainingStageOperator):
    """One training run of an ablation: ``run`` is an item of ``pipeline.tasks.ablation.plan_runs``."""

    template_fields = (*TrainingStageOperator.template_fields, "run")

    def __init__(self, *, run: Any, **kwargs: Any) -> None:
        super().__init__(corpus=None, stage="main", **kwargs)
        self.run = run

    def execute(self, context: Any) -> Any:
        from operators.params import testing_switches_enabled

        self.corpus = self.run["corpus"]
        context["run_label"] = f"{self.run['arm']} seed {self.run['seed']}"
        params = context["params"]
        if testing_switches_enabled() and params.get("fail_at_step") and params.get("fail_arm") == self.run["arm"] \
                and context["ti"].try_number == 1:        # tests only: the first try of this arm crashes
            self.fail_at_step = int(params["fail_at_step"])
        return super().execute(context)

    def _config(self, context: Any):
        from pipeline.tasks.ablation import run_config

        return run_config(dict(context["params"]), context["run_id"], self.run)

    def _out_dir(self, context: Any) -> Path:
        from pipeline.tasks.ablation import run_dir

        return run_dir(dict(context["params"]), context["run_id"], self.run)
