"""Adding a published run to the dedup index (:mod:`pipeline.dedup.minhash.index`), in tasks whose memory is bounded.

Three steps, so no task holds the shipped documents of the whole run:

1. :func:`write_release_part` (per batch of shards, in the quality stage's batch task: no task of its own): the
   documents of the batch that shipped (``<kept_stage>/<shard>.parquet``) with their signatures, doc ids and band
   keys, as part ``k`` of the release: ``parts/sig-<k>.npy`` (docs, num_perm), ``parts/docs-<k>.parquet`` and
   ``parts/keys-<k>.npy`` (bands, docs).  Memory: one shard's columns; the part's arrays are written through
   memory maps.
2. :func:`merge_release_band` (per band, 14 tasks): the band's keys of every part, with their ordinals in the
   release (parts in order), sorted and reduced to the first ordinal of each distinct key, written as the one
   sorted file a later refresh's band task binary-searches (``band_<bbb>.keys.npy`` / ``.ords.npy``).  The keys go
   to runs addressed by their top 16 bits (:mod:`pipeline.dedup.minhash.clusters.runs`: slot order is key order),
   each written within ``memory_mb``, then sorted one key range at a time and appended to the output in order.
   Memory: ``BYTES_PER_KEY`` per key of one range, at most ``memory_mb``.
3. :func:`register_release` (publish, one task): ``parts.json`` (the parts' document counts) and the release's
   entry in ``releases.json``, under the index's lock; it reads markers only.

:func:`add_release` runs the three in this process (CLI, tests).  Idempotent: every file is written atomically
and adding a release again rewrites identical files.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np

from pipeline.dedup.minhash.config import MinhashConfig, check_config
from pipeline.dedup.minhash.index import index_root, locked
from pipeline.dedup.minhash.layout import MinhashError, band_column, read_manifest, shard_entry, signature_path
from pipeline.io import atomic_path, config_digest, read_json, read_marker, write_json

log = logging.getLogger(__name__)

_NAME = re.compile(r"^[A-Za-z0-9._-]+$")
BYTES_PER_KEY = 64          # a range's keys and ordinals, the sort index and sorted copies, the distinct output


def release_dir(data_root: str | Path, cfg: MinhashConfig, release: str) -> Path:
    if not _NAME.match(release):
        raise MinhashError(f"release name {release!r}: use letters, digits, '.', '_' or '-'")
    return index_root(data_root, cfg) / "releases" / release


def _part_marker(rel: Path, part: int, parts: int) -> Path:
    return rel / "parts" / f"part-{part:05d}-of-{parts:05d}.json"


def write_release_part(rdir: Path, cfg: MinhashConfig, data_root: str | Path, release: str, part: int, parts: int,
                       shards: list[str], kept_stage: str = "quality") -> dict:
    """Part ``part`` of ``parts`` of the release: the shipped documents of ``shards`` (consecutive in the
    manifest), in shard then row order.  Returns its marker (the document count)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    cfg = check_config(cfg)
    rdir = Path(rdir)
    rel = release_dir(data_root, cfg, release)
    manifest = read_manifest(rdir, cfg.digest())
    shipped = []
    for shard in shards:
        shard_entry(manifest, shard, rdir)
        kept_file = rdir / kept_stage / f"{shard}.parquet"
        if not kept_file.exists():
            raise MinhashError(f"{kept_file}: missing; the index records what stage {kept_stage!r} kept")
        kept_ids = pq.read_table(kept_file, columns=["doc_id"]).column(0).cast(pa.string())
        t = pq.read_table(signature_path(rdir, shard), columns=["doc_id", "shingles"])
        mask = pc.and_(pc.is_in(t.column("doc_id").cast(pa.string()), value_set=kept_ids),
                       pc.greater(t.column("shingles"), 0))
        shipped.append(np.flatnonzero(mask.to_numpy(zero_copy_only=False)))
    n = int(sum(len(r) for r in shipped))
    sig_dtype = np.uint64 if cfg.scheme == "affine64" else np.uint32
    docs_schema = pa.schema([("doc_id", pa.string()), ("domain", pa.string()), ("source", pa.string())])
    cols = ["doc_id", "domain", "source", "signature"] + [band_column(b) for b in range(cfg.bands)]
    folder = rel / "parts"
    with atomic_path(folder / f"sig-{part:05d}.npy") as sig_tmp, atomic_path(folder / f"keys-{part:05d}.npy") as \
            key_tmp, atomic_path(folder / f"docs-{part:05d}.parquet") as docs_tmp, \
            pq.ParquetWriter(docs_tmp, docs_schema, compression="zstd") as docs_out:
        sig = np.lib.format.open_memmap(sig_tmp, mode="w+", dtype=sig_dtype, shape=(n, cfg.num_perm))
        keys = np.lib.format.open_memmap(key_tmp, mode="w+", dtype=np.uint64, shape=(cfg.bands, n))
        pos = 0
        for shard, rows in zip(shards, shipped, strict=True):
            t = pq.read_table(signature_path(rdir, shard), columns=cols).take(pa.array(rows))
            sig[pos:pos + len(rows)] = pc.list_flatten(t.column("signature")).to_numpy().reshape(-1, cfg.num_perm)
            for b in range(cfg.bands):
                keys[b, pos:pos + len(rows)] = t.column(band_column(b)).to_numpy()
            docs_out.write_table(pa.table({c: t.column(c).cast(pa.string()) for c in ("doc_id", "domain", "source")},
                                          schema=docs_schema), row_group_size=1024)
            pos += len(rows)
        sig.flush()
        keys.flush()
        del sig, keys
    info = {"part": part, "parts": parts, "docs": n, "shards": len(shards), "run_dir": str(rdir),
            "digest": config_digest("release_part", cfg.digest(), release, part, parts, list(shards), kept_stage)}
    write_json(_part_marker(rel, part, parts), info)
    return info


