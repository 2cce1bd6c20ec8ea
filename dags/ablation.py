"""ablation: does this chain train a better model? Arms (corpus variants named in ``ablation.arms``) trained as
small proxies on matched mixtures, several seeds each, scored in bits per byte on references held out before
ingest, with intervals, an A/A noise floor and verdicts (``pipeline/ablation/``, ``pipeline/tasks/ablation.py``).

``split`` ingests the sources once and holds the references out; ``build_arm`` (mapped per arm) builds each arm's
corpus through the corpus chain's task functions; ``train`` (mapped per arm x seed, and the A/A pair) trains on the
configured backend like a ``pretrain`` stage: a cleared failed run resumes from its newest checkpoint; ``score``
(mapped) measures each checkpoint; ``report`` writes ``report.json`` / ``report.md`` under
``<data_root>/ablation/<run id>/``. Triggered by hand; the settings come from the deployment's config.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import Param, dag, get_current_context, task

from operators.ablation import AblationTrainOperator
from operators.params import config_path, testing_switches_enabled
from operators.routing import data_task_kwargs, train_task_kwargs
from pipeline.config import load_config

CFG = load_config(config_path())
# Test switches (MINDLOOM_TESTING_SWITCHES=1 only): the first try of arm fail_arm's runs crashes after fail_at_step.
PARAMS = {"fail_at_step": Param(None, type=["null", "integer"], minimum=1, title="Fail at step"),
          "fail_arm": Param("", type="string", title="Arm whose runs fail once")} if testing_switches_enabled() else {}


@dag(
    dag_id="ablation",
    schedule=None,
    start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    params=PARAMS,
    tags=["mindloom", "ablation"],
    default_args={"retries": CFG.airflow.train_retries, "retry_delay": pendulum.duration(seconds=5),
                  **data_task_kwargs()},
    doc_md=__doc__,
)
def ablation():
    @task(multiple_outputs=False)
    def split(params=None, run_id=None) -> list[str]:
        from pipeline.tasks.ablation import split as run

        return run(dict(params), run_id)["arms"]

    @task(multiple_outputs=False, map_index_template="{{ arm_label }}")
    def build_arm(arm: str, params=None, run_id=None) -> dict:
        from pipeline.tasks.ablation import build_arm as run

        get_current_context()["arm_label"] = arm
        return run(dict(params), run_id, arm)

    @task(multiple_outputs=False)
    def plan_runs(built: list[dict], params=None, run_id=None) -> list[dict]:
        from pipeline.tasks.ablation import plan_runs as run

        return run(dict(params), run_id, list(built))

    @task(multiple_outputs=False, map_index_template="{{ run_label }}")
    def score(run: dict, params=None, run_id=None) -> dict:
        from pipeline.tasks.ablation import score as run_score

        get_current_context()["run_label"] = f"{run['arm']} seed {run['seed']}"
        return run_score(dict(params), run_id, run)

    @task(multiple_outputs=False)
    def report(scored: list[dict], built: list[dict], params=None, run_id=None) -> dict:
        from pipeline.tasks.ablation import report as run

        return run(dict(params), run_id, list(scored), list(built))

    built = build_arm.expand(arm=split())
    runs = plan_runs(built)
    trained = AblationTrainOperator.partial(task_id="train", map_index_template="{{ run_label }}",
                                            **train_task_kwargs()).expand(run=runs)
    scored = score.expand(run=runs)
    trained >> scored
    report(scored, built)


ablation()
