"""Exact dedup across the whole corpus: one copy of each normalized text survives.

:func:`build_exact_index` reads only the ``doc_id`` and ``text_hash`` columns of every ingest shard (a few dozen
bytes per document) and lists the duplicates with the id of the copy that is kept: the first occurrence in shard
order, so the choice is deterministic.  :func:`run_exact_dedup_shard` (mapped per shard) drops those ids.
"""

from __future__ import annotations

import logging
from pathlib import Path

from pipeline.io import (completed, count_removed, new_stats, read_parquet, write_marker, write_parquet,
                         write_stats)

log = logging.getLogger(__name__)


def build_exact_index(rdir: Path, shards: list[str], enabled: bool = True) -> dict:
    """Write ``exact_dedup/duplicates.parquet`` (doc_id, kept_id); return counts."""
    import pyarrow as pa

    out = rdir / "exact_dedup" / "duplicates.parquet"
    first: dict[str, str] = {}
    dup_ids: list[str] = []
    kept_ids: list[str] = []
    for shard in sorted(shards):
        t = read_parquet(rdir / "ingest" / f"{shard}.parquet", columns=["doc_id", "text_hash"])
        for did, h in zip(t.column("doc_id").to_pylist(), t.column("text_hash").to_pylist(), strict=True):
            if h in first and enabled:
                dup_ids.append(did)
                kept_ids.append(first[h])
            else:
                first.setdefault(h, did)
    write_parquet(pa.table({"doc_id": pa.array(dup_ids, pa.string()), "kept_id": pa.array(kept_ids, pa.string())}),
                  out)
    return {"unique_texts": len(first), "duplicates": len(dup_ids)}


def run_exact_dedup_shard(rdir: Path, shard: str) -> dict:
    import pyarrow as pa
    import pyarrow.compute as pc

    out = rdir / "exact_dedup" / f"{shard}.parquet"
    if done := completed(out):
        return done["stats"]
    table = read_parquet(rdir / "ingest" / f"{shard}.parquet")
    dups = read_parquet(rdir / "exact_dedup" / "duplicates.parquet", columns=["doc_id"]).column("doc_id")
    is_dup = pc.is_in(table.column("doc_id"), value_set=dups)
    domain = table.column("domain")[0].as_py() if table.num_rows else shard.rsplit("-", 1)[0]
    stats = new_stats(domain)
    nbytes = pc.binary_length(pc.cast(table.column("text"), pa.large_binary()))
    stats["in_docs"] = table.num_rows
    stats["in_bytes"] = int(pc.sum(nbytes).as_py() or 0)
    kept = table.filter(pc.invert(is_dup))
    stats["kept_docs"] = kept.num_rows
    stats["kept_bytes"] = int(pc.sum(pc.filter(nbytes, pc.invert(is_dup))).as_py() or 0)
    n_dup = table.num_rows - kept.num_rows
    if n_dup:
        count_removed(stats, "exact_duplicate", stats["in_bytes"] - stats["kept_bytes"], n_dup)
    write_parquet(kept, out)
    stats = write_stats(rdir, "exact_dedup", shard, stats)
    write_marker(out, {"stats": stats})
    return stats
