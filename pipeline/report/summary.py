"""A plain-text summary of the latest corpus and training run: what ``make demo`` prints at the end."""

from __future__ import annotations

from pathlib import Path

from pipeline.io import read_json

STAGES = ("ingest", "exact_dedup", "minhash", "quality", "tokenize", "mixture", "overlaps_heldout")


def _latest_report(data_root: Path) -> Path | None:
    reports = sorted((data_root / "train").glob("*/report.json"), key=lambda p: p.stat().st_mtime)
    return reports[-1] if reports else None


def _eval_lines(ev: dict) -> list[str]:
    per = ev.get("per_domain") or {}
    if not per:
        return [f"    held-out eval: {ev.get('skipped', 'none')}"] if ev else []
    cells = ", ".join(f"{d} {v['loss']:.3f} (ppl {v['ppl']:.0f})" for d, v in sorted(per.items()))
    return [f"    held-out loss per domain: {cells}"]


def render_summary(data_root: str | Path) -> str:
    data_root = Path(data_root)
    latest = data_root / "corpus" / "LATEST.json"
    if not latest.exists():
        return f"no corpus published under {data_root} yet"
    corpus = read_json(latest)
    full = read_json(Path(corpus["run_dir"]) / "corpus_summary.json")
    stats = full["stats"]
    lines = [f"corpus run  {corpus['run_dir']}", "", "documents per stage and domain (in -> kept, removed by reason)"]
    domains = sorted({d for st in stats.values() for d in st})
    for stage in STAGES:
        for dom in domains:
            s = stats.get(stage, {}).get(dom)
            if not s:
                continue
            removed = ", ".join(f"{k} {v}" for k, v in sorted(s["removed"].items())) or "-"
            lines.append(f"  {stage:<16} {dom:<13} {s['in_docs']:>6} -> {s['kept_docs']:<6} {removed}")
    for e in full.get("empty_sources") or []:
        lines.append(f"  empty source {e['source']} ({e['domain']}, allow_empty): {e['detail']}")
    lines += ["", "tokens per domain in the MindRecord rows"]
    total = max(corpus["tokens"], 1)
    for dom, n in sorted(corpus["tokens_per_domain"].items()):
        lines.append(f"  {dom:<13} {n:>10,}  {100 * n / total:5.1f} %")
    lines += ["", f"MindRecord  {corpus['shards']} shards, {corpus['samples']:,} rows of {corpus['seq_len'] + 1} "
                  f"tokens, vocab {corpus['vocab_size']}", f"  {corpus['mindrecord_dir']}"]
    report_path = _latest_report(data_root)
    if report_path is None:
        lines.append("\nno training run yet")
        return "\n".join(lines)
    report = read_json(report_path)
    lines += ["", f"training run {report['run_id']}"]
    order = report.get("stage_order") or list(report["stages"])
    for name in order:
        s = report["stages"][name]
        lines += [f"  stage {name}: {s.get('state')}, {s.get('steps')} steps"
                  + (f" (resumed from step {s['resumed_from']})" if s.get("resumed_from") else ""),
                  f"    loss {s.get('first_loss'):.4f} -> {s.get('final_loss'):.4f} (min {s.get('min_loss'):.4f}), "
                  f"{s.get('tokens_per_s', 0):,.0f} tokens/s, {s.get('params', 0):,} parameters, "
                  f"{s.get('mode')} mode, attention {s.get('attention_impl')}",
                  f"    checkpoint {s.get('checkpoint')}",
                  *_eval_lines(s.get("eval") or {}),
                  f"    metrics    {Path(s.get('checkpoint', '')).parent.parent / 'metrics.jsonl'}"]
    lines.append(f"  report       {report_path}")
    return "\n".join(lines)
