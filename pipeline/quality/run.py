"""Quality stage: one call per shard runs the shard's domain chain, keeps the scores, and audits the removals.

Inputs and outputs of :func:`run_quality_shard` (``<rdir>`` is the run folder)::

    <rdir>/<input_stage>/<shard>.parquet        read (default stage exact_dedup; a MinHash stage may come first)
    <rdir>/quality/<shard>.parquet              kept documents, text after C4 line cleaning / PII masking,
                                                plus one q_<filter>_<score> column per score
    <rdir>/quality/scores/<shard>.parquet       every input document's scores, reason and detail, and the
                                                scoring signature per domain (schema metadata)
    <rdir>/removed/quality/...                  per-reason samples and counts (pipeline/quality/filters/audit.py)
    <rdir>/stats/quality/<shard>.json           in = kept + removed by reason, plus chars, est. tokens, PII counts

``reuse_scores=True`` takes the decisions from the stored scores instead of recomputing them (after checking they
are still valid), so re-tuned thresholds are applied in a fraction of the time; the output is byte-identical to a
full recompute with the same config.  Filters, parameters and sources: ``pipeline/quality/filters/``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from pathlib import Path
from typing import Any

from pipeline.io import completed, count_removed, new_stats, read_parquet, write_marker, write_parquet, write_stats
from pipeline.quality.config import QualityConfig
from pipeline.quality.filters.audit import quality_report, render_quality_report, write_removed
from pipeline.quality.filters.basic import LANG_COLUMNS
from pipeline.quality.filters.chain import (
    SIGNATURE_KEY,
    Chain,
    QualityError,
    check_signature,
    reapply_decisions,
    signatures_of,
)
from pipeline.quality.filters.pii import PiiMasker
from pipeline.quality.filters.text import Doc, approx_tokens, cjk_char_count

log = logging.getLogger(__name__)

__all__ = ["run_quality_shard", "reapply_decisions", "quality_report", "render_quality_report", "QualityError",
           "scores_path"]


def scores_path(rdir: Path, shard: str) -> Path:
    return Path(rdir) / "quality" / "scores" / f"{shard}.parquet"


def _digest(q: QualityConfig, input_stage: str) -> str:
    blob = json.dumps({"quality": dataclasses.asdict(q), "input_stage": input_stage}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def _check_language_columns(chains: dict[str, Chain], table: Any, input_stage: str, shard: str) -> list[str]:
    """Error (or, with on_missing: keep, a warning) when a chain filters on language the input cannot tell."""
    missing = [c for c in LANG_COLUMNS if c not in table.column_names]
    warnings = []
    for domain, chain in sorted(chains.items()):
        for f in chain.filters:
            if f.name != "language" or not missing:
                continue
            msg = (f"domain {domain!r} runs the 'language' filter but {input_stage}/{shard}.parquet has no "
                   f"{'/'.join(missing)} column: language ID has not run before quality")
            if f.p.on_missing == "error":
                raise QualityError(f"quality/{shard}: {msg}; run language ID at ingest (pipeline/ingest/langid.py) or "
                                   "set the chain's overrides.language.on_missing: keep")
            warnings.append(f"{msg}; language filter NOT applied to {table.num_rows} documents (on_missing: keep)")
            log.warning("quality/%s: %s", shard, warnings[-1])
    return warnings


def _load_scores(rdir: Path, shard: str, table: Any, chains: dict[str, Chain]) -> list[dict]:
    path = scores_path(rdir, shard)
    if not path.exists():
        raise QualityError(f"quality/{shard}: reuse_scores=True but {path} does not exist; run without it first")
    stored = read_parquet(path)
    if stored.column("doc_id").to_pylist() != table.column("doc_id").to_pylist():
        raise QualityError(f"quality/{shard}: stored scores are for other documents than the input; recompute")
    signatures = signatures_of(stored)
    for domain, chain in chains.items():
        check_signature(chain, signatures.get(domain, []))
    return stored.to_pylist()


def _add(stats: dict, key: str, n: int) -> None:
    stats[key] = stats.get(key, 0) + n


def _finish_kept(q: QualityConfig, doc: Doc, original: str, chain: Chain, reused: bool, masker: PiiMasker | None,
                 stats: dict) -> str:
    """The text a kept document leaves with: C4-cleaned (unless filtering is off) and PII-masked when enabled."""
    if not q.enabled:
        doc.set_text(original)              # scoring only: documents leave unchanged
    elif reused:
        chain.transform(doc)                # scoring would have cleaned it; decisions came from stored scores
    if doc.text != original:
        _add(stats["transforms"], "c4_docs_changed", 1)
        _add(stats["transforms"], "c4_chars_removed", len(original) - len(doc.text))
    if masker and (not q.pii.domains or doc.domain in q.pii.domains):
        masked, found = masker.mask(doc.text)
        if found:
            doc.set_text(masked)
            _add(stats["pii"], "docs", 1)
            for kind, count in found.items():
                _add(stats["pii"], kind, count)
    return doc.text


def _tables(table: Any, chains: dict[str, Chain], rows: list[dict], keep: list[bool], texts: list[str]):
    """(scores of every document with the chain signatures, kept rows with new text and their score columns)."""
    import pyarrow as pa

    columns = list(dict.fromkeys(c for ch in chains.values() for c in ch.columns()))
    scores = pa.table({"doc_id": pa.array([r["doc_id"] for r in rows], pa.string()),
                       "domain": pa.array([r["domain"] for r in rows], pa.string()),
                       **{c: pa.array([r.get(c) for r in rows], pa.string() if is_str else pa.float64())
                          for c, is_str in columns},
                       "q_reason": pa.array([r["q_reason"] for r in rows], pa.string()),
                       "q_detail": pa.array([r["q_detail"] for r in rows], pa.string())})
    signatures = {d: c.signature() for d, c in chains.items()}
    scores = scores.replace_schema_metadata({SIGNATURE_KEY: json.dumps(signatures, sort_keys=True)})
    mask = pa.array(keep, pa.bool_())
    kept = table.filter(mask)
    for name, values in (("text", texts), ("n_chars", [len(t) for t in texts])):
        if name in kept.column_names:
            field = kept.schema.field(name)
            kept = kept.set_column(kept.column_names.index(name), field, pa.array(values, field.type))
    for c, _ in columns:
        kept = kept.append_column(c, scores.column(c).filter(mask))
    return scores, kept


def run_quality_shard(q: QualityConfig, rdir: Path, shard: str, input_stage: str = "exact_dedup",
                      reuse_scores: bool = False) -> dict:
    """Filter one shard with its domain's chain; returns the shard's stats (in = kept + removed by reason)."""
    rdir = Path(rdir)
    out = rdir / "quality" / f"{shard}.parquet"
    digest = _digest(q, input_stage)
    if (done := completed(out)) and done.get("quality_sha256") == digest:
        return done["stats"]
    src = rdir / input_stage / f"{shard}.parquet"
    if not src.exists():
        raise QualityError(f"quality/{shard}: input {src} does not exist (input_stage={input_stage!r})")
    table = read_parquet(src)
    n = table.num_rows
    domains = table.column("domain").to_pylist() if n else []
    chains = {d: Chain.build(q, d) for d in sorted(set(domains))}
    stats = new_stats(domains[0] if n else shard.rsplit("-", 1)[0])
    stats.update(in_chars=0, kept_chars=0, in_tokens_est=0, kept_tokens_est=0, enabled=q.enabled,
                 input_stage=input_stage, chains={d: c.names() for d, c in chains.items()}, transforms={}, pii={},
                 warnings=_check_language_columns(chains, table, input_stage, shard))
    stored = _load_scores(rdir, shard, table, chains) if reuse_scores else None
    log.info("quality/%s: %d documents, %s", shard, n, "decisions from stored scores" if stored else "scoring")
    masker = PiiMasker(q.pii.emails, q.pii.ips, q.pii.phones, q.pii.only_public_ips) if q.pii.enabled else None
    cols = {c: table.column(c).to_pylist() if c in table.column_names else [None] * n
            for c in ("doc_id", "text", "source", "meta", *LANG_COLUMNS)}
    present = [c for c in LANG_COLUMNS if c in table.column_names]

    rows, keep, texts, removed = [], [], [], []
    for i in range(n):
        text, domain, chain = cols["text"][i], domains[i], chains[domains[i]]
        doc = Doc(text, cols["doc_id"][i], domain, cols["meta"][i], {c: cols[c][i] for c in present})
        nbytes, nchars, ntok = len(text.encode("utf-8")), len(text), approx_tokens(len(text), cjk_char_count(text), 4)
        for key, v in (("in_docs", 1), ("in_bytes", nbytes), ("in_chars", nchars), ("in_tokens_est", ntok)):
            _add(stats, key, v)
        try:
            row = stored[i] if stored is not None else chain.score(doc)
        except Exception as exc:            # a filter bug must name the document, not just crash the shard
            raise QualityError(f"quality/{shard}: scoring document {doc.doc_id} (row {i}) with chain "
                               f"{chain.names()} failed: {type(exc).__name__}: {exc}") from exc
        drop = chain.decide(row) if q.enabled else None
        rows.append({**row, "doc_id": doc.doc_id, "domain": domain, "q_reason": drop[0] if drop else "",
                     "q_detail": drop[1] if drop else ""})
        keep.append(drop is None)
        if drop:
            count_removed(stats, drop[0], nbytes)
            _add(stats["removed"][drop[0]], "chars", nchars)
            _add(stats["removed"][drop[0]], "tokens", ntok)
            removed.append({"doc_id": doc.doc_id, "domain": domain, "source": cols["source"][i] or "",
                            "reason": drop[0], "detail": drop[1], "n_chars": nchars, "n_tokens_est": ntok,
                            "text": text})
            continue
        texts.append(_finish_kept(q, doc, text, chain, stored is not None, masker, stats))
        for key, v in (("kept_docs", 1), ("kept_bytes", nbytes), ("kept_chars", len(texts[-1])),
                       ("kept_tokens_est", approx_tokens(len(texts[-1]), cjk_char_count(texts[-1]), 4))):
            _add(stats, key, v)

    scores, kept = _tables(table, chains, rows, keep, texts)
    write_parquet(scores, scores_path(rdir, shard))
    write_removed(rdir, shard, removed, stats["removed"], q.audit_samples, q.audit_max_chars)
    write_parquet(kept, out)
    stats = write_stats(rdir, "quality", shard, stats)
    write_marker(out, {"stats": stats, "quality_sha256": digest})
    return stats
