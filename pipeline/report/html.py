"""The run report: one self-contained HTML page per run (corpus and, when present, training).

It reads only files the stages already wrote (stats, manifest, optional mixture/dedup/filter reports, the training
stages' ``metrics.jsonl`` and ``summary.json``), so it can be rebuilt at any time and never changes a result.
Sections that have no data yet are left out rather than faked.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

from pipeline.io import atomic_path, read_json
from pipeline.report.plots import bar_chart, line_chart, stage_offsets

CSS = """body{font-family:sans-serif;margin:24px;max-width:1100px;color:#222}
table{border-collapse:collapse;margin:8px 0 16px}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
th{background:#f1f1f1}td:first-child,th:first-child{text-align:left}h2{border-bottom:1px solid #ddd}
.charts svg{margin:4px 12px 12px 0}pre{background:#f7f7f7;padding:8px;overflow:auto;max-height:240px}"""


def _table(header: list[str], rows: list[list]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_cell(c))}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _cell(v) -> str:
    if isinstance(v, float):
        return f"{v:,.4g}"
    if isinstance(v, int):
        return f"{v:,}"
    return "" if v is None else str(v)


def _fixed(v, digits: int) -> str | None:
    """One format per column (``709`` and ``1,604`` tokens/s, not ``709.2`` next to ``1,604``)."""
    return None if v is None else f"{float(v):,.{digits}f}"


def _read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def corpus_section(run_dir: Path) -> str:
    summary_path = run_dir / "corpus_summary.json"
    if not summary_path.exists():
        return f"<p>corpus summary missing in {html.escape(str(run_dir))}</p>"
    summary = read_json(summary_path)
    stats = summary.get("stats", {})
    parts = [f"<h2>Corpus</h2><p>run folder <code>{html.escape(str(run_dir))}</code> · config "
             f"<code>{summary.get('config_sha256', '')[:12]}</code> · tokenizer "
             f"<code>{summary.get('tokenizer_sha256', '')[:12]}</code></p>"]
    rows, removals = [], {}
    from pipeline.report.summary import STAGES

    order = [st for st in STAGES if st in stats] + sorted(set(stats) - set(STAGES))
    for stage, per_domain in ((st, stats[st]) for st in order):
        for dom, s in sorted(per_domain.items()):
            removed = ", ".join(f"{k} {v}" for k, v in sorted(s["removed"].items()))
            rows.append([stage, dom, s["in_docs"], s["kept_docs"], s["in_docs"] - s["kept_docs"], removed])
            for reason, n in s["removed"].items():
                removals.setdefault(dom, {})[f"{stage}:{reason}"] = float(n)
    parts.append("<h3>Documents per stage and domain</h3>"
                 + _table(["stage", "domain", "in", "kept", "removed", "by reason"], rows))
    charts = [bar_chart(removals, "Documents removed per rule and domain", "documents")] if removals else []
    tokens = summary.get("tokens_per_domain", {})
    mixture = _first_json(run_dir, ("mixture/report.json", "mixture_report.json"))
    if mixture and isinstance(mixture.get("domains"), dict):
        groups = {d: {"target": float(v.get("target_share", 0)), "achieved": float(v.get("achieved_token_share", 0))}
                  for d, v in mixture["domains"].items()}
        charts.append(bar_chart(groups, "Domain mixture: target vs achieved token share", "share"))
    elif tokens:
        total = sum(tokens.values()) or 1
        charts.append(bar_chart({d: {"achieved": n / total} for d, n in tokens.items()},
                                "Domain mixture: token share in MindRecord rows", "share"))
    parts.append('<div class="charts">' + "".join(charts) + "</div>")
    parts.append("<h3>MindRecord</h3>" + _table(
        ["shards", "rows", "tokens", "seq_len", "vocab"],
        [[summary.get("shards"), summary.get("samples"), summary.get("tokens"), summary.get("seq_len"),
          summary.get("vocab_size")]]))
    parts.append(quality_section(run_dir))
    dedup = _first_json(run_dir, ("minhash/report.json", "minhash_report.json"))
    if dedup:
        from pipeline.report.dedup import near_duplicate_section

        parts.append(near_duplicate_section(dedup))
    return "".join(parts)


def quality_section(run_dir: Path) -> str:
    """Per domain and rule: documents and estimated tokens removed, with one example snippet each."""
    from pipeline.quality.filters.audit import quality_report

    if not (run_dir / "stats" / "quality").exists():
        return ""
    report = quality_report(run_dir, examples=1)
    rows, tokens = [], {}
    for dom, d in sorted(report.items()):
        for reason, r in sorted(d["rules"].items(), key=lambda kv: -kv[1]["docs"]):
            example = (r.get("examples") or [""])[0]
            example = example.get("snippet", "") if isinstance(example, dict) else str(example)
            rows.append([dom, reason, r["docs"], f"{r['docs_pct']:.1f} %", r["tokens"], example[:120]])
            tokens.setdefault(dom, {})[reason] = float(r["tokens"])
    if not rows:
        return "<h3>Quality filtering</h3><p>no document removed</p>"
    return ("<h3>Quality filtering: removed per domain and rule</h3>"
            + _table(["domain", "rule", "docs", "share of domain", "est. tokens", "example"], rows)
            + '<div class="charts">' + bar_chart(tokens, "Estimated tokens removed per rule and domain", "tokens")
            + "</div>")


def _first_json(run_dir: Path, names: tuple[str, ...]) -> dict | None:
    for n in names:
        if (run_dir / n).exists():
            return read_json(run_dir / n)
    return None


def training_section(stage_dirs: dict[str, Path]) -> str:
    parts = ["<h2>Training</h2>"]
    rows, loss_series, lr_series, evals = [], {}, {}, {}
    for name, d in stage_dirs.items():
        s = read_json(d / "summary.json") if (d / "summary.json").exists() else {}
        rows.append([name, s.get("state"), s.get("steps"), s.get("resumed_from"), _fixed(s.get("first_loss"), 4),
                     _fixed(s.get("final_loss"), 4), _fixed(s.get("tokens_per_s"), 0), s.get("params"),
                     s.get("checkpoint")])
        metrics = _read_jsonl(d / "metrics.jsonl")
        loss_series[name] = [(m["step"], m["loss"]) for m in metrics if "loss" in m]
        lr_series[name] = [(m["step"], m["lr"]) for m in metrics if "lr" in m]
        for dom, v in (s.get("eval") or {}).get("per_domain", {}).items():
            evals.setdefault(dom, {})[name] = float(v.get("loss", v) if isinstance(v, dict) else v)
    parts.append(_table(["stage", "state", "steps", "resumed from", "first loss", "final loss", "tokens/s",
                         "parameters", "checkpoint"], rows))
    # one global step axis: each stage starts where the stages before it ended (a dashed line marks it)
    offsets = stage_offsets(loss_series)
    marks = [(x, name) for name, x in offsets.items()] if len(offsets) > 1 else None
    charts = [line_chart({n: [(x + offsets.get(n, 0), y) for x, y in v] for n, v in series.items()}, title,
                         "global step (all stages)", label, marks=marks)
              for series, title, label in ((loss_series, "Training loss", "loss"),
                                           (lr_series, "Learning rate", "lr"))]
    if evals:
        charts.append(bar_chart(evals, "Held-out loss per domain", "loss", from_zero=False))
    parts.append('<div class="charts">' + "".join(charts) + "</div>")
    return "".join(parts)


def write_report(out: Path, title: str, corpus_run_dir: Path | None = None,
                 stage_dirs: dict[str, Path] | None = None) -> Path:
    body = [f"<h1>{html.escape(title)}</h1>"]
    if corpus_run_dir is not None:
        body.append(corpus_section(Path(corpus_run_dir)))
    if stage_dirs:
        body.append(training_section({k: Path(v) for k, v in stage_dirs.items()}))
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{CSS}</style></head><body>{''.join(body)}</body></html>")
    with atomic_path(out) as tmp:
        tmp.write_text(page, encoding="utf-8")
    return out
