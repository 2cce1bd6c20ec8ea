"""The dedup tasks of the corpus chain, one call per task: exact dedup's three steps, MinHash's stages and the
dedup index's release parts and bands. :mod:`pipeline.tasks.corpus` imports them, and its ``run_step`` finds each
by name there, like the sink's steps (:mod:`pipeline.tasks.sink_steps`)."""

from __future__ import annotations

from pathlib import Path

from pipeline.config import MindloomConfig
from pipeline.dedup import exact as exact_dedup
from pipeline.profile import measured
from pipeline.tasks import batches
from pipeline.tasks.run_state import load_run_config, profiled, run_of


def exact_hash_batch(batch: dict, specs: list[dict]) -> dict:
    """Exact dedup, step 1 (per batch): hash the batch's shards into ``dedup.exact_partitions`` partitions, one
    file."""
    cfg = load_run_config(batch["run_dir"])
    return exact_dedup.run_exact_hash_batch(Path(batch["run_dir"]), batch["task"], batch["of"],
                                            [s["shard"] for s in specs], cfg.dedup.exact_partitions)


def exact_partitions(specs: list[dict]) -> list[dict]:
    """The hash partitions step 2 is mapped over: ``{run_dir, partition, batches}`` each (from the batch handles,
    never the shard list)."""
    rdir = specs[0]["run_dir"]
    return [{"run_dir": rdir, "partition": p, "batches": specs[0]["of"]}
            for p in range(load_run_config(rdir).dedup.exact_partitions)]


@profiled("exact_partition")
def exact_partition(item: dict) -> dict:
    """Exact dedup, step 2 (per hash partition): the first copy of each text in plan order survives."""
    cfg = load_run_config(item["run_dir"])
    return exact_dedup.run_exact_partition(Path(item["run_dir"]), item["batches"], item["partition"],
                                           cfg.dedup.exact_partitions, enabled=cfg.dedup.exact)


def exact_dedup_shard(spec: dict) -> dict:
    """Exact dedup, step 3 (per shard): drop the duplicate rows its batch gathered from the partitions."""
    cfg = load_run_config(spec["run_dir"])
    return exact_dedup.run_exact_dedup_shard(Path(spec["run_dir"]), spec["shard"], cfg.dedup.exact_partitions,
                                             spec["exact_drops"])


def minhash_signatures(spec: dict) -> dict:
    """Near dedup, stage 1 (per shard): MinHash signatures of the exact-deduplicated documents."""
    from pipeline.dedup import minhash

    cfg = load_run_config(spec["run_dir"])
    return minhash.run_signatures_shard(Path(spec["run_dir"]), spec["shard"], cfg.minhash, input_stage="exact_dedup",
                                        quality=cfg.quality)


@profiled("minhash_bands")
def minhash_bands(specs: list[dict]) -> list[dict]:
    """Near dedup: record the stage-1 layout (checked by stage 4); return one spec per band for stage 2."""
    from pipeline.dedup import minhash

    rdir, shards = run_of(specs)
    cfg = load_run_config(rdir)
    return minhash.build_manifest(rdir, shards, cfg.minhash, cfg.data_root, release=rdir.name)


@profiled("minhash_band")
def minhash_band(band_spec: dict) -> dict:
    """Near dedup, stage 2 (per band): sort and merge the band's bucket keys into candidate pairs."""
    from pipeline.dedup import minhash

    rdir = Path(band_spec["run_dir"])
    return minhash.run_band(rdir, band_spec["band"], load_run_config(rdir).minhash)


@profiled("minhash_cluster_tasks")
def minhash_cluster_tasks(specs: list[dict]) -> list[dict]:
    """Near dedup, stage 3: the items every clustering step is mapped over (``parallelism`` at most, fewer when
    stage 2 found few candidate edges)."""
    from pipeline.dedup.minhash import clusters

    rdir, _ = run_of(specs)
    cfg = load_run_config(rdir)
    return clusters.plan_tasks(rdir, cfg.minhash, cfg.parallelism)


def minhash_cluster(step: str, item: dict) -> dict:
    """Near dedup, stage 3: one task of clustering step ``step`` (``pipeline.dedup.minhash.clusters.STEPS``)."""
    from pipeline.dedup.minhash import clusters

    with measured(item["run_dir"], f"minhash_{step}", batches.batch_unit(item)) as prof:
        out = clusters.run_step(step, item, load_run_config(item["run_dir"]).minhash)
    return {**out, **{k: prof[k] for k in ("wall_s", "cpu_s", "peak_rss_mb")}}


@profiled("minhash_finish")
def minhash_cluster_finish(specs: list[dict]) -> dict:
    """Near dedup, stage 3: the one task that joins the last open edges of the component rounds."""
    from pipeline.dedup.minhash import clusters

    rdir, _ = run_of(specs)
    cfg = load_run_config(rdir)
    return clusters.run_step("finish", {"run_dir": str(rdir), "task": 0,
                                        "of": clusters.planned_tasks(rdir, cfg.minhash)}, cfg.minhash)


def minhash_removal(spec: dict) -> dict:
    """Near dedup, stage 4 (per shard): drop the non-survivors; verifies the stage-1 manifest first."""
    from pipeline.dedup import minhash

    return minhash.run_removal_shard(Path(spec["run_dir"]), spec["shard"], load_run_config(spec["run_dir"]).minhash,
                                     decided=spec.get("minhash_decisions"))


@profiled("minhash_report")
def minhash_report(specs: list[dict]) -> dict:
    from pipeline.dedup import minhash

    rdir, _ = run_of(specs)
    return minhash.write_report(rdir, load_run_config(rdir).minhash)


def release_part_batch(batch: dict, specs: list[dict]) -> dict:
    """The dedup index's part of this batch (per batch, after its quality shards): what the batch ships, so the
    publish step adds the release without reading every shard (``pipeline.dedup.minhash.release``)."""
    cfg = load_run_config(batch["run_dir"])
    if not cfg.minhash.enabled:
        return {"skipped": "minhash.enabled is false"}
    from pipeline.dedup.minhash.release import write_release_part

    rdir = Path(batch["run_dir"])
    return write_release_part(rdir, cfg.minhash, cfg.data_root, rdir.name, batch["task"], batch["of"],
                              [s["shard"] for s in specs], kept_stage="quality")


def _release_parts(rdir: Path, cfg: MindloomConfig) -> int:
    """The number of release parts: the run's shard batches."""
    return len(batches.plan_batches(rdir, len(batches.shard_names(rdir)), cfg.parallelism))


@profiled("release_band")
def minhash_release_band(band_spec: dict) -> dict:
    """The dedup index: one band's sorted keys of everything the run ships, from the batches' parts."""
    rdir = Path(band_spec["run_dir"])
    cfg = load_run_config(rdir)
    if not cfg.minhash.enabled:
        return {"band": band_spec["band"], "skipped": "minhash.enabled is false"}
    from pipeline.dedup.minhash.release import merge_release_band

    return merge_release_band(cfg.minhash, cfg.data_root, rdir.name, band_spec["band"], _release_parts(rdir, cfg))
