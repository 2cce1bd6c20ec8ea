"""Quality verdicts before clustering, so a near-duplicate cluster keeps a document the filters will keep.

Quality filtering runs after MinHash.  If the survivor were chosen blind, a cluster could keep the one member the
filters then drop, and the whole cluster would be lost.  Stage 1 therefore scores every document with its
domain's quality chain (:class:`pipeline.quality.filters.chain.Chain`, the same code and parameters as the quality
stage; the decisions themselves stay in the quality stage) and stores two columns beside the signature:

* ``keep``: 1 when the chain would keep the document, 0 when it would drop it, -1 when unknown (no quality
  config given, or the chain could not score it, e.g. a language filter without language columns);
* ``score``: the share of the chain's filters the document passes (1.0 for every kept document), so among
  dropped members the one closest to passing ranks first.

The survivor criteria ``kept`` and ``score`` (:mod:`pipeline.dedup.minhash.survivors`) read them.  Every score row
is also kept (``minhash/prescores/<shard>.parquet``, :mod:`pipeline.quality.prescored`), so the quality stage
decides from it instead of scoring the same documents again.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

LANG_COLUMNS = ("lang", "lang_score")
#: input columns the scoring reads besides doc_id, domain and text
EXTRA_COLUMNS = ("meta", *LANG_COLUMNS)


def chain_verdicts(quality: Any, table: Any, domains: list[str]) -> tuple[np.ndarray, np.ndarray, dict, list]:
    """(keep int8, score float64, chains by domain, score row or None) per row of ``table`` (columns doc_id, text
    and, when present, meta/lang)."""
    from pipeline.quality.filters.chain import Chain
    from pipeline.quality.filters.text import Doc

    n = table.num_rows
    keep = np.full(n, -1, np.int8)
    score = np.full(n, np.nan)
    rows: list[dict | None] = [None] * n
    chains: dict[str, Any] = {}
    if quality is None or not n:
        return keep, score, {}, rows
    names = table.column_names
    texts = table.column("text").to_pylist()
    ids = table.column("doc_id").to_pylist()
    metas = table.column("meta").to_pylist() if "meta" in names else [None] * n
    langs = {c: table.column(c).to_pylist() for c in LANG_COLUMNS if c in names}
    failed: set[str] = set()
    for i in range(n):
        domain = domains[i]
        if domain not in chains:
            chains[domain] = quality.chain(domain) and Chain.build(quality, domain)
        chain = chains[domain]
        if not chain:
            continue
        doc = Doc(texts[i], ids[i], domain, metas[i], {c: v[i] for c, v in langs.items()})
        try:
            row = chain.score(doc)
            passed = [f.decide({k: row[f.column(k)] for k in f.score_names}) is None for f in chain.filters]
        except Exception as exc:  # the quality stage reports it, naming the document; here it is only unknown
            if domain not in failed:
                log.warning("minhash pre-scoring of domain %s: %s: %s (keep unknown)", domain,
                            type(exc).__name__, exc)
                failed.add(domain)
            continue
        rows[i] = row
        score[i] = sum(passed) / len(passed) if passed else 1.0
        keep[i] = 1 if all(passed) or not quality.enabled else 0
    return keep, score, {d: c for d, c in chains.items() if c}, rows
