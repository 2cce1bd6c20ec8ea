"""Exact dedup across the whole corpus, hash-partitioned: one copy of each normalized text survives.

Three mappable steps, so no task ever holds more than one partition of the corpus's hashes, and no step opens a
number of files that grows as the product of two corpus-sized counts:

1. :func:`run_exact_hash_batch` (per batch of ingest shards, the DAG's batch task) reads only ``doc_id`` and
   ``text_hash`` of its shards and writes one file, ``exact_dedup/hashes/batch-<k>-of-<n>.parquet``: the hash as
   two uint64 words, the doc id, the shard's ordinal in the batch and the row, sorted by partition
   (``int(text_hash[:8], 16) % n_partitions``), so the next step's row-group statistics skip the other partitions.
2. :func:`run_exact_partition` (per partition) reads its slice of every batch's hash file in batch order (which is
   plan order) and lists the duplicates with the id of the copy that is kept: the first occurrence in plan order
   (shard, then row), so the choice depends neither on the number of partitions nor on the number of batches.
   Output: ``exact_dedup/partitions/p<k>-of-<n>.parquet`` (doc_id, kept_id, shard, batch, ord, row), sorted by
   batch, then shard, then row.
3. :func:`attach_drops` (once per batch) reads the batch's slice of each partition file and gives each shard spec
   its duplicate rows; :func:`run_exact_dedup_shard` (per shard, in the batch's pool) drops them and writes
   ``exact_dedup/<shard>.parquet`` and its stats (stage ``exact_dedup``, reason ``exact_duplicate``).

File opens: step 2 opens B hash files in each of its P tasks and step 3 P partition files in each of its B tasks,
so P × B for each, with B the batch count (``parallelism``, fixed) and P growing with the corpus: linear.  (Until
#23 these files were per shard, P × S opens, and ``exact_partition`` grew quadratically with the corpus; the
stages' exponents now are in ``make bench-scale``, topic scale, ``scale.worst_stage_exponent``.)

:func:`build_exact_index` runs steps 1 and 2, :func:`drop_exact_duplicates` step 3, for a list of shards in
``n_batches`` groups, in one call (tests and single-task wiring).

Memory: step 1 holds one chunk of its batch (``HASH_CHUNK_DOCS``, 2 M documents) with the sort's copy: a fixed
cost per document of a chunk plus Arrow's read buffers, so a step-1 task's peak is bounded by the chunk size
whatever the batch size.  Step 3's shard task holds one shard's table, text included,
and its duplicate rows; its batch gather holds the batch's duplicates.  Step 2 holds its partition: per
document the 128-bit hash as two uint64 words, its doc id in an Arrow string array, and the sort's index and
sorted copy, measured as the rise in peak RSS of one partition of synthetic documents (the Python and numpy share
is bounded by ``tests/test_exact_dedup.py::test_partition_memory_per_document``).  So one step-2 task holds about
``bytes per document × corpus documents / n_partitions``.  :func:`exact_partition_count`
(what ``dedup.exact_partitions: 0`` is meant to resolve to) plans with 160 bytes per document and 256 MB per
task (1.7 M documents per partition), at most 1024 partitions, so a step-2 task stays under 2 GB up to about
13 billion documents.  The survivors never depend on the partition or batch count.

Completion: every marker carries a digest of its settings and of the ``sha256`` its inputs' markers recorded, so a
changed input or partition count redoes the step.  Inputs are checked by their markers (a stat and a small JSON
read each), never re-read or hashed; step 3 reads the partition files only when one of its batch's shards is
not complete.
"""

from __future__ import annotations

import logging
from pathlib import Path

