"""The optional false-positive check of stage 3: similarity of each distinct candidate pair.

* Pairs of this run get the **exact** Jaccard similarity of their shingle sets.  The texts of the documents that
  appear in any candidate pair (usually a small share of the corpus) are read once, shard by shard, and their
  sorted distinct 64-bit hashes of the same shingles as the signatures (a fast non-cryptographic hash; SHA-1 is
  only needed where datasketch compatibility is) are appended to an on-disk store (``minhash/clusters/.shingles.u64``) that the check then memory-maps, so memory
  holds an offset per document, not the shingles.  With 64-bit hashes a spurious collision between two distinct
  shingles has probability ~|A|·|B|/2^64: the result is exact for any practical purpose.
* Pairs with an earlier release (index nodes) get the **estimated** similarity (share of equal signature
  values), since the index keeps signatures, not texts.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from pipeline.dedup.minhash.config import MinhashConfig
from pipeline.dedup.minhash.index import DedupIndex
from pipeline.dedup.minhash.layout import (
    INDEX_BIT,
    MinhashError,
    gid_to_shard,
    input_path,
    read_rows,
    signature_path,
    split_index_node,
)
from pipeline.dedup.minhash.signatures import SignatureEngine


class ShingleStore:
    """Sorted distinct shingle hashes of a fixed, sorted set of current documents (gids), on disk."""

    def __init__(self, rdir: Path, manifest: dict, cfg: MinhashConfig, gids: np.ndarray, path: Path):
        import pyarrow.parquet as pq

        self.gids = gids
        self.path = path
        self.offsets = np.zeros(len(gids) + 1, np.int64)
        engine = SignatureEngine(cfg)
        shard_idx, rows = gid_to_shard(manifest, gids)
        path.parent.mkdir(parents=True, exist_ok=True)
        pos, filled = 0, 0
        with open(path, "wb") as fh:
            for s in np.unique(shard_idx):
                entry = manifest["shards"][int(s)]
                sel = np.flatnonzero(shard_idx == s)
                src = input_path(rdir, manifest["input_stage"], entry["shard"])
                if pq.ParquetFile(src).metadata.num_rows != entry["docs"]:
                    raise MinhashError(f"{src}: row count differs from the stage-1 manifest ({entry['docs']})")
                texts = read_rows(src, rows[sel], ["text"]).column(0).to_pylist()
                domain = entry["domain"]
                for start in range(0, len(texts), 2048):
                    values, offs = engine.shingle_sets(texts[start:start + 2048], domain)
                    values.astype(np.uint64).tofile(fh)
                    k = len(offs) - 1
                    self.offsets[filled + 1:filled + k + 1] = pos + offs[1:]
                    pos += int(offs[-1])
                    filled += k
        self.values = np.memmap(path, dtype=np.uint64, mode="r", shape=(pos,)) if pos else np.zeros(0, np.uint64)

    def jaccard(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Exact Jaccard similarity of the pairs (a[i], b[i]) of gids (all must be in the store)."""
        ia = np.searchsorted(self.gids, a)
        ib = np.searchsorted(self.gids, b)
        inter = _intersections(np.asarray(self.values), self.offsets, ia, ib)
        sizes = np.diff(self.offsets)
        union = sizes[ia] + sizes[ib] - inter
        return np.where(union > 0, inter / np.maximum(union, 1), 1.0)

    def close(self) -> None:
        self.values = np.zeros(0, np.uint64)
        if self.path.exists():
            os.unlink(self.path)


def _intersections(values: np.ndarray, offs: np.ndarray, ia: np.ndarray, ib: np.ndarray) -> np.ndarray:
    try:
        import pipeline.dedup.minhash.kernels as kernels
    except ImportError:          # numba missing: numpy per pair (slower, same result)
        out = np.empty(len(ia), np.int64)
        for i, (x, y) in enumerate(zip(ia, ib, strict=True)):
            out[i] = len(np.intersect1d(values[offs[x]:offs[x + 1]], values[offs[y]:offs[y + 1]],
                                        assume_unique=True))
        return out
    return kernels.intersections(values, offs, ia.astype(np.int64), ib.astype(np.int64))


def read_signatures(rdir: Path, manifest: dict, gids: np.ndarray, num_perm: int) -> np.ndarray:
    """Signature rows of sorted current gids, read shard by shard."""
    import pyarrow.compute as pc

    out = np.zeros((len(gids), num_perm), np.uint64)
    shard_idx, rows = gid_to_shard(manifest, gids)
    for s in np.unique(shard_idx):
        sel = np.flatnonzero(shard_idx == s)
        taken = read_rows(signature_path(rdir, manifest["shards"][int(s)]["shard"]), rows[sel], ["signature"]).column(0)
        out[sel] = pc.list_flatten(taken).to_numpy().reshape(len(sel), num_perm)
    return out


def estimated_jaccard(rdir: Path, manifest: dict, index: DedupIndex, a: np.ndarray, b: np.ndarray,
                      num_perm: int) -> np.ndarray:
    """Share of equal signature values between current docs ``a`` and index nodes ``b``."""
    if not len(a):
        return np.zeros(0)
    ua, inv_a = np.unique(a, return_inverse=True)
    cur = read_signatures(rdir, manifest, ua, num_perm)[inv_a]
    rel, ords = split_index_node(b)
    old = np.zeros_like(cur)
    for r in np.unique(rel):
        sel = np.flatnonzero(rel == r)
        old[sel] = index.signatures(int(r), ords[sel])
    return (cur == old).mean(axis=1)


def is_index(nodes: np.ndarray) -> np.ndarray:
    return (nodes.astype(np.uint64) & INDEX_BIT) != 0
