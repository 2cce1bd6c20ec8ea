"""Stage 2: candidate pairs of ONE band (an independent task per band), by sort/merge in bounded memory.

A band task reads only its own key column from every stage-1 signature file (8 bytes per document), so the 14
tasks of the default setting run in parallel and none of them sees a signature.  Documents whose key is equal
share a bucket; each bucket of k documents yields k − 1 *star* edges (smallest global id, other member) — enough
for connected components, and linear even for the huge buckets that boilerplate creates (all-pairs would be
quadratic).  When the band's keys do not fit ``memory_mb`` they are processed in 2^p key-range partitions (the top
p bits of the key), each read, sorted and merged on its own; documents of one bucket always share a partition.

With a dedup index (earlier releases, :mod:`pipeline.dedup.minhash.index`), each key is also looked up in the release's
sorted key file of this band; a hit adds the edge (document, index node) whose node id has the top bit set.

Memory: about ``_BYTES_PER_DOC`` per document of the band partition being merged (keys and gids, their
concatenation, the sort index and sorted copies, run labels) plus a fixed cost, and one shard's key column while
reading.  ``_BYTES_PER_DOC`` is the rise of peak RSS (``VmHWM``) per document of a fresh process running one
band over synthetic stage-1 files with 20 % of documents in buckets, at two sizes of one partition.  Output:
16 bytes per candidate edge (a, b), one run per partition addressed by the slot of ``a``
(:mod:`pipeline.dedup.minhash.clusters.runs`), so stage 3's tasks each read the edges of their anchors.

Passes: every shard's key column of the band is read exactly once.  When 2^p partitions are needed, that single
read scatters (key, gid) pairs (16 bytes per document) into 2^p spill files on local disk under
``minhash/cc/bands/.work-<bbb>/``, each then read once, sorted and merged on its own and deleted; without
partitions the keys go straight to memory.
For 1e9 documents and the default 1024 MB: p = 7 (128 partitions of 7.8 M documents, about 0.9 GB each), 8 GB
of key reads and 16 GB of spill written and read once per band task, 14 band tasks.
"""

from __future__ import annotations

import logging
import math
import shutil
from pathlib import Path

import numpy as np

from pipeline.dedup.minhash.config import MinhashConfig, check_config
from pipeline.dedup.minhash.index import DedupIndex
from pipeline.dedup.minhash.layout import MinhashError, band_column, read_manifest, signature_path

log = logging.getLogger(__name__)

_BYTES_PER_DOC = 112       # measured peak per document of one partition (see the module docstring)


def partition_bits(docs: int, memory_mb: int) -> int:
    """Smallest p with docs/2^p documents of one partition fitting the memory budget."""
    need = docs * _BYTES_PER_DOC / (memory_mb * (1 << 20))
    return 0 if need <= 1 else min(16, math.ceil(math.log2(need)))


def _read_keys(rdir: Path, entry: dict, band: int) -> tuple[np.ndarray, np.ndarray]:
    """(keys, gids) of the documents of one shard that have shingles.

    Read through ``ParquetFile``, not ``pq.read_table``: a band task reads two columns of every shard's signature
    file, and the dataset layer that ``read_table`` sets up per file was most of each read's time at bench-scale
    (shards times bands reads of one small column), several times what a read costs this way.  Pre-buffering
    (which coalesces column-chunk reads) is off: it only pays off for chunks far larger than a shard's key column,
    and a read is faster without it."""
    import pyarrow.parquet as pq

    path, cols = signature_path(rdir, entry["shard"]), [band_column(band), "shingles"]
    with pq.ParquetFile(path, pre_buffer=False) as f:
        t = f.read(columns=cols, use_threads=False)
    if t.column_names != cols:          # ParquetFile leaves out a column it lacks without a word
        raise MinhashError(f"{path}: no column {sorted(set(cols) - set(t.column_names))}; stage 1 output changed "
                           "after the manifest was written")
    if t.num_rows != entry["docs"]:
        raise MinhashError(f"{signature_path(rdir, entry['shard'])}: {t.num_rows} rows, manifest says "
                           f"{entry['docs']}; stage 1 output changed after the manifest was written")
    keys = t.column(0).to_numpy()
    valid = t.column(1).to_numpy() > 0
    gids = np.arange(entry["offset"], entry["offset"] + entry["docs"], dtype=np.uint64)
    return keys[valid], gids[valid]


