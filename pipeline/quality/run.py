"""Quality stage: one call per shard runs the shard's domain chain, keeps the scores, and audits the removals.

Inputs and outputs of :func:`run_quality_shard` (``<rdir>`` is the run folder)::

    <rdir>/<input_stage>/<shard>.parquet        read (default stage exact_dedup; a MinHash stage may come first)
    <rdir>/quality/<shard>.parquet              kept documents, text after C4 line cleaning / PII masking,
                                                plus one q_<filter>_<score> column per score
    <rdir>/quality/scores/<shard>.parquet       every input document's scores, reason and detail, and the
                                                scoring signature per domain (schema metadata)
    <rdir>/removed/quality/...                  per-reason samples and counts (pipeline/quality/filters/audit.py)
    <rdir>/stats/quality/<shard>.json           in = kept + removed by reason, plus chars, est. tokens, PII counts

Documents are scored in a pool of ``quality.workers`` processes (0: every core; a shard with under 2 MB of text
left to score or rewrite, which is most shards once MinHash stage 1 has scored them, stays in the task's own
process) in batches; results are consumed in document order and every count is added in the main
process, so the output is byte-identical whatever the pool size.  The worker count is not part of the stage's
completion digest.

``reuse_scores=True`` takes the decisions from the stored scores instead of recomputing them (after checking they
are still valid), so re-tuned thresholds are applied in a fraction of the time; the output is byte-identical to a
full recompute with the same config.  ``prescored`` (the chain passes ``minhash/prescores/<shard>.parquet``) does
the same with the rows MinHash stage 1 scored for its survivors (:mod:`pipeline.quality.prescored`), when they were
made with these settings; the documents it lacks are scored here.  ``prescored_docs`` in the stats counts them.
Filters, parameters and sources: ``pipeline/quality/filters/``.

With the quality classifier on (:mod:`pipeline.quality.classifier`), every document of the shard is scored here by
its domain's model set, with the model of its fold, after the train step made the models and the cuts; the stats'
``classifier.cut_counts`` count per domain the documents scored and those the cut keeps (the quality report sums
them over the run).

Memory: one shard at a time: its input table (text included, about the shard's text bytes), the kept rows and
scores being built (about as much again), and per pool worker one batch of documents.  So about 2-3x the text of
one shard (``ingest.shard_bytes``, 64 MiB by default) plus the workers' batches: set by the shard size, not the
corpus.  The classifier adds one model set per process (``folds`` models of about 4 x ``dim`` x ``buckets`` bytes
plus the vocabulary: about 2 x 17 MB at the defaults).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pipeline.ingest.run import worker_count
from pipeline.io import (
    completed,
    config_digest,
    count_removed,
    new_stats,
    read_parquet,
    recorded_sha256,
    settings,
    write_marker,
    write_parquet,
    write_stats,
)
from pipeline.quality import classifier, decontaminate
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
from pipeline.quality.prescored import read_prescores

log = logging.getLogger(__name__)

#: shards with less text to work on than this are handled in the task's own process (:func:`_work_bytes`)
PARALLEL_MIN_BYTES = 2 << 20
BATCH_DOCS = 64
BATCH_BYTES = 4 << 20

__all__ = ["run_quality_shard", "reapply_decisions", "quality_report", "render_quality_report", "QualityError",
           "scores_path"]


def scores_path(rdir: Path, shard: str) -> Path:
    return Path(rdir) / "quality" / "scores" / f"{shard}.parquet"


def _digest(q: QualityConfig, input_stage: str, input_sha256: str, decont: dict | None = None,
            clf: dict | None = None) -> str:
    """The marker's config digest: the settings (not ``workers``: how many processes score changes nothing they
    write), the input stage and the sha256 the input's marker recorded (a rewritten input redoes the shard); with
    decontamination on, the digest of its index (eval files and settings), else nothing of it; the same for the
    classifier (its manifest's digest: model, cuts, settings)."""
    parts = ("quality", settings(q, "workers", "decontamination", "classifier"), input_stage, input_sha256)
    extra = (*(("decontamination", decont["digest"]) if decont else ()),
             *(("classifier", clf["digest"]) if clf else ()))
    return config_digest(*parts, *extra)


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


def _utf8_lengths(column: Any) -> list[int]:
    """UTF-8 byte length of every text of a string column, without encoding each text again in Python."""
    import pyarrow.compute as pc

    return pc.binary_length(column).to_pylist()


def _work_bytes(q: QualityConfig, chains: dict[str, Chain], domains: list[str], stored: list, nbytes: list[int],
                decont: Any) -> int:
    """Bytes of text that still need per-document work here, which decides whether a pool pays off: documents
    without stored scores, plus those a text-changing filter (C4 line cleaning) still rewrites; every document
    when PII masking or decontamination reads them all.  MinHash stage 1 scores nearly every document, so most
    shards are decided from their scores, and shipping their text to pool workers and back cost more than it saved.
    """
    if decont or q.pii.enabled or q.classifier.enabled:         # the classifier scores every document
        return sum(nbytes)
    rewrite = {d for d, c in chains.items() if any(f.modifies_text for f in c.filters)} if q.enabled else set()
    return sum(b for b, s, d in zip(nbytes, stored, domains, strict=True) if s is None or d in rewrite)


def _add(stats: dict, key: str, n: int) -> None:
    stats[key] = stats.get(key, 0) + n


def _finish_kept(q: QualityConfig, doc: Doc, original: str, chain: Chain, reused: bool, masker: PiiMasker | None,
                 counts: list) -> str:
    """The text a kept document leaves with: C4-cleaned (unless filtering is off) and PII-masked when enabled.

    What it did is appended to ``counts`` as (stats section, key, amount), added to the stats in document order.
    """
    if not q.enabled:
        doc.set_text(original)              # scoring only: documents leave unchanged
    elif reused:
        chain.transform(doc)                # scoring would have cleaned it; decisions came from stored scores
    if doc.text != original:
        counts.append(("transforms", "c4_docs_changed", 1))
        counts.append(("transforms", "c4_chars_removed", len(original) - len(doc.text)))
    if masker and (not q.pii.domains or doc.domain in q.pii.domains):
        masked, found = masker.mask(doc.text)
        if found:
            doc.set_text(masked)
            counts.append(("pii", "docs", 1))
            counts.extend(("pii", kind, count) for kind, count in found.items())
    return doc.text


# --------------------------------------------------------------------------------------------------------------
# Per-document work (worker processes, or the task's own process)

_WORKER: dict = {}


def _init_worker(q: QualityConfig, decont_dir: str | None = None, clf_dir: str | None = None) -> None:
    """A worker's state: the settings, never the shard, so the shards of a batch task share one pool (with the shard
    in its arguments every shard started a pool of its own that lived until the task ended, so a batch task held
    idle workers for every shard it had done)."""
    masker = PiiMasker(q.pii.emails, q.pii.ips, q.pii.phones, q.pii.only_public_ips) if q.pii.enabled else None
    old = _WORKER.get("clf")
    _WORKER.clear()
    decont = decontaminate.Decontaminator(decont_dir, q.decontamination.n) if decont_dir else None
    clf = classifier.Decider(clf_dir) if clf_dir else None
    if clf and old and old.dir == clf.dir and old.manifest["digest"] == clf.manifest["digest"]:
        clf = old                   # the task's next shard in its own process: the loaded model set stays
    _WORKER.update(q=q, masker=masker, chains={}, decont=decont, clf=clf)


def _score_one(i: int, text: str, doc_id: str, domain: str, meta: Any, columns: dict, stored: dict | None) -> tuple:
    """(score row, drop or None, est. tokens in, final text or None when dropped, est. tokens kept, stats counts);
    with the classifier on, the row has the document's ``q_classifier_score`` (its domain's model of its fold)."""
    w = _WORKER
    q, chains = w["q"], w["chains"]
    chain = chains.get(domain) or chains.setdefault(domain, Chain.build(q, domain))
    doc = Doc(text, doc_id, domain, meta, columns)
    ntok = approx_tokens(len(text), doc.n_cjk, 4)
    try:
        row = stored if stored is not None else chain.score(doc)
    except Exception as exc:            # a filter bug must name the document, not just crash the shard
        raise QualityError(f"quality: scoring document {doc_id} of domain {domain} (row {i}) with chain "
                           f"{chain.names()} failed: {type(exc).__name__}: {exc}") from exc
    drop = chain.decide(row) if q.enabled else None
    if w["clf"]:                                                    # the last rule of every chain
        row, drop = w["clf"].apply(row, text, domain, doc_id, drop, q.enabled)
    if w["decont"] and (hit := w["decont"].first_hit(text)):       # eval text outranks every other reason
        row, drop = {**row, **hit}, decontaminate.drop_of(hit)
    if drop:
        return row, drop, ntok, None, 0, ()
    counts: list = []
    final = _finish_kept(q, doc, text, chain, stored is not None, w["masker"], counts)
    kept_tok = ntok if final == text else approx_tokens(len(final), cjk_char_count(final), 4)
    return row, None, ntok, final, kept_tok, counts


def _score_batch(items: list[tuple]) -> list[tuple]:
    return [_score_one(*item) for item in items]


def _batches(items: Iterator[tuple], sizes: list[int]) -> Iterator[list[tuple]]:
    batch, size = [], 0
    for item in items:
        batch.append(item)
        size += sizes[item[0]]
        if len(batch) >= BATCH_DOCS or size >= BATCH_BYTES:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def _results(items: Iterator[tuple], sizes: list[int], workers: int, init_args: tuple, shard: str) -> Iterator[tuple]:
    """:func:`_score_one` of every item, in input order, computed by ``workers`` processes."""
    if workers <= 1:
        _init_worker(*init_args)
        for item in items:
            yield _score_one(*item)
        return
    from concurrent.futures.process import BrokenProcessPool

    from pipeline.pools import ordered_map

    try:
        for done in ordered_map(_score_batch, _batches(items, sizes), workers, "pipeline.quality.run",
                                _init_worker, init_args):
            yield from done
    except BrokenProcessPool as exc:
        raise QualityError(f"quality/{shard}: a worker process died ({exc}); rerun with "
                           "quality.workers: 1 to see which document kills it") from None


def _tables(table: Any, chains: dict[str, Chain], rows: list[dict], keep: list[bool], texts: list[str],
            clf: dict | None = None):
    """(scores of every document with the chain signatures, kept rows with new text and their score columns)."""
    import pyarrow as pa

    columns = list(dict.fromkeys([*(c for ch in chains.values() for c in ch.columns()),
                                  *([(classifier.COLUMN, False)] if clf else [])]))
    scores = pa.table({"doc_id": pa.array([r["doc_id"] for r in rows], pa.string()),
                       "domain": pa.array([r["domain"] for r in rows], pa.string()),
                       **{c: pa.array([r.get(c) for r in rows], pa.string() if is_str else pa.float64())
                          for c, is_str in columns},
                       "q_reason": pa.array([r["q_reason"] for r in rows], pa.string()),
                       "q_detail": pa.array([r["q_detail"] for r in rows], pa.string())})
    signatures = {d: c.signature() for d, c in chains.items()}
    scores = scores.replace_schema_metadata({SIGNATURE_KEY: json.dumps(signatures, sort_keys=True),
                                             **({classifier.META_KEY: clf["digest"]} if clf else {})})
    mask = pa.array(keep, pa.bool_())
    kept = table.filter(mask)
    for name, values in (("text", texts), ("n_chars", [len(t) for t in texts])):
        if name in kept.column_names:
            field = kept.schema.field(name)
            kept = kept.set_column(kept.column_names.index(name), field, pa.array(values, field.type))
    for c, _ in columns:
        kept = kept.append_column(c, scores.column(c).filter(mask))
    return scores, kept


def _shard_stats(q: QualityConfig, table, chains: dict, domains: list, shard: str, input_stage: str,
                 decont: dict | None, clf: dict | None) -> dict:
    """The shard's stats before any document: its chains, warnings, and the index and classifier it used."""
    stats = new_stats(domains[0] if domains else shard.rsplit("-", 1)[0])
    stats.update(in_chars=0, kept_chars=0, in_tokens_est=0, kept_tokens_est=0, enabled=q.enabled,
                 input_stage=input_stage, chains={d: c.names() for d, c in chains.items()}, transforms={}, pii={},
                 warnings=_check_language_columns(chains, table, input_stage, shard))
    if decont:
        stats["decontamination"] = {k: decont[k] for k in ("items", "ngrams", "digest")} | {"n": q.decontamination.n}
    if clf:
        stats["classifier"] = {"model_sha256": clf["model"]["sha256"], "digest": clf["digest"],
                               "training": clf["training"], "cuts": {d: c["cut"] for d, c in clf["cuts"].items()},
                               "rules": {d: {k: c.get(k) for k in ("rule", "cut", "cut_from")}
                                         for d, c in clf["cuts"].items() if c["cut"] is not None},
                               "cut_counts": {}}
    return stats


def run_quality_shard(q: QualityConfig, rdir: Path, shard: str, input_stage: str = "exact_dedup",
                      reuse_scores: bool = False, prescored: Path | None = None) -> dict:
    """Filter one shard with its domain's chain; returns the shard's stats (in = kept + removed by reason)."""
    rdir = Path(rdir)
    out = rdir / "quality" / f"{shard}.parquet"
    src = rdir / input_stage / f"{shard}.parquet"
    if not src.exists():
        raise QualityError(f"quality/{shard}: input {src} does not exist (input_stage={input_stage!r})")
    decont = decontaminate.index_manifest(q.decontamination, rdir)
    clf = classifier.manifest(q.classifier, rdir)
    digest = _digest(q, input_stage, recorded_sha256(src), decont, clf)
    if done := completed(out, digest):
        return done["stats"]
    table = read_parquet(src)
    n = table.num_rows
    domains = table.column("domain").to_pylist() if n else []
    chains = {d: Chain.build(q, d) for d in sorted(set(domains))}
    stats = _shard_stats(q, table, chains, domains, shard, input_stage, decont, clf)
    if clf:
        cutter = classifier.Decider(classifier.classifier_dir(rdir))       # counts only: no model is loaded
    cols = {c: table.column(c).to_pylist() if c in table.column_names else [None] * n
            for c in ("doc_id", "text", "source", "meta", *LANG_COLUMNS)}
    stored = (_load_scores(rdir, shard, table, chains) if reuse_scores
              else read_prescores(prescored, q, chains, cols["doc_id"], domains))
    stats["prescored_docs"] = 0 if reuse_scores else sum(r is not None for r in stored)
    log.info("quality/%s: %d documents, %d decided from stored scores", shard, n,
             n if reuse_scores else stats["prescored_docs"])
    present = [c for c in LANG_COLUMNS if c in table.column_names]
    nbytes_col = _utf8_lengths(table.column("text")) if n else []
    workers = (worker_count(q.workers)
               if _work_bytes(q, chains, domains, stored, nbytes_col, decont) >= PARALLEL_MIN_BYTES else 1)
    items = ((i, cols["text"][i], cols["doc_id"][i], domains[i], cols["meta"][i], {c: cols[c][i] for c in present},
              stored[i]) for i in range(n))

    rows, keep, texts, removed = [], [], [], []
    init = (q, str(decontaminate.index_dir(rdir))) if decont else (q,)
    if clf:
        init = (q, init[1] if decont else None, str(classifier.classifier_dir(rdir)))
    results = _results(items, nbytes_col, workers, init, shard)
    for i, (row, drop, ntok, final, kept_tok, counts) in enumerate(results):
        text, domain, doc_id = cols["text"][i], domains[i], cols["doc_id"][i]
        nbytes, nchars = nbytes_col[i], len(text)
        for key, v in (("in_docs", 1), ("in_bytes", nbytes), ("in_chars", nchars), ("in_tokens_est", ntok)):
            _add(stats, key, v)
        if clf and (score := row.get(classifier.COLUMN)) is not None:     # the cut's share, whatever the chain did
            c = stats["classifier"]["cut_counts"].setdefault(domain, {"scored": 0, "kept": 0})
            c["scored"] += 1
            c["kept"] += cutter.kept_by_cut(domain, doc_id, score)
        rows.append({**row, "doc_id": doc_id, "domain": domain, "q_reason": drop[0] if drop else "",
                     "q_detail": drop[1] if drop else ""})
        keep.append(drop is None)
        if drop:
            count_removed(stats, drop[0], nbytes)
            _add(stats["removed"][drop[0]], "chars", nchars)
            _add(stats["removed"][drop[0]], "tokens", ntok)
            removed.append({"doc_id": doc_id, "domain": domain, "source": cols["source"][i] or "",
                            "reason": drop[0], "detail": drop[1], "n_chars": nchars, "n_tokens_est": ntok,
                            "text": text, **{k: row[k] for k in decontaminate.AUDIT_KEYS if k in row}})
            continue
        for section, key, v in counts:
            _add(stats[section], key, v)
        texts.append(final)
        for key, v in (("kept_docs", 1), ("kept_bytes", nbytes), ("kept_chars", len(final)),
                       ("kept_tokens_est", kept_tok)):
            _add(stats, key, v)

    scores, kept = _tables(table, chains, rows, keep, texts, clf)
    write_parquet(scores, scores_path(rdir, shard))
    write_removed(rdir, shard, removed, stats["removed"], q.audit_samples, q.audit_max_chars)
    kept_sha256 = write_parquet(kept, out)
    stats = write_stats(rdir, "quality", shard, stats)
    write_marker(out, {"stats": stats}, config=digest, sha256=kept_sha256)
    return stats
