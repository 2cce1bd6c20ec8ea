"""Stage 3 of MinHash: candidate pairs → similarity check → connected components → survivors, as mapped steps.

No task holds the clustered documents of the whole run.  The work is cut by a hash of the node (a document's
global id, or an earlier release's index node) into ``SLOTS`` slots (:mod:`.runs`), and each step is a set of
``T`` tasks, each reading the records addressed to its share of the slots from every file the step before wrote,
one slot range at a time within ``minhash.memory_mb``:

======== ============================================================= =========================================
step     what a task does                                              reads
======== ============================================================= =========================================
pairs    distinct candidate pairs of its slots; requests for the       its slots of every band's runs
         documents they need (:mod:`.pairs`)
gather   its own shards' requested rows: survivor fields, shingle      its document range's requests, its shards
         sets, signatures, sent to the slots that asked (:mod:`.gather`)
check    the similarity check, the rescue of buckets with a false      its pairs, its slots of the sets
         anchor, local components of the passing pairs (:mod:`.check`)
ls_1 …   large-star / small-star rounds, ``ROUNDS`` of them, no-ops    its slots of the previous round
         once the residual fits one task (:mod:`.components`)
finish   (one task) union-find over the residual                       the residual of the round that fit
labels   each node's label, fields and similarity, sent to its         its slots of the round's nodes, fields,
         label's slot (:mod:`.decide`)                                 similarities
decide   survivors per component; decisions sorted by gid              its slots of the members
======== ============================================================= =========================================

Stage 4 (:mod:`pipeline.dedup.minhash.removal`) reads a batch's id range of every ``decide`` run.

``T`` is set once per run by :func:`plan_tasks` (the DAG's fan step) from the candidate edges stage 2 found:
``parallelism`` at most, one task per ``EDGES_PER_TASK`` candidate edges at least, so a small corpus runs one
task per step and a terabyte runs ``parallelism``.  Every task commits a marker (its runs, counts, and a digest
of its settings and inputs, :func:`pipeline.dedup.minhash.clusters.runs.commit`): a killed run resumes at the
first task without one, and a rerun with unchanged inputs reads markers only.  The decisions do not depend on
``T`` or on the memory budget.

:func:`run_clusters` runs every step in this process (CLI, tests, benchmarks); the DAG maps each step over the
items of :func:`plan_tasks` and calls :func:`run_step`.
"""

from __future__ import annotations

import functools
import logging
import math
from pathlib import Path

import numpy as np

from pipeline.dedup.minhash.clusters import runs
from pipeline.dedup.minhash.clusters.components import ROUNDS, round_steps
from pipeline.dedup.minhash.config import REASON_NEAR_DUP, REASON_PREVIOUS, MinhashConfig, check_config
from pipeline.dedup.minhash.index import DedupIndex
from pipeline.dedup.minhash.layout import MinhashError, clusters_summary_path, read_manifest
from pipeline.io import config_digest, read_json, write_json

log = logging.getLogger(__name__)

#: one clustering task per this many candidate edges at least (below, a task's fixed cost is most of its work)
EDGES_PER_TASK = 4_000_000
STEPS: tuple[str, ...] = ("pairs", "gather", "check", *round_steps(), "finish", "labels", "decide")
SINGLE = ("finish",)
_BEFORE = dict(zip(STEPS[1:], STEPS[:-1], strict=True)) | {"pairs": "bands"}


def plan_path(rdir: Path) -> Path:
    return runs.step_dir(rdir, "plan.json")


