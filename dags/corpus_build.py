"""corpus_build / corpus_refresh: raw text → exact and MinHash dedup → quality filter → mixture → MindRecord.

``corpus_build`` is triggered by hand (UI form or REST); ``corpus_refresh`` is the same chain on a cron schedule
(``airflow.refresh_schedule`` of the deployment's config, default Sundays 03:00 UTC, no catch-up) and is the one to
backfill.

Wiring only: the chain is the ordered list of steps in ``pipeline.tasks.steps`` (the same list ``mindloom corpus``
runs), and every task body is one call, ``pipeline.tasks.corpus.run_step``.  The shard plan is a file in the run
folder; every per-shard stage is mapped over ``parallelism`` batch handles of it (``pipeline.tasks.batches``), so
the task count per stage is fixed whatever the corpus size.  The sink is a shuffle: each
shard's training copies are scattered to output files by their order key, then the writer tasks (mapped over
batches of output files) pack and write one MindRecord file each, and ``write_mindrecord`` assembles the set.
Outputs live under ``<data_root>/runs/<run_id>/`` (never ``ds``: UI and API runs have no logical date).  The last task
publishes the MindRecord set as the ``mindloom_corpus`` Asset, which schedules the ``pretrain`` DAG.  Before it,
``approve`` waits for a person (``approval`` in the config: by default ``corpus_refresh`` runs wait and
``corpus_build`` runs pass through; ``operators/approval.py``).
"""

from __future__ import annotations

import pendulum
from airflow.sdk import TaskGroup, dag, get_current_context, task

from operators.approval import CorpusApproval
from operators.params import build_params, config_path, corpus_asset
from operators.routing import data_task_kwargs
from pipeline.config import load_config
from pipeline.tasks.steps import STEPS, Step

CORPUS = corpus_asset()
CFG = load_config(config_path())


@task(multiple_outputs=False)
def chain_step(step_id: str, item=None):
    """One step of ``pipeline.tasks.steps.STEPS``: the UI label of a mapped item, then one call."""
    from operators.skips import skip_when_nothing_new
    from pipeline.tasks.corpus import run_step
    from pipeline.tasks.steps import BY_ID, item_label

    ctx = get_current_context()
    step = BY_ID[step_id]
    if step.mapped:
        ctx["shard_label"] = item_label(step, item)
    out = skip_when_nothing_new(run_step, step_id, item, params=dict(ctx["params"]), run_id=ctx["run_id"],
                                config_path=config_path(), dag_id=ctx["dag"].dag_id)
    if step.outlet:
        ctx["outlet_events"][CORPUS].extra = out
    return out


def _task(step: Step, made: dict):
    """The Airflow task (mapped where the step is) of one step; ``made`` holds the earlier steps' outputs."""
    kwargs = {"task_id": step.name, **({"outlets": [CORPUS]} if step.outlet else {}),
              **({"map_index_template": "{{ shard_label }}"} if step.mapped else {})}
    op = chain_step.override(**kwargs)
    if step.kind == "plan":
        return op(step_id=step.task_id)
    if step.mapped:
        return op.partial(step_id=step.task_id).expand(item=made["plan" if step.kind == "batch" else step.over])
    return op(step_id=step.task_id, item=made["plan"])


def corpus_chain():
    """One task (group) per step of the declared chain, wired by its data and ``after`` dependencies."""
    made: dict = {}
    groups: dict = {}
    for step in STEPS:
        if step.group and step.group not in groups:
            groups[step.group] = TaskGroup(step.group)
        if step.group:
            with groups[step.group]:
                made[step.task_id] = _task(step, made)
        else:
            made[step.task_id] = _task(step, made)
        for dep in step.after:
            made[dep] >> made[step.task_id]
        if step.outlet:             # a person approves the corpus before it is published (operators/approval.py)
            approve = CorpusApproval(task_id="approve")
            [made[dep] for dep in step.after] >> approve >> made[step.task_id]


def _corpus_dag(dag_id: str, schedule: str | None, tags: list[str]):
    return dag(
        dag_id=dag_id,
        schedule=schedule,
        start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
        catchup=False,
        max_active_runs=1,
        params=build_params("corpus"),
        tags=["mindloom", "data", *tags],
        # queue/executor of every task from MINDLOOM_DATA_QUEUE / MINDLOOM_DATA_EXECUTOR (operators/routing.py)
        default_args={"retries": 1, "retry_delay": pendulum.duration(seconds=10), **data_task_kwargs()},
        doc_md=__doc__,
    )(corpus_chain)()


corpus_build = _corpus_dag("corpus_build", None, ["manual"])
corpus_refresh = _corpus_dag("corpus_refresh", CFG.airflow.refresh_schedule, ["scheduled"])
