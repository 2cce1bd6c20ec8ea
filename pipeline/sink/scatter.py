"""Sink step 1 (per tokenized shard): every training copy of every document put in its key-range bucket.

The mixture (:mod:`pipeline.sink.mixture`) decided how many copies of each document train; a training document
that overlaps a held-out one is given none here (:mod:`pipeline.sink.heldout_overlap`, which reads the tokens this
step reads anyway).  Each copy gets its order
key (:func:`pipeline.sink.packing.order_keys`: a hash of seed, doc id and copy number); the corpus is one packed
stream of every copy in key order, so the order of the shipped rows depends only on (seed, doc id, copy), never on
shard boundaries, task count or a process RNG.  To cut that stream without a global sort, keys are split into
``n_buckets`` ranges (:func:`bucket_of`, monotone in the key): bucket 0's copies in key order, then bucket 1's, and
so on, *is* the stream.  Output files are then dealt rows, not documents (:mod:`pipeline.sink.shards`).

:func:`scatter_shard` orders one shard's copies by key and cuts them into buckets, in memory: ``key`` uint64,
``domain`` int32 (index into the set's domain list), ``tokens`` list<int32>.  The number of buckets is the number of
output files (a writer reads about one bucket's worth).

:func:`run_scatter_part` does that for every shard of one scatter task and writes one *part*,
``sink/scatter/part-<task>-of-<tasks>.arrow`` (an Arrow IPC file, uncompressed), whose record batch ``b`` is bucket
``b`` of all its shards in order.  Shards go to disk in *runs* of about ``RUN_TOKENS`` tokens, one record batch
each, and the runs are merged into the part (``MERGE_FAN_IN`` at most at once, a group of buckets at a time, every
run closed after each group): the task writes
runs + buckets record batches, not shards x buckets (a corpus 250 times bench-scale's 4 GB has about 250,000
shards and 3,000 files: 7.5e8 batches), and holds a bounded number of files open whatever its shard count.  The
part's completion marker lists the tokens and copies per bucket, so a writer knows where every bucket starts in
the stream from the parts' markers alone and reads only the buckets its rows fall in.  A writer reads
``parallelism`` parts per bucket, whatever the corpus size.

:func:`n_output_files` sizes the set: the smallest multiple of ``pack.shard_num`` whose files hold at most
``pack.shard_mb`` MiB of row tokens each.

Memory: one tokenized shard being read, about 30 bytes per token of the shard (the Parquet column, its copy
reordered by key), plus the shards held for the next run: ``RUN_TOKENS`` tokens at 4 bytes, twice while the run is
put in bucket order, and 24 bytes per copy for keys and indices; the merge holds one bucket of the part (the
part's copies over the number of files) and maps about ``MERGE_TOKENS`` tokens of its runs at a time.  It does not
depend on the corpus size.  The tokenized input is identified by its marker's digest, the mixture decisions are hashed
as they are read.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.io import HashingFile, atomic_path, completed, config_digest, read_marker, write_marker
from pipeline.sink import heldout_overlap
from pipeline.sink.packing import order_keys

SCATTER_DIR = Path("sink") / "scatter"
TOKEN_BYTES = 4
#: What a part's marker keeps of each of its shards' markers (the set's manifest lists them as its inputs).
SHARD_FIELDS = ("shard", "docs", "unique_docs", "overlaps_heldout", "input_sha256", "mixture_sha256")
#: tokens of shards held before they are written as one run (4 bytes each: 64 MB)
RUN_TOKENS = 16 << 20
#: runs merged at once.  A run is one record batch, mapped with its file closed: it holds a mapping (Linux allows
#: 65,530), not a descriptor; only the runs of a second merge pass (past this many) hold one each while merged
MERGE_FAN_IN = 1024
#: tokens of the buckets merged with one set of mappings: they are closed after each group, so the pages a merge
#: touched do not stay resident for the whole part (4 bytes each: 256 MB)
MERGE_TOKENS = 64 << 20


def n_output_files(row_tokens: int, shard_mb: int, shard_num: int) -> int:
    """Files for ``row_tokens`` tokens of rows: a multiple of ``shard_num``, each at most ``shard_mb`` MiB."""
    per_file = max(1, (shard_mb << 20) // TOKEN_BYTES)
    files = max(1, -(-row_tokens // per_file))
    return -(-files // shard_num) * shard_num


def stream_tokens(report: dict, add_bos: bool) -> int:
    """Tokens of the packed stream from the mixture report: the selected tokens plus EOS (and BOS) per copy."""
    return int(report["total_selected_tokens"]) + int(report["total_selected_docs"]) * (2 if add_bos else 1)


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


@dataclass
class ShardScatter:
    """One shard's training copies in key order (so in bucket order), held in memory until its run is written."""

    keys: Any           # uint64, ascending
    dom: Any            # int32 domain index per copy
    tokens: Any         # list<int32> per copy
    bounds: Any         # n_files + 1 row offsets of the buckets
    marker: dict        # SHARD_FIELDS, copies and tokens per bucket, the config digest


