"""Clustering step 3 (per task): the similarity check of the task's pairs, and its local components.

For one slot range at a time (within ``memory_mb``) the task holds its distinct pairs and the shingle sets and
signatures the gather tasks sent to those slots (:mod:`.gather`):

* a pair of this run gets the **exact** Jaccard similarity of the two sets (64-bit shingle hashes: a spurious
  collision has probability about |A|·|B|/2^64);
* a pair with an earlier release (an index node) gets the **estimated** similarity, the share of equal signature
  values, since the index keeps signatures, not texts;
* a bucket whose anchor failed the check gets its other members checked against each other (stage 2 emits each
  bucket as a star around its smallest id, so a false anchor would otherwise split true duplicates): all member
  pairs up to ``PAIRWISE_MAX`` members, else a star around the smallest rejected member.  The members' sets are
  at hand: they were asked for by the anchor's slot.  The bucket's edges are re-read from the band runs of this
  slot range only when it has a rejected pair.

With the check off every candidate pair passes.  Every checked pair is written with its verdict (output
``checked``); the pairs that pass are reduced to their components *within the slot range* by union-find, and each
component becomes a star around its smallest id, addressed both ways for the first round of
:mod:`.components` (output ``edges``); every passing pair's best similarity goes to the slots of its two documents
(output ``sims``).  The stars span the same components as the pairs, in no more edges.

Memory: about ``BYTES_PER_PAIR`` per pair and 16 bytes per shingle hash of the range's sets.
"""

from __future__ import annotations

from itertools import combinations

import numpy as np

import pipeline.dedup.minhash.clusters.runs as runs
from pipeline.dedup.minhash.clusters.components import star_edges, union_stars
from pipeline.dedup.minhash.clusters.pairs import band_edges, pair_counts, read_pairs
from pipeline.dedup.minhash.layout import split_index_node
from pipeline.dedup.minhash.verify import intersections, is_index

BYTES_PER_PAIR = 320         # peak per distinct pair, check off (measured, plus margin): stars, similarities, verdicts
#: buckets with at most this many members (anchor excluded) get every member pair checked
PAIRWISE_MAX = 64


def checked_schema():
    import pyarrow as pa

    return pa.schema([("a", pa.uint64()), ("b", pa.uint64()), ("similarity", pa.float32()),
                      ("method", pa.string()), ("passed", pa.bool_())])


def sims_schema():
    import pyarrow as pa

    return pa.schema([("node", pa.uint64()), ("sim", pa.float32())])