def _parts(rel: Path, parts: int) -> list[dict]:
    out = []
    for k in range(parts):
        path = _part_marker(rel, k, parts)
        if not path.exists():
            raise MinhashError(f"{path}: part {k + 1} of {parts} of release {rel.name!r} is not written; run the "
                               "quality stage's tasks (they write the release's parts) first")
        out.append(read_json(path))
    return out


def merge_release_band(cfg: MinhashConfig, data_root: str | Path, release: str, band: int, parts: int) -> dict:
    """``band_<bbb>.keys.npy`` (sorted distinct keys of the band) and ``.ords.npy`` (the first ordinal in the
    release of each) from every part, in key ranges within ``memory_mb``."""
    import pyarrow as pa

    from pipeline.dedup.minhash.clusters import runs

    cfg = check_config(cfg)
    rel = release_dir(data_root, cfg, release)
    found = _parts(rel, parts)
    starts = np.concatenate([[0], np.cumsum([p["docs"] for p in found])]).astype(np.int64)
    work = rel / "parts" / f".band-{band:03d}"
    schema = pa.schema([("key", pa.uint64()), ("ord", pa.uint64())])
    chunk = max(1, (cfg.memory_mb << 20) // BYTES_PER_KEY)
    written: list[Path] = []
    for k in range(parts):
        keys = np.load(rel / "parts" / f"keys-{k:05d}.npy", mmap_mode="r")
        for lo in range(0, keys.shape[1], chunk):
            part_keys = np.array(keys[band, lo:lo + chunk])
            ords = np.arange(starts[k] + lo, starts[k] + lo + len(part_keys), dtype=np.uint64)
            written.append(work / f"run-{len(written):06d}.arrow")
            runs.write_run(written[-1], pa.table({"key": part_keys, "ord": ords}, schema=schema),
                           (part_keys >> np.uint64(64 - runs.SLOT_BITS)).astype(np.int64))
        del keys
    counts = runs.slot_counts(written, 0, runs.SLOTS)
    col = band_column(band)
    with atomic_path(rel / f"{col}.keys.npy") as keys_tmp, atomic_path(rel / f"{col}.ords.npy") as ords_tmp, \
            _NpyAppender(keys_tmp) as keys_out, _NpyAppender(ords_tmp) as ords_out:
        for r0, r1 in runs.plan_ranges(counts, 0, BYTES_PER_KEY, cfg.memory_mb << 20):
            t = runs.read_range(written, r0, r1, schema)
            key, ord_ = t.column("key").to_numpy(), t.column("ord").to_numpy()
            order = np.lexsort((ord_, key))
            key, ord_ = key[order], ord_[order]
            first = np.r_[True, key[1:] != key[:-1]] if len(key) else np.zeros(0, bool)
            keys_out.append(key[first])
            ords_out.append(ord_[first])
        distinct = keys_out.rows
    for path in written:
        path.unlink()
        path.with_name(path.name[:-len(".arrow")] + ".slots").unlink()
    if written:                     # no keys in any part (a release of no documents): no run folder was made
        work.rmdir()
    return {"band": band, "keys": int(starts[-1]), "distinct": distinct, "runs": len(written)}


class _NpyAppender:
    """A 1-D uint64 ``.npy`` written front to back without knowing its length: a fixed 128-byte header is
    rewritten with the final shape when the file is closed."""

    HEADER = 128

    def __init__(self, path: Path):
        self.path, self.rows = path, 0

    def __enter__(self):
        self.fh = open(self.path, "wb")
        self.fh.write(b"\0" * self.HEADER)
        return self

    def append(self, values: np.ndarray) -> None:
        self.fh.write(np.ascontiguousarray(values, dtype="<u8").tobytes())
        self.rows += len(values)

    def __exit__(self, *exc) -> None:
        text = f"{{'descr': '<u8', 'fortran_order': False, 'shape': ({self.rows},), }}".encode()
        pad = self.HEADER - 10 - len(text) - 1
        self.fh.seek(0)
        self.fh.write(b"\x93NUMPY\x01\x00" + (self.HEADER - 10).to_bytes(2, "little") + text + b" " * pad + b"\n")
        self.fh.close()


def register_release(cfg: MinhashConfig, data_root: str | Path, release: str, parts: int,
                     kept_stage: str = "quality") -> dict:
    """Record the release (its parts' counts, then its entry in ``releases.json``) once every part and band file
    is written; a later refresh with ``use_index`` compares with it from then on."""
    cfg = check_config(cfg)
    root = index_root(data_root, cfg)
    rel = release_dir(data_root, cfg, release)
    found = _parts(rel, parts)
    missing = [b for b in range(cfg.bands) if not (rel / f"{band_column(b)}.keys.npy").exists()]
    if missing:
        raise MinhashError(f"{rel}: band {missing[0]}'s keys are not merged ({len(missing)} bands missing); run the "
                           "release's band tasks first")
    n = sum(p["docs"] for p in found)
    with locked(root):
        write_json(rel / "parts.json", {"parts": [p["docs"] for p in found]})
        listing = root / "releases.json"
        info = read_json(listing) if listing.exists() else {"fingerprint": cfg.fingerprint(),
                                                            "signature_fields": cfg.signature_fields(),
                                                            "releases": []}
        run_dir = found[0]["run_dir"] if found else ""
        entry = {"name": release, "docs": n, "run_dir": run_dir, "kept_stage": kept_stage, **_tokenizer_of(run_dir)}
        names = [r["name"] for r in info["releases"]]
        if release in names:                       # re-adding keeps the release's place in the order
            info["releases"][names.index(release)] = entry
        else:
            info["releases"].append(entry)
        write_json(listing, info)
    log.info("dedup index %s: release %s with %d documents in %d parts", root, release, n, parts)
    return {"index": str(root), "release": release, "docs": n, "parts": parts, "releases": len(info["releases"])}


def _tokenizer_of(run_dir: str) -> dict:
    """The release's tokenizer (path and digest) when its run trained or copied one: a refresh keeps it."""
    model = Path(run_dir) / "tokenizer" / "spm.model" if run_dir else None
    marker = read_marker(model) if model else None
    return {"tokenizer": str(model), "tokenizer_sha256": marker["sha256"]} if marker else {}


def extended_release(cfg: MinhashConfig, data_root: str | Path, run: str) -> dict | None:
    """The release an incremental refresh (run ``run``) extends: the newest one in the index before ``run`` (a
    rerun of a published run extends what came before it, not itself), or None for a first release."""
    listing = index_root(data_root, check_config(cfg)) / "releases.json"
    releases = read_json(listing)["releases"] if listing.exists() else []
    names = [r["name"] for r in releases]
    before = releases[:names.index(run)] if run in names else releases
    return before[-1] if before else None


def add_release(rdir: Path, cfg: MinhashConfig, data_root: str | Path, release: str,
                kept_stage: str = "minhash") -> dict:
    """The three steps in this process, the whole run as one part: index what ``<kept_stage>`` kept."""
    cfg = check_config(cfg)
    shards = [e["shard"] for e in read_manifest(Path(rdir), cfg.digest())["shards"]]
    write_release_part(Path(rdir), cfg, data_root, release, 0, 1, shards, kept_stage)
    for band in range(cfg.bands):
        merge_release_band(cfg, data_root, release, band, 1)
    return register_release(cfg, data_root, release, 1, kept_stage)
