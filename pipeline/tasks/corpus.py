"""The corpus chain as one call per task: what the ``corpus_build`` DAG and ``mindloom corpus`` both run.

The order and shape of the chain is data (:mod:`pipeline.tasks.steps`); :func:`run_step` is the one entry point of
every task, in Airflow and in :func:`run_all` alike.  The sink's tasks live in :mod:`pipeline.tasks.sink_steps`
and are looked up here like the others.

A run lives in ``<data_root>/runs/<run id>/``.  :func:`prepare_run` freezes the resolved configuration there
(``config.json``) so every later task of the run — possibly on another worker, possibly retried after someone
edited the YAML — reads exactly the same settings.  Each function takes the run folder and returns a small,
JSON-serialisable dict (it travels through XCom): shard names and stats, never document rows.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from pipeline import confine
from pipeline.config import MindloomConfig, config_from_dict
from pipeline.dedup import exact as exact_dedup
from pipeline.form import config_from_params
from pipeline.ingest import output as ingest_output
from pipeline.ingest import run as ingest
from pipeline.io import claim_run_dir, read_json, run_dir, write_json
from pipeline.pools import task_pools
from pipeline.profile import measured
from pipeline.quality import decontaminate
from pipeline.quality import run as quality
from pipeline.report.html import write_report
from pipeline.sink import mindrecord
from pipeline.sink.shards import RowDealError
from pipeline.tasks import batches, records, steps
from pipeline.tasks.dedup_steps import (  # noqa: F401  (run_step finds each step's function by name here)
    _release_parts,
    exact_dedup_shard,
    exact_hash_batch,
    exact_partition,
    exact_partitions,
    minhash_band,
    minhash_bands,
    minhash_cluster,
    minhash_cluster_finish,
    minhash_cluster_tasks,
    minhash_release_band,
    minhash_removal,
    minhash_report,
    minhash_signatures,
    release_part_batch,
)
from pipeline.tasks.run_state import NothingToShip, load_run_config, profiled, run_of
from pipeline.tasks.sink_steps import (  # noqa: F401  (run_step finds each step's function by name here)
    finalize_mindrecord,
    manifest_summary,
    plan_mixture,
    sink_file_batches,
    sink_scatter_batch,
    write_file_batch,
    write_validation,
)
from pipeline.tokenizer import run as tokenizer

log = logging.getLogger(__name__)


def prepare_run(params: dict | MindloomConfig, run_id: str, config_path: str | None = None,
                dag_id: str | None = None) -> list[dict]:
    """Validate the config (YAML + Params, or a loaded config), freeze it in the run folder, plan the shards.

    The folder is claimed for ``dag_id``'s run ``run_id`` first (:func:`pipeline.io.claim_run_dir`): a run of the
    other corpus DAG, or a run id that maps to the same folder name, is refused instead of sharing it.

    Returns one spec per shard, each carrying ``run_dir`` and ``shard``: the list the DAG maps every per-shard
    stage over, and the only argument the later tasks need.
    """
    cfg = params if isinstance(params, MindloomConfig) else config_from_params(params, config_path)
    # Runs from Airflow (a config file, form params on top) are confined; a trusted caller passing a loaded config
    # (the CLI, benchmarks) is confined only when the deployment declares roots.
    confined = config_path is not None or bool(os.environ.get(confine.ENV))
    roots = _check_inputs_confined(cfg, config_path) if confined else []
    rdir = run_dir(cfg.data_root, run_id)
    claim_run_dir(rdir, dag_id, run_id)
    write_json(rdir / "config.json", cfg.to_dict())
    decontaminate.build_index(cfg.quality.decontamination, rdir)    # once per run; every quality shard reads it
    empty: list[dict] = []
    specs = [{**s, "run_dir": str(rdir)} for s in ingest.plan_ingest(cfg, empty)]
    for spec in specs if confined else []:     # every local file a listing found, symlinks resolved
        if not any("://" in p for p in cfg.sources[spec["source_index"]].paths):
            for unit in spec["units"]:
                unit["path"] = confine.check_path(unit["path"], roots,    # ingest opens the path that was checked
                                                  f"sources[{spec['source_index']}] ({spec['source']})")
    if not cfg.dedup.exact_partitions:      # auto: sized from the plan, frozen with the run's config
        cfg = config_from_dict(cfg.to_dict())
        cfg.dedup.exact_partitions = exact_dedup.exact_partition_count(
            sum(s["bytes"] for s in specs), sum(s.get("docs_estimate", 0) for s in specs))
        write_json(rdir / "config.json", cfg.to_dict())
    write_json(rdir / "plan.json", specs)
    write_json(rdir / "empty_sources.json", empty)
    log.info("run %s: %d ingest shards in %s", run_id, len(specs), rdir)
    return specs


def _check_inputs_confined(cfg: MindloomConfig, config_path: str | None) -> list[str]:
    """Refuse a data root or source pattern outside the deployment's allowed roots, before anything is listed."""
    roots = confine.allowed_roots(cfg.data_root, config_path)
    if os.environ.get(confine.ENV):
        confine.check_path(cfg.data_root, roots, "data_root")
        if config_path:
            confine.check_path(config_path, roots, "config file ($MINDLOOM_CONFIG)")
    for i, src in enumerate(cfg.sources):
        if not cfg.domains or src.domain in cfg.domains:
            for j, pattern in enumerate(src.paths):
                confine.check_path(confine.static_root(pattern), roots, f"sources[{i}].paths[{j}]")
    for j, path in enumerate(cfg.quality.decontamination.paths if cfg.quality.decontamination.enabled else []):
        confine.check_path(path, roots, f"quality.decontamination.paths[{j}]")
    clf = cfg.quality.classifier
    for where, path in ([("model_path", clf.model_path)] if clf.enabled and clf.model_path else []) + \
            [(f"positive_paths[{j}]", p) for j, p in enumerate(clf.positive_paths if clf.enabled else [])]:
        confine.check_path(path, roots, f"quality.classifier.{where}")
    return roots


