"""pretrain: train the LLaMA-style MindSpore model on the latest published corpus, stage by stage.

One ``train_<stage>`` task per entry of ``train.stages`` (warmup → main → long_context by default), each followed
by ``eval_<stage>`` (held-out loss and perplexity per domain), then ``report``, then, when ``export.formats`` is set,
``export``: the last stage's final checkpoint for mindformers and/or Hugging Face, published as the
``mindloom_model`` Asset. A stage with its own ``seq_len`` (long_context) gets a ``repack_<stage>`` data task that
re-packs the corpus rows to that length while the earlier stages train, so no device waits for it.

Scheduled on the ``mindloom_corpus`` Asset (a finished ``corpus_build`` run triggers it) and triggerable by hand.
The DAG is created unpaused (``is_paused_upon_creation=False``): it only ever runs when a corpus is published or
someone triggers it, and a paused DAG would drop the first publish.  The training stage runs as a detached job
through ``TrainingStageOperator``; its summary (losses, tokens/s, checkpoint) is the stage task's XCom and is
collected by ``report``.  Clearing a failed stage re-runs it, and the job resumes from the stage's newest
checkpoint; clearing a succeeded stage re-trains it from the stage start (the old folder is kept).

Automatic retries per stage: ``airflow.train_retries`` of the deployment's config (default 1), ``retry_delay`` 5 s;
``airflow.train_deferrable`` makes the stages wait in the triggerer, ``airflow.pretrain_cron`` adds a cron next to
the Asset (which makes the DAG backfillable).
"""

from __future__ import annotations

import pendulum
from airflow.sdk import dag, task

from operators.params import config_path, corpus_asset, fail_step_template, model_asset, pretrain_params
from operators.routing import data_task_kwargs, train_task_kwargs
from operators.training import TrainingStageOperator
from pipeline.config import load_config
from pipeline.tasks.pretrain import repack_stages, stage_names, stage_timeout

CORPUS = corpus_asset()
CFG = load_config(config_path())
STAGES = stage_names(CFG)                             # train.stages of the deployment's config, in order
REPACKED = set(repack_stages(CFG))                    # stages with their own seq_len: a repack_<stage> data task
RETRIES = CFG.airflow.train_retries
if CFG.airflow.pretrain_cron:                        # a cron next to the Asset makes the DAG backfillable
    from airflow.sdk import AssetOrTimeSchedule
    from airflow.timetables.trigger import CronTriggerTimetable

    SCHEDULE = AssetOrTimeSchedule(timetable=CronTriggerTimetable(CFG.airflow.pretrain_cron, timezone="UTC"),
                                   assets=[CORPUS])
else:
    SCHEDULE = [CORPUS]


@dag(
    dag_id="pretrain",
    schedule=SCHEDULE,
    start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    params=pretrain_params(STAGES, RETRIES),
    is_paused_upon_creation=False,
    tags=["mindloom", "train"],
    default_args={"retries": RETRIES,
                  "retry_delay": pendulum.duration(seconds=5), **data_task_kwargs()},
    doc_md=__doc__,
)
def pretrain():
    @task(multiple_outputs=False)
    def resolve_corpus(params=None, triggering_asset_events=None) -> dict:
        from pipeline.tasks.corpus_choice import resolve_corpus as run

        events = [e.extra for evs in (triggering_asset_events or {}).values() for e in evs]
        return run(dict(params), events)

    @task(multiple_outputs=False)
    def evaluate(stage: str, params=None, run_id=None) -> dict:
        """Held-out loss and perplexity per domain, measured by the stage job right after its last step."""
        from pipeline.tasks.pretrain import stage_eval_for_run

        return stage_eval_for_run(dict(params), run_id, stage)

    @task(multiple_outputs=False)
    def repack(stage: str, corpus: dict, params=None, run_id=None) -> dict:
        """The corpus rows at the stage's seq_len, written while earlier stages train (pipeline/train/repack.py)."""
        from pipeline.tasks.pretrain import prepare_stage_data_for_run

        return prepare_stage_data_for_run(dict(params), run_id, stage, corpus)

    @task(multiple_outputs=False)
    def report(stages: dict, corpus: dict, params=None, run_id=None) -> dict:
        from pipeline.tasks.pretrain import write_report

        return write_report(dict(params), run_id, stages, corpus)

    corpus = resolve_corpus()
    previous, summaries = corpus, {}
    for name in STAGES:
        train = TrainingStageOperator(
            task_id=f"train_{name}", stage=name, corpus=corpus, fail_at_step=fail_step_template(name),
            deferrable=CFG.airflow.train_deferrable,
            execution_timeout=stage_timeout(CFG, name), **train_task_kwargs())
        evaluated = evaluate.override(task_id=f"eval_{name}")(name)
        previous >> train >> evaluated
        if name in REPACKED:
            repack.override(task_id=f"repack_{name}")(name, corpus) >> train
        previous, summaries[name] = evaluated, train.output
    reported = report(summaries, corpus)
    previous >> reported
    if CFG.export.formats:
        @task(outlets=[model_asset()], multiple_outputs=False)
        def export(params=None, run_id=None, outlet_events=None) -> dict:
            """The last stage's final checkpoint in every format of ``export.formats`` (pipeline/tasks/export.py)."""
            from pipeline.tasks.export import export_run

            result = export_run(dict(params), run_id)
            outlet_events[model_asset()].extra = result
            return result

        reported >> export()


pretrain()
