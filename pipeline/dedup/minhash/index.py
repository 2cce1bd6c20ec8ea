"""Persistent dedup index: the band keys of every release already shipped, for incremental refreshes.

A scheduled refresh must not ship again what an earlier corpus version already contains, and must not re-read
that old data to find out.  After a run is published, :func:`add_release` stores, for the documents it shipped:

    <index_dir>/<fingerprint>/releases.json                 registered releases, in order
    <index_dir>/<fingerprint>/releases/<name>/band_<bbb>.keys.npy   sorted distinct band keys (uint64)
    <index_dir>/<fingerprint>/releases/<name>/band_<bbb>.ords.npy   ordinal of the first document with that key
    <index_dir>/<fingerprint>/releases/<name>/signatures.npy        (docs, num_perm) signatures, by ordinal
    <index_dir>/<fingerprint>/releases/<name>/docs.parquet          ordinal → doc_id, domain, source

``fingerprint`` = :meth:`MinhashConfig.fingerprint` (shingling, permutations, bands × rows): releases signed
with other parameters are invisible to a run, not silently mismatched.  Keys and signatures are ``.npy`` rather
than Parquet on purpose: a band task binary-searches a memory map, so an index far larger than RAM costs only the
pages it touches.  A run records the release list it saw in its manifest (:meth:`DedupIndex.snapshot`), so all
band tasks of one run compare against the same releases even if another run publishes meanwhile.

Matches against the index are checked with the signatures' *estimated* Jaccard similarity (standard error
≈ √(s(1−s)/num_perm)), since the old texts are deliberately not read again.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import re
from pathlib import Path

import numpy as np

from pipeline.dedup.minhash.config import MinhashConfig, check_config
from pipeline.dedup.minhash.layout import (
    MinhashError,
    band_column,
    index_node,
    read_manifest,
    read_rows,
    signature_path,
)
from pipeline.io import atomic_path, read_json, write_json

log = logging.getLogger(__name__)

_NAME = re.compile(r"^[A-Za-z0-9._-]+$")


#: memory for the band keys add_release holds at once (8 bytes per shipped document per band)
RELEASE_KEY_BYTES = 256 << 20

def index_root(data_root: str | Path, cfg: MinhashConfig) -> Path:
    base = Path(cfg.index_dir) if cfg.index_dir else Path(data_root) / "dedup_index"
    return base / cfg.fingerprint()


class DedupIndex:
    """Read side of the index, limited to a fixed list of releases (numbered in that order)."""

    def __init__(self, root: Path | None, releases: list[str]):
        self.root = root
        self.releases = releases
        self._cache: dict = {}

    @classmethod
    def open(cls, data_root: str | Path, cfg: MinhashConfig) -> DedupIndex:
        root = index_root(data_root, cfg)
        listing = root / "releases.json"
        names = [r["name"] for r in read_json(listing)["releases"]] if listing.exists() else []
        return cls(root, names)

    @classmethod
    def from_manifest(cls, manifest: dict) -> DedupIndex:
        info = manifest.get("index") or {}
        if not info.get("releases"):
            return cls(None, [])
        return cls(Path(info["root"]), list(info["releases"]))

    def snapshot(self, exclude: str | None = None) -> dict:
        names = [n for n in self.releases if n != exclude]
        return {"root": str(self.root) if self.root else "", "releases": names}

    def _dir(self, release: int) -> Path:
        return self.root / "releases" / self.releases[release]

    def _load(self, release: int, name: str) -> np.ndarray:
        key = (release, name)
        if key not in self._cache:
            path = self._dir(release) / name
            if not path.exists():
                raise MinhashError(f"dedup index file {path} is missing (release {self.releases[release]!r})")
            self._cache[key] = np.load(path, mmap_mode="r")
        return self._cache[key]

    def match_band(self, band: int, keys: np.ndarray, gids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Edges (gid, index node) for current documents whose key of ``band`` is in an indexed release."""
        out_a, out_b = [np.zeros(0, np.uint64)], [np.zeros(0, np.uint64)]
        if not len(keys):
            return out_a[0], out_b[0]
        order = np.argsort(keys, kind="stable")
        skeys, sgids = keys[order], gids[order]
        for r in range(len(self.releases)):
            ikeys = self._load(r, f"{band_column(band)}.keys.npy")
            if not len(ikeys):
                continue
            pos = np.searchsorted(ikeys, skeys)
            pos_c = np.minimum(pos, len(ikeys) - 1)
            hit = (pos < len(ikeys)) & (np.asarray(ikeys[pos_c]) == skeys)
            if hit.any():
                ords = np.asarray(self._load(r, f"{band_column(band)}.ords.npy")[pos_c[hit]])
                out_a.append(sgids[hit])
                out_b.append(index_node(r, ords))
        return np.concatenate(out_a), np.concatenate(out_b)

    def signatures(self, release: int, ords: np.ndarray) -> np.ndarray:
        return np.asarray(self._load(release, "signatures.npy")[ords.astype(np.int64)])

    def doc_ids(self, release: int, ords: np.ndarray) -> list[str]:
        return read_rows(self._dir(release) / "docs.parquet", ords.astype(np.int64), ["doc_id"]).column(0).to_pylist()


