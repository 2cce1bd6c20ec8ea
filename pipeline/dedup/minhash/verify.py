"""The optional false-positive check of stage 3: similarity of each distinct candidate pair.

* Pairs of this run get the **exact** Jaccard similarity of their shingle sets.  The texts of the documents that
  appear in any candidate pair (usually a small share of the corpus) are read once, shard by shard, and their
  sorted distinct 64-bit hashes of the same shingles as the signatures (a fast non-cryptographic hash; SHA-1 is
  only needed where datasketch compatibility is) are appended to an on-disk store (``minhash/clusters/.shingles.u64``).
  The check reads it back in chunks of pairs whose sets total at most ``ShingleStore.CHUNK_BYTES`` (64 MB; a
  single larger pair is its own chunk), each through a mapping that is closed before the next, so memory holds an
  offset per document and one chunk, not the shingles: a mapping kept open for the whole check made every page
  it touched resident (1.7 GB of a 4 GB corpus with 30 % duplicates).  With 64-bit hashes a spurious collision between two distinct
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

    #: Shingle-set bytes held at once while checking pairs (one pair whose sets are larger is a chunk by itself).
    CHUNK_BYTES = 64 << 20

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
        self.total = pos
        self.max_chunk_bytes = 0        # the largest chunk of sets held at once (what the memory bound is about)

    def jaccard(self, a: np.ndarray, b: np.ndarray, chunk_bytes: int | None = None) -> np.ndarray:
        """Exact Jaccard similarity of the pairs (a[i], b[i]) of gids (all must be in the store).

        Pairs are taken in order of their first document and cut into chunks whose two sets total at most
        ``chunk_bytes`` (default :attr:`CHUNK_BYTES`); each chunk's distinct documents are copied out of a mapping
        of the store that is closed before the next chunk."""
        ia = np.searchsorted(self.gids, a)
        ib = np.searchsorted(self.gids, b)
        sizes = np.diff(self.offsets)
        inter = np.zeros(len(ia), np.int64)
        budget = max(1, (chunk_bytes or self.CHUNK_BYTES) // 8)
        order = np.argsort(np.minimum(ia, ib), kind="stable")
        cost = np.cumsum(sizes[ia[order]] + sizes[ib[order]])
        start = 0
        while start < len(order):
            base = cost[start - 1] if start else 0
            end = max(start + 1, int(np.searchsorted(cost, base + budget, side="right")))
            sel = order[start:end]
            inter[sel] = self._chunk_intersections(ia[sel], ib[sel])
            start = end
        union = sizes[ia] + sizes[ib] - inter
        return np.where(union > 0, inter / np.maximum(union, 1), 1.0)

    def _chunk_intersections(self, ia: np.ndarray, ib: np.ndarray) -> np.ndarray:
        docs = np.unique(np.concatenate([ia, ib]))
        starts, lengths = self.offsets[docs], np.diff(self.offsets)[docs]
        local = np.zeros(len(docs) + 1, np.int64)
        np.cumsum(lengths, out=local[1:])
        mapped = np.memmap(self.path, dtype=np.uint64, mode="r", shape=(self.total,)) if self.total else None
        try:
            idx = np.repeat(starts - local[:-1], lengths) + np.arange(local[-1], dtype=np.int64)
            values = np.asarray(mapped[idx]) if mapped is not None else np.zeros(0, np.uint64)
        finally:
            del mapped                   # unmapped: its pages leave this process's resident memory
        self.max_chunk_bytes = max(self.max_chunk_bytes, values.nbytes)
        return _intersections(values, local, np.searchsorted(docs, ia), np.searchsorted(docs, ib))

    def close(self) -> None:
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
