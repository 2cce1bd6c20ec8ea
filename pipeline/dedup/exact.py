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

Memory: step 1 and step 3 hold one shard (step 1 its ``doc_id``/``text_hash`` columns as Python strings, about
250 bytes per document; step 3 the shard's table, text included, plus the ids of its duplicates).  Step 2 holds
its partition: per document the 128-bit hash as two uint64 words (decoded from the Arrow buffer, no Python
object per document), its doc id in an Arrow string array, and the sort's index and sorted copy — measured
130 bytes per document of the partition as the rise in peak RSS (1 M synthetic documents, 10 % duplicates, one
partition, ``ru_maxrss`` 66 → 189 MB, 3.1 s; of it 43 bytes numpy by ``tracemalloc``; the former dict of hex
strings took 272 bytes and 4.5 s).  So one step-2 task holds about ``130 × corpus documents / n_partitions``
bytes.  :func:`exact_partition_count` (what ``dedup.exact_partitions: 0`` is meant to resolve to) plans with
160 bytes per document and 256 MB per task (1.7 M documents per partition), at most 1024 partitions, so a
step-2 task stays under 2 GB up to about 13 billion documents.  The survivors never depend on the partition
count.

Completion: every marker carries a digest of its settings and of the ``sha256`` its inputs' markers recorded, so a
changed input or partition count redoes the step.  Inputs are checked by their markers (a stat and a small JSON
read each), never re-read or hashed: step 2 checks every shard's hash file and step 3 every partition file.
"""

from __future__ import annotations

import logging
from pathlib import Path

from pipeline.io import (
    completed,
    config_digest,
    count_removed,
    new_stats,
    read_parquet,
    write_marker,
    write_parquet,
    write_stats,
)

log = logging.getLogger(__name__)

DEFAULT_PARTITIONS = 16
MAX_PARTITIONS = 1024            # the DAG maps one task per partition
PARTITION_BYTES_PER_DOC = 160    # step 2's peak RSS per document of its partition: measured 130, plus margin
PARTITION_TARGET_BYTES = 256 << 20
ASSUMED_DOC_BYTES = 1024         # documents per input byte when the plan has no document count


def exact_partition_count(total_input_bytes: int, docs_estimate: int = 0,
                          target_bytes: int = PARTITION_TARGET_BYTES) -> int:
    """Partitions for ``dedup.exact_partitions: 0``: enough that one step-2 task holds at most ``target_bytes``.

    ``docs_estimate`` is the plan's document count (the sum of the ingest specs' ``docs``); without one the
    documents are estimated from ``total_input_bytes`` at ``ASSUMED_DOC_BYTES`` each, the larger of the two
    estimates winning.  Hashes spread evenly over partitions (BLAKE2b), so a partition holds about
    ``docs / n`` documents at ``PARTITION_BYTES_PER_DOC`` each.  Clamped to 1 … ``MAX_PARTITIONS``.
    """
    docs = max(int(docs_estimate), -(-int(total_input_bytes) // ASSUMED_DOC_BYTES), 1)
    need = -(-docs * PARTITION_BYTES_PER_DOC // max(int(target_bytes), 1))
    return max(1, min(MAX_PARTITIONS, need))


def _check_partitions(n_partitions: int) -> None:
    if not 1 <= n_partitions <= MAX_PARTITIONS:
        raise ValueError(f"exact dedup: {n_partitions} partitions; resolve dedup.exact_partitions (0 = auto) with "
                         f"exact_partition_count() before calling, 1 … {MAX_PARTITIONS}")


def partition_of(text_hash: str, n_partitions: int) -> int:
    return int(text_hash[:8], 16) % n_partitions


def _hash_path(rdir: Path, shard: str) -> Path:
    return rdir / "exact_dedup" / "hashes" / f"{shard}.parquet"


def _partition_path(rdir: Path, partition: int, n_partitions: int) -> Path:
    return rdir / "exact_dedup" / "partitions" / f"p{partition:05d}-of-{n_partitions:05d}.parquet"


def _input_marker(path: Path, what: str, hint: str) -> dict:
    """The marker of a complete input (its existence, size and digest; its data is not read)."""
    done = completed(path)
    if not done:
        raise FileNotFoundError(f"{path}: {what} is missing or incomplete; {hint}")
    return done


def run_exact_hash_shard(rdir: Path, shard: str, n_partitions: int = DEFAULT_PARTITIONS) -> dict:
    """Step 1: the shard's (partition, text_hash, doc_id, row), sorted by partition then row."""
    import pyarrow as pa

    _check_partitions(n_partitions)
    out = _hash_path(rdir, shard)
    src = rdir / "ingest" / f"{shard}.parquet"
    digest = config_digest("exact_hash", n_partitions, _input_marker(src, "ingest shard", "run ingest first")["sha256"])
    if done := completed(out, digest):
        return done["info"]
    t = read_parquet(src, columns=["doc_id", "text_hash"])
    hashes = t.column("text_hash").to_pylist()
    parts = [partition_of(h, n_partitions) for h in hashes]
    table = pa.table({"partition": pa.array(parts, pa.int32()), "text_hash": pa.array(hashes, pa.string()),
                      "doc_id": t.column("doc_id"), "row": pa.array(range(len(hashes)), pa.int64())})
    table = table.sort_by([("partition", "ascending"), ("row", "ascending")])
    sha = write_parquet(table, out)
    info = {"shard": shard, "docs": len(hashes), "n_partitions": n_partitions}
    write_marker(out, {"info": info}, config=digest, sha256=sha)
    return info


