"""corpus_build / corpus_refresh: raw text → exact and MinHash dedup → quality filter → mixture → MindRecord.

``corpus_build`` is triggered by hand (UI form or REST); ``corpus_refresh`` is the same chain on a cron schedule
(``MINDLOOM_REFRESH_SCHEDULE``, default Sundays 03:00 UTC, no catch-up) and is the one to backfill.

Wiring only: every task body is one call into ``pipeline.tasks.corpus``.  The shard plan is a file in the run folder;
every per-shard stage is mapped over ``parallelism`` batch handles of it (``pipeline.tasks.batches``), so the task
count per stage is fixed whatever the corpus size ("specs" below are those handles).  The sink is a shuffle: each
shard's training copies are scattered to output files by their order key, then the writer tasks (mapped over
batches of output files) pack and write one MindRecord file each, and ``write_mindrecord`` assembles the set.
Outputs live under ``<data_root>/runs/<run_id>/`` (never ``ds``: UI and API runs have no logical date).  The last task publishes the MindRecord set as the ``mindloom_corpus`` Asset, which
schedules the ``pretrain`` DAG.
"""

from __future__ import annotations

import os

import pendulum
from airflow.sdk import dag, get_current_context, task, task_group

from operators.params import build_params, config_path, corpus_asset
from operators.routing import data_task_kwargs

CORPUS = corpus_asset()
SHARD_LABEL = "{{ shard_label }}"


def _label(batch_or_name: dict | str) -> None:
    from pipeline.tasks.batches import batch_label

    name = batch_label(batch_or_name) if isinstance(batch_or_name, dict) else batch_or_name
    get_current_context()["shard_label"] = name