@contextlib.contextmanager
def _locked(root: Path):
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _save_npy(path: Path, arr: np.ndarray) -> None:
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as fh:
            np.save(fh, arr)


def add_release(rdir: Path, cfg: MinhashConfig, data_root: str | Path, release: str,
                kept_stage: str = "minhash") -> dict:
    """Add the documents this run shipped (``<rdir>/<kept_stage>/<shard>.parquet`` doc ids) to the index.

    Streams shard by shard (signatures into a memory-mapped ``.npy``), then reads the band keys of as many bands at
    once as fit in :data:`RELEASE_KEY_BYTES` (all 14 up to about 2 million shipped documents: one read of each
    shard instead of one per band, which cost more than the keys themselves), so memory stays bounded, not the
    signatures.  This is the one part of ``publish`` that grows with the corpus: the index holds a key per band
    per shipped document, so a later refresh can remove what this release already shipped (``use_index``).  Idempotent: adding a release again rewrites identical files.
    """
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    cfg = check_config(cfg)
    if not _NAME.match(release):
        raise MinhashError(f"release name {release!r}: use letters, digits, '.', '_' or '-'")
    rdir = Path(rdir)
    manifest = read_manifest(rdir, cfg.digest())
    root = index_root(data_root, cfg)
    rel_dir = root / "releases" / release
    shipped: list[np.ndarray] = []
    for entry in manifest["shards"]:
        kept_file = rdir / kept_stage / f"{entry['shard']}.parquet"
        if not kept_file.exists():
            raise MinhashError(f"{kept_file}: missing; the index records what stage {kept_stage!r} kept")
        kept_ids = pq.read_table(kept_file, columns=["doc_id"]).column(0).cast(pa.string())
        t = pq.read_table(signature_path(rdir, entry["shard"]), columns=["doc_id", "shingles"])
        mask = pc.and_(pc.is_in(t.column("doc_id").cast(pa.string()), value_set=kept_ids),
                       pc.greater(t.column("shingles"), 0))
        shipped.append(np.flatnonzero(mask.to_numpy(zero_copy_only=False)))
    n = int(sum(len(rows) for rows in shipped))
    docs_schema = pa.schema([("doc_id", pa.string()), ("domain", pa.string()), ("source", pa.string()),
                             ("ord", pa.int64())])
    with _locked(root):
        sig_dtype = np.uint64 if cfg.scheme == "affine64" else np.uint32
        with atomic_path(rel_dir / "signatures.npy") as sig_tmp, \
                atomic_path(rel_dir / "docs.parquet") as docs_tmp, \
                pq.ParquetWriter(docs_tmp, docs_schema, compression="zstd") as docs_out:
            sig = np.lib.format.open_memmap(sig_tmp, mode="w+", dtype=sig_dtype, shape=(n, cfg.num_perm))
            pos = 0
            for entry, rows in zip(manifest["shards"], shipped, strict=True):
                t = pq.read_table(signature_path(rdir, entry["shard"]),
                                  columns=["doc_id", "domain", "source", "signature"]).take(pa.array(rows))
                sig[pos:pos + len(rows)] = pc.list_flatten(t.column("signature")).to_numpy().reshape(-1, cfg.num_perm)
                docs_out.write_table(pa.table({
                    "doc_id": t.column("doc_id").cast(pa.string()), "domain": t.column("domain").cast(pa.string()),
                    "source": t.column("source").cast(pa.string()),
                    "ord": pa.array(np.arange(pos, pos + len(rows), dtype=np.int64))}, schema=docs_schema),
                    row_group_size=1024)
                pos += len(rows)
            sig.flush()
            del sig
        per_pass = max(1, min(cfg.bands, RELEASE_KEY_BYTES // max(1, 8 * n)))   # bands whose keys fit at once
        for first_band in range(0, cfg.bands, per_pass):
            group = [band_column(j) for j in range(first_band, min(cfg.bands, first_band + per_pass))]
            tables = [pq.read_table(signature_path(rdir, e["shard"]), columns=group)
                      for e, rows in zip(manifest["shards"], shipped, strict=True)]
            for col in group:
                keys = [t.column(col).to_numpy()[rows] for t, rows in zip(tables, shipped, strict=True)]
                k = np.concatenate(keys) if keys else np.zeros(0, np.uint64)
                uniq, first = np.unique(k, return_index=True)
                _save_npy(rel_dir / f"{col}.keys.npy", uniq.astype(np.uint64))
                _save_npy(rel_dir / f"{col}.ords.npy", first.astype(np.uint64))
            del tables
        listing = root / "releases.json"
        info = read_json(listing) if listing.exists() else {"fingerprint": cfg.fingerprint(),
                                                            "signature_fields": cfg.signature_fields(),
                                                            "releases": []}
        entry = {"name": release, "docs": n, "run_dir": str(rdir), "kept_stage": kept_stage}
        names = [r["name"] for r in info["releases"]]
        if release in names:                       # re-adding keeps the release's place in the order
            info["releases"][names.index(release)] = entry
        else:
            info["releases"].append(entry)
        write_json(listing, info)
    log.info("dedup index %s: release %s with %d documents", root, release, n)
    return {"index": str(root), "release": release, "docs": n, "releases": len(info["releases"])}
