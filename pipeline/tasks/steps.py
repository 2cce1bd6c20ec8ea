"""The corpus chain as data: one ordered list of steps that the ``corpus_build`` DAG and ``mindloom corpus`` both run.

Why: the DAG and the CLI used to wire the chain twice (a 206-line ``corpus_chain`` and a hand-written ``run_all``
that skipped the batch plan and fused some fan-in steps), so they could drift.  Now ``dags/corpus_build.py`` makes
one Airflow task per :class:`Step` (mapped where the step is mapped) and :func:`pipeline.tasks.corpus.run_all`
walks the same list in order, in one process; both call :func:`pipeline.tasks.corpus.run_step`.

Kinds of step (``item`` is what one task receives):

``plan``   the run's planning task; returns the shard batch handles (``parallelism`` of them at most)
``batch``  mapped over those handles: a per-shard ``stage`` over the batch's shards (``run_stage_batch``), then
           the stages in ``then`` over the same batch
``run``    one fan-in task; receives the list of handles (a few numbers each, never the plan)
``fan``    one task that returns the items a ``map`` step is mapped over (hash partitions, bands, file batches)
``map``    mapped over the items returned by the ``fan`` step named in ``over`` (``call(item)``, or
           ``call(stage, item)`` when the step names a ``stage``: the steps of MinHash's clustering share one call)

Stages with no barrier between them share a task (``then``): ingest hashes its batch for exact dedup, and exact
dedup's task computes the survivors' MinHash signatures.  Each mapped task instance costs a fixed amount whatever
it does (Airflow's own bookkeeping under ``dags test``, a new process per task on Celery), so at
the shipped ``parallelism`` of 64 two fewer mapped steps are 128 fewer task instances per run; every stage still
writes its own profile, markers and stats.

The list is in an order that respects every dependency, so running it top to bottom is a valid schedule.  A step's
upstream tasks are ``after`` plus the step whose output it consumes (the plan, or ``over``).
"""

from __future__ import annotations

from dataclasses import dataclass

KINDS = ("plan", "batch", "run", "fan", "map")


@dataclass(frozen=True)
class Step:
    name: str                      # task id inside its group
    group: str | None              # Airflow task group (None: top level)
    kind: str                      # one of KINDS
    call: str = "run_stage_batch"  # function of pipeline.tasks.corpus that the task body calls
    stage: str | None = None       # batch steps: the per-shard stage (pipeline.tasks.corpus.SHARD_STAGES); map
                                   # steps: the first argument of ``call`` (then ``call(stage, item)``)
    then: tuple[str, ...] = ()     # batch steps: stages the same task runs next over the same batch (no barrier)
    after: tuple[str, ...] = ()    # task ids that must finish first (besides the data dependency)
    over: str | None = None        # map steps: the fan step whose items they are mapped over
    label: str | None = None       # map steps: UI label of one item, ``str.format(**item)`` (None: batch label)
    outlet: bool = False           # the task that publishes the corpus Asset

    @property
    def task_id(self) -> str:
        return f"{self.group}.{self.name}" if self.group else self.name

    @property
    def mapped(self) -> bool:
        return self.kind in ("batch", "map")


def _batch(name: str, group: str, stage: str | tuple[str, ...], *after: str) -> Step:
    first, *then = (stage,) if isinstance(stage, str) else stage
    return Step(name, group, "batch", stage=first, then=tuple(then), after=after)


#: MinHash stage 3's steps, in order (``pipeline.dedup.minhash.clusters.STEPS``; named here so the DAG file does
#: not import numpy to parse): each mapped over the items of ``cluster_tasks``, but ``finish``, which runs once.
CLUSTER_STEPS = ("pairs", "gather", "check", "ls_1", "ss_1", "ls_2", "ss_2", "ls_3", "finish", "labels", "decide")


def _cluster_steps() -> list[Step]:
    out, before = [], "near_dedup.cluster_tasks"
    for name in CLUSTER_STEPS:
        if name == "finish":
            out.append(Step(name, "near_dedup", "run", "minhash_cluster_finish", after=(before,)))
        else:
            out.append(Step(name, "near_dedup", "map", "minhash_cluster", stage=name, over="near_dedup.cluster_tasks",
                            after=(before,) if before != "near_dedup.cluster_tasks" else (), label="part-{task:03d}"))
        before = f"near_dedup.{name}"
    return out


