"""Stage 3: distinct candidate pairs → (optional) similarity check → connected components → who survives.

Memory is bounded by what is *duplicated*, never by the corpus: the task never holds a signature table or a
per-document array of the whole run.  Edges are read band file by band file; when all of them would not fit
``memory_mb`` they are spilled into hash partitions on disk (``a mod K``) and made distinct one partition at a
time.  Union-find runs on compact ids of the documents that have at least one surviving edge, with numpy
hooking (each root hooks onto the smallest root it touches) and pointer jumping, so the component label is its
smallest global id whatever the edge order — deterministic.

Memory: about 64 bytes per candidate edge of the edge partition being made distinct (all bands' edges of a pair
count, so a pair found by all 14 bands costs 14 edges; ``memory_mb`` sets the partition count) plus about 100
bytes per document with a surviving edge (compact id, parent, best similarity, ``union1d``/``searchsorted``
temporaries), and the shingle sets of those documents on disk for the Jaccard check.  Nothing scales with the
corpus itself.  Measured (peak RSS rise, fresh process, synthetic stage-2 output where every band finds the same
pairs, check off): 1 M documents with 20 k / 100 k / 200 k of them in clusters: 57 / 110 / 190 MB, i.e. about
700 bytes per clustered document at 12.6 candidate edges each (55 per edge); 0.5 M and 1 M documents with 100 k clustered:
108 and 110 MB.  ``BENCHMARKS.md`` has the same stage on real text (peak RSS 268 → 369 MB for 1× → 8× corpus).

Passes: every band file is read once here (spilled to ``a mod K`` partition files when the edges exceed
``memory_mb``, each written and read once); the rescue of buckets with a rejected anchor reads them once more, row
group by row group (:mod:`.rescue`); the texts of clustered documents are read once.  For 1e9 documents with 3e8 of
them in clusters the edge partitions stay at ``memory_mb``, but the union-find arrays (about 100 bytes per
clustered document) reach about 30 GB: the one part of MinHash that is not bounded by the configuration.

Which member of a component survives is decided by :mod:`pipeline.dedup.minhash.survivors` (``survivor_order``); a
component that contains a document of an earlier release keeps that one, since it has already shipped.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import numpy as np

import pipeline.dedup.minhash.survivors as survivors
from pipeline.dedup.minhash.config import REASON_NEAR_DUP, REASON_PREVIOUS, MinhashConfig, check_config
from pipeline.dedup.minhash.index import DedupIndex
from pipeline.dedup.minhash.layout import (
    band_path,
    clusters_summary_path,
    decisions_path,
    edges_path,
    gid_to_shard,
    read_manifest,
    stage_dir,
)
from pipeline.dedup.minhash.report import select_examples
from pipeline.dedup.minhash.verify import ShingleStore, estimated_jaccard, is_index
from pipeline.io import completed, read_json, write_json, write_marker, write_parquet
from pipeline.profile import own_peak_rss_mb

log = logging.getLogger(__name__)

_EDGE_BYTES = 64           # per edge while reading, sorting and checking one partition


# ------------------------------------------------------------------------------------------------------------
# Distinct edges, partitioned


def _band_edges(rdir: Path, band: int):
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(band_path(rdir, band))
    for i in range(pf.num_row_groups):
        t = pf.read_row_group(i)
        yield t.column("a").to_numpy(), t.column("b").to_numpy()


def _distinct(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if not len(a):
        return a, b
    order = np.lexsort((b, a))
    a, b = a[order], b[order]
    keep = np.r_[True, (a[1:] != a[:-1]) | (b[1:] != b[:-1])]
    return a[keep], b[keep]


def edge_partitions(rdir: Path, bands: int, total_edges: int, memory_mb: int, work: Path):
    """Yield (a, b) of distinct edges, one partition at a time (a single one when everything fits)."""
    k = max(1, -(-total_edges * _EDGE_BYTES // (memory_mb << 20)))
    if k == 1:
        parts = [e for band in range(bands) for e in _band_edges(rdir, band)]
        if parts:
            yield _distinct(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))
        return
    work.mkdir(parents=True, exist_ok=True)
    files = [open(work / f"part_{i:05d}.u64", "wb") for i in range(k)]
    try:
        for band in range(bands):
            for a, b in _band_edges(rdir, band):
                part = a % np.uint64(k)
                for i in np.unique(part):
                    sel = part == i
                    np.stack([a[sel], b[sel]], axis=1).astype(np.uint64).tofile(files[int(i)])
    finally:
        for f in files:
            f.close()
    for i in range(k):
        pairs = np.fromfile(work / f"part_{i:05d}.u64", dtype=np.uint64).reshape(-1, 2)
        (work / f"part_{i:05d}.u64").unlink()
        yield _distinct(pairs[:, 0].copy(), pairs[:, 1].copy())


# ------------------------------------------------------------------------------------------------------------
# Union-find with numpy


def _compress(parent: np.ndarray) -> np.ndarray:
    while True:
        grand = parent[parent]
        if np.array_equal(grand, parent):
            return parent
        parent = grand


def union(parent: np.ndarray, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Merge the components of each (u[i], v[i]); roots are always the smallest index of their component."""
    while len(u):
        parent = _compress(parent)
        ru, rv = parent[u], parent[v]
        open_ = ru != rv
        if not open_.any():
            break
        u, v, ru, rv = u[open_], v[open_], ru[open_], rv[open_]
        np.minimum.at(parent, np.maximum(ru, rv), np.minimum(ru, rv))
    return _compress(parent)