from pipeline.io import (
    HashingFile,
    atomic_path,
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
PARTITION_BYTES_PER_DOC = 160    # step 2's peak RSS per document of its partition: the measured cost plus margin
PARTITION_TARGET_BYTES = 256 << 20
HASH_CHUNK_DOCS = 2_000_000      # step 1 sorts this many documents at a time (bounds its memory)
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


def _groups(shards: list[str], n_batches: int) -> list[list[str]]:
    """``shards`` cut into ``n_batches`` contiguous groups whose sizes differ by at most one (as the plan's
    batches)."""
    n = max(1, min(int(n_batches), len(shards)))
    bounds = [k * len(shards) // n for k in range(n + 1)]
    return [shards[bounds[k]: bounds[k + 1]] for k in range(n)]


def _hash_path(rdir: Path, batch: int, n_batches: int) -> Path:
    return rdir / "exact_dedup" / "hashes" / f"batch-{batch:05d}-of-{n_batches:05d}.parquet"


def _partition_path(rdir: Path, partition: int, n_partitions: int) -> Path:
    return rdir / "exact_dedup" / "partitions" / f"p{partition:05d}-of-{n_partitions:05d}.parquet"


def _input_marker(path: Path, what: str, hint: str) -> dict:
    """The marker of a complete input (its existence, size and digest; its data is not read)."""
    done = completed(path)
    if not done:
        raise FileNotFoundError(f"{path}: {what} is missing or incomplete; {hint}")
    return done


def run_exact_hash_batch(rdir: Path, batch: int, n_batches: int, shards: list[str],
                         n_partitions: int = DEFAULT_PARTITIONS, chunk_docs: int | None = None) -> dict:
    """Step 1: one file for the batch's shards: (partition, h0, h1, doc_id, ord, row).

    Shards are gathered in plan order into chunks of about ``chunk_docs`` documents; each chunk is sorted by
    partition (stable, so shard ordinal then row within a partition) and appended in row groups of 1024 rows.
    Row groups therefore span few partitions, and step 2's filter reads about one or two per chunk.
    ``chunk_docs`` defaults to :data:`HASH_CHUNK_DOCS`.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    _check_partitions(n_partitions)
    out = _hash_path(rdir, batch, n_batches)
    srcs = [rdir / "ingest" / f"{s}.parquet" for s in shards]
    inputs = [_input_marker(p, "ingest shard", "run ingest first")["sha256"] for p in srcs]
    digest = config_digest("exact_hash", n_partitions, list(shards), inputs)
    if done := completed(out, digest):
        return done["info"]
    schema = pa.schema([("partition", pa.int32()), ("h0", pa.uint64()), ("h1", pa.uint64()), ("doc_id", pa.string()),
                        ("ord", pa.int32()), ("row", pa.int32())])
    held: list = []
    docs = chunks = 0

    def flush(writer) -> None:
        nonlocal held, chunks
        if not held:
            return
        table = pa.concat_tables(held)
        held = []
        order = np.argsort(table.column("partition").to_numpy(), kind="stable")
        writer.write_table(table.take(pa.array(order)), row_group_size=1024)
        chunks += 1

    with atomic_path(out) as tmp, open(tmp, "wb") as fh:
        sink = HashingFile(fh)
        with pq.ParquetWriter(sink, schema, compression="zstd") as writer:
            for k, src in enumerate(srcs):
                t = read_parquet(src, columns=["doc_id", "text_hash"])
                h = _hash_words(t.column("text_hash"), src)
                part = ((h[:, 0] >> np.uint64(32)) % np.uint64(n_partitions)).astype(np.int32)
                held.append(pa.table({"partition": part, "h0": h[:, 0], "h1": h[:, 1],
                                      "doc_id": t.column("doc_id").cast(pa.string()),
                                      "ord": np.full(t.num_rows, k, np.int32),
                                      "row": np.arange(t.num_rows, dtype=np.int32)}, schema=schema))
                docs += t.num_rows
                del t, h, part
                if sum(x.num_rows for x in held) >= (chunk_docs or HASH_CHUNK_DOCS):
                    flush(writer)
            flush(writer)
    info = {"batch": batch, "of": n_batches, "shards": list(shards), "docs": docs, "chunks": chunks,
            "n_partitions": n_partitions}
    write_marker(out, {"info": info}, config=digest, sha256=sink.hash.hexdigest())
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


def run_exact_partition(rdir: Path, n_batches: int, partition: int, n_partitions: int = DEFAULT_PARTITIONS,
                        enabled: bool = True) -> dict:
    """Step 2: duplicates whose hash falls in ``partition``, each with the id of the first copy in plan order.

    Reads the partition's slice of each of the ``n_batches`` hash files (row-group statistics skip the rest).  The
    hashes are held as two uint64 words per document and the doc ids as one Arrow string array; a stable sort by
    hash puts the copies of a text next to each other in plan order, so the first of each run is the survivor.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    _check_partitions(n_partitions)
    out = _partition_path(rdir, partition, n_partitions)
    markers = [_input_marker(_hash_path(rdir, b, n_batches), f"hashes of batch {b} of {n_batches}",
                             "run the exact-hash step (every batch, same parallelism) first")
               for b in range(n_batches)]
    digest = config_digest("exact_partition", partition, n_partitions, enabled, [m["sha256"] for m in markers])
    if done := completed(out, digest):
        return done["info"]
    words, ids, batch_no, ords, rows = [], [], [], [], []
    for b in range(n_batches):
        t = pq.read_table(_hash_path(rdir, b, n_batches), columns=["h0", "h1", "doc_id", "ord", "row"],
                          filters=[("partition", "=", partition)])
        words.append(np.column_stack([t.column("h0").to_numpy(), t.column("h1").to_numpy()]).astype(np.uint64))
        ids.extend(t.column("doc_id").chunks)
        batch_no.append(np.full(t.num_rows, b, np.int32))
        ords.append(t.column("ord").to_numpy())
        rows.append(t.column("row").to_numpy())
        del t
    h = np.concatenate(words) if words else np.zeros((0, 2), np.uint64)
    del words
    n = len(h)
    order = np.lexsort((h[:, 1], h[:, 0]))           # stable: copies of a text stay in plan order
    h = h[order]
    first = np.ones(n, bool)
    first[1:] = (h[1:] != h[:-1]).any(axis=1)
    del h
    unique = int(first.sum())
    dup_ord = kept_ord = np.zeros(0, np.int64)
    if enabled and unique < n:
        run_start = np.maximum.accumulate(np.where(first, np.arange(n), 0))
        kept_ord = order[run_start[~first]]               # position (plan order) of the copy that is kept
        dup_ord = order[~first]
        del run_start
        by_pos = np.argsort(dup_ord, kind="stable")        # output in plan order: batch, shard, row
        dup_ord, kept_ord = dup_ord[by_pos], kept_ord[by_pos]
    del order, first
    doc_ids = pa.chunked_array(ids, pa.string())
    batch_col = np.concatenate(batch_no) if batch_no else np.zeros(0, np.int32)
    ord_col = np.concatenate(ords) if ords else np.zeros(0, np.int32)
    shard_base = np.cumsum([0] + [len(m["info"]["shards"]) for m in markers], dtype=np.int64)
    names = pa.array([s for m in markers for s in m["info"]["shards"]], pa.string())
    shard_ix = shard_base[batch_col[dup_ord]] + ord_col[dup_ord]
    sha = write_parquet(pa.table({
        "doc_id": doc_ids.take(pa.array(dup_ord)).combine_chunks(),
        "kept_id": doc_ids.take(pa.array(kept_ord)).combine_chunks(),
        "shard": names.take(pa.array(shard_ix)),
        "batch": pa.array(batch_col[dup_ord]), "ord": pa.array(ord_col[dup_ord]),
        "row": pa.array((np.concatenate(rows) if rows else np.zeros(0, np.int32))[dup_ord])}), out)
    info = {"partition": partition, "n_partitions": n_partitions, "unique_texts": unique,
            "duplicates": len(dup_ord)}
    write_marker(out, {"info": info}, config=digest, sha256=sha)
    return info


def build_exact_index(rdir: Path, shards: list[str], enabled: bool = True,
                      n_partitions: int = DEFAULT_PARTITIONS, n_batches: int = 1) -> dict:
    """Steps 1 and 2 for every shard (in ``n_batches`` groups) and partition in one call; the corpus-wide counts."""
    _check_partitions(n_partitions)
    groups = _groups(list(shards), n_batches)
    for b, group in enumerate(groups):
        run_exact_hash_batch(rdir, b, len(groups), group, n_partitions)
    infos = [run_exact_partition(rdir, len(groups), p, n_partitions, enabled) for p in range(n_partitions)]
    return {"unique_texts": sum(i["unique_texts"] for i in infos), "duplicates": sum(i["duplicates"] for i in infos),
            "partitions": n_partitions}


def _partitions_digest(rdir: Path, n_partitions: int) -> str:
    """One digest of the recorded sha256 of every partition file (markers only)."""
    return config_digest("exact_partitions", [
        _input_marker(_partition_path(rdir, p, n_partitions), f"exact-dedup partition {p} of {n_partitions}",
                      "run every partition (same n_partitions) before dropping duplicates")["sha256"]
        for p in range(n_partitions)])


def _shard_digest(rdir: Path, shard: str, n_partitions: int, partitions: str) -> str:
    src = rdir / "ingest" / f"{shard}.parquet"
    return config_digest("exact_dedup", n_partitions, _input_marker(src, "ingest shard", "run ingest first")["sha256"],
                         partitions)


def attach_drops(rdir: Path, batch: int, n_batches: int, specs: list[dict],
                 n_partitions: int = DEFAULT_PARTITIONS) -> list[dict]:
    """Step 3's gather, once per batch: each spec gets ``exact_drops`` (its duplicate rows and their doc ids).

    The batch's slice of each partition file is read once (P opens per batch, not per shard), and only when one of
    the batch's shards is not yet complete; ``specs`` are the batch's output shards in plan order, the order
    step 1 numbered them in.
    """
    import numpy as np
    import pyarrow.parquet as pq

    _check_partitions(n_partitions)
    parts = _partitions_digest(rdir, n_partitions)
    drops = [{"partitions": parts, "rows": [], "ids": []} for _ in specs]
    if all(completed(rdir / "exact_dedup" / f"{s['shard']}.parquet",
                     _shard_digest(rdir, s["shard"], n_partitions, parts))
           for s in specs):
        return [{**s, "exact_drops": d} for s, d in zip(specs, drops, strict=True)]
    for p in range(n_partitions):
        t = pq.read_table(_partition_path(rdir, p, n_partitions), columns=["ord", "row", "doc_id", "shard"],
                          filters=[("batch", "=", batch)])
        ords, rows = t.column("ord").to_numpy(), t.column("row").to_numpy()
        if len(ords) and int(ords.max()) >= len(specs):
            raise ValueError(f"{_partition_path(rdir, p, n_partitions)}: batch {batch} of {n_batches} has shard "
                             f"ordinal {int(ords.max())} but the batch lists {len(specs)} shards; rerun the "
                             f"exact-hash step with this plan")
        for k in np.unique(ords).tolist():
            sel = ords == k
            drops[k]["rows"] += rows[sel].tolist()
            drops[k]["ids"] += t.column("doc_id").filter(sel).to_pylist()
    return [{**s, "exact_drops": d} for s, d in zip(specs, drops, strict=True)]


def run_exact_dedup_shard(rdir: Path, shard: str, n_partitions: int, drops: dict) -> dict:
    """Step 3: the shard without its duplicate rows (``drops`` from :func:`attach_drops`), with stats
    (in = kept + exact_duplicate).  The doc id of every dropped row is checked against what step 2 listed."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    _check_partitions(n_partitions)
    out = rdir / "exact_dedup" / f"{shard}.parquet"
    src = rdir / "ingest" / f"{shard}.parquet"
    digest = _shard_digest(rdir, shard, n_partitions, drops["partitions"])
    if done := completed(out, digest):
        return done["stats"]
    table = read_parquet(src)
    rows = np.asarray(drops["rows"], np.int64)
    if len(rows) and (rows.max() >= table.num_rows
                      or table.column("doc_id").take(pa.array(rows)).to_pylist() != list(drops["ids"])):
        raise ValueError(f"{src}: the exact-dedup partitions list rows that are not this shard's documents; the "
                         f"ingest output changed after exact dedup's step 1: rerun it")
    is_dup = np.zeros(table.num_rows, bool)
    is_dup[rows] = True
    domain = table.column("domain")[0].as_py() if table.num_rows else shard.rsplit("-", 1)[0]
    stats = new_stats(domain)
    nbytes = pc.binary_length(pc.cast(table.column("text"), pa.large_binary()))
    keep = pa.array(~is_dup)
    stats["in_docs"] = table.num_rows
    stats["in_bytes"] = int(pc.sum(nbytes).as_py() or 0)
    kept = table.filter(keep)
    stats["kept_docs"] = kept.num_rows
    stats["kept_bytes"] = int(pc.sum(pc.filter(nbytes, keep)).as_py() or 0)
    n_dup = table.num_rows - kept.num_rows
    if n_dup:
        count_removed(stats, "exact_duplicate", stats["in_bytes"] - stats["kept_bytes"], n_dup)
    sha = write_parquet(kept, out)
    stats = write_stats(rdir, "exact_dedup", shard, stats)
    write_marker(out, {"stats": stats}, config=digest, sha256=sha)
    return stats


def drop_exact_duplicates(rdir: Path, shards: list[str], n_partitions: int = DEFAULT_PARTITIONS,
                          n_batches: int = 1) -> list[dict]:
    """Step 3 for every shard (in the same ``n_batches`` groups as :func:`build_exact_index`), in this process."""
    out = []
    for b, group in enumerate(groups := _groups(list(shards), n_batches)):
        specs = attach_drops(rdir, b, len(groups), [{"shard": s} for s in group], n_partitions)
        out += [run_exact_dedup_shard(rdir, s["shard"], n_partitions, s["exact_drops"]) for s in specs]
    return out