def plan_tasks(params: dict | MindloomConfig, run_id: str, config_path: str | None = None,
               dag_id: str | None = None) -> list[dict]:
    """The ``plan`` step: :func:`prepare_run` (the run folder claimed for ``dag_id``'s run), then ``parallelism``
    batch handles (what every per-shard stage is mapped over), each batch's own plan file and the compact shard
    index (:mod:`pipeline.tasks.batches`)."""
    specs = prepare_run(params, run_id, config_path, dag_id)
    rdir = Path(specs[0]["run_dir"])
    handles = batches.plan_batches(rdir, len(specs), load_run_config(rdir).parallelism)
    batches.split_plan(specs, handles)
    batches.write_index(rdir, [s["shard"] for s in specs])
    return handles


def run_stage_batch(stage: str, batch: dict) -> dict:
    """One mapped task of a per-shard stage: ``stage`` over the batch's shards (profiled under ``profile/``).

    Stages that handle a shard in one process run the batch in a pool of ``task_workers`` processes; the others
    (ingest, quality, tokenize) parallelise inside a shard with their own ``workers`` settings.  A stage in
    :data:`BATCH_STAGES` handles the whole batch in one call (one output per batch).
    """
    cfg = load_run_config(batch["run_dir"])
    workers = batches.pool_size(cfg.task_workers, batch["last"] - batch["first"] + 1) if stage in POOLED else 1
    min_pool = POOLED.get(stage, 0)
    with measured(batch["run_dir"], stage, batches.batch_unit(batch)) as prof:
        if stage in BATCH_STAGES:
            out = batches.run_whole_batch(BATCH_STAGES[stage], batch, ingest_output.output_specs)
        else:
            out = batches.run_batch(SHARD_STAGES[stage], batch, workers, _expander(stage, batch, cfg),
                                    min_pool_bytes=min_pool)
        prof.update(shards=out["shards"], input_bytes=out["input_bytes"], workers=workers)
    return {**out, **{k: prof[k] for k in ("wall_s", "cpu_s", "peak_rss_mb")}}      # what the task reports