def corpus_chain():
    """The task graph shared by both DAGs."""
    @task
    def plan(params=None, run_id=None, dag=None) -> list[dict]:
        """Plan the shards into the run folder (claimed for this DAG's run); return ``parallelism`` batch handles."""
        from pipeline.tasks.corpus import plan_tasks

        return plan_tasks(dict(params), run_id, config_path(), dag.dag_id)

    specs = plan()

    @task_group(group_id="ingest")
    def ingest_group():
        @task(map_index_template=SHARD_LABEL, multiple_outputs=False)
        def ingest_shard(batch: dict) -> dict:
            from pipeline.tasks.corpus import run_stage_batch

            _label(batch)
            return run_stage_batch("ingest", batch)

        return ingest_shard.expand(batch=specs)

    @task_group(group_id="clean")
    def clean_group():
        @task(map_index_template=SHARD_LABEL, multiple_outputs=False)
        def exact_hash(batch: dict) -> dict:
            from pipeline.tasks.corpus import run_stage_batch

            _label(batch)
            return run_stage_batch("exact_hash", batch)

        @task
        def partitions(specs: list[dict]) -> list[int]:
            from pipeline.tasks.corpus import exact_partitions

            return exact_partitions(specs)

        @task(map_index_template=SHARD_LABEL, multiple_outputs=False)
        def exact_partition(specs: list[dict], partition: int) -> dict:
            from pipeline.tasks.corpus import exact_partition as run

            _label(f"partition-{partition:03d}")
            return run(specs, partition)

        @task(map_index_template=SHARD_LABEL, multiple_outputs=False)
        def exact_dedup(batch: dict) -> dict:
            from pipeline.tasks.corpus import run_stage_batch

            _label(batch)
            return run_stage_batch("exact_dedup", batch)

        hashed = exact_hash.expand(batch=specs)
        parts = exact_partition.partial(specs=specs).expand(partition=partitions(specs))
        dedup = exact_dedup.expand(batch=specs)
        hashed >> parts >> dedup
        return hashed, dedup

    @task_group(group_id="near_dedup")
    def near_dedup_group():
        """MinHash in four stages: signatures per shard, buckets per band, clusters, removal per shard."""

        @task(map_index_template=SHARD_LABEL, multiple_outputs=False)
        def signatures(batch: dict) -> dict:
            from pipeline.tasks.corpus import run_stage_batch

            _label(batch)
            return run_stage_batch("minhash_signatures", batch)

        @task
        def bands(specs: list[dict]) -> list[dict]:
            from pipeline.tasks.corpus import minhash_bands

            return minhash_bands(specs)

        @task(map_index_template=SHARD_LABEL, multiple_outputs=False)
        def band(band_spec: dict) -> dict:
            from pipeline.tasks.corpus import minhash_band

            _label(f"band-{band_spec['band']:03d}")
            return minhash_band(band_spec)

        @task(multiple_outputs=False)
        def clusters(specs: list[dict]) -> dict:
            from pipeline.tasks.corpus import minhash_clusters

            return minhash_clusters(specs)

        @task(map_index_template=SHARD_LABEL, multiple_outputs=False)
        def removal(batch: dict) -> dict:
            from pipeline.tasks.corpus import run_stage_batch

            _label(batch)
            return run_stage_batch("minhash_removal", batch)

        @task(multiple_outputs=False)
        def dedup_report(specs: list[dict]) -> dict:
            from pipeline.tasks.corpus import minhash_report

            return minhash_report(specs)

        sigs = signatures.expand(batch=specs)
        band_specs = bands(specs)
        sigs >> band_specs
        removed = removal.expand(batch=specs)
        band.expand(band_spec=band_specs) >> clusters(specs) >> removed >> dedup_report(specs)
        return sigs, removed

    @task_group(group_id="filter")
    def filter_group():
        @task(map_index_template=SHARD_LABEL, multiple_outputs=False)
        def quality_filter(batch: dict) -> dict:
            from pipeline.tasks.corpus import run_stage_batch

            _label(batch)
            return run_stage_batch("quality", batch)

        return quality_filter.expand(batch=specs)

    @task_group(group_id="tokenize")
    def tokenize_group():
        @task(multiple_outputs=False)
        def train_tokenizer(specs: list[dict]) -> dict:
            from pipeline.tasks.corpus import train_tokenizer as run

            return run(specs)

        @task(map_index_template=SHARD_LABEL, multiple_outputs=False)
        def encode(batch: dict) -> dict:
            from pipeline.tasks.corpus import run_stage_batch

            _label(batch)
            return run_stage_batch("tokenize", batch)

        tok = train_tokenizer(specs)
        enc = encode.expand(batch=specs)
        tok >> enc
        return tok, enc

    @task_group(group_id="sink")
    def sink_group():
        @task(multiple_outputs=False)
        def plan_mixture(specs: list[dict]) -> dict:
            from pipeline.tasks.corpus import plan_mixture as run

            return run(specs)

        @task(map_index_template=SHARD_LABEL, multiple_outputs=False)
        def scatter(batch: dict) -> dict:
            from pipeline.tasks.corpus import run_stage_batch

            _label(batch)
            return run_stage_batch("sink_scatter", batch)

        @task
        def output_files(specs: list[dict]) -> list[dict]:
            from pipeline.tasks.corpus import sink_file_batches

            return sink_file_batches(specs)

        @task(map_index_template=SHARD_LABEL, multiple_outputs=False)
        def write_files(batch: dict) -> dict:
            from pipeline.tasks.corpus import write_file_batch

            _label(batch)
            return write_file_batch(batch)

        @task(multiple_outputs=False)
        def write_mindrecord(specs: list[dict]) -> dict:
            from pipeline.tasks.corpus import finalize_mindrecord

            return finalize_mindrecord(specs)

        @task(multiple_outputs=False)
        def write_validation(specs: list[dict]) -> dict:
            from pipeline.tasks.corpus import write_validation as run

            return run(specs)

        mix = plan_mixture(specs)
        scattered = scatter.expand(batch=specs)
        files = output_files(specs)
        mix >> scattered >> files
        written = [write_files.expand(batch=files) >> write_mindrecord(specs), write_validation(specs)]
        mix >> written[1]
        return mix, written

    @task(outlets=[CORPUS], multiple_outputs=False)
    def publish(specs: list[dict], outlet_events=None) -> dict:
        from pipeline.tasks.corpus import publish as run

        summary = run(specs)
        outlet_events[CORPUS].extra = summary
        return summary

    ingested = ingest_group()
    hashed, deduped = clean_group()
    sigs, near_deduped = near_dedup_group()
    cleaned = filter_group()
    tok, encoded = tokenize_group()
    mix, written = sink_group()
    ingested >> hashed
    deduped >> sigs
    near_deduped >> cleaned
    cleaned >> tok
    encoded >> mix
    written >> publish(specs)


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
corpus_refresh = _corpus_dag("corpus_refresh", os.environ.get("MINDLOOM_REFRESH_SCHEDULE") or "0 3 * * 0",
                             ["scheduled"])
