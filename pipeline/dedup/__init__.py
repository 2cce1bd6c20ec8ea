"""Deduplication: ``exact`` (hash of normalized text, across the corpus), then ``minhash/`` (near duplicates).

``config`` holds ``DedupConfig``; the near-duplicate settings live beside their stage in ``minhash/config.py``.
"""
