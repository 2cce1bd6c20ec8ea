"""Settings of exact deduplication; the near-duplicate settings are in ``pipeline/dedup/minhash/config.py``."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.configkit import _f


@dataclass
class DedupConfig:
    exact: bool = _f(True, desc="Remove exact duplicates (hash of normalized text) across the whole corpus.")
    exact_partitions: int = _f(0, desc="Hash partitions of exact dedup; each is one mapped task holding 1/n of the "
                               "corpus' hashes (about 130 bytes per document). 0: sized from the plan so that one "
                               "holds at most 256 MB.", ge=0, le=1024)
