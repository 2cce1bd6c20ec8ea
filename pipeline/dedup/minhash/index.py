"""Persistent dedup index: the band keys of every release already shipped, for incremental refreshes.

A scheduled refresh must not ship again what an earlier corpus version already contains, and must not re-read
that old data to find out.  When a run is published, :mod:`pipeline.dedup.minhash.release` has stored, for the
documents it shipped:

    <index_dir>/<fingerprint>/releases.json                 registered releases, in order
    <index_dir>/<fingerprint>/releases/<name>/band_<bbb>.keys.npy   sorted distinct band keys (uint64)
    <index_dir>/<fingerprint>/releases/<name>/band_<bbb>.ords.npy   ordinal of the first document with that key
    <index_dir>/<fingerprint>/releases/<name>/parts.json            documents per part (ordinals run part by part)
    <index_dir>/<fingerprint>/releases/<name>/parts/sig-<k>.npy     (docs, num_perm) signatures of part k
    <index_dir>/<fingerprint>/releases/<name>/parts/docs-<k>.parquet  part k's ordinals → doc_id, domain, source

(A release of the first layout has one ``signatures.npy`` and ``docs.parquet`` instead of parts; it reads the
same.)

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
from pathlib import Path

import numpy as np

from pipeline.dedup.minhash.config import MinhashConfig
from pipeline.dedup.minhash.layout import MinhashError, band_column, index_node, read_rows
from pipeline.io import read_json

log = logging.getLogger(__name__)

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

    def _parts(self, release: int) -> np.ndarray:
        """First ordinal of every part of the release (and the end); a release of the first layout is one part."""
        key = (release, "parts")
        if key not in self._cache:
            listing = self._dir(release) / "parts.json"
            sizes = read_json(listing)["parts"] if listing.exists() else None
            self._cache[key] = None if sizes is None else np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        return self._cache[key]

    def _by_part(self, release: int, ords: np.ndarray):
        """(part file suffix, positions of ``ords`` in it, their indices in ``ords``) per part they fall in."""
        ords = ords.astype(np.int64)
        starts = self._parts(release)
        if starts is None:
            yield "", ords, np.arange(len(ords))
            return
        part = np.searchsorted(starts, ords, side="right") - 1
        for k in np.unique(part):
            sel = np.flatnonzero(part == k)
            yield f"-{int(k):05d}", ords[sel] - starts[k], sel

    def signatures(self, release: int, ords: np.ndarray) -> np.ndarray:
        out = None
        for suffix, local, sel in self._by_part(release, ords):
            name = f"parts/sig{suffix}.npy" if suffix else "signatures.npy"
            values = np.asarray(self._load(release, name)[local])
            out = np.zeros((len(ords), values.shape[1]), values.dtype) if out is None else out
            out[sel] = values
        return out if out is not None else np.zeros((0, 0), np.uint32)

    def doc_ids(self, release: int, ords: np.ndarray) -> list[str]:
        out: list = [None] * len(ords)
        for suffix, local, sel in self._by_part(release, ords):
            path = self._dir(release) / (f"parts/docs{suffix}.parquet" if suffix else "docs.parquet")
            for i, d in zip(sel.tolist(), read_rows(path, local, ["doc_id"]).column(0).to_pylist(), strict=True):
                out[i] = d
        return out


@contextlib.contextmanager
def locked(root: Path):
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
