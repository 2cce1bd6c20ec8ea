"""Helpers of stage 3's similarity check (:mod:`pipeline.dedup.minhash.clusters.check`): set intersections and
which node ids belong to an earlier release.

Shingle sets are the sorted distinct 64-bit hashes of a document's shingles (a fast non-cryptographic hash; SHA-1
is only needed where datasketch compatibility is), so a spurious collision between two distinct shingles has
probability ~|A|·|B|/2^64: the similarity is exact for any practical purpose.
"""

from __future__ import annotations

import numpy as np

from pipeline.dedup.minhash.layout import INDEX_BIT


def intersections(values: np.ndarray, offs: np.ndarray, ia: np.ndarray, ib: np.ndarray) -> np.ndarray:
    try:
        import pipeline.dedup.minhash.kernels as kernels
    except ImportError:          # numba missing: numpy per pair (slower, same result)
        out = np.empty(len(ia), np.int64)
        for i, (x, y) in enumerate(zip(ia, ib, strict=True)):
            out[i] = len(np.intersect1d(values[offs[x]:offs[x + 1]], values[offs[y]:offs[y + 1]],
                                        assume_unique=True))
        return out
    return kernels.intersections(values, offs, ia.astype(np.int64), ib.astype(np.int64))


def is_index(nodes: np.ndarray) -> np.ndarray:
    return (nodes.astype(np.uint64) & INDEX_BIT) != 0