def _expander(stage: str, batch: dict, cfg: MindloomConfig):
    """Plan specs -> the specs a stage runs over: ingest's own; after ingest one per output shard; exact dedup's
    drop step adds each shard's duplicate rows, gathered once for the batch."""
    if stage == "ingest":
        return None
    if stage == "exact_dedup":
        return lambda plan: exact_dedup.attach_drops(Path(batch["run_dir"]), batch["task"], batch["of"],
                                                     ingest_output.output_specs(plan), cfg.dedup.exact_partitions)
    if stage == "minhash_removal":
        from pipeline.dedup.minhash.removal import attach_decisions

        return lambda plan: attach_decisions(Path(batch["run_dir"]), cfg.minhash, ingest_output.output_specs(plan))
    return ingest_output.output_specs


def ingest_shard(spec: dict) -> dict:
    return ingest.run_ingest_shard(load_run_config(spec["run_dir"]), Path(spec["run_dir"]), spec)


def quality_shard(spec: dict) -> dict:
    """Quality (per shard), deciding from the rows MinHash stage 1 scored where it can."""
    from pipeline.dedup.minhash.layout import prescores_path

    rdir = Path(spec["run_dir"])
    return quality.run_quality_shard(load_run_config(rdir).quality, rdir, spec["shard"], input_stage="minhash",
                                     prescored=prescores_path(rdir, spec["shard"]))


def train_classifier(specs: list[dict]) -> dict:
    """The quality classifier (:mod:`pipeline.quality.classifier`): trained on a sample of the deduplicated shards
    (or a supplied model), then each domain's cut set from the scores of a sample of the domain
    (``cut_sample_docs``), before the mapped quality tasks, which score their own shards' documents.  Off: returns
    at once (no profile, no file)."""
    from pipeline.quality import classifier

    rdir = Path(specs[0]["run_dir"])
    cfg = load_run_config(rdir)
    if not cfg.quality.classifier.enabled:
        return {"enabled": False}
    from pipeline.dedup.minhash.layout import prescores_path

    with measured(rdir, "train_classifier", "all"):
        _, shards = run_of(specs)
        found = classifier.train_classifier(cfg.quality.classifier, rdir, shards, cfg.seed, input_stage="minhash",
                                            quality=cfg.quality, prescored=lambda shard: prescores_path(rdir, shard))
    return {"enabled": True, "training": found["training"],
            "probe_max_separation": found["probe"]["max_separation"],
            **{k: found[k] for k in ("held_out", "cuts", "train")}}


def nothing_new(rdir: Path, why: str) -> NothingToShip:
    """The skip of an incremental refresh, with what its documents became (from the stages' stats)."""
    stats = collect_stats(rdir)
    ingested = sum(d["in_docs"] for d in stats.get("ingest", {}).values())
    previous = sum(d["removed"].get("near_duplicate_of_previous_release", 0)
                   for d in stats.get("minhash", {}).values())
    return NothingToShip(f"incremental refresh {Path(rdir).name}: {why}: of {ingested:,} documents ingested, "
                         f"{previous:,} duplicate an earlier release and the rest were removed by dedup and the "
                         "filters; nothing is published and no training starts")


@profiled("train_tokenizer")
def train_tokenizer(specs: list[dict]) -> dict:
    """The tokenizer on a sample of the filtered shards.  An incremental refresh that kept nothing ends here,
    skipped (:class:`NothingToShip`)."""
    rdir, shards = run_of(specs)
    cfg = load_run_config(rdir)
    if cfg.minhash.use_index and not any(d["kept_docs"] for d in collect_stats(rdir).get("quality", {}).values()):
        raise nothing_new(rdir, "nothing new to ship")
    release = None
    if cfg.minhash.use_index:       # an incremental refresh keeps the tokenizer of the release it extends
        from pipeline.dedup.minhash.release import extended_release

        release = extended_release(cfg.minhash, cfg.data_root, Path(rdir).name)
    return tokenizer.train_tokenizer(cfg.tokenizer, rdir, shards, cfg.seed, weights=cfg.mixture.weights,
                                     release=release)


