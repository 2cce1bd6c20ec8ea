"""``make ablation``: the ablation DAG's steps (``mindloom ablation``: ``pipeline.tasks.ablation.run_all``, the same
task functions) over ``configs/ablation.yaml`` at the shape this machine affords, timed, with its report kept as
``benchmarks/results/ablation.json``: the one copy of its figures, which results.json names and from which the
README's table and BENCHMARKS.md are rendered (:func:`metrics`, :func:`markdown`).

    .venv/bin/python benchmarks/ablation.py [--config configs/ablation.yaml] [--run-id make-ablation]

A rerun with the same run id reuses every finished step (split, arm corpora, training runs, scores), so an
interrupted ``make ablation`` resumes; ``wall_s`` is then the rerun's, and ``train_s`` (summed from the runs' own
summaries) stays the training time that was spent. The library is ``pipeline/ablation/``; docs/ablation.md says
how to read the figures.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import REPO, RESULTS_DIR, PeakSampler, machine, metric  # noqa: E402

PREFIX = "shipped_minus_raw"


def _shape(cfg, root: Path) -> dict:
    """What was trained: the proxy's parameters, tokens per run and per parameter, runs, and the training time
    the runs' own summaries record."""
    summaries = [json.loads(p.read_text(encoding="utf-8")) for p in sorted(root.glob("train/*/*/summary.json"))]
    params = next((s.get("params") or s.get("parameters") for s in summaries
                   if s.get("params") or s.get("parameters")), None)
    tokens = cfg.ablation.steps * cfg.train.batch_size * cfg.pack.seq_len
    return {"preset": cfg.train.preset, "params": params, "steps": cfg.ablation.steps, "tokens_per_run": tokens,
            "tokens_per_param": round(tokens / params, 3) if params else None, "seeds": cfg.ablation.seeds,
            "runs": len(summaries), "arms": list(cfg.ablation.arms), "piece_bytes": cfg.ablation.piece_bytes,
            "train_s": round(sum(float(s.get("wall_s") or 0) for s in summaries), 1)}


def main(argv: list[str] | None = None) -> int:
    from pipeline.config import load_config
    from pipeline.tasks.ablation import run_all

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path, default=REPO / "configs" / "ablation.yaml")
    ap.add_argument("--run-id", default="make-ablation")
    args = ap.parse_args(argv)
    cfg = load_config(args.config)
    start = machine()
    t0 = time.time()
    with PeakSampler() as peak:
        out = run_all(cfg, args.run_id)
    report_path = Path(out["report"])
    result = {"command": f"benchmarks/ablation.py --config {args.config} --run-id {args.run_id}",
              "machine": start, "wall_s": round(time.time() - t0, 1), "peak_rss_mb": peak.peak_mb,
              "shape": _shape(cfg, report_path.parent),
              "split": json.loads((report_path.parent / "split.json").read_text(encoding="utf-8")),
              "report": json.loads(report_path.read_text(encoding="utf-8"))}
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    (RESULTS_DIR / "ablation.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(markdown(result))
    return 0


def _diff_row(name: str, iv: dict, compared: str, note: str, headline: bool = False) -> dict:
    m = metric("ablation", name, "bits/byte", [iv["mean"]], compared=compared, issue=51, headline=headline,
               note=note + ("" if iv["lo"] is None else f"; 95 % interval [{iv['lo']:+.4f}, {iv['hi']:+.4f}]"))
    m.update(lo=iv["lo"], hi=iv["hi"], seeds=iv["seeds"])
    return m


def metrics(res: dict) -> list[dict]:
    """results.json rows: per scope the shipped arm's difference against the baseline, the control's, the floor."""
    rep = res.get("report")
    if not rep:
        return []
    shape = res["shape"]
    base = rep["baseline"]
    compared = f"{base}, {shape['tokens_per_run']:,} tokens per run, {shape['seeds']} seeds"
    out = []
    for arm, rows in rep["differences"].items():
        for scope, iv in rows.items():
            out.append(_diff_row(f"{arm}_minus_{base}_{scope}", iv, compared,
                                 f"bits per byte on the {scope} references, {arm} minus {base}: negative = {arm} "
                                 f"is better; verdict {iv['verdict']}", headline=scope == rep["primary"]))
    if rep.get("control"):
        out.append(_diff_row("control_effect", rep["control"], compared,
                             "the chain on the junk-planted corpus minus no chain: "
                             + ("detected" if rep["control_detected"] else "not detected"), headline=True))
    if rep.get("noise_floor") is not None:
        out.append(metric("ablation", "noise_floor", "bits/byte", [rep["noise_floor"]], compared=compared, issue=51,
                          note="the largest difference the A/A pair shows within its interval"))
    return out


def markdown(res: dict) -> str:
    """The report's own table (``pipeline.ablation.report.markdown``) under a line saying what was trained."""
    from pipeline.ablation.report import markdown as report_markdown

    if not res.get("report"):
        return "No `make ablation` results yet.\n"
    s = res["shape"]
    size = f"{s['params'] / 1e6:.2f} M" if s.get("params") else "?"
    head = (f"`make ablation` on this machine ({res['machine'].get('cores', '?')} cores): the `{s['preset']}` "
            f"proxy ({size} parameters), {s['steps']} steps, {s['tokens_per_run']:,} tokens per run "
            f"({s['tokens_per_param']} tokens per parameter), {s['seeds']} seeds, {s['runs']} training runs, "
            f"{res['wall_s'] / 60:.0f} min.\n\n")
    return head + report_markdown(res["report"]).split("\n", 2)[2]


if __name__ == "__main__":
    sys.exit(main())
