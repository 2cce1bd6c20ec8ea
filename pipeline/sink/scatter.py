"""Sink step 1 (per tokenized shard): every training copy of every document assigned to an output MindRecord file.

The mixture (:mod:`pipeline.sink.mixture`) decided how many copies of each document train.  Each copy gets its order
key (:func:`pipeline.sink.packing.order_keys`: a hash of seed, doc id and copy number) and goes to output file
``key % n_files``; inside a file the copies are packed in key order.  So the order of the shipped rows depends only
on (seed, doc id, copy), never on shard boundaries, task count or a process RNG, and every output file holds a
hash-random sample of every domain.

:func:`run_scatter_shard` writes ``sink/scatter/<shard>.arrow`` (an Arrow IPC file, uncompressed) whose record
batch ``k`` holds the copies bound for output file ``k``: ``key`` uint64, ``domain`` int32 (index into the set's
domain list), ``tokens`` list<int32>.  A writer task reads batch ``k`` of every scatter file and nothing else
(:mod:`pipeline.sink.shards`).  This is the map side of a map/reduce shuffle: ``shards * files`` batches in all.
The completion marker lists the tokens and copies per output file, so writers can size their buffers exactly.

:func:`n_output_files` sizes the set: the smallest multiple of ``pack.shard_num`` whose files hold at most
``pack.shard_mb`` MiB of row tokens each.

Memory: one tokenized shard at a time, about 30 bytes per token of the shard (the Parquet column, its copy
reordered by key, and the Arrow batches), plus 24 bytes per copy for keys and indices.  It does not depend on the
corpus size.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.io import atomic_path, completed, read_parquet, sha256_file, write_marker
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


def run_scatter_shard(rdir: Path, shard: str, *, seed: int, n_files: int, domains: list[str]) -> dict:
    """Assign the shard's training copies to ``n_files`` output files; return the marker (counts per file)."""
    import numpy as np
    import pyarrow as pa

    out = scatter_path(rdir, shard)
    if (done := completed(out)) and done.get("n_files") == n_files:
        return done
    tok_path, mix_path = rdir / "tokenize" / f"{shard}.parquet", rdir / "mixture" / f"{shard}.parquet"
    t = read_parquet(tok_path, columns=["doc_id", "domain", "tokens"])
    ids = t.column("doc_id").to_pylist()
    dec = read_parquet(mix_path, columns=["doc_id", "copies"])
    if dec.column("doc_id").to_pylist() != ids:
        raise ValueError(f"{mix_path}: documents differ from {tok_path}; rerun the mixture plan after tokenization")
    copies = dec.column("copies").to_numpy().astype(np.int64)
    index = {d: i for i, d in enumerate(domains)}
    try:
        dom = np.asarray([index[d] for d in t.column("domain").to_pylist()], np.int32)
    except KeyError as exc:
        raise ValueError(f"{tok_path}: domain {exc.args[0]!r} is not in the mixture report's domains "
                         f"{domains}; rerun the mixture plan") from None
    idx, keys = order_keys(seed, ids, copies)
    target = (keys % np.uint64(n_files)).astype(np.int64)
    order = np.lexsort((keys, target))        # by output file, then by key
    idx, keys, target = idx[order], keys[order], target[order]
    tokens = t.column("tokens").combine_chunks().take(pa.array(idx))
    lens = np.diff(tokens.offsets.to_numpy()).astype(np.int64) if len(idx) else np.zeros(0, np.int64)
    bounds = np.searchsorted(target, np.arange(n_files + 1))
    schema = pa.schema([("key", pa.uint64()), ("domain", pa.int32()), ("tokens", pa.list_(pa.int32()))])
    with atomic_path(out) as tmp, pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
        for k in range(n_files):
            lo, hi = int(bounds[k]), int(bounds[k + 1])
            writer.write_batch(pa.record_batch([pa.array(keys[lo:hi], pa.uint64()),
                                                pa.array(dom[idx[lo:hi]], pa.int32()), tokens.slice(lo, hi - lo)],
                                               schema=schema))
    cum = np.concatenate([[0], np.cumsum(lens)])
    extra = {"shard": shard, "n_files": n_files, "copies": np.diff(bounds).tolist(),
             "tokens": (cum[bounds[1:]] - cum[bounds[:-1]]).tolist(), "docs": len(ids),
             "unique_docs": int((copies > 0).sum()), "input_sha256": sha256_file(tok_path),
             "mixture_sha256": sha256_file(mix_path)}
    write_marker(out, extra)
    return {**extra, "output": out.name}


def read_batch(path: Path, k: int):
    """Record batch ``k`` of a scatter file (only its bytes are read)."""
    import pyarrow as pa

    with pa.OSFile(str(path), "rb") as f:
        return pa.ipc.open_file(f).get_batch(k)
