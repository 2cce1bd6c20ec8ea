"""Where the four stages keep their files, and the stage-1 manifest that ties them together.

``<run>/minhash/`` holds the stage-4 outputs ``<shard>.parquet`` (same columns as the input shard) and, in
sub-folders that never match ``minhash/*.parquet``::

    signatures/<shard>.parquet   stage 1: one row per input document (band keys, signature, survivor fields)
    manifest.json                after stage 1: shard order, doc counts, global id offsets, sha256 of inputs and
                                 signature files, config digest, and the dedup-index releases this run compares to
    cc/bands/                    stage 2: runs of candidate edges (a, b) of each band, by the slot of a, and a
                                 marker per band task (:mod:`pipeline.dedup.minhash.clusters.runs`)
    cc/plan.json, cc/<step>/     stage 3: the clustering tasks and every step's runs and task markers
                                 (:mod:`pipeline.dedup.minhash.clusters`); ``cc/check/`` keeps every checked pair with
                                 its similarity and verdict (:func:`~pipeline.dedup.minhash.clusters.checked_pairs`)
    clusters/summary.json        stage 3's counts and report examples, added up from its task markers
    clusters/<shard>.parquet     stage 4: removed rows of one shard: row, doc_id, cluster (smallest global id of
                                 its current members), kept_doc_id (``<release>:<doc_id>`` when an earlier
                                 release's document was kept), reason, similarity (best verified pair)
    report.json                  clusters, removals per domain, example clusters with differing spans

A document's *global id* is ``offset[shard] + row`` with shards in manifest order; ids of documents in the dedup
index (earlier releases) have the top bit set (:func:`index_node`).  Nothing downstream guesses the shard layout:
stage 2, 3 and 4 read it from the manifest, and stage 4 refuses an input whose sha256 or row count differs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.io import read_json, recorded_sha256, write_json

INDEX_BIT = np.uint64(1 << 63)
_ORD_BITS = 40


class MinhashError(RuntimeError):
    """A stage cannot go on safely (changed input, missing upstream output); the message names what and where."""


def stage_dir(rdir: Path) -> Path:
    return Path(rdir) / "minhash"


def signature_path(rdir: Path, shard: str) -> Path:
    return stage_dir(rdir) / "signatures" / f"{shard}.parquet"


def prescores_path(rdir: Path, shard: str) -> Path:
    """Stage 1's quality score rows of a shard (:mod:`pipeline.quality.prescored`), read by the quality stage."""
    return stage_dir(rdir) / "prescores" / f"{shard}.parquet"


def manifest_path(rdir: Path) -> Path:
    return stage_dir(rdir) / "manifest.json"


def decisions_path(rdir: Path, shard: str) -> Path:
    return stage_dir(rdir) / "clusters" / f"{shard}.parquet"


def clusters_summary_path(rdir: Path) -> Path:
    return stage_dir(rdir) / "clusters" / "summary.json"


def output_path(rdir: Path, shard: str) -> Path:
    return stage_dir(rdir) / f"{shard}.parquet"


def report_path(rdir: Path) -> Path:
    return stage_dir(rdir) / "report.json"


def input_path(rdir: Path, input_stage: str, shard: str) -> Path:
    return Path(rdir) / input_stage / f"{shard}.parquet"


def band_column(band: int) -> str:
    return f"band_{band:03d}"


def index_node(release: int, ordinal: np.ndarray) -> np.ndarray:
    """Global ids for documents of index release number ``release`` (top bit set, release in bits 40..62)."""
    return INDEX_BIT | (np.uint64(release) << np.uint64(_ORD_BITS)) | ordinal.astype(np.uint64)


