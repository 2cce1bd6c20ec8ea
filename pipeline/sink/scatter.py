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
set's domain list), ``tokens`` list<int32>.  The number of buckets is the number of output files (a writer reads
about one bucket's worth).

:func:`run_scatter_part` does that for every shard of one scatter task and then merges them into one *part*,
``sink/scatter/part-<task>-of-<tasks>.arrow``, whose batch ``b`` is bucket ``b`` of all its shards (the shard files
are removed).  Its completion marker lists the tokens and copies per bucket, so a writer knows where every bucket
starts in the stream from the parts' markers alone and reads only the buckets its rows fall in.  Why parts: a
writer reads every scatter output's marker and opens every one for each bucket it touches.  Per shard that is
shards x files in all (a corpus 250 times bench-scale's 4 GB has about 250,000 shards and 3,000 files: 7.5e8 opens
and markers of 3,000 counts read 250,000 times per writer, and a bucket's 250,000 memory maps are over Linux's
default of 65,530 per process).  Per part it is ``parallelism`` per bucket, whatever the corpus size.

:func:`n_output_files` sizes the set: the smallest multiple of ``pack.shard_num`` whose files hold at most
``pack.shard_mb`` MiB of row tokens each.

Memory: one tokenized shard at a time, about 30 bytes per token of the shard (the Parquet column, its copy
reordered by key, and the Arrow batches), plus 24 bytes per copy for keys and indices; the merge holds one bucket
of the part (the part's copies over the number of files) and maps its shards' files.  It does not depend on the
corpus size.  The tokenized input is identified by its marker's digest, the mixture decisions are hashed as they
are read.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.io import HashingFile, atomic_path, completed, config_digest, marker_path, read_marker, write_marker
from pipeline.sink import heldout_overlap
from pipeline.sink.packing import order_keys

SCATTER_DIR = Path("sink") / "scatter"
TOKEN_BYTES = 4
#: What a part's marker keeps of each of its shards' markers (the set's manifest lists them as its inputs).
SHARD_FIELDS = ("shard", "docs", "unique_docs", "overlaps_heldout", "input_sha256", "mixture_sha256")


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


def part_name(task: int, tasks: int) -> str:
    """The scatter output of task ``task`` of ``tasks`` (zero-based), as the DAG maps the scatter."""
    return f"part-{task:05d}-of-{tasks:05d}"


def part_path(rdir: Path, part: str) -> Path:
    return rdir / SCATTER_DIR / f"{part}.arrow"


def _schema():
    import pyarrow as pa

    return pa.schema([("key", pa.uint64()), ("domain", pa.int32()), ("tokens", pa.list_(pa.int32()))])


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


def _shard_digest(rdir: Path, shard: str, seed: int, n_files: int, domains: list[str]) -> tuple:
    """(config digest, tokenized marker, mixture decisions, their sha256, held-out index) of one shard's scatter."""
    tok_path, mix_path = rdir / "tokenize" / f"{shard}.parquet", rdir / "mixture" / f"{shard}.parquet"
    tok_done = completed(tok_path)
    if not tok_done:
        raise FileNotFoundError(f"{tok_path}: tokenized shard is missing or incomplete; run tokenize first")
    dec, mix_sha = _read_hashed(mix_path, ["doc_id", "copies"])
    overlap = heldout_overlap.plan_index(rdir)
    return (config_digest("sink_scatter", seed, n_files, domains, tok_done["sha256"], mix_sha, overlap), tok_done,
            dec, mix_sha, overlap)


def run_scatter_shard(rdir: Path, shard: str, *, seed: int, n_files: int, domains: list[str]) -> dict:
    """Put the shard's training copies into ``n_files`` key-range buckets; return the marker (counts per bucket)."""
    import numpy as np
    import pyarrow as pa

    from pipeline.io import read_parquet

    out = scatter_path(rdir, shard)
    digest, tok_done, dec, mix_sha, overlap = _shard_digest(rdir, shard, seed, n_files, domains)
    if done := completed(out, digest):
        return done
    tok_path, mix_path = rdir / "tokenize" / f"{shard}.parquet", rdir / "mixture" / f"{shard}.parquet"
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
    schema = _schema()
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


def run_scatter_part(rdir: Path, part: str, shards: list[str], *, seed: int, n_files: int,
                     domains: list[str]) -> dict:
    """Scatter every shard of ``shards`` (:func:`run_scatter_shard`), then merge them into ``part`` (bucket ``b``:
    the shards' bucket ``b`` in the order given) and remove the shards' files; return the part's marker.

    A rerun whose shards' settings and inputs are unchanged returns the part's marker (the shards' digests are
    recomputed from their inputs' markers and mixture files); otherwise the shards are scattered again."""
    import numpy as np
    import pyarrow as pa

    out = part_path(rdir, part)
    if read_marker(out):
        digest = config_digest("sink_scatter_part", n_files,
                               [_shard_digest(rdir, s, seed, n_files, domains)[0] for s in shards])
        if done := completed(out, digest):
            return done
    copies, tokens, configs, kept = np.zeros(n_files, np.int64), np.zeros(n_files, np.int64), [], []
    for s in shards:           # only the sums of the shards' per-bucket counts are kept (files x shards otherwise)
        m = run_scatter_shard(rdir, s, seed=seed, n_files=n_files, domains=domains)
        copies += np.asarray(m["copies"], np.int64)
        tokens += np.asarray(m["tokens"], np.int64)
        configs.append(m["config"])
        kept.append({k: m[k] for k in SHARD_FIELDS})
    digest = config_digest("sink_scatter_part", n_files, configs)
    readers = [pa.ipc.open_file(pa.memory_map(str(scatter_path(rdir, s)), "r")) for s in shards]
    schema = _schema()
    with atomic_path(out) as tmp, open(tmp, "wb") as fh, pa.ipc.new_file(sink := HashingFile(fh), schema) as writer:
        for b in range(n_files):
            table = pa.Table.from_batches([r.get_batch(b) for r in readers], schema).combine_chunks()
            writer.write_batch(table.to_batches()[0] if table.num_rows else
                               pa.record_batch([pa.array([], f.type) for f in schema], schema=schema))
    del readers
    extra = {"part": part, "n_files": n_files, "copies": copies.tolist(), "tokens": tokens.tolist(), "shards": kept}
    done = write_marker(out, extra, config=digest, sha256=sink.hash.hexdigest())
    for s in shards:          # their copies are in the part now
        scatter_path(rdir, s).unlink(missing_ok=True)
        marker_path(scatter_path(rdir, s)).unlink(missing_ok=True)
    return done


def open_batch(path: Path, k: int):
    """Record batch ``k`` of a scatter file, memory-mapped: only the pages a writer touches are read."""
    import pyarrow as pa

    return pa.ipc.open_file(pa.memory_map(str(path), "r")).get_batch(k)
