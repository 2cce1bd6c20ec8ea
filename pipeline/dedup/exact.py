"""Exact dedup across the whole corpus, hash-partitioned: one copy of each normalized text survives.

Three mappable steps, so no task ever holds more than one partition of the corpus's hashes:

1. :func:`run_exact_hash_shard` (per ingest shard) reads only ``doc_id`` and ``text_hash`` and writes
   ``exact_dedup/hashes/<shard>.parquet`` sorted by partition (``int(text_hash[:8], 16) % n_partitions``), so
   the next step's row-group statistics skip the other partitions.
2. :func:`run_exact_partition` (per partition) reads its slice of every shard's hash file in sorted shard order and
   lists the duplicates with the id of the copy that is kept: the first occurrence in shard order (then row order),
   so the choice is deterministic and does not depend on the number of partitions.  Output:
   ``exact_dedup/partitions/p<k>-of-<n>.parquet`` (doc_id, kept_id, shard), sorted by shard.
3. :func:`run_exact_dedup_shard` (per ingest shard) drops its duplicates and writes ``exact_dedup/<shard>.parquet``
   and its stats (stage ``exact_dedup``, reason ``exact_duplicate``).

:func:`build_exact_index` runs steps 1 and 2 for all shards and partitions in one call (the single-task wiring).
"""

from __future__ import annotations

import logging
from pathlib import Path

from pipeline.io import completed, count_removed, new_stats, read_parquet, write_marker, write_parquet, write_stats

log = logging.getLogger(__name__)

DEFAULT_PARTITIONS = 16


def partition_of(text_hash: str, n_partitions: int) -> int:
    return int(text_hash[:8], 16) % n_partitions


def _hash_path(rdir: Path, shard: str) -> Path:
    return rdir / "exact_dedup" / "hashes" / f"{shard}.parquet"


def _partition_path(rdir: Path, partition: int, n_partitions: int) -> Path:
    return rdir / "exact_dedup" / "partitions" / f"p{partition:05d}-of-{n_partitions:05d}.parquet"


def run_exact_hash_shard(rdir: Path, shard: str, n_partitions: int = DEFAULT_PARTITIONS) -> dict:
    """Step 1: the shard's (partition, text_hash, doc_id, row), sorted by partition then row."""
    import pyarrow as pa

    out = _hash_path(rdir, shard)
    if done := completed(out):
        return done["info"]
    t = read_parquet(rdir / "ingest" / f"{shard}.parquet", columns=["doc_id", "text_hash"])
    hashes = t.column("text_hash").to_pylist()
    parts = [partition_of(h, n_partitions) for h in hashes]
    table = pa.table({"partition": pa.array(parts, pa.int32()), "text_hash": pa.array(hashes, pa.string()),
                      "doc_id": t.column("doc_id"), "row": pa.array(range(len(hashes)), pa.int64())})
    table = table.sort_by([("partition", "ascending"), ("row", "ascending")])
    write_parquet(table, out)
    info = {"shard": shard, "docs": len(hashes), "n_partitions": n_partitions}
    write_marker(out, {"info": info})
    return info


def run_exact_partition(rdir: Path, shards: list[str], partition: int, n_partitions: int = DEFAULT_PARTITIONS,
                        enabled: bool = True) -> dict:
    """Step 2: duplicates whose hash falls in ``partition``, each with the id of the first copy in shard order."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = _partition_path(rdir, partition, n_partitions)
    if done := completed(out):
        return done["info"]
    first: dict[str, str] = {}
    dup_ids: list[str] = []
    kept_ids: list[str] = []
    dup_shards: list[str] = []
    for shard in sorted(shards):
        path = _hash_path(rdir, shard)
        if not completed(path):
            raise FileNotFoundError(f"{path}: hashes of shard {shard} are missing; run the exact-hash step first")
        t = pq.read_table(path, columns=["text_hash", "doc_id"], filters=[("partition", "=", partition)])
        for did, h in zip(t.column("doc_id").to_pylist(), t.column("text_hash").to_pylist(), strict=True):
            kept = first.setdefault(h, did)
            if kept != did and enabled:
                dup_ids.append(did)
                kept_ids.append(kept)
                dup_shards.append(shard)
    write_parquet(pa.table({"doc_id": pa.array(dup_ids, pa.string()), "kept_id": pa.array(kept_ids, pa.string()),
                            "shard": pa.array(dup_shards, pa.string())}), out)
    info = {"partition": partition, "n_partitions": n_partitions, "unique_texts": len(first),
            "duplicates": len(dup_ids)}
    write_marker(out, {"info": info})
    return info


def build_exact_index(rdir: Path, shards: list[str], enabled: bool = True,
                      n_partitions: int = DEFAULT_PARTITIONS) -> dict:
    """Steps 1 and 2 for every shard and partition in one call; returns the corpus-wide counts."""
    for shard in sorted(shards):
        run_exact_hash_shard(rdir, shard, n_partitions)
    infos = [run_exact_partition(rdir, shards, p, n_partitions, enabled) for p in range(n_partitions)]
    return {"unique_texts": sum(i["unique_texts"] for i in infos), "duplicates": sum(i["duplicates"] for i in infos),
            "partitions": n_partitions}


def _duplicates_of(rdir: Path, shard: str, n_partitions: int):
    import pyarrow as pa
    import pyarrow.parquet as pq

    ids = []
    for p in range(n_partitions):
        path = _partition_path(rdir, p, n_partitions)
        if not completed(path):
            raise FileNotFoundError(f"{path}: exact-dedup partition {p} of {n_partitions} is missing; run every "
                                    "partition (same n_partitions) before dropping duplicates")
        ids.append(pq.read_table(path, columns=["doc_id"], filters=[("shard", "=", shard)]).column("doc_id"))
    return pa.chunked_array([c for col in ids for c in col.chunks], pa.string())


def run_exact_dedup_shard(rdir: Path, shard: str, n_partitions: int = DEFAULT_PARTITIONS) -> dict:
    """Step 3: the shard without its duplicates, with stats (in = kept + exact_duplicate)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    out = rdir / "exact_dedup" / f"{shard}.parquet"
    if done := completed(out):
        return done["stats"]
    table = read_parquet(rdir / "ingest" / f"{shard}.parquet")
    is_dup = pc.is_in(table.column("doc_id"), value_set=_duplicates_of(rdir, shard, n_partitions))
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