def tokenize_shard(spec: dict) -> dict:
    cfg = load_run_config(spec["run_dir"])
    return tokenizer.run_tokenize_shard(Path(spec["run_dir"]), spec["shard"], workers=cfg.tokenizer.encode_workers)


def collect_stats(rdir: str | Path) -> dict:
    """Per stage and domain: documents in, kept and removed by reason (summed over shards)."""
    rdir = Path(rdir)
    out: dict[str, dict] = {}
    for stage_dir in sorted((rdir / "stats").glob("*")):
        stage: dict[str, dict] = {}
        for f in sorted(stage_dir.glob("*.json")):
            s = read_json(f)
            d = stage.setdefault(s["domain"], {"in_docs": 0, "kept_docs": 0, "in_bytes": 0, "kept_bytes": 0,
                                               "removed": {}, "tokens": 0})
            for k in ("in_docs", "kept_docs", "in_bytes", "kept_bytes"):
                d[k] += s[k]
            d["tokens"] += s.get("tokens", 0)
            for reason, v in s["removed"].items():
                d["removed"][reason] = d["removed"].get(reason, 0) + v["docs"]
        out[stage_dir.name] = stage
    return out


@profiled("publish")
def publish(specs: list[dict]) -> dict:
    """Record the finished corpus as the latest one (``<data_root>/corpus/LATEST.json``) and summarise it.

    The summary carries the manifest's sha256; the manifest carries every file's size and sha256 as its writer
    computed them.  Nothing here reads MindRecord data.
    """
    import hashlib
    import json

    rdir, _ = run_of(specs)
    cfg = load_run_config(rdir)
    raw = (Path(rdir) / "mindrecord" / mindrecord.MANIFEST).read_bytes()     # one small read: parsed and hashed
    manifest = json.loads(raw)
    summary = manifest_summary(Path(rdir), manifest)
    summary["manifest_sha256"] = hashlib.sha256(raw).hexdigest()     # what training checks at start
    summary["stats"] = collect_stats(rdir)
    if cfg.quality.classifier.enabled:      # the share each domain's cut kept, counted by the quality tasks
        from pipeline.quality.classifier import measured_cut
        from pipeline.quality.filters.audit import quality_stats

        summary["classifier_cut"] = measured_cut(quality_stats(rdir))
    empty = Path(rdir) / "empty_sources.json"
    summary["empty_sources"] = read_json(empty) if empty.exists() else []
    if cfg.minhash.enabled:     # later refreshes can deduplicate against what this run shipped
        from pipeline.dedup.minhash.release import register_release

        summary["dedup_release"] = register_release(cfg.minhash, cfg.data_root, Path(rdir).name,
                                                    _release_parts(Path(rdir), cfg), kept_stage="quality")
    write_json(Path(rdir) / "corpus_summary.json", summary)
    summary["report_html"] = str(write_report(Path(rdir) / "report.html",
                                              f"mindloom corpus {cfg.run_name} ({Path(rdir).name})",
                                              corpus_run_dir=Path(rdir)))
    write_json(Path(cfg.data_root) / "corpus" / "LATEST.json", summary)
    return {k: v for k, v in summary.items() if k != "stats"}


#: The per-shard stages, by the name the DAG's batch tasks use.
SHARD_STAGES = {"ingest": ingest_shard, "exact_dedup": exact_dedup_shard,
                "minhash_signatures": minhash_signatures, "minhash_removal": minhash_removal,
                "quality": quality_shard, "tokenize": tokenize_shard}

#: Stages whose batch task makes one output for the whole batch: ``fn(batch handle, output shard specs)``.
BATCH_STAGES = {"exact_hash": exact_hash_batch, "sink_scatter": sink_scatter_batch,
                "release_part": release_part_batch}

