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

The rule is applied per component by :mod:`pipeline.dedup.minhash.clusters.decide`, one sort over a slot range's
members (Arrow/numpy).
"""

from __future__ import annotations

import numpy as np


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