def doc_ranges(manifest: dict, tasks: int) -> list[tuple[int, int]]:
    """Shard ranges ``[first, stop)`` of the ``tasks`` document ranges: contiguous, near equal in documents."""
    offsets = np.array([e["offset"] for e in manifest["shards"]] + [manifest["docs"]], np.int64)
    cuts = [0] + [int(np.searchsorted(offsets, k * manifest["docs"] // tasks, side="left"))
                  for k in range(1, tasks)] + [len(manifest["shards"])]
    cuts = np.maximum.accumulate(np.minimum(cuts, len(manifest["shards"])))
    return [(int(cuts[k]), int(cuts[k + 1])) for k in range(tasks)]


def plan_tasks(rdir: str | Path, cfg: MinhashConfig, parallelism: int) -> list[dict]:
    """The items every clustering step is mapped over: ``T`` = ``parallelism`` at most, one per
    ``EDGES_PER_TASK`` candidate edges at least; each names its slot share and its document range."""
    cfg = check_config(cfg)
    rdir = Path(rdir)
    if not cfg.enabled:
        return [{"run_dir": str(rdir), "task": 0, "of": 1, "shards": [0, 0]}]
    manifest = read_manifest(rdir, cfg.digest())
    found = runs.markers(rdir, "bands", cfg.bands, "run stage 2 (the band tasks) first")
    edges = sum(m["stats"]["edges"] for m in found)
    tasks = max(1, min(int(parallelism), math.ceil(edges / EDGES_PER_TASK)))
    ranges = doc_ranges(manifest, tasks)
    items = [{"run_dir": str(rdir), "task": k, "of": tasks, "shards": list(r)} for k, r in enumerate(ranges)]
    shards = manifest["shards"]
    starts = [shards[a]["offset"] if a < len(shards) else manifest["docs"] for a, _ in ranges]
    write_json(plan_path(rdir), {"tasks": tasks, "candidate_edges": edges, "config": cfg.digest(),
                                 "manifest": config_digest(manifest), "index": manifest.get("index") or {},
                                 "starts": starts, "docs": manifest["docs"], "items": items})
    return items


def _plan(rdir: Path, cfg: MinhashConfig) -> dict:
    path = plan_path(rdir)
    if not path.exists():
        raise MinhashError(f"{path} is missing: plan the clustering tasks after stage 2 (the bands)")
    plan = read_json(path)
    if plan.get("config") != cfg.digest():
        raise MinhashError(f"{path}: planned for another minhash config; plan the clustering tasks again")
    return plan


def planned_tasks(rdir: Path, cfg: MinhashConfig) -> int:
    """Clustering tasks the plan made (one no-op task when near dedup is off: nothing was planned)."""
    cfg = check_config(cfg)
    return int(_plan(rdir, cfg)["tasks"]) if cfg.enabled else 1


class Context:
    """What every clustering task reads first: the plan (task count, the manifest's digest, the index releases),
    the budget and the steps' markers.  The stage-1 manifest (about 250 bytes per shard) is parsed only by a task
    that reads shards (``gather``)."""

    def __init__(self, rdir: Path, cfg: MinhashConfig, tasks: int):
        self.rdir, self.cfg, self.tasks = Path(rdir), cfg, tasks
        plan = _plan(self.rdir, cfg)
        self.manifest_digest = plan["manifest"]
        self.starts = np.array(plan["starts"], np.int64)      # the document ranges' first global ids
        self.docs = int(plan["docs"])
        self.budget = cfg.memory_mb << 20
        self.index = DedupIndex.from_manifest({"index": plan.get("index")})
        self._markers: dict = {}

    @functools.cached_property
    def manifest(self) -> dict:
        manifest = read_manifest(self.rdir, self.cfg.digest())
        if config_digest(manifest) != self.manifest_digest:
            raise MinhashError(f"{self.rdir}: the stage-1 manifest changed after the clustering tasks were planned; "
                               "plan them again")
        return manifest

    def markers(self, step: str, tasks: int | None = None) -> list[dict]:
        n = tasks or (self.cfg.bands if step == "bands" else 1 if step in SINGLE else self.tasks)
        if (step, n) not in self._markers:
            self._markers[(step, n)] = runs.markers(self.rdir, step, n, f"run step {step!r} first")
        return self._markers[(step, n)]

    def inputs(self, step: str, output: str, tasks: int | None = None) -> list[Path]:
        return runs.input_runs(self.rdir, step, self.markers(step, tasks), output)

    def own_marker(self, step: str, item: dict) -> dict:
        return self.markers(step)[item["task"]]

    def band_runs(self) -> list[Path]:
        return self.inputs("bands", "edges")

    def band_runs_by_band(self) -> list[list[Path]]:
        return [runs.input_runs(self.rdir, "bands", [m], "edges") for m in self.markers("bands")]


    def engine(self):
        from pipeline.dedup.minhash.signatures import SignatureEngine

        return SignatureEngine(self.cfg)

    def bytes_per_set(self) -> float:
        """Memory per shingle set a check task holds: 12 bytes per hash (the one copy of :func:`runs.read_lists`,
        and the pages of the run being copied) plus 64 per set (its gid, bounds and sort)."""
        found = self.markers("gather")
        engines = {m["stats"].get("engine") for m in found if m["stats"].get("texts")}
        if len(engines) > 1:
            raise MinhashError(f"clustering gather: shingle sets were hashed by different engines {sorted(engines)} "
                               "(numba is missing on some workers); they cannot be compared")
        values = sum(m["stats"]["set_values"] for m in found)
        sets = sum(m["stats"]["texts"] for m in found)
        return 64.0 + 12.0 * values / max(1, sets)

    def residual_limit(self) -> int:
        from pipeline.dedup.minhash.clusters import components

        return self.budget // components.BYTES_PER_RESIDUAL


def _digest(ctx: Context, step: str, item: dict) -> str:
    before = _BEFORE[step]
    return runs.digest_of("minhash_cluster", step, ctx.cfg.digest(), ctx.manifest_digest, item["task"], item["of"],
                          inputs=ctx.markers(before))


def run_step(step: str, item: dict, cfg: MinhashConfig) -> dict:
    """One task of one clustering step (skipped when its marker matches); returns the task's counts."""
    from pipeline.dedup.minhash.clusters import check, components, decide, gather, pairs

    cfg = check_config(cfg)
    rdir = Path(item["run_dir"])
    if not cfg.enabled:
        return {"step": step, "skipped": "minhash.enabled is false"}
    if step not in STEPS:
        raise MinhashError(f"unknown clustering step {step!r}; one of {STEPS}")
    tasks = planned_tasks(rdir, cfg)
    if item["of"] != tasks:
        raise MinhashError(f"clustering step {step}: item of {item['of']} tasks, the plan has {tasks}; "
                           "plan the clustering tasks again")
    task, of = (0, 1) if step in SINGLE else (item["task"], item["of"])
    if step in SINGLE and item["task"] != 0:
        return {"step": step, "skipped": "one task"}
    ctx = Context(rdir, cfg, tasks)
    digest = _digest(ctx, step, {**item, "task": task, "of": of})
    if found := runs.done(rdir, step, task, of, digest):
        return {"step": step, "task": task, **found["stats"]}
    runs.clear_outputs(rdir, step, task, of)
    if step == "pairs":
        outputs, stats = pairs.run_pairs(ctx, item)
    elif step == "gather":
        outputs, stats = gather.run_gather(ctx, item)
    elif step == "check":
        outputs, stats = check.run_check(ctx, item)
    elif step == "finish":
        outputs, stats = components.run_finish(ctx)
    elif step == "labels":
        outputs, stats = decide.run_labels(ctx, item)
    elif step == "decide":
        outputs, stats = decide.run_decide(ctx, item)
    else:
        outputs, stats = components.run_round(ctx, step, item)
    runs.commit(rdir, step, task, of, digest, outputs, stats)
    return {"step": step, "task": task, **stats}


def run_clusters(rdir: str | Path, cfg: MinhashConfig, parallelism: int = 1) -> dict:
    """Every clustering step in this process, as the DAG runs them; returns the summary."""
    cfg = check_config(cfg)
    if not cfg.enabled:
        return {"skipped": "minhash.enabled is false"}
    items = plan_tasks(rdir, cfg, parallelism)
    for step in STEPS:
        for item in items[:1] if step in SINGLE else items:
            run_step(step, item, cfg)
    return write_summary(rdir, cfg)


def decisions_ready(rdir: Path, cfg: MinhashConfig) -> Context:
    ctx = Context(rdir, cfg, planned_tasks(rdir, cfg))
    ctx.markers("decide")
    return ctx


def write_summary(rdir: str | Path, cfg: MinhashConfig) -> dict:
    """``clusters/summary.json`` from the steps' markers (no decision read): what the report shows."""
    from pipeline.dedup.minhash.clusters.decide import best_examples

    cfg = check_config(cfg)
    rdir = Path(rdir)
    ctx = decisions_ready(rdir, cfg)
    docs = read_manifest(rdir, cfg.digest())["docs"]

    def total(step: str, key: str) -> int:
        return sum(m["stats"].get(key, 0) for m in ctx.markers(step))

    decided = ctx.markers("decide")
    sizes: dict[str, int] = {}
    for m in decided:
        for k, v in m["stats"]["cluster_sizes"].items():
            sizes[k] = sizes.get(k, 0) + v
    finish = ctx.markers("finish")[0]["stats"]
    summary = {
        "candidate_edges": total("pairs", "candidate_edges"), "distinct_pairs": total("check", "distinct_pairs"),
        "checked": total("check", "checked"), "false_positives": total("check", "false_positives"),
        "index_pairs": total("check", "index_pairs"), "index_false_positives": total("check", "index_false_positives"),
        "member_pairs": total("check", "member_pairs"), "member_pairs_passed": total("check", "member_pairs_passed"),
        "tasks": ctx.tasks, "rounds": finish["round"], "residual_edges": finish["residual"],
        "docs": docs, "docs_in_clusters": total("decide", "docs_in_clusters"),
        "clusters": total("decide", "clusters"),
        "largest_cluster": max((m["stats"]["largest_cluster"] for m in decided), default=0),
        "cluster_sizes": dict(sorted(sizes.items(), key=lambda kv: int(kv[0]))),
        "removed": {r: sum(m["stats"]["removed"][r] for m in decided) for r in (REASON_NEAR_DUP, REASON_PREVIOUS)},
        "bands": [m["stats"] for m in ctx.markers("bands")], "index_releases": ctx.index.releases,
        "threshold": cfg.threshold, "jaccard_check": cfg.jaccard_check,
        "examples": best_examples([e for m in decided for e in m["stats"]["examples"]], cfg.report_examples)}
    write_json(clusters_summary_path(rdir), summary)
    log.info("minhash clusters: %d clusters, %d removed, %d false positives dropped, %d tasks, resolved after "
             "round %d", summary["clusters"], sum(summary["removed"].values()), summary["false_positives"],
             ctx.tasks, summary["rounds"])
    return summary


def read_decisions(rdir: Path, cfg: MinhashConfig, gid_lo: int, gid_hi: int):
    """Decisions of global ids ``[gid_lo, gid_hi)``, sorted by gid, from every ``decide`` run."""
    from pipeline.dedup.minhash.clusters.decide import decision_schema

    ctx = decisions_ready(rdir, cfg)
    return runs.read_sorted(ctx.inputs("decide", "decisions"), "gid", gid_lo, gid_hi, decision_schema())


def checked_pairs(rdir: str | Path, cfg: MinhashConfig):
    """Every checked pair of the run with its similarity, method and verdict (the check's ``checked`` runs)."""
    from pipeline.dedup.minhash.clusters.check import checked_schema

    cfg = check_config(cfg)
    ctx = Context(Path(rdir), cfg, planned_tasks(Path(rdir), cfg))
    return runs.read_range(ctx.inputs("check", "checked"), 0, runs.SLOTS, checked_schema())


def band_edges(rdir: str | Path, cfg: MinhashConfig, band: int):
    """Stage 2's candidate edges (a, b) of one band, from its runs."""
    from pipeline.dedup.minhash.clusters.pairs import edge_schema

    cfg = check_config(cfg)
    found = read_json(runs.marker_file(Path(rdir), "bands", band, cfg.bands))
    return runs.read_range(runs.input_runs(Path(rdir), "bands", [found], "edges"), 0, runs.SLOTS, edge_schema())


__all__ = ["band_edges", "checked_pairs", "ROUNDS", "STEPS", "plan_tasks", "read_decisions", "run_clusters",
           "run_step", "write_summary"]
