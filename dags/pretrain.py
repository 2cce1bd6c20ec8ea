"""pretrain: train the LLaMA-style MindSpore model on the latest published corpus and report its metrics.

Scheduled on the ``mindloom_corpus`` Asset (a finished ``corpus_build`` run triggers it) and triggerable by hand.
The training stage runs as a detached job through ``TrainingStageOperator``; its summary (losses, tokens/s,
checkpoint) is the stage task's XCom and is collected by ``report``.  Clearing a failed stage re-runs it, and the
job resumes from the stage's newest checkpoint.
"""

from __future__ import annotations

import os

import pendulum
from airflow.sdk import Param, dag, task

from operators.params import build_params, corpus_asset
from operators.routing import data_task_kwargs, train_task_kwargs
from operators.training import TrainingStageOperator

CORPUS = corpus_asset()
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
                                  description="Simulate a crash after this step's checkpoint (first try only).")},
    tags=["mindloom", "train"],
    default_args={"retries": int(os.environ.get("MINDLOOM_TRAIN_RETRIES", "1")),
                  "retry_delay": pendulum.duration(seconds=5), **data_task_kwargs()},
    doc_md=__doc__,
)
def pretrain():
    @task(multiple_outputs=False)
    def resolve_corpus(params=None, triggering_asset_events=None) -> dict:
        from pipeline.pretrain import resolve_corpus as run

        events = [e.extra for evs in (triggering_asset_events or {}).values() for e in evs]
        return run(dict(params), events)

    corpus = resolve_corpus()
    main = TrainingStageOperator(
        task_id="train_main", stage="main", corpus=corpus,
        fail_at_step="{{ params.fail_at_step if ti.try_number == 1 else '' }}",
        deferrable=os.environ.get("MINDLOOM_TRAIN_DEFERRABLE", "").lower() in ("1", "true", "yes"),
        **train_task_kwargs())

    @task(multiple_outputs=False)
    def report(stage_summary: dict, corpus: dict, params=None, run_id=None) -> dict:
        from pipeline.pretrain import write_report

        return write_report(dict(params), run_id, {"main": stage_summary}, corpus)

    report(main.output, corpus)


pretrain()