class _Store:
    """The shingle sets (or signatures) a slot range received, by gid.

    The lists are copied once, straight from the mapped runs into one array (:func:`runs.read_lists`), and left
    in the order read: only the small per-document arrays are sorted by gid (``bounds`` holds each document's
    start and end, interleaved, so ``bounds[2k]:bounds[2k + 1]`` are the values of ``gids[k]``).  The store
    holds each hash once, 8 bytes; a document sent to the range twice is kept twice, looked up once."""

    def __init__(self, paths: list, lo: int, hi: int):
        gids, starts, self.values = runs.read_lists(paths, lo, hi, "values")
        order = np.argsort(gids, kind="stable")
        first = np.r_[True, gids[order][1:] != gids[order][:-1]] if len(gids) else np.zeros(0, bool)
        keep = order[first]
        self.gids = gids[keep]
        self.bounds = np.empty(2 * len(keep), np.int64)
        self.bounds[0::2], self.bounds[1::2] = starts[keep], starts[keep + 1]

    def positions(self, gids: np.ndarray, what: str) -> np.ndarray:
        pos = np.searchsorted(self.gids, gids)
        ok = (pos < len(self.gids)) & (self.gids[np.minimum(pos, max(len(self.gids) - 1, 0))] == gids)
        if not ok.all():
            from pipeline.dedup.minhash.layout import MinhashError

            raise MinhashError(f"clustering check: the {what} of document {int(gids[~ok][0])} was not gathered; "
                               "rerun the gather step")
        return pos

    def jaccard(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        ia, ib = self.positions(a, "shingle set"), self.positions(b, "shingle set")
        sizes = self.bounds[1::2] - self.bounds[0::2]
        inter = intersections(self.values, self.bounds, 2 * ia, 2 * ib)
        union = sizes[ia] + sizes[ib] - inter
        return np.where(union > 0, inter / np.maximum(union, 1), 1.0)


def run_check(ctx, item: dict) -> tuple[dict, dict]:
    import pyarrow as pa

    task, tasks = item["task"], item["of"]
    lo, hi = runs.task_slots(task, tasks)
    set_runs, sig_runs = ctx.inputs("gather", "sets"), ctx.inputs("gather", "sigs")
    out = {name: runs.RunWriter(ctx.rdir, "check", task, tasks, name) for name in ("checked", "edges", "sims")}
    stats = {"distinct_pairs": 0, "checked": 0, "false_positives": 0, "index_pairs": 0, "index_false_positives": 0,
             "member_pairs": 0, "member_pairs_passed": 0, "passed": 0, "ranges": 0, "set_bytes_max": 0}
    per_set = ctx.bytes_per_set()
    counts = pair_counts(ctx, item, lo, hi) * BYTES_PER_PAIR
    if ctx.cfg.jaccard_check:
        counts = counts + runs.slot_counts(set_runs, lo, hi) * per_set
    for r0, r1 in runs.plan_ranges(counts, lo, 1.0, ctx.budget):
        a, b = read_pairs(ctx, item, r0, r1)
        stats["ranges"] += 1
        old = is_index(b)
        sim = np.full(len(a), np.nan)
        method = np.full(len(a), "none", dtype=object)
        ok = np.ones(len(a), bool)
        extra = (np.zeros(0, np.uint64),) * 2 + (np.zeros(0),)
        if ctx.cfg.jaccard_check:
            store = _Store(set_runs, r0, r1)
            stats["set_bytes_max"] = max(stats["set_bytes_max"], int(store.values.nbytes))
            cur = ~old
            sim[cur] = store.jaccard(a[cur], b[cur])
            if old.any():
                sim[old] = _estimated(ctx, sig_runs, r0, r1, a[old], b[old])
            method = np.where(old, "estimate", "exact").astype(object)
            ok = sim >= ctx.cfg.threshold
            failed = ~ok & cur
            if failed.any():
                extra = _rescue(ctx, r0, r1, a[failed], b[failed], store)
            del store
        stats["distinct_pairs"] += len(a)
        stats["checked"] += len(a) if ctx.cfg.jaccard_check else 0
        stats["false_positives"] += int((~ok & ~old).sum())
        stats["index_pairs"] += int(old.sum())
        stats["index_false_positives"] += int((~ok & old).sum())
        ma, mb, msim = extra
        mok = msim >= ctx.cfg.threshold
        stats["member_pairs"] += len(ma)
        stats["member_pairs_passed"] += int(mok.sum())
        ca = np.concatenate([a, ma])
        cb = np.concatenate([b, mb])
        csim = np.concatenate([sim, msim]).astype(np.float32)
        cok = np.concatenate([ok, mok])
        cmethod = np.concatenate([method, np.full(len(ma), "exact_member", dtype=object)])
        out["checked"].write(pa.table({"a": ca, "b": cb, "similarity": csim, "method": pa.array(cmethod, pa.string()),
                                       "passed": cok}, schema=checked_schema()), runs.slot_of(ca))
        pa_, pb, psim = ca[cok], cb[cok], csim[cok]
        stats["passed"] += len(pa_)
        key, other = union_stars(pa_, pb)
        out["edges"].write(*star_edges(key, other))
        nodes = np.concatenate([pa_, pb])
        best = np.concatenate([psim, psim])
        nodes, best = _max_by_node(nodes, best)
        out["sims"].write(pa.table({"node": nodes, "sim": best}, schema=sims_schema()), runs.slot_of(nodes))
    return {name: w.written for name, w in out.items()}, stats


def _max_by_node(nodes: np.ndarray, sim: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each node once with its largest similarity (NaN when it has none: check off)."""
    if not len(nodes):
        return nodes, sim
    order = np.argsort(nodes, kind="stable")
    nodes, sim = nodes[order], sim[order]
    starts = np.flatnonzero(np.r_[True, nodes[1:] != nodes[:-1]])
    return nodes[starts], np.fmax.reduceat(sim, starts).astype(np.float32)


def _estimated(ctx, sig_runs: list, lo: int, hi: int, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Share of equal signature values between current documents ``a`` and index nodes ``b``."""
    store = _Store(sig_runs, lo, hi)
    pos = store.positions(a, "signature")
    n = ctx.cfg.num_perm
    cur = store.values.reshape(-1, n)[store.bounds[0::2][pos] // n] if len(store.values) else np.zeros((0, n),
                                                                                                    np.uint64)
    rel, ords = split_index_node(b)
    old = np.zeros_like(cur)
    for r in np.unique(rel):
        sel = np.flatnonzero(rel == r)
        old[sel] = ctx.index.signatures(int(r), ords[sel])
    return (cur == old).mean(axis=1)


def _rescue(ctx, r0: int, r1: int, failed_a: np.ndarray, failed_b: np.ndarray, store: _Store):
    """Member pairs of the buckets (in any band) whose anchor failed against a member, and their similarity."""
    failed = set(zip(failed_a.tolist(), failed_b.tolist(), strict=True))
    anchors = np.unique(failed_a)
    out: set[tuple[int, int]] = set()
    for band_runs in ctx.band_runs_by_band():
        a, b = band_edges(band_runs, r0, r1)
        sel = np.isin(a, anchors) & ~is_index(b)
        a, b = a[sel], b[sel]
        order = np.lexsort((b, a))
        a, b = a[order], b[order]
        if not len(a):
            continue
        starts = np.flatnonzero(np.r_[True, a[1:] != a[:-1]])
        for s, e in zip(starts, np.r_[starts[1:], len(a)], strict=True):
            anchor, members = int(a[s]), b[s:e].tolist()
            bad = [m for m in members if (anchor, m) in failed]
            if not bad or len(members) < 2:
                continue
            if len(members) <= PAIRWISE_MAX:
                out.update(combinations(members, 2))            # members are sorted: x < y
            else:
                out.update((min(bad[0], m), max(bad[0], m)) for m in members if m != bad[0])
    pairs = np.array(sorted(out), np.uint64).reshape(-1, 2)
    ma, mb = pairs[:, 0].copy(), pairs[:, 1].copy()
    return ma, mb, (store.jaccard(ma, mb) if len(ma) else np.zeros(0))
