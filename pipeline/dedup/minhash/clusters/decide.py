"""Clustering steps 10-11: every member of a component brought to its label's slot, then who survives.

``labels`` (per task, by node slot): each node's component label (:mod:`.components`), joined with its survivor
fields (sent by its document range, :mod:`.gather`) and its best similarity (from the check), is sent to the
slot of its label (output ``members``).

``decide`` (per task, by label slot): a slot range's members grouped by label, one sort; the rule of
:mod:`pipeline.dedup.minhash.survivors` picks who stays.  The removed documents are written sorted by global id
(output ``decisions``), so the removal task of a batch of shards reads its id range from each run by binary
search.  The task also counts its components (sizes, removals by reason) and keeps its largest ones as report
examples, so the summary adds up markers and reads no decision.

Memory: about ``LABEL_BYTES`` per node (labels) and ``DECIDE_BYTES`` per member (decide) of the slot range held.
"""

from __future__ import annotations

import numpy as np

import pipeline.dedup.minhash.clusters.runs as runs
from pipeline.dedup.minhash.clusters.check import sims_schema
from pipeline.dedup.minhash.clusters.components import finish_round, labels_of, load_roots, node_schema
from pipeline.dedup.minhash.clusters.gather import fields_schema
from pipeline.dedup.minhash.config import REASON_NEAR_DUP, REASON_PREVIOUS
from pipeline.dedup.minhash.layout import MinhashError, split_index_node
from pipeline.dedup.minhash.survivors import rank_keys
from pipeline.dedup.minhash.verify import is_index

LABEL_BYTES = 400            # peak per node of labels (measured, plus margin): nodes, fields, similarities, the join
DECIDE_BYTES = 700           # peak per member of decide (measured, plus margin): members, rank keys, doc ids, output


def member_schema():
    import pyarrow as pa

    return pa.schema([("label", pa.uint64()), ("node", pa.uint64()), ("doc_id", pa.large_string()),
                      ("keep", pa.int8()), ("score", pa.float64()), ("n_chars", pa.int64()),
                      ("source", pa.large_string()), ("sim", pa.float32())])


def decision_schema():
    import pyarrow as pa

    return pa.schema([("gid", pa.uint64()), ("doc_id", pa.string()), ("cluster", pa.uint64()),
                      ("kept_doc_id", pa.string()), ("kept_gid", pa.uint64()), ("reason", pa.string()),
                      ("similarity", pa.float32())])


def _lookup(keys: np.ndarray, table, column: str) -> np.ndarray:
    """Row of ``table`` (sorted by ``column``) for every key, -1 where absent."""
    col = table.column(column).to_numpy()
    if not len(col):
        return np.full(len(keys), -1)
    pos = np.minimum(np.searchsorted(col, keys), len(col) - 1)
    return np.where(col[pos] == keys, pos, -1)


def _sorted_by(table, column: str):
    import pyarrow as pa

    order = np.argsort(table.column(column).to_numpy(), kind="stable")
    return table.take(pa.array(order))


def run_labels(ctx, item: dict) -> tuple[dict, dict]:
    """Members of the task's node slots, sent to their labels' slots."""
    import pyarrow as pa
    import pyarrow.compute as pc

    lo, hi = runs.task_slots(item["task"], item["of"])
    r = finish_round(ctx)
    node_runs = ctx.inputs(f"ls_{r}", "nodes")
    field_runs, sim_runs = ctx.inputs("gather", "fields"), ctx.inputs("check", "sims")
    roots = load_roots(ctx)
    writer = runs.RunWriter(ctx.rdir, "labels", item["task"], item["of"], "members")
    stats = {"members": 0, "ranges": 0}
    counts = runs.slot_counts(node_runs, lo, hi)
    for r0, r1 in runs.plan_ranges(counts, lo, LABEL_BYTES, ctx.budget):
        node, label = labels_of(runs.read_range(node_runs, r0, r1, node_schema()), roots)
        order = np.argsort(node, kind="stable")
        node, label = node[order], label[order]
        fields = _sorted_by(runs.read_range(field_runs, r0, r1, fields_schema()), "gid")
        sims = runs.read_range(sim_runs, r0, r1, sims_schema())
        snode, ssim = sims.column("node").to_numpy(), sims.column("sim").to_numpy()
        best = np.full(len(node), np.nan, np.float32)
        if len(snode):                                 # a node's pairs may have been checked in several slots
            at = np.searchsorted(node, snode)
            np.fmax.at(best, np.minimum(at, max(len(node) - 1, 0)), ssim)
        cur = ~is_index(node)
        row = _lookup(node, fields, "gid")
        if (row[cur] < 0).any():
            raise MinhashError("clustering labels: no survivor fields for document "
                               f"{int(node[cur][row[cur] < 0][0])}; rerun the gather step")
        take = pa.array(np.where(row >= 0, row, 0))
        valid = pa.array(row >= 0)
        cols = {c: pc.if_else(valid, fields.column(c).take(take), pa.nulls(len(node), fields.schema.field(c).type))
                if len(fields) else pa.nulls(len(node), fields.schema.field(c).type)
                for c in ("doc_id", "keep", "score", "n_chars", "source")}
        members = pa.table({"label": label, "node": node, **cols, "sim": best}, schema=member_schema())
        writer.write(members, runs.slot_of(label))
        stats["members"] += len(node)
        stats["ranges"] += 1
    return {"members": writer.written}, stats