def _hash_words(column, path: Path):
    """128-bit text hashes (32 hex digits each) as an (n, 2) array of big-endian uint64 words.

    Decoded from the Arrow string buffer with numpy, so no Python object is made per document.
    """
    import numpy as np
    import pyarrow as pa

    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    n = len(arr)
    if not n:
        return np.zeros((0, 2), np.uint64)
    arr = arr.cast(pa.large_string())
    _, offsets, data = arr.buffers()
    off = np.frombuffer(offsets, np.int64, count=n + 1, offset=arr.offset * 8)
    nib = _hex_table()[np.frombuffer(data, np.uint8, count=int(off[-1] - off[0]), offset=int(off[0]))]
    if arr.null_count or len(nib) != 32 * n or (np.diff(off) != 32).any() or (nib > 15).any():
        raise ValueError(f"{path}: text_hash values are not all 32 hex digits (128-bit BLAKE2b)")
    nib = nib.reshape(n, 16, 2)
    return ((nib[..., 0] << 4) | nib[..., 1]).view(">u8").astype(np.uint64)


def _hex_table():
    import numpy as np

    table = np.full(256, 255, np.uint8)
    for i, c in enumerate("0123456789abcdef"):
        table[ord(c)] = table[ord(c.upper())] = i
    return table


def run_exact_partition(rdir: Path, shards: list[str], partition: int, n_partitions: int = DEFAULT_PARTITIONS,
                        enabled: bool = True) -> dict:
    """Step 2: duplicates whose hash falls in ``partition``, each with the id of the first copy in shard order.

    The partition's hashes are held as two uint64 words per document and its doc ids as one Arrow string array;
    a stable sort by hash puts the copies of a text next to each other in shard-then-row order, so the first of
    each run is the survivor.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    _check_partitions(n_partitions)
    out = _partition_path(rdir, partition, n_partitions)
    names = sorted(shards)
    inputs = [_input_marker(_hash_path(rdir, s), f"hashes of shard {s}", "run the exact-hash step first")["sha256"]
              for s in names]
    digest = config_digest("exact_partition", partition, n_partitions, enabled, names, inputs)
    if done := completed(out, digest):
        return done["info"]
    words, ids, counts = [], [], []
    for shard in names:
        path = _hash_path(rdir, shard)
        t = pq.read_table(path, columns=["text_hash", "doc_id"], filters=[("partition", "=", partition)])
        words.append(_hash_words(t.column("text_hash"), path))
        ids.extend(t.column("doc_id").chunks)
        counts.append(t.num_rows)
        del t
    h = np.concatenate(words) if words else np.zeros((0, 2), np.uint64)
    del words
    n = len(h)
    order = np.lexsort((h[:, 1], h[:, 0]))           # stable: copies of a text stay in shard-then-row order
    h = h[order]
    first = np.ones(n, bool)
    first[1:] = (h[1:] != h[:-1]).any(axis=1)
    del h
    unique = int(first.sum())
    dup_ord = kept_ord = np.zeros(0, np.int64)
    if enabled and unique < n:
        run_start = np.maximum.accumulate(np.where(first, np.arange(n), 0))
        kept_ord = order[run_start[~first]]               # ordinal (shard, then row) of the copy that is kept
        dup_ord = order[~first]
        del run_start
        by_doc = np.argsort(dup_ord, kind="stable")        # output in shard order, then row order
        dup_ord, kept_ord = dup_ord[by_doc], kept_ord[by_doc]
    del order, first
    doc_ids = pa.chunked_array(ids, pa.string())
    ends = np.cumsum(counts, dtype=np.int64)
    shard_of = np.searchsorted(ends, dup_ord, side="right")
    sha = write_parquet(pa.table({"doc_id": doc_ids.take(pa.array(dup_ord)).combine_chunks(),
                                  "kept_id": doc_ids.take(pa.array(kept_ord)).combine_chunks(),
                                  "shard": pa.array([names[i] for i in shard_of.tolist()], pa.string())}), out)
    info = {"partition": partition, "n_partitions": n_partitions, "unique_texts": unique,
            "duplicates": len(dup_ord)}
    write_marker(out, {"info": info}, config=digest, sha256=sha)
    return info


def build_exact_index(rdir: Path, shards: list[str], enabled: bool = True,
                      n_partitions: int = DEFAULT_PARTITIONS) -> dict:
    """Steps 1 and 2 for every shard and partition in one call; returns the corpus-wide counts."""
    _check_partitions(n_partitions)
    for shard in sorted(shards):
        run_exact_hash_shard(rdir, shard, n_partitions)
    infos = [run_exact_partition(rdir, shards, p, n_partitions, enabled) for p in range(n_partitions)]
    return {"unique_texts": sum(i["unique_texts"] for i in infos), "duplicates": sum(i["duplicates"] for i in infos),
            "partitions": n_partitions}


def _partition_digests(rdir: Path, n_partitions: int) -> list[str]:
    """The recorded sha256 of every partition file (markers only)."""
    return [_input_marker(_partition_path(rdir, p, n_partitions),
                          f"exact-dedup partition {p} of {n_partitions}",
                          "run every partition (same n_partitions) before dropping duplicates")["sha256"] for p in range(n_partitions)]


def _duplicates_of(rdir: Path, shard: str, n_partitions: int):
    import pyarrow as pa
    import pyarrow.parquet as pq

    ids = []
    for p in range(n_partitions):
        path = _partition_path(rdir, p, n_partitions)
        ids.append(pq.read_table(path, columns=["doc_id"], filters=[("shard", "=", shard)]).column("doc_id"))
    return pa.chunked_array([c for col in ids for c in col.chunks], pa.string())


def run_exact_dedup_shard(rdir: Path, shard: str, n_partitions: int = DEFAULT_PARTITIONS) -> dict:
    """Step 3: the shard without its duplicates, with stats (in = kept + exact_duplicate)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    _check_partitions(n_partitions)
    out = rdir / "exact_dedup" / f"{shard}.parquet"
    src = rdir / "ingest" / f"{shard}.parquet"
    digest = config_digest("exact_dedup", n_partitions, _input_marker(src, "ingest shard", "run ingest first")["sha256"],
                           _partition_digests(rdir, n_partitions))
    if done := completed(out, digest):
        return done["stats"]
    table = read_parquet(src)
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
    sha = write_parquet(kept, out)
    stats = write_stats(rdir, "exact_dedup", shard, stats)
    write_marker(out, {"stats": stats}, config=digest, sha256=sha)
    return stats
