"""pretrain: train the LLaMA-style MindSpore model on the latest published corpus, stage by stage.

One ``train_<stage>`` task per entry of ``train.stages`` (warmup → main → long_context by default), each followed
by ``eval_<stage>`` (held-out loss and perplexity per domain), then ``report``.

Scheduled on the ``mindloom_corpus`` Asset (a finished ``corpus_build`` run triggers it) and triggerable by hand.
The training stage runs as a detached job through ``TrainingStageOperator``; its summary (losses, tokens/s,
checkpoint) is the stage task's XCom and is collected by ``report``.  Clearing a failed stage re-runs it, and the
job resumes from the stage's newest checkpoint.
"""

from __future__ import annotations

import os

import pendulum
from airflow.sdk import Param, dag, task

from operators.params import build_params, config_path, corpus_asset
from operators.routing import data_task_kwargs, train_task_kwargs
from operators.training import TrainingStageOperator
from pipeline.config import load_config
from pipeline.tasks.pretrain import stage_names

CORPUS = corpus_asset()
STAGES = stage_names(load_config(config_path()))      # train.stages of the deployment's config, in order
# Optional cron next to the Asset (MINDLOOM_PRETRAIN_CRON, e.g. "0 4 * * 0") makes the DAG backfillable.
_CRON = os.environ.get("MINDLOOM_PRETRAIN_CRON", "")
if _CRON:
    from airflow.sdk import AssetOrTimeSchedule
    from airflow.timetables.trigger import CronTriggerTimetable

    SCHEDULE = AssetOrTimeSchedule(timetable=CronTriggerTimetable(_CRON, timezone="UTC"), assets=[CORPUS])
else:
    SCHEDULE = [CORPUS]


@dag(
    dag_id="pretrain",
    schedule=SCHEDULE,
    start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    params={**build_params("train"),
            "corpus_manifest": Param("", type="string", title="Corpus summary",
                                     description="Path of a corpus_summary.json; empty: the triggering Asset "
                                                 "event, else the latest published corpus."),
            "fail_at_step": Param(None, type=["null", "integer"], title="Fail at step (testing)",
                                  description="Simulate a crash after this step's checkpoint (first try only)."),
            "fail_stage": Param(STAGES[-1] if "main" not in STAGES else "main", type="string", enum=STAGES,
                                title="Stage that fails (testing)", description="Stage fail_at_step applies to.")},
    tags=["mindloom", "train"],
    default_args={"retries": int(os.environ.get("MINDLOOM_TRAIN_RETRIES", "1")),
                  "retry_delay": pendulum.duration(seconds=5), **data_task_kwargs()},
    doc_md=__doc__,
)
def pretrain():
    @task(multiple_outputs=False)
    def resolve_corpus(params=None, triggering_asset_events=None) -> dict:
        from pipeline.tasks.pretrain import resolve_corpus as run

        events = [e.extra for evs in (triggering_asset_events or {}).values() for e in evs]
        return run(dict(params), events)

    @task(multiple_outputs=False)
    def evaluate(stage: str, params=None, run_id=None) -> dict:
        """Held-out loss and perplexity per domain, measured by the stage job right after its last step."""
        from pipeline.tasks.pretrain import stage_eval_for_run

        return stage_eval_for_run(dict(params), run_id, stage)

    @task(multiple_outputs=False)
    def report(stages: dict, corpus: dict, params=None, run_id=None) -> dict:
        from pipeline.tasks.pretrain import write_report

        return write_report(dict(params), run_id, stages, corpus)

    corpus = resolve_corpus()
    previous, summaries = corpus, {}
    for name in STAGES:
        # fail_at_step (testing) applies to one stage, on its first try only: a retry or a clear resumes.
        fail = (f"{{{{ params.fail_at_step if ti.try_number == 1 and params.fail_stage == '{name}' else '' }}}}")
        train = TrainingStageOperator(
            task_id=f"train_{name}", stage=name, corpus=corpus, fail_at_step=fail,
            deferrable=os.environ.get("MINDLOOM_TRAIN_DEFERRABLE", "").lower() in ("1", "true", "yes"),
            **train_task_kwargs())
        evaluated = evaluate.override(task_id=f"eval_{name}")(name)
        previous >> train >> evaluated
        previous, summaries[name] = evaluated, train.output
    previous >> report(summaries, corpus)


pretrain()
