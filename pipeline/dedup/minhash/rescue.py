"""Second chance for a bucket whose anchor was a false candidate (part of stage 3).

Stage 2 emits each bucket as a *star*: (anchor = smallest gid, member).  When the exact check rejects an
anchor–member pair, the anchor may simply be the odd one out while the other members are true duplicates of one
another; with star edges alone they would never be joined.  :func:`member_pairs` finds, band by band, every
bucket with at least one rejected anchor–member pair and returns the pairs among its other members to check:
all of them for buckets up to ``PAIRWISE_MAX`` members, else a new star around the smallest rejected member
(linear, as stage 2 is, for the huge buckets boilerplate creates).

Cost: one more read of every band file, row group by row group (2^20 edges, 16 MB), and only when some pair was
rejected; memory holds one row group plus the edges of buckets with a rejected anchor (16 bytes each).
"""

from __future__ import annotations

from itertools import combinations
from pathlib import Path

import numpy as np

from pipeline.dedup.minhash.layout import band_path
from pipeline.dedup.minhash.verify import is_index

#: buckets with at most this many members (anchor excluded) get every member pair checked
PAIRWISE_MAX = 64


def member_pairs(rdir: Path, bands: int, failed_a: np.ndarray, failed_b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct (a < b) gid pairs among the members of buckets with a rejected anchor–member pair."""
    import pyarrow.parquet as pq

    if not len(failed_a):
        return np.zeros(0, np.uint64), np.zeros(0, np.uint64)
    failed = set(zip(failed_a.tolist(), failed_b.tolist(), strict=True))
    anchors = np.unique(failed_a)
    out: set[tuple[int, int]] = set()
    for band in range(bands):
        pf = pq.ParquetFile(band_path(rdir, band))
        kept_a, kept_b = [np.zeros(0, np.uint64)], [np.zeros(0, np.uint64)]
        for g in range(pf.num_row_groups):      # one row group in memory, plus the edges of rejected anchors
            t = pf.read_row_group(g, columns=["a", "b"])
            a, b = t.column("a").to_numpy(), t.column("b").to_numpy()
            sel = np.isin(a, anchors) & ~is_index(b)
            kept_a.append(a[sel])
            kept_b.append(b[sel])
        a, b = np.concatenate(kept_a), np.concatenate(kept_b)
        order = np.lexsort((b, a))
        a, b = a[order], b[order]
        if not len(a):
            continue
        starts = np.flatnonzero(np.r_[True, a[1:] != a[:-1]])
        for lo, hi in zip(starts, np.r_[starts[1:], len(a)], strict=True):
            anchor, members = int(a[lo]), b[lo:hi].tolist()
            bad = [m for m in members if (anchor, m) in failed]
            if not bad or len(members) < 2:
                continue
            if len(members) <= PAIRWISE_MAX:
                out.update(combinations(members, 2))          # members are sorted: x < y
            else:
                out.update((min(bad[0], m), max(bad[0], m)) for m in members if m != bad[0])
    pairs = np.array(sorted(out), np.uint64).reshape(-1, 2)
    return pairs[:, 0].copy(), pairs[:, 1].copy()