def scatter_shard(rdir: Path, shard: str, *, seed: int, n_files: int, domains: list[str]) -> ShardScatter:
    """Order the shard's training copies by key and cut them into ``n_files`` key-range buckets (in memory)."""
    import numpy as np
    import pyarrow as pa

    from pipeline.io import read_parquet

    digest, tok_done, dec, mix_sha, overlap = _shard_digest(rdir, shard, seed, n_files, domains)
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
    bounds = np.searchsorted(bucket_of(keys, n_files), np.arange(n_files + 1))
    tokens = t.column("tokens").combine_chunks().take(pa.array(idx))
    lens = np.diff(tokens.offsets.to_numpy()).astype(np.int64) if len(idx) else np.zeros(0, np.int64)
    cum = np.concatenate([[0], np.cumsum(lens)])
    marker = {"shard": shard, "n_files": n_files, "copies": np.diff(bounds).tolist(),
              "tokens": (cum[bounds[1:]] - cum[bounds[:-1]]).tolist(), "docs": len(ids),
              "unique_docs": int((copies > 0).sum()), "overlaps_heldout": n_overlapping,
              "input_sha256": tok_done["sha256"], "mixture_sha256": mix_sha, "config": digest}
    return ShardScatter(keys, dom[idx], tokens, bounds, marker)


def _write_run(path: Path, held: list[ShardScatter], n_files: int) -> None:
    """One run of several shards: a single record batch in bucket order (a bucket's copies shard by shard, each in
    key order) and, beside it, the row offsets of the buckets (``<run>.buckets.npy``)."""
    import numpy as np
    import pyarrow as pa

    schema = _schema()
    if not held:
        table, bucket, order = schema.empty_table(), np.zeros(0, np.int64), np.zeros(0, np.int64)
    else:
        bucket = np.concatenate([np.repeat(np.arange(n_files), np.diff(h.bounds)) for h in held])
        order = np.argsort(bucket, kind="stable")
        table = pa.table({"key": np.concatenate([h.keys for h in held]),
                          "domain": np.concatenate([h.dom for h in held]),
                          "tokens": pa.concat_arrays([h.tokens for h in held])}, schema=schema).take(pa.array(order))
    np.save(_offsets_path(path), np.searchsorted(bucket[order], np.arange(n_files + 1)).astype(np.int64))
    batch = table.combine_chunks().to_batches()
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, schema) as writer:   # one batch, even if empty
        writer.write_batch(batch[0] if table.num_rows else _empty_batch(schema))


def _empty_batch(schema):
    import pyarrow as pa

    return pa.record_batch([pa.array([], f.type) for f in schema], schema=schema)


def _offsets_path(run: Path) -> Path:
    return run.with_suffix(".buckets.npy")


class _Run:
    """A run or merged part opened for reading bucket by bucket (one file descriptor)."""

    def __init__(self, path: Path):
        import numpy as np
        import pyarrow as pa

        self.src = pa.memory_map(str(path), "r")
        self.reader = pa.ipc.open_file(self.src)
        off = _offsets_path(path)
        self.offsets = np.load(off) if off.exists() else None
        self.whole = None
        if self.offsets is not None:            # one batch: mapped, and the file closed (the mapping stays)
            self.whole = self.reader.get_batch(0)
            self.src.close()

    def bucket(self, b: int):
        if self.offsets is None:
            return self.reader.get_batch(b)
        lo, hi = int(self.offsets[b]), int(self.offsets[b + 1])
        return self.whole.slice(lo, hi - lo)

    def close(self) -> None:
        self.src.close()
        self.reader = self.whole = None


