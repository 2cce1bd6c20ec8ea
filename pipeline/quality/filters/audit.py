"""Evidence of what quality filtering removed: a bounded sample per reason, counts, and the run report.

Layout under the run folder::

    removed/quality/<reason>/<shard>.parquet   at most ``audit_samples`` removed documents of that reason
    removed/quality/<shard>.counts.json        every reason of the shard: docs, bytes, chars, est. tokens, sampled

The sample is the documents with the smallest BLAKE2b(doc_id): uniform over the shard, and the same on every rerun.
:func:`quality_report` sums the stats of all shards per domain and reason and picks example snippets from the
samples; :func:`render_quality_report` prints it for the run summary.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from pipeline.io import read_json, read_parquet, write_json, write_parquet

REMOVED_DIR = ("removed", "quality")


def _rank(doc_id: str) -> bytes:
    return hashlib.blake2b(doc_id.encode("utf-8"), digest_size=8).digest()


def write_removed(rdir: Path, shard: str, removed: list[dict], counts: dict[str, dict], samples: int,
                  max_chars: int) -> None:
    """Write the per-reason samples and the counts of one shard (stale reason files of the shard are deleted)."""
    import pyarrow as pa

    base = rdir.joinpath(*REMOVED_DIR)
    by_reason: dict[str, list[dict]] = {}
    for row in removed:
        by_reason.setdefault(row["reason"], []).append(row)
    for stale in base.glob(f"*/{shard}.parquet"):
        if stale.parent.name not in by_reason:
            stale.unlink()
    sampled: dict[str, int] = {}
    for reason, rows in sorted(by_reason.items()):
        pick = sorted(rows, key=lambda r: _rank(r["doc_id"]))[:samples]
        sampled[reason] = len(pick)
        path = base / reason / f"{shard}.parquet"
        if not pick:
            path.unlink(missing_ok=True)
            continue
        out = [{**r, "truncated": len(r["text"]) > max_chars, "text": r["text"][:max_chars]} for r in pick]
        write_parquet(pa.Table.from_pylist(out), path)
    write_json(base / f"{shard}.counts.json",
               {reason: {**c, "sampled": sampled.get(reason, 0)} for reason, c in sorted(counts.items())})


def quality_stats(rdir: str | Path) -> list[dict]:
    """The quality stage's stats, one per shard, in shard order."""
    return [read_json(f) for f in sorted((Path(rdir) / "stats" / "quality").glob("*.json"))]


def quality_report(rdir: str | Path, examples: int = 3, snippet_chars: int = 160) -> dict:
    """Per domain: documents/chars/est. tokens in and kept, and per removal reason the same plus example snippets;
    with the quality classifier, ``classifier_cut``: the documents it scored, those its cut kept and their share,
    over the whole run (:func:`pipeline.quality.classifier.measured_cut`).

    ``{domain: {"in_docs", "kept_docs", "in_chars", "kept_chars", "in_tokens", "kept_tokens", "chains",
    "warnings", "pii", "rules": {reason: {"docs", "chars", "tokens", "docs_pct", "tokens_pct", "examples"}},
    ["classifier_cut": {"scored", "kept", "share", "rule", "cut", "cut_from"}]}}``
    """
    from pipeline.quality.classifier import measured_cut

    rdir = Path(rdir)
    report: dict[str, dict] = {}
    stats = quality_stats(rdir)
    for s in stats:
        d = report.setdefault(s["domain"], {"in_docs": 0, "kept_docs": 0, "in_chars": 0, "kept_chars": 0,
                                            "in_tokens": 0, "kept_tokens": 0, "chains": {}, "warnings": [],
                                            "pii": {}, "rules": {}})
        for k in ("in_docs", "kept_docs", "in_chars", "kept_chars"):
            d[k] += s.get(k, 0)
        d["in_tokens"] += s.get("in_tokens_est", 0)
        d["kept_tokens"] += s.get("kept_tokens_est", 0)
        d["chains"].update(s.get("chains", {}))
        d["warnings"] += [w for w in s.get("warnings", []) if w not in d["warnings"]]
        for k, v in s.get("pii", {}).items():
            d["pii"][k] = d["pii"].get(k, 0) + v
        for reason, c in s["removed"].items():
            r = d["rules"].setdefault(reason, {"docs": 0, "chars": 0, "tokens": 0, "examples": []})
            r["docs"] += c["docs"]
            r["chars"] += c.get("chars", 0)
            r["tokens"] += c.get("tokens", 0)
    for domain, c in measured_cut(stats).items():
        if domain in report:
            report[domain]["classifier_cut"] = c
    samples = _examples(rdir, examples, snippet_chars)
    for domain, d in report.items():
        for reason, r in d["rules"].items():
            r["docs_pct"] = round(100 * r["docs"] / d["in_docs"], 2) if d["in_docs"] else 0.0
            r["tokens_pct"] = round(100 * r["tokens"] / d["in_tokens"], 2) if d["in_tokens"] else 0.0
            r["examples"] = samples.get((domain, reason), [])
    return report


def _examples(rdir: Path, k: int, snippet_chars: int) -> dict[tuple[str, str], list[dict]]:
    rows: dict[tuple[str, str], list[dict]] = {}
    for f in sorted(rdir.joinpath(*REMOVED_DIR).glob("*/*.parquet")):
        for r in read_parquet(f, columns=["doc_id", "domain", "reason", "detail", "text"]).to_pylist():
            rows.setdefault((r["domain"], r["reason"]), []).append(r)
    from pipeline.quality.filters.pii import PiiMasker

    masker = PiiMasker()            # removed documents were never masked; their snippets go into reports
    out = {}
    for key, rs in rows.items():
        pick = sorted(rs, key=lambda r: _rank(r["doc_id"]))[:k]
        out[key] = [{"doc_id": r["doc_id"], "detail": r["detail"],
                     "snippet": masker.mask(" ".join(r["text"][:snippet_chars].split()))[0]} for r in pick]
    return out


def render_quality_report(report: dict[str, Any], examples: int = 1) -> str:
    """Plain-text table: per domain and rule, documents and est. tokens removed, with example snippets."""
    lines = ["quality filtering: removed per domain and rule (docs, est. tokens, share of the domain's input)"]
    for domain, d in sorted(report.items()):
        chain = " -> ".join(next(iter(d["chains"].values()), [])) or "-"
        lines.append(f"  {domain}: {d['in_docs']} docs in, {d['kept_docs']} kept; "
                     f"{d['in_tokens']:,} -> {d['kept_tokens']:,} est. tokens; chain {chain}")
        for w in d["warnings"]:
            lines.append(f"    WARNING {w}")
        if d["pii"]:
            lines.append("    pii masked: " + ", ".join(f"{k} {v}" for k, v in sorted(d["pii"].items())))
        if c := d.get("classifier_cut"):
            lines.append(f"    classifier cut ({c['rule']}, from {c['cut_from']}): kept {c['kept']} of {c['scored']} "
                         f"scored ({100 * c['share']:.1f} %)")
        for reason, r in sorted(d["rules"].items(), key=lambda kv: -kv[1]["docs"]):
            lines.append(f"    {reason:<34} {r['docs']:>6} docs {r['docs_pct']:5.1f} %  {r['tokens']:>10,} tokens "
                         f"{r['tokens_pct']:5.1f} %")
            for ex in r["examples"][:examples]:
                lines.append(f"      e.g. {ex['doc_id']} ({ex['detail']}): {ex['snippet'][:100]!r}")
    return "\n".join(lines)
