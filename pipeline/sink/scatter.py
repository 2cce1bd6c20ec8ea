"""Sink step 1 (per tokenized shard): every training copy of every document put in its key-range bucket.

The mixture (:mod:`pipeline.sink.mixture`) decided how many copies of each document train; a training document
that overlaps a held-out one is given none here (:mod:`pipeline.sink.heldout_overlap`, which reads the tokens this
step reads anyway).  Each copy gets its order
key (:func:`pipeline.sink.packing.order_keys`: a hash of seed, doc id and copy number); the corpus is one packed
stream of every copy in key order, so the order of the shipped rows depends only on (seed, doc id, copy), never on
shard boundaries, task count or a process RNG.  To cut that stream without a global sort, keys are split into
``n_buckets`` ranges (:func:`bucket_of`, monotone in the key): bucket 0's copies in key order, then bucket 1's, and
so on, *is* the stream.  Output files are then dealt rows, not documents (:mod:`pipeline.sink.shards`).

:func:`run_scatter_shard` writes ``sink/scatter/<shard>.arrow`` (an Arrow IPC file, uncompressed) whose record
batch ``b`` holds the shard's copies in bucket ``b``, in key order: ``key`` uint64, ``domain`` int32 (index into the
set's domain list), ``tokens`` list<int32>.  The completion marker lists the tokens and copies per bucket, so a
writer knows where every bucket starts in the stream from the markers alone and reads only the buckets its rows
fall in.  The number of buckets is the number of output files (a writer reads about one bucket's worth).

:func:`n_output_files` sizes the set: the smallest multiple of ``pack.shard_num`` whose files hold at most
``pack.shard_mb`` MiB of row tokens each.

Memory: one tokenized shard at a time, about 30 bytes per token of the shard (the Parquet column, its copy
reordered by key, and the Arrow batches), plus 24 bytes per copy for keys and indices.  It does not depend on the
corpus size.  The tokenized input is identified by its marker's digest, the mixture decisions are hashed as they
are read: no input is read twice.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.io import HashingFile, atomic_path, completed, config_digest, write_marker
from pipeline.sink import heldout_overlap
from pipeline.sink.packing import order_keys

SCATTER_DIR = Path("sink") / "scatter"
TOKEN_BYTES = 4


def n_output_files(row_tokens: int, shard_mb: int, shard_num: int) -> int:
    """Files for ``row_tokens`` tokens of rows: a multiple of ``shard_num``, each at most ``shard_mb`` MiB."""
    per_file = max(1, (shard_mb << 20) // TOKEN_BYTES)
    files = max(1, -(-row_tokens // per_file))
    return -(-files // shard_num) * shard_num


def stream_tokens(report: dict, add_bos: bool) -> int:
    """Tokens of the packed stream from the mixture report: the selected tokens plus EOS (and BOS) per copy."""
    return int(report["total_selected_tokens"]) + int(report["total_selected_docs"]) * (2 if add_bos else 1)


def scatter_path(rdir: Path, shard: str) -> Path:
    return rdir / SCATTER_DIR / f"{shard}.arrow"


def bucket_of(keys, n_buckets: int):
    """Key-range bucket of every key: monotone in the key, so the buckets in order are the key-ordered stream."""
    import numpy as np

    return (((keys >> np.uint64(32)) * np.uint64(n_buckets)) >> np.uint64(32)).astype(np.int64)


def _read_hashed(path: Path, columns: list[str]):
    """A small Parquet file read once from memory, with the sha256 of its bytes (no second read to hash it)."""
    import hashlib

    import pyarrow as pa
    import pyarrow.parquet as pq

    data = path.read_bytes()
    return pq.read_table(pa.BufferReader(data), columns=columns), hashlib.sha256(data).hexdigest()


def run_scatter_shard(rdir: Path, shard: str, *, seed: int, n_files: int, domains: list[str]) -> dict:
    """Put the shard's training copies into ``n_files`` key-range buckets; return the marker (counts per bucket)."""
    import numpy as np
    import pyarrow as pa

    from pipeline.io import read_parquet

    out = scatter_path(rdir, shard)
    tok_path, mix_path = rdir / "tokenize" / f"{shard}.parquet", rdir / "mixture" / f"{shard}.parquet"
    tok_done = completed(tok_path)
    if not tok_done:
        raise FileNotFoundError(f"{tok_path}: tokenized shard is missing or incomplete; run tokenize first")
    dec, mix_sha = _read_hashed(mix_path, ["doc_id", "copies"])
    overlap = heldout_overlap.plan_index(rdir)
    digest = config_digest("sink_scatter", seed, n_files, domains, tok_done["sha256"], mix_sha, overlap)
    if done := completed(out, digest):
        return done
    t = read_parquet(tok_path, columns=["doc_id", "domain", "tokens"] + (["n_bytes"] if overlap else []))
    ids = t.column("doc_id").to_pylist()
    if dec.column("doc_id").to_pylist() != ids:
        raise ValueError(f"{mix_path}: documents differ from {tok_path}; rerun the mixture plan after tokenization")
    copies = dec.column("copies").to_numpy().astype(np.int64)
    n_overlapping = heldout_overlap.drop_overlapping(rdir, shard, t, copies, overlap) if overlap else 0
    index = {d: i for i, d in enumerate(domains)}
    try:
        dom = np.asarray([index[d] for d in t.column("domain").to_pylist()], np.int32)
    except KeyError as exc:
        raise ValueError(f"{tok_path}: domain {exc.args[0]!r} is not in the mixture report's domains "
                         f"{domains}; rerun the mixture plan") from None
    idx, keys = order_keys(seed, ids, copies)
    order = np.argsort(keys, kind="stable")            # key order is bucket order too (bucket_of is monotone)
    idx, keys = idx[order], keys[order]
    target = bucket_of(keys, n_files)
    tokens = t.column("tokens").combine_chunks().take(pa.array(idx))
    lens = np.diff(tokens.offsets.to_numpy()).astype(np.int64) if len(idx) else np.zeros(0, np.int64)
    bounds = np.searchsorted(target, np.arange(n_files + 1))
    schema = pa.schema([("key", pa.uint64()), ("domain", pa.int32()), ("tokens", pa.list_(pa.int32()))])
    with atomic_path(out) as tmp, open(tmp, "wb") as fh, pa.ipc.new_file(sink := HashingFile(fh), schema) as writer:
        for k in range(n_files):
            lo, hi = int(bounds[k]), int(bounds[k + 1])
            writer.write_batch(pa.record_batch([pa.array(keys[lo:hi], pa.uint64()),
                                                pa.array(dom[idx[lo:hi]], pa.int32()), tokens.slice(lo, hi - lo)],
                                               schema=schema))
    cum = np.concatenate([[0], np.cumsum(lens)])
    extra = {"shard": shard, "n_files": n_files, "copies": np.diff(bounds).tolist(),
             "tokens": (cum[bounds[1:]] - cum[bounds[:-1]]).tolist(), "docs": len(ids),
             "unique_docs": int((copies > 0).sum()), "overlaps_heldout": n_overlapping,
             "input_sha256": tok_done["sha256"], "mixture_sha256": mix_sha}
    return write_marker(out, extra, config=digest, sha256=sink.hash.hexdigest())


def open_batch(path: Path, k: int):
    """Record batch ``k`` of a scatter file, memory-mapped: only the pages a writer touches are read."""
    import pyarrow as pa

    return pa.ipc.open_file(pa.memory_map(str(path), "r")).get_batch(k)