def star_edges(keys: np.ndarray, gids: np.ndarray) -> tuple[np.ndarray, np.ndarray, dict]:
    """(anchor, member) for every bucket of equal keys; anchor = smallest gid of the bucket."""
    order = np.lexsort((gids, keys))
    k, g = keys[order], gids[order]
    if len(k) < 2:
        return np.zeros(0, np.uint64), np.zeros(0, np.uint64), {"buckets": 0, "largest": 0}
    starts = np.flatnonzero(np.r_[True, k[1:] != k[:-1]])
    run = np.cumsum(np.r_[True, k[1:] != k[:-1]]) - 1
    anchor = g[starts][run]
    member = np.ones(len(k), bool)
    member[starts] = False
    sizes = np.diff(np.r_[starts, len(k)])
    return anchor[member], g[member], {"buckets": int((sizes > 1).sum()), "largest": int(sizes.max())}


def _partitions(rdir: Path, manifest: dict, band: int, bits: int, work: Path):
    """Yield (keys, gids) of each key-range partition in order, reading every shard's key column once."""
    if not bits:
        parts = [_read_keys(rdir, entry, band) for entry in manifest["shards"]]
        yield (np.concatenate([p[0] for p in parts]) if parts else np.zeros(0, np.uint64),
               np.concatenate([p[1] for p in parts]) if parts else np.zeros(0, np.uint64))
        return
    n, shift = 1 << bits, np.uint64(64 - bits)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    paths = [work / f"part_{i:05d}.u64" for i in range(n)]
    files = [open(p, "wb") for p in paths]
    try:
        for entry in manifest["shards"]:
            keys, gids = _read_keys(rdir, entry, band)
            part = (keys >> shift).astype(np.int64)
            order = np.argsort(part, kind="stable")       # shard order kept inside each partition
            bounds = np.searchsorted(part[order], np.arange(n + 1))
            pairs = np.stack([keys[order], gids[order]], axis=1)
            for i in np.flatnonzero(np.diff(bounds)):
                pairs[bounds[i]:bounds[i + 1]].tofile(files[i])
    finally:
        for f in files:
            f.close()
    try:
        for path in paths:
            pairs = np.fromfile(path, dtype=np.uint64).reshape(-1, 2)
            path.unlink()
            yield pairs[:, 0].copy(), pairs[:, 1].copy()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_band(rdir: Path, band: int, cfg: MinhashConfig) -> dict:
    """Candidate edges of band ``band`` → runs of (a, b) addressed by the slot of a (``minhash/cc/bands/``)."""
    import pyarrow as pa

    from pipeline.dedup.minhash.clusters import runs
    from pipeline.io import config_digest

    cfg = check_config(cfg)
    if not cfg.enabled:
        return {"band": band, "skipped": "minhash.enabled is false"}
    rdir = Path(rdir)
    if not 0 <= band < cfg.bands:
        raise MinhashError(f"band {band} out of range: the config has {cfg.bands} bands")
    manifest = read_manifest(rdir, cfg.digest())
    digest = runs.digest_of("minhash_band", cfg.digest(), config_digest(manifest), band)
    if done := runs.done(rdir, "bands", band, cfg.bands, digest):
        return done["stats"]
    runs.clear_outputs(rdir, "bands", band, cfg.bands)
    index = DedupIndex.from_manifest(manifest)
    bits = partition_bits(manifest["docs"], cfg.memory_mb)
    stats = {"band": band, "partitions": 1 << bits, "docs": 0, "buckets": 0, "largest_bucket": 0, "edges": 0,
             "index_matches": 0}
    schema = pa.schema([("a", pa.uint64()), ("b", pa.uint64())])
    writer = runs.RunWriter(rdir, "bands", band, cfg.bands, "edges")
    for keys, gids in _partitions(rdir, manifest, band, bits, runs.step_dir(rdir, "bands") / f".work-{band:03d}"):
        a, b, info = star_edges(keys, gids)
        stats["docs"] += len(keys)
        stats["buckets"] += info["buckets"]
        stats["largest_bucket"] = max(stats["largest_bucket"], info["largest"])
        ia, ib = index.match_band(band, keys, gids)
        stats["index_matches"] += len(ia)
        a, b = np.concatenate([a, ia]), np.concatenate([b, ib])
        stats["edges"] += len(a)
        writer.write(pa.table({"a": a, "b": b}, schema=schema), runs.slot_of(a))
    runs.commit(rdir, "bands", band, cfg.bands, digest, {"edges": writer.written}, stats)
    log.info("minhash band %d: %d docs, %d buckets (largest %d), %d edges, %d index matches", band, stats["docs"],
             stats["buckets"], stats["largest_bucket"], stats["edges"], stats["index_matches"])
    return stats