# ------------------------------------------------------------------------------------------------------------
# Stage 3 entry point


def run_clusters(rdir: Path, cfg: MinhashConfig) -> dict:
    """Clusters of the whole run → ``minhash/clusters/<shard>.parquet`` per shard + edges + summary."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    cfg = check_config(cfg)
    if not cfg.enabled:
        return {"skipped": "minhash.enabled is false"}
    rdir = Path(rdir)
    manifest = read_manifest(rdir, cfg.digest())
    summary_file = clusters_summary_path(rdir)
    if (done := completed(summary_file)) and done.get("config") == cfg.digest():
        summary = read_json(summary_file)
        if "examples" in summary:          # a summary from before the report's selection moved here is redone
            return summary
    index = DedupIndex.from_manifest(manifest)
    band_stats = []
    for band in range(cfg.bands):
        info = completed(band_path(rdir, band))
        if info is None or info.get("config") != cfg.digest():
            from pipeline.dedup.minhash.layout import MinhashError

            raise MinhashError(f"{band_path(rdir, band)}: stage 2 output missing or stale; run band {band}")
        band_stats.append(info["stats"])
    total_edges = sum(s["edges"] for s in band_stats)
    work = stage_dir(rdir) / "clusters" / ".work"
    shutil.rmtree(work, ignore_errors=True)

    # 1. distinct edges (partitioned), candidate nodes
    parts, nodes = [], np.zeros(0, np.uint64)
    for a, b in edge_partitions(rdir, cfg.bands, total_edges, cfg.memory_mb, work / "edges"):
        path = work / f"distinct_{len(parts):05d}.npy"
        path.parent.mkdir(parents=True, exist_ok=True)
        np.save(path, np.stack([a, b], axis=1))
        parts.append(path)
        intra = ~is_index(b)                 # only pairs inside this run need shingle sets
        nodes = np.union1d(nodes, np.union1d(a[intra], b[intra]))
    store = ShingleStore(rdir, manifest, cfg, nodes, work / ".shingles.u64") if cfg.jaccard_check else None

    # 2. check every distinct pair; keep passing edges
    stats = {"candidate_edges": total_edges, "distinct_pairs": 0, "checked": 0, "false_positives": 0,
             "index_pairs": 0, "index_false_positives": 0, "partitions": len(parts), "member_pairs": 0,
             "member_pairs_passed": 0}
    failed: list[tuple[np.ndarray, np.ndarray]] = []
    edge_schema = pa.schema([("a", pa.uint64()), ("b", pa.uint64()), ("similarity", pa.float32()),
                             ("method", pa.string()), ("passed", pa.bool_())])
    passed_files = []
    from pipeline.io import atomic_path

    with atomic_path(edges_path(rdir)) as tmp, pq.ParquetWriter(tmp, edge_schema, compression="zstd") as writer:
        for i, path in enumerate(parts):
            ab = np.load(path)
            a, b = ab[:, 0], ab[:, 1]
            old = is_index(b)
            sim = np.full(len(a), np.nan)
            method = np.where(old, "estimate", "exact") if cfg.jaccard_check else np.full(len(a), "none")
            if cfg.jaccard_check:
                sim[~old] = store.jaccard(a[~old], b[~old])
                sim[old] = estimated_jaccard(rdir, manifest, index, a[old], b[old], cfg.num_perm)
                ok = sim >= cfg.threshold
            else:
                ok = np.ones(len(a), bool)
            stats["distinct_pairs"] += len(a)
            stats["checked"] += len(a) if cfg.jaccard_check else 0
            stats["false_positives"] += int((~ok & ~old).sum())
            stats["index_pairs"] += int(old.sum())
            stats["index_false_positives"] += int((~ok & old).sum())
            writer.write_table(pa.table({"a": a, "b": b, "similarity": sim.astype(np.float32), "method": method,
                                         "passed": ok}, schema=edge_schema))
            failed.append((a[~ok & ~old], b[~ok & ~old]))
            keep = work / f"passed_{i:05d}.npy"
            np.save(keep, np.stack([a[ok], b[ok]], axis=1))
            np.save(work / f"passed_sim_{i:05d}.npy", sim[ok])
            passed_files.append(keep)
            path.unlink()
        if store is not None and failed:      # a rejected anchor: check the bucket's other members pairwise
            from pipeline.dedup.minhash.rescue import member_pairs

            a, b = member_pairs(rdir, cfg.bands, *(np.concatenate(x) for x in zip(*failed, strict=True)))
            sim = store.jaccard(a, b) if len(a) else np.zeros(0)
            ok = sim >= cfg.threshold
            stats["member_pairs"], stats["member_pairs_passed"] = len(a), int(ok.sum())
            writer.write_table(pa.table({"a": a, "b": b, "similarity": sim.astype(np.float32),
                                         "method": np.full(len(a), "exact_member"), "passed": ok},
                                        schema=edge_schema))
            np.save(work / f"passed_{len(parts):05d}.npy", np.stack([a[ok], b[ok]], axis=1))
            np.save(work / f"passed_sim_{len(parts):05d}.npy", sim[ok])
            passed_files.append(work / f"passed_{len(parts):05d}.npy")
    if store is not None:
        store.close()

    # 3. union-find over passing edges
    members = np.zeros(0, np.uint64)
    for path in passed_files:
        ab = np.load(path)
        members = np.union1d(members, ab.ravel())
    parent = np.arange(len(members), dtype=np.int64)
    best_sim = np.full(len(members), np.nan)
    for i, path in enumerate(passed_files):
        ab = np.load(path)
        u, v = np.searchsorted(members, ab[:, 0]), np.searchsorted(members, ab[:, 1])
        parent = union(parent, u, v)
        sim = np.load(work / f"passed_sim_{i:05d}.npy")
        for side in (u, v):
            np.fmax.at(best_sim, side, sim)
    root = parent
    decisions = survivors.decide(rdir, manifest, cfg, index, members, root, best_sim)
    shutil.rmtree(work, ignore_errors=True)

    # 4. per-shard decision files (one per shard, possibly empty) + summary
    _write_decisions(rdir, manifest, decisions)
    sizes = np.bincount(root)[np.unique(root)] if len(root) else np.zeros(0, np.int64)
    stats.update({
        "docs": manifest["docs"], "docs_in_clusters": int((~is_index(members)).sum()),
        "clusters": int(len(sizes)), "largest_cluster": int(sizes.max()) if len(sizes) else 0,
        "cluster_sizes": {str(k): int(v) for k, v in zip(*np.unique(sizes, return_counts=True), strict=True)},
        "removed": {reason: int(pc.sum(pc.equal(decisions.column("reason"), reason)).as_py() or 0)
                    for reason in (REASON_NEAR_DUP, REASON_PREVIOUS)},
        "bands": band_stats, "index_releases": index.releases, "threshold": cfg.threshold,
        "jaccard_check": cfg.jaccard_check, "examples": select_examples(decisions, cfg.report_examples)})
    write_json(summary_file, stats)
    write_marker(summary_file, {"config": cfg.digest()})
    log.info("minhash clusters: %d clusters, %d removed, %d false positives dropped, peak RSS %.0f MB",
             stats["clusters"], sum(stats["removed"].values()), stats["false_positives"], own_peak_rss_mb())
    return stats


def _write_decisions(rdir: Path, manifest: dict, decided) -> None:
    """One decisions file per shard (possibly empty), rows ascending."""
    import pyarrow as pa

    gids = decided.column("gid").to_numpy(zero_copy_only=False)
    shard_idx, rows = gid_to_shard(manifest, gids) if len(gids) else (np.zeros(0, int), np.zeros(0, int))
    for s, entry in enumerate(manifest["shards"]):
        sel = np.flatnonzero(shard_idx == s)
        sel = sel[np.argsort(rows[sel], kind="stable")]
        part = decided.take(pa.array(sel, pa.int64())).drop_columns(["gid", "kept_gid"])
        part = part.add_column(0, "row", pa.array(rows[sel].astype(np.int32)))
        write_parquet(part, decisions_path(rdir, entry["shard"]))
