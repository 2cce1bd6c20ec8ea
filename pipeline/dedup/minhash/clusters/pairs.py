"""Clustering step 1 (per task): the distinct candidate pairs of the task's slots, and what each needs read.

Stage 2 wrote every band's star edges (anchor a, member b) as runs addressed by the slot of ``a``
(:mod:`pipeline.dedup.minhash.buckets`), so the edges of one anchor in all bands meet in one task.  The task reads
its slots from every band's runs, one slot range at a time within ``memory_mb``, and keeps each pair once.

It then asks the documents' own tasks for what the check needs (:mod:`.gather`): every current document of a pair
is requested by the slot of the pair's anchor, with a flag saying whether its shingle set is needed (a pair of
this run, check on) or its signature (a pair with an earlier release); every request also brings the document's
survivor fields.  Requests are addressed to the *document range* of the document (the task whose shards hold it),
so the gather task reads its own shards once, in order; they are addressed by :func:`doc_slot`, a linear cut of the
ids, so it reads them a range at a time.

Memory: about ``BYTES_PER_EDGE`` per candidate edge of the slot range being made distinct.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

import pipeline.dedup.minhash.clusters.runs as runs
from pipeline.dedup.minhash.verify import is_index

BYTES_PER_EDGE = 128         # peak per candidate edge read: the edges, the sort, the requests (measured, plus margin)
NEED_SET, NEED_SIGNATURE = 1, 2


def edge_schema():
    import pyarrow as pa

    return pa.schema([("a", pa.uint64()), ("b", pa.uint64())])


def request_schema():
    import pyarrow as pa

    return pa.schema([("gid", pa.uint64()), ("slot", pa.int32()), ("need", pa.int8())])


def distinct(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each (a, b) once, sorted by a then b."""
    if not len(a):
        return a, b
    order = np.lexsort((b, a))
    a, b = a[order], b[order]
    keep = np.r_[True, (a[1:] != a[:-1]) | (b[1:] != b[:-1])]
    return a[keep], b[keep]


def doc_slot(gids: np.ndarray, docs: int) -> np.ndarray:
    """The slot a request for a current document is addressed to: a linear cut of the global ids (slot order is
    document order), so a gather task reads its documents' requests in ranges, in shard order."""
    return np.minimum(gids.astype(np.int64) * runs.SLOTS // max(1, docs), runs.SLOTS - 1)


def run_pairs(ctx, item: dict) -> dict:
    """Distinct pairs of the item's slots → runs ``pairs`` (by slot of a) and ``requests`` (by document range)."""
    import pyarrow as pa

    lo, hi = runs.task_slots(item["task"], item["of"])
    band_runs = ctx.band_runs()
    pairs_out = runs.RunWriter(ctx.rdir, "pairs", item["task"], item["of"], "pairs")
    requests_out = runs.RunWriter(ctx.rdir, "pairs", item["task"], item["of"], "requests")
    stats = {"candidate_edges": 0, "distinct_pairs": 0, "index_pairs": 0, "ranges": 0}
    counts = runs.slot_counts(band_runs, lo, hi)
    for r0, r1 in runs.plan_ranges(counts, lo, BYTES_PER_EDGE, ctx.budget):
        t = runs.read_range(band_runs, r0, r1, edge_schema())
        a, b = distinct(t.column("a").to_numpy(), t.column("b").to_numpy())
        stats["candidate_edges"] += t.num_rows
        del t
        stats["distinct_pairs"] += len(a)
        stats["ranges"] += 1
        old = is_index(b)
        stats["index_pairs"] += int(old.sum())
        slot = runs.slot_of(a)
        pairs_out.write(pa.table({"a": a, "b": b}, schema=edge_schema()), slot)
        # requests: a for every pair, b for pairs inside this run; the flag says what the check reads
        need_a = np.where(old, NEED_SIGNATURE, NEED_SET) if ctx.cfg.jaccard_check else np.zeros(len(a))
        gid = np.concatenate([a, b[~old]])
        need = np.concatenate([need_a, np.full(int((~old).sum()), NEED_SET if ctx.cfg.jaccard_check else 0)])
        req_slot = np.concatenate([slot, slot[~old]])
        gid, req_slot, need = _merge_requests(gid, req_slot, need.astype(np.int8))
        requests_out.write(pa.table({"gid": gid, "slot": req_slot.astype(np.int32), "need": need},
                                    schema=request_schema()), doc_slot(gid, ctx.docs))
    return {"pairs": pairs_out.written, "requests": requests_out.written}, stats


def _merge_requests(gid: np.ndarray, slot: np.ndarray, need: np.ndarray):
    """One request per (gid, slot), its flags OR-ed."""
    if not len(gid):
        return gid, slot, need
    order = np.lexsort((slot, gid))
    gid, slot, need = gid[order], slot[order], need[order]
    first = np.r_[True, (gid[1:] != gid[:-1]) | (slot[1:] != slot[:-1])]
    starts = np.flatnonzero(first)
    return gid[starts], slot[starts], np.bitwise_or.reduceat(need, starts).astype(np.int8)


def read_pairs(ctx, item: dict, r0: int, r1: int) -> tuple[np.ndarray, np.ndarray]:
    """The task's own distinct pairs of slots ``[r0, r1)`` (a pair's slot is in one of its runs only, so they are
    distinct as read)."""
    paths = [runs.step_dir(ctx.rdir, "pairs") / r["run"] for r in ctx.own_marker("pairs", item)["outputs"]["pairs"]]
    t = runs.read_range(paths, r0, r1, edge_schema())
    return t.column("a").to_numpy(), t.column("b").to_numpy()


def pair_counts(ctx, item: dict, lo: int, hi: int) -> np.ndarray:
    paths = [runs.step_dir(ctx.rdir, "pairs") / r["run"] for r in ctx.own_marker("pairs", item)["outputs"]["pairs"]]
    return runs.slot_counts(paths, lo, hi)


def band_edges(band_run_paths: list[Path], r0: int, r1: int) -> tuple[np.ndarray, np.ndarray]:
    t = runs.read_range(band_run_paths, r0, r1, edge_schema())
    return t.column("a").to_numpy(), t.column("b").to_numpy()
