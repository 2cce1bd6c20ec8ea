"""Settings of exact deduplication; the near-duplicate settings are in ``pipeline/dedup/minhash/config.py``."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.configkit import _f


@dataclass
class DedupConfig:
    exact: bool = _f(True, desc="Remove exact duplicates (hash of normalized text) across the whole corpus.")
    exact_partitions: int = _f(16, desc="Hash partitions of exact dedup; each is one mapped task.", ge=1, le=1024)