STEPS: tuple[Step, ...] = (
    Step("plan", None, "plan", "plan_tasks"),
    _batch("ingest_shard", "ingest", ("ingest", "exact_hash")),
    Step("partitions", "clean", "fan", "exact_partitions", after=("ingest.ingest_shard",)),
    Step("exact_partition", "clean", "map", "exact_partition", over="clean.partitions",
         label="partition-{partition:03d}"),
    _batch("exact_dedup", "clean", ("exact_dedup", "minhash_signatures"), "clean.exact_partition"),
    Step("bands", "near_dedup", "fan", "minhash_bands", after=("clean.exact_dedup",)),
    Step("band", "near_dedup", "map", "minhash_band", over="near_dedup.bands", label="band-{band:03d}"),
    Step("cluster_tasks", "near_dedup", "fan", "minhash_cluster_tasks", after=("near_dedup.band",)),
    *_cluster_steps(),
    _batch("removal", "near_dedup", "minhash_removal", "near_dedup.decide"),
    Step("dedup_report", "near_dedup", "run", "minhash_report", after=("near_dedup.removal",)),
    Step("train_classifier", "filter", "run", "train_classifier", after=("near_dedup.removal",)),
    _batch("quality_filter", "filter", ("quality", "release_part"), "filter.train_classifier"),
    Step("train_tokenizer", "tokenize", "run", "train_tokenizer", after=("filter.quality_filter",)),
    _batch("encode", "tokenize", "tokenize", "tokenize.train_tokenizer"),
    Step("plan_mixture", "sink", "run", "plan_mixture", after=("tokenize.encode",)),
    _batch("scatter", "sink", "sink_scatter", "sink.plan_mixture"),
    Step("output_files", "sink", "fan", "sink_file_batches", after=("sink.scatter",)),
    Step("write_files", "sink", "map", "write_file_batch", over="sink.output_files"),
    Step("write_mindrecord", "sink", "run", "finalize_mindrecord", after=("sink.write_files",)),
    Step("write_validation", "sink", "run", "write_validation", after=("sink.plan_mixture",)),
    Step("release_band", "near_dedup", "map", "minhash_release_band", over="near_dedup.bands",
         after=("filter.quality_filter",), label="band-{band:03d}"),
    Step("publish", None, "run", "publish",
         after=("sink.write_mindrecord", "sink.write_validation", "near_dedup.dedup_report",
                "near_dedup.release_band"),
         outlet=True),
)

BY_ID: dict[str, Step] = {s.task_id: s for s in STEPS}


def check_steps(steps: tuple[Step, ...] = STEPS) -> None:
    """Refuse a list that cannot run top to bottom: unknown kinds, duplicate ids, or a dependency that comes later."""
    seen: set[str] = set()
    for i, s in enumerate(steps):
        if s.kind not in KINDS:
            raise ValueError(f"step {s.task_id}: kind {s.kind!r} is not one of {KINDS}")
        if (s.kind == "plan") != (i == 0):
            raise ValueError(f"step {s.task_id}: the plan step must come first, and only once")
        if s.kind == "batch" and not s.stage or s.kind == "map" and not s.over:
            raise ValueError(f"step {s.task_id}: a {s.kind} step needs {'stage' if s.kind == 'batch' else 'over'}")
        for dep in (*s.after, *([s.over] if s.over else [])):
            if dep not in seen:
                raise ValueError(f"step {s.task_id}: depends on {dep!r}, which is not an earlier step")
        if s.over and BY_ID[s.over].kind != "fan":
            raise ValueError(f"step {s.task_id}: maps over {s.over}, which is not a fan step")
        if s.task_id in seen:
            raise ValueError(f"step {s.task_id}: listed twice")
        seen.add(s.task_id)


def item_label(step: Step, item: dict) -> str:
    """What the UI shows for one mapped task: ``task 3/64: shards 120-159``, ``band-004``."""
    from pipeline.tasks.batches import batch_label

    return step.label.format(**item) if step.label else batch_label(item)


check_steps()
