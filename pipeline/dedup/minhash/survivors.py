"""Which document a cluster keeps: a documented, configurable, deterministic rule (part of stage 3).

``survivor_order`` lists criteria, most important first (default ``kept, score, longest, source_priority,
doc_id``):

* ``kept``: a document the quality filters would keep, before one they would drop (verdicts from stage 1,
  :mod:`pipeline.dedup.minhash.prescore`; unknown verdicts rank between the two);
* ``score``: highest score: the input column ``score_column`` when set, else the share of its quality chain's
  filters the document passes (stage 1); documents without one rank last;
* ``longest`` / ``shortest``: most / fewest characters;
* ``source_priority``: earliest in the configured ``source_priority`` list (unlisted sources after listed ones);
* ``first``: earliest position in the run (shard order of the manifest, then row);
* ``doc_id``: smallest document id.

The document's position always breaks a remaining tie, so the same inputs and config give the same survivors,
whatever order edges or shards were processed in.  A cluster that contains a document of an earlier release keeps
*that* one (the smallest such index node): it has already shipped, so every current member is removed with reason
``near_duplicate_of_previous_release`` and kept id ``<release>:<doc_id>``.

Everything is columnar (Arrow/numpy): memory is a few dozen bytes per document that has a near duplicate.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.dedup.minhash.config import REASON_NEAR_DUP, REASON_PREVIOUS, MinhashConfig
from pipeline.dedup.minhash.index import DedupIndex
from pipeline.dedup.minhash.layout import gid_to_shard, read_rows, signature_path, split_index_node
from pipeline.dedup.minhash.verify import is_index

FIELDS = ("doc_id", "domain", "source", "n_chars", "score", "keep")


def doc_fields(rdir: Path, manifest: dict, gids: np.ndarray):
    """Survivor fields of sorted current gids, as an Arrow table in gid order."""
    import pyarrow as pa

    shard_idx, rows = gid_to_shard(manifest, gids)
    parts = []
    for s in np.unique(shard_idx):
        sel = np.flatnonzero(shard_idx == s)
        t = read_rows(signature_path(rdir, manifest["shards"][int(s)]["shard"]), rows[sel], list(FIELDS))
        parts.append(pa.table({"doc_id": t.column("doc_id").cast(pa.string()),
                               "domain": t.column("domain").cast(pa.string()),
                               "source": t.column("source").cast(pa.string()),
                               "n_chars": t.column("n_chars").cast(pa.int64()),
                               "score": t.column("score").cast(pa.float64()),
                               "keep": t.column("keep").cast(pa.int8())}))
    return pa.concat_tables(parts).combine_chunks()


def rank_keys(fields, gids: np.ndarray, order: list[str], source_priority: list[str]) -> list[np.ndarray]:
    """Sort keys, most important first (smaller = preferred), ending with the position."""
    import pyarrow as pa
    import pyarrow.compute as pc

    keys = []
    for crit in order:
        if crit == "kept":          # 1 keep → 0, -1 unknown → 1, 0 drop → 2
            keep = fields.column("keep").to_numpy(zero_copy_only=False).astype(np.int64)
            keys.append(np.where(keep == 1, 0, np.where(keep < 0, 1, 2)))
        elif crit == "score":
            score = fields.column("score").to_numpy(zero_copy_only=False).astype(np.float64)
            keys.append(np.where(np.isnan(score), np.inf, -score))
        elif crit in ("longest", "shortest"):
            n = fields.column("n_chars").to_numpy(zero_copy_only=False).astype(np.int64)
            keys.append(-n if crit == "longest" else n)
        elif crit == "source_priority":
            idx = pc.index_in(fields.column("source"), value_set=pa.array(source_priority, pa.string()))
            keys.append(idx.fill_null(len(source_priority)).to_numpy(zero_copy_only=False).astype(np.int64))
        elif crit == "first":
            keys.append(gids.astype(np.int64))
        elif crit == "doc_id":
            keys.append(pc.rank(fields.column("doc_id"), sort_keys="ascending", tiebreaker="dense")
                        .to_numpy(zero_copy_only=False).astype(np.int64))
    keys.append(gids.astype(np.int64))
    return keys


def decide(rdir: Path, manifest: dict, cfg: MinhashConfig, index: DedupIndex, members: np.ndarray,
           root: np.ndarray, best_sim: np.ndarray):
    """Removed current documents: Arrow table (gid, doc_id, cluster, kept_doc_id, kept_gid, reason, similarity).

    ``kept_gid`` is the survivor's global id: a current row, or an earlier release's index node (``is_index``).
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    schema = pa.schema([("gid", pa.uint64()), ("doc_id", pa.string()), ("cluster", pa.uint64()),
                        ("kept_doc_id", pa.string()), ("kept_gid", pa.uint64()), ("reason", pa.string()),
                        ("similarity", pa.float32())])
    old = is_index(members)
    cur = np.flatnonzero(~old)
    if not len(cur):
        return schema.empty_table()
    gids = members[cur]
    fields = doc_fields(rdir, manifest, gids)
    comps, cinv = np.unique(root[cur], return_inverse=True)

    # components holding an earlier release's document keep the smallest such node
    old_pos = np.flatnonzero(old)                        # ascending node ids: first per component = smallest
    old_comps, first = np.unique(root[old_pos], return_index=True)
    keeper_nodes = members[old_pos[first]]
    keeper_ids = np.empty(len(keeper_nodes), dtype=object)
    rel, ords = split_index_node(keeper_nodes)
    for r in np.unique(rel):
        sel = np.flatnonzero(rel == r)
        keeper_ids[sel] = [f"{index.releases[int(r)]}:{d}" for d in index.doc_ids(int(r), ords[sel])]
    at = np.minimum(np.searchsorted(old_comps, comps), max(len(old_comps) - 1, 0))
    has_old = (at < len(old_comps)) & (old_comps[at] == comps) if len(old_comps) else np.zeros(len(comps), bool)

    # the survivor of every other component: first by the rank keys
    order = np.lexsort(rank_keys(fields, gids, cfg.survivor_order, cfg.source_priority)[::-1] + [cinv])
    leads = np.r_[True, cinv[order][1:] != cinv[order][:-1]]
    winner = np.empty(len(comps), np.int64)
    winner[cinv[order][leads]] = order[leads]
    is_winner = np.zeros(len(cur), bool)
    is_winner[winner] = True
    prev = has_old[cinv]
    gone = np.flatnonzero(prev | ~is_winner)
    first_member = np.unique(cinv, return_index=True)[1]          # cur is in gid order: smallest current gid

    doc_ids = fields.column("doc_id")
    kept_near = doc_ids.take(pa.array(winner[cinv[gone]]))
    kept_prev = pa.array([keeper_ids[at[c]] if has_old[c] else "" for c in cinv[gone]], pa.string())
    kept_gid = gids[winner[cinv[gone]]]
    if len(keeper_nodes):
        kept_gid = np.where(prev[gone], keeper_nodes[at[cinv[gone]]], kept_gid)
    return pa.table({
        "gid": pa.array(gids[gone], pa.uint64()), "doc_id": doc_ids.take(pa.array(gone)),
        "cluster": pa.array(gids[first_member[cinv[gone]]], pa.uint64()),
        "kept_doc_id": pc.if_else(pa.array(prev[gone]), kept_prev, kept_near),
        "kept_gid": pa.array(kept_gid, pa.uint64()),
        "reason": pa.array(np.where(prev[gone], REASON_PREVIOUS, REASON_NEAR_DUP).tolist(), pa.string()),
        "similarity": pa.array(best_sim[cur][gone].astype(np.float32))}, schema=schema)