#: Stages that handle one shard in one process: their batch tasks run a pool of ``task_workers`` processes when
#: the batch has at least this much input (plan bytes).  Starting and stopping a pool costs more CPU than exact
#: dedup, MinHash removal and the scatter spend on a batch of the shipped size (their work per MB is small), so
#: those pool only large batches; signatures do much more work per MB, so their pool pays from a few
#: tens of MB.  The sink scatter runs in the task's process: with the held-out overlap check
#: (:mod:`pipeline.sink.heldout_overlap`, whose index the task memory-maps once for all its shards) a batch costs
#: less than a pool.  Per-stage CPU per MB: ``make bench-scale`` (topic ``scale``, the stage table in
#: BENCHMARKS.md); a task's fixed cost: ``task_cost.*``.
POOLED = {"exact_dedup": 256 << 20, "minhash_signatures": 32 << 20, "minhash_removal": 256 << 20}


def latest_corpus(data_root: str | Path) -> dict:
    path = Path(data_root) / "corpus" / "LATEST.json"
    if not path.exists():
        raise FileNotFoundError(f"{path}: no corpus has been published yet; run the corpus_build DAG first")
    return read_json(path)


def run_step(task_id: str, item=None, **plan_args):
    """The body of every task of the chain: call the step's function on what the task received.

    ``item`` is one batch handle or fanned-out item (mapped steps) or the list of batch handles (fan-in steps);
    ``plan_args`` (``params``, ``run_id``, ``config_path``) go to the plan step only.  The task's process pools
    are kept for the step's next task when this process runs task after task (:func:`pipeline.pools.task_pools`).
    """
    step = steps.BY_ID[task_id]
    fn = globals()[step.call]          # looked up at call time: a profiler may wrap the module's functions
    _check_item(step, item)
    try:
        return _call_step(step, fn, item, plan_args)
    except RowDealError as exc:          # an incremental refresh too small to fill one row per file: a skip too
        rdir = Path((item[0] if isinstance(item, list) else item)["run_dir"])
        if load_run_config(rdir).minhash.use_index:
            raise nothing_new(rdir, f"too little new to fill the training files ({exc})") from exc
        raise


def _check_item(step, item) -> None:
    """The task boundary: the record a step receives has the fields its function reads (``records``)."""
    if step.kind == "batch":
        records.checked(item, records.BatchHandle, step.task_id)
    elif step.kind == "map":
        records.checked(item, records.MAPPED[step.call], step.task_id)
    elif step.kind in ("run", "fan"):
        if not isinstance(item, list) or not item:
            raise records.TaskRecordError(f"task {step.task_id}: expected the list of batch handles, got {item!r}")
        for handle in item:
            records.checked(handle, records.BatchHandle, step.task_id)


def _call_step(step, fn, item, plan_args: dict):
    with task_pools(step=step.task_id):
        if step.kind == "plan":
            return fn(**plan_args)
        if step.kind != "batch":
            return fn(item) if step.stage is None else fn(step.stage, item)
        out = fn(step.stage, item)
        if step.then:       # the batch's later stages in the same task: their own profile, markers and stats
            out["then"] = {stage: {k: v for k, v in fn(stage, item).items()
                                   if k in ("wall_s", "cpu_s", "peak_rss_mb")} for stage in step.then}
        return out


def run_all(params: dict | MindloomConfig, run_id: str, config_path: str | None = None, progress: bool = True) -> dict:
    """The whole chain in this process (the CLI path): every step of :data:`pipeline.tasks.steps.STEPS` in order,
    mapped steps once per item, exactly as the DAG's tasks run them.  Returns the publish step's summary (an
    incremental refresh with nothing new raises :class:`NothingToShip` from the step that found it)."""
    from tqdm import tqdm

    out: dict = {}
    for step in steps.STEPS:
        if step.kind == "plan":
            out[step.task_id] = run_step(step.task_id, params=params, run_id=run_id, config_path=config_path)
        elif step.mapped:
            items = out["plan"] if step.kind == "batch" else out[step.over]
            out[step.task_id] = [run_step(step.task_id, it) for it in
                                 tqdm(items, desc=step.task_id, disable=not progress, unit="task")]
        else:
            out[step.task_id] = run_step(step.task_id, out["plan"])
    return out["publish"]