def run_decide(ctx, item: dict) -> tuple[dict, dict]:
    """Survivors of the components whose labels are in the task's slots: ``decisions`` sorted by gid."""
    lo, hi = runs.task_slots(item["task"], item["of"])
    member_runs = ctx.inputs("labels", "members")
    writer = runs.RunWriter(ctx.rdir, "decide", item["task"], item["of"], "decisions")
    stats = {"members": 0, "docs_in_clusters": 0, "clusters": 0, "largest_cluster": 0, "cluster_sizes": {},
             "removed": {REASON_NEAR_DUP: 0, REASON_PREVIOUS: 0}, "examples": [], "ranges": 0}
    counts = runs.slot_counts(member_runs, lo, hi)
    for r0, r1 in runs.plan_ranges(counts, lo, DECIDE_BYTES, ctx.budget):
        members = runs.read_range(member_runs, r0, r1, member_schema())
        decided, sizes = decide_members(ctx, members)
        stats["ranges"] += 1
        stats["members"] += members.num_rows
        stats["docs_in_clusters"] += int((~is_index(members.column("node").to_numpy())).sum())
        stats["clusters"] += len(sizes)
        stats["largest_cluster"] = max([stats["largest_cluster"], *sizes.tolist()])
        for k, v in zip(*np.unique(sizes, return_counts=True), strict=True):
            stats["cluster_sizes"][str(k)] = stats["cluster_sizes"].get(str(k), 0) + int(v)
        reasons = decided.column("reason").to_numpy(zero_copy_only=False)
        for reason in stats["removed"]:
            stats["removed"][reason] += int((reasons == reason).sum())
        stats["examples"] = best_examples(stats["examples"] + select_examples(decided, ctx.cfg.report_examples),
                                          ctx.cfg.report_examples)
        writer.write(decided, np.zeros(decided.num_rows, np.int64))
    return {"decisions": writer.written}, stats


def best_examples(found: list[dict], limit: int) -> list[dict]:
    """The ``limit`` clusters with the most removed documents (ties: smallest cluster id)."""
    return sorted(found, key=lambda e: (-e["removed_count"], e["cluster"]))[:limit]