def _merge(runs: list[Path], out, n_files: int, bucket_tokens) -> None:
    """Bucket ``b`` of ``out`` (a writable binary file) = bucket ``b`` of every run, in order: ``n_files`` batches.

    The runs are opened for a group of consecutive buckets of about ``MERGE_TOKENS`` tokens and closed after it,
    so what the task maps and touches at once is one group of the part, not all of it."""
    import numpy as np
    import pyarrow as pa

    schema = _schema()
    cum = np.concatenate([[0], np.cumsum(np.asarray(bucket_tokens, np.int64))])
    with pa.ipc.new_file(out, schema) as writer:
        b = 0
        while b < n_files:
            stop = max(b + 1, int(np.searchsorted(cum, cum[b] + MERGE_TOKENS, side="right")) - 1)
            opened = [_Run(r) for r in runs]
            try:
                for k in range(b, min(stop, n_files)):
                    table = pa.Table.from_batches([r.bucket(k) for r in opened], schema).combine_chunks()
                    writer.write_batch(table.to_batches()[0] if table.num_rows else _empty_batch(schema))
            finally:
                for r in opened:
                    r.close()
                del opened
            b = stop


def run_scatter_part(rdir: Path, part: str, shards: list[str], *, seed: int, n_files: int,
                     domains: list[str]) -> dict:
    """Scatter every shard of ``shards`` (:func:`scatter_shard`) into ``part``: bucket ``b`` of the part is the
    shards' bucket ``b`` in the order given; return the part's marker.

    Shards are held in memory until they hold ``RUN_TOKENS`` tokens and then written as one *run* (a single
    record batch in bucket order), so the task writes a record batch per run, not one per shard and bucket; the
    runs are merged into the part ``MERGE_FAN_IN`` at a time (in more passes only past ``MERGE_FAN_IN`` runs,
    64 GB of tokens), a group of buckets at a time, so the task holds a bounded number of files open and pages
    mapped, whatever its number of shards.

    A rerun whose shards' settings and inputs are unchanged returns the part's marker (the shards' digests are
    recomputed from their inputs' markers and mixture files); otherwise the shards are scattered again."""
    import numpy as np

    out = part_path(rdir, part)
    if read_marker(out):
        digest = config_digest("sink_scatter_part", n_files,
                               [_shard_digest(rdir, s, seed, n_files, domains)[0] for s in shards])
        if done := completed(out, digest):
            return done
    work = rdir / SCATTER_DIR / f".{part}.runs"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    copies, tokens, configs, kept, runs, held, held_tokens = (np.zeros(n_files, np.int64), np.zeros(n_files, np.int64),
                                                               [], [], [], [], 0)
    for s in shards:
        h = scatter_shard(rdir, s, seed=seed, n_files=n_files, domains=domains)
        copies += np.asarray(h.marker["copies"], np.int64)
        tokens += np.asarray(h.marker["tokens"], np.int64)
        configs.append(h.marker["config"])
        kept.append({k: h.marker[k] for k in SHARD_FIELDS})
        held.append(h)
        held_tokens += len(h.tokens.values)
        if held_tokens >= RUN_TOKENS:
            runs.append(work / f"run-{len(runs):06d}.arrow")
            _write_run(runs[-1], held, n_files)
            held, held_tokens = [], 0
    if held or not runs:
        runs.append(work / f"run-{len(runs):06d}.arrow")
        _write_run(runs[-1], held, n_files)
    del held
    level = 0
    while len(runs) > MERGE_FAN_IN:         # past MERGE_FAN_IN runs: merge groups of them first
        merged = []
        for g in range(0, len(runs), MERGE_FAN_IN):
            merged.append(work / f"merge-{level}-{g // MERGE_FAN_IN:06d}.arrow")
            with open(merged[-1], "wb") as fh:
                _merge(runs[g:g + MERGE_FAN_IN], fh, n_files, tokens)
        runs, level = merged, level + 1
    digest = config_digest("sink_scatter_part", n_files, configs)
    with atomic_path(out) as tmp, open(tmp, "wb") as fh:
        sink = HashingFile(fh)
        _merge(runs, sink, n_files, tokens)
    extra = {"part": part, "n_files": n_files, "copies": copies.tolist(), "tokens": tokens.tolist(), "shards": kept}
    done = write_marker(out, extra, config=digest, sha256=sink.hash.hexdigest())
    shutil.rmtree(work, ignore_errors=True)
    return done


def open_batch(path: Path, k: int):
    """Record batch ``k`` of a scatter part, memory-mapped: only the pages a writer touches are read.  The file is
    closed at once (the mapping lives as long as the batch), so a writer holds no descriptor per part it reads."""
    import pyarrow as pa

    src = pa.memory_map(str(path), "r")
    try:
        return pa.ipc.open_file(src).get_batch(k)
    finally:
        src.close()