def split_index_node(node: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    node = node.astype(np.uint64)
    return ((node & ~INDEX_BIT) >> np.uint64(_ORD_BITS)).astype(np.int64), (node & np.uint64((1 << _ORD_BITS) - 1))


def write_manifest(rdir: Path, shards: list[str], cfg_digest: str, fingerprint: str, input_stage: str,
                   index: dict) -> dict:
    """Record the stage-1 shard layout (after every signature shard is complete)."""
    from pipeline.io import completed

    entries, offset = [], 0
    for shard in shards:
        sig = signature_path(rdir, shard)
        done = completed(sig)
        if done is None:
            raise MinhashError(f"minhash stage 1 output {sig} is missing or incomplete; run signatures for {shard!r}")
        if done.get("config") != cfg_digest:
            raise MinhashError(f"{sig}: computed with another minhash config ({done.get('config')}) than this run "
                               f"({cfg_digest}); rerun stage 1")
        entries.append({"shard": shard, "docs": done["docs"], "offset": offset, "domain": done["domain"],
                        "input_sha256": done["input_sha256"], "signatures_sha256": done["sha256"]})
        offset += done["docs"]
    if offset >= 1 << 62:
        raise MinhashError(f"{offset} documents exceed the global id space")
    manifest = {"version": 1, "config": cfg_digest, "fingerprint": fingerprint, "input_stage": input_stage,
                "shards": entries, "docs": offset, "index": index}
    write_json(manifest_path(rdir), manifest)
    return manifest


_MANIFEST_CACHE: dict = {}


def read_manifest(rdir: Path, cfg_digest: str | None = None) -> dict:
    """The stage-1 manifest (read only: callers must not change it).

    Parsed once per process and file version: a batch task's shards (stage 4) and a worker's later shards reuse
    it instead of each parsing a file that grows with the number of shards (about 250 bytes per shard).
    """
    path = manifest_path(rdir)
    if not path.exists():
        raise MinhashError(f"{path} is missing: build the minhash manifest after stage 1 (signatures)")
    st = path.stat()
    key = (str(path.resolve()), st.st_mtime_ns, st.st_size, st.st_ino)
    manifest = _MANIFEST_CACHE.get(key)
    if manifest is None:
        manifest = read_json(path)
        _MANIFEST_CACHE.clear()
        _MANIFEST_CACHE[key] = manifest
    if cfg_digest is not None and manifest["config"] != cfg_digest:
        raise MinhashError(f"{path}: the run's minhash config changed after stage 1 (manifest {manifest['config']}, "
                           f"now {cfg_digest}); rerun from stage 1")
    return manifest


_ENTRIES: list = [None, {}]       # (manifest, {shard: entry}) of the manifest last looked up


def shard_entry(manifest: dict, shard: str, rdir: Path) -> dict:
    if _ENTRIES[0] is not manifest:   # one index per manifest, not a scan of every shard per lookup
        _ENTRIES[:] = [manifest, {e["shard"]: e for e in manifest["shards"]}]
    if (entry := _ENTRIES[1].get(shard)) is not None:
        return entry
    raise MinhashError(f"shard {shard!r} is not in the stage-1 manifest {manifest_path(rdir)} "
                       f"(shards: {[e['shard'] for e in manifest['shards']][:20]}); the shard layout changed")


def verify_input(rdir: Path, manifest: dict, shard: str) -> Path:
    """The input shard, after checking it is byte-for-byte the one stage 1 signed."""
    entry = shard_entry(manifest, shard, rdir)
    path = input_path(rdir, manifest["input_stage"], shard)
    if not path.exists():
        raise MinhashError(f"{path}: input shard is missing (stage 1 read {entry['docs']} documents from it)")
    actual = recorded_sha256(path)
    if actual != entry["input_sha256"]:
        raise MinhashError(f"{path}: sha256 {actual[:16]}… differs from the stage-1 manifest "
                           f"({entry['input_sha256'][:16]}…); the input changed after signatures were computed")
    return path


def gid_to_shard(manifest: dict, gids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(shard index, row) of current-run global ids."""
    offsets = np.array([e["offset"] for e in manifest["shards"]], dtype=np.int64)
    g = gids.astype(np.int64)
    idx = np.searchsorted(offsets, g, side="right") - 1
    return idx, g - offsets[idx]


def read_rows(path: Path, rows: np.ndarray, columns: list[str]):
    """``rows`` of a Parquet file (in the given order), reading only the row groups that hold them.

    Single-threaded and without pre-buffering: these are small selections, and Arrow's read buffers would
    otherwise dominate the peak memory of the cluster stage.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(path, pre_buffer=False)
    md = pf.metadata
    starts = np.cumsum([0] + [md.row_group(i).num_rows for i in range(md.num_row_groups)])
    rows = np.asarray(rows, dtype=np.int64)
    if len(rows) and (rows.min() < 0 or rows.max() >= starts[-1]):
        raise MinhashError(f"{path}: rows up to {rows.max()} requested, the file has {starts[-1]}")
    group_of = np.searchsorted(starts, rows, side="right") - 1
    groups = np.unique(group_of)
    table = pf.read_row_groups(groups.tolist(), columns=columns, use_threads=False)
    base = np.concatenate([[0], np.cumsum(starts[groups + 1] - starts[groups])])
    out = table.take(base[np.searchsorted(groups, group_of)] + rows - starts[group_of])
    del table
    pa.default_memory_pool().release_unused()
    return out