def decide_members(ctx, members):
    """Removed current documents of complete components, sorted by gid, and every component's size.

    A component holding an earlier release's document keeps the smallest such node: every current member goes
    with reason ``near_duplicate_of_previous_release`` and kept id ``<release>:<doc_id>``.  Otherwise the first
    current member by the configured rank keys stays."""
    import pyarrow as pa
    import pyarrow.compute as pc

    schema = decision_schema()
    if not members.num_rows:
        return schema.empty_table(), np.zeros(0, np.int64)
    label, node = members.column("label").to_numpy(), members.column("node").to_numpy()
    order = np.lexsort((node, label))
    members = members.take(pa.array(order))
    label, node = label[order], node[order]
    comps, cinv, sizes = np.unique(label, return_inverse=True, return_counts=True)
    old = is_index(node)
    cur = np.flatnonzero(~old)
    # the smallest earlier-release node of each component (nodes ascend within a label)
    old_pos = np.flatnonzero(old)
    old_comp, first = np.unique(cinv[old_pos], return_index=True)
    has_old = np.zeros(len(comps), bool)
    has_old[old_comp] = True
    keeper_node = np.zeros(len(comps), np.uint64)
    keeper_node[old_comp] = node[old_pos[first]]
    keeper_id = np.full(len(comps), "", dtype=object)
    rel, ords = split_index_node(keeper_node[old_comp])
    for r in np.unique(rel):
        sel = np.flatnonzero(rel == r)
        keeper_id[old_comp[sel]] = [f"{ctx.index.releases[int(r)]}:{d}" for d in ctx.index.doc_ids(int(r), ords[sel])]
    # the survivor of every component without one: first of its current members by the rank keys
    fields = members.take(pa.array(cur))
    fields = fields.set_column(fields.schema.get_field_index("doc_id"), "doc_id",
                               fields.column("doc_id").cast(pa.string()))
    fields = fields.set_column(fields.schema.get_field_index("source"), "source",
                               fields.column("source").cast(pa.string()))
    ccur = cinv[cur]
    gids = node[cur]
    keys = rank_keys(fields, gids, ctx.cfg.survivor_order, ctx.cfg.source_priority)
    rank = np.lexsort(keys[::-1] + [ccur])
    leads = np.r_[True, ccur[rank][1:] != ccur[rank][:-1]]
    winner = np.full(len(comps), -1, np.int64)
    winner[ccur[rank][leads]] = rank[leads]
    is_winner = np.zeros(len(cur), bool)
    is_winner[winner[winner >= 0]] = True
    prev = has_old[ccur]
    gone = np.flatnonzero(prev | ~is_winner)
    doc_ids = fields.column("doc_id").cast(pa.string())
    win = winner[ccur[gone]]
    kept_near = doc_ids.take(pa.array(np.maximum(win, 0)))
    kept_prev = pa.array(keeper_id[ccur[gone]].tolist(), pa.string())
    kept_gid = np.where(prev[gone], keeper_node[ccur[gone]], gids[np.maximum(win, 0)])
    out = pa.table({
        "gid": pa.array(gids[gone], pa.uint64()), "doc_id": doc_ids.take(pa.array(gone)),
        "cluster": pa.array(comps[ccur[gone]], pa.uint64()),
        "kept_doc_id": pc.if_else(pa.array(prev[gone]), kept_prev, kept_near),
        "kept_gid": pa.array(kept_gid, pa.uint64()),
        "reason": pa.array(np.where(prev[gone], REASON_PREVIOUS, REASON_NEAR_DUP).tolist(), pa.string()),
        "similarity": fields.column("sim").take(pa.array(gone))}, schema=schema)
    by_gid = np.argsort(out.column("gid").to_numpy(), kind="stable")
    return out.take(pa.array(by_gid)), sizes


def select_examples(decided, limit: int) -> list[dict]:
    """The ``limit`` largest clusters (ties: smallest cluster id), from stage 3's decisions while they are in memory.

    Each keeps its first 20 removed doc ids (ascending global id, i.e. shard then row), the count, and the global
    ids of the survivor and of the first removed member, so the report reads exactly two rows per example.
    """
    if limit == 0 or decided.num_rows == 0:
        return []
    cluster = decided.column("cluster").to_numpy()
    ids, counts = np.unique(cluster, return_counts=True)
    chosen = ids[np.lexsort((ids, -counts))][:limit]
    gid = decided.column("gid").to_numpy()
    sel = np.flatnonzero(np.isin(cluster, chosen))      # one pass over the removed docs, not one per example
    sel = sel[np.argsort(gid[sel], kind="stable")]       # members by global id: shard, then row
    out = []
    for c in chosen:
        rows = sel[cluster[sel] == c]
        first = int(rows[0])
        sim = decided.column("similarity")[first].as_py()
        out.append({"cluster": int(c), "kept": decided.column("kept_doc_id")[first].as_py(),
                    "kept_gid": int(decided.column("kept_gid")[first].as_py()),
                    "removed": decided.column("doc_id").take(rows[:20]).to_pylist(),
                    "removed_gid": int(gid[first]), "removed_count": len(rows),
                    "reason": decided.column("reason")[first].as_py(),
                    "similarity": None if sim is None or np.isnan(sim) else round(float(sim), 4)})
    return out
