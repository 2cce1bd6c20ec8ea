"""Quality scores computed before the quality stage, kept so that stage decides from them instead of scoring again.

MinHash stage 1 scores every document with its domain's chain to choose cluster survivors
(:mod:`pipeline.dedup.minhash.prescore`); the quality stage then scored the same text with the same chain a second
time, paying the scoring CPU twice.  Stage 1 now writes every row it scored to a *prescores*
table (doc_id, domain, the row as JSON, which keeps each score's type: an int stays an int in a drop's detail
text; the chains' scoring signatures and the quality settings' digest in the schema metadata), and the quality
stage takes a document's row from it, as ``reuse_scores`` does with its own stored scores: decisions from the row,
text changes replayed by :meth:`Chain.transform`.  The output is byte-identical to scoring again (the chain's
scores are deterministic).

A prescores table is only used when it was made with the same quality settings (digest) and every chain's
scoring signature matches; otherwise, or for a document it lacks (one the chain could not score), the quality
stage scores as before.  It never decides anything on its own.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

DIGEST_KEY = b"mindloom.quality.settings_digest"


def quality_digest(quality: Any) -> str:
    """sha256 of the quality config (empty when none).  ``workers`` is left out: how many processes score the
    documents does not change a verdict; so is ``decontamination``: it changes no score (the quality stage checks
    every document against the index itself); nor ``classifier``: the quality stage scores with it itself."""
    if quality is None:
        return ""
    settings = {k: v for k, v in dataclasses.asdict(quality).items()
                if k not in ("workers", "decontamination", "classifier")}
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()


def _plain(value: Any) -> Any:
    """A numpy scalar as the Python number it holds (for JSON)."""
    return value.item() if hasattr(value, "item") else str(value)


def write_prescores(path: Path, quality: Any, chains: dict[str, Any], doc_ids: list[str], domains: list[str],
                    rows: list[dict | None]) -> None:
    """Write the rows stage 1 scored (None: not scored) with the chains' signatures and the settings digest.
    A row of ~50 scores is about 1.5 KB of JSON; on disk Parquet compresses it to a small fraction of that."""
    import pyarrow as pa

    from pipeline.io import write_parquet
    from pipeline.quality.filters.chain import SIGNATURE_KEY

    table = pa.table({"doc_id": pa.array(doc_ids, pa.string()), "domain": pa.array(domains, pa.string()),
                      "row": pa.array([None if r is None else json.dumps(r, default=_plain) for r in rows],
                                      pa.string())})
    signatures = {d: c.signature() for d, c in chains.items()}
    write_parquet(table.replace_schema_metadata({SIGNATURE_KEY: json.dumps(signatures, sort_keys=True),
                                                 DIGEST_KEY: quality_digest(quality)}), path)


def read_prescores(path: Path | None, quality: Any, chains: dict[str, Any], doc_ids: list[str],
                   domains: list[str]) -> list[dict | None]:
    """Per input document, its stored score row (score columns of its chain) or None when it must be scored.

    All None when there is no table, or it was made with other quality settings or another scoring signature.
    """
    from pipeline.io import read_parquet
    from pipeline.quality.filters.chain import QualityError, check_signature, signatures_of

    none: list[dict | None] = [None] * len(doc_ids)
    if path is None or not Path(path).exists():
        return none
    table = read_parquet(path)
    meta = table.schema.metadata or {}
    if meta.get(DIGEST_KEY, b"").decode() != quality_digest(quality):
        log.info("%s: made with other quality settings; scoring every document", path)
        return none
    try:
        signatures = signatures_of(table)
        for domain, chain in chains.items():
            check_signature(chain, signatures.get(domain, []))
    except QualityError as exc:
        log.info("%s: %s; scoring every document", path, exc)
        return none
    ids = table.column("doc_id").to_pylist()
    if len(set(ids)) != len(ids):
        log.info("%s: repeated doc ids; scoring every document", path)
        return none
    at = {doc_id: i for i, doc_id in enumerate(ids)}
    stored = table.column("row").to_pylist()
    stored_domains = table.column("domain").to_pylist()
    wanted = {d: {c for c, _ in ch.columns()} for d, ch in chains.items()}
    out: list[dict | None] = []
    for doc_id, domain in zip(doc_ids, domains, strict=True):
        i = at.get(doc_id)
        row = None
        if i is not None and stored[i] is not None and stored_domains[i] == domain and domain in wanted:
            row = json.loads(stored[i])
            if not wanted[domain] <= row.keys():
                row = None
        out.append(row)
    return out
