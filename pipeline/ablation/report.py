"""The ablation's result: per arm against the baseline, the difference in bits per byte (primary number first,
then every domain), its interval, the A/A noise floor and the verdict, with each arm's token shares and epochs per
domain beside it. Written once, as ``report.json`` (every figure), ``report.md`` (the table) and ``report.svg`` (the
differences against zero and the noise floor) in the run folder.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from pipeline.ablation import plot
from pipeline.ablation.stats import (
    DocScore,
    Interval,
    bits_per_byte,
    control_detected,
    noise_floor,
    paired_difference,
    verdict,
)
from pipeline.io import read_json, write_json


def _by_arm(runs: list[dict]) -> dict[str, dict[int, list[DocScore]]]:
    """Scores per arm, keyed by seed index (the A/A arm's seeds are offset; pairs are by index)."""
    out: dict[str, dict[int, list[DocScore]]] = {}
    for run in runs:
        docs = [DocScore(d["doc"], d["source"], d["domain"], float(d["nats"]), int(d["bytes"]))
                for d in read_json(run["scores"])["docs"]]
        out.setdefault(run["arm"], {})[run["index"]] = docs
    return out


def cloze_of(runs: list[dict]) -> dict:
    """Last-word cloze accuracy per arm: pooled over its items per seed, then the mean over seeds; per domain
    likewise. Arms without items (``ablation.cloze_items: 0``, or scores written before the task) are left out."""
    per: dict[str, dict] = {}
    for run in runs:
        docs = read_json(run["scores"])["docs"]
        if not any(d.get("cloze", [0, 0])[0] for d in docs):
            continue
        arm = per.setdefault(run["arm"], {"seeds": [], "domains": {}})
        n, k = (sum(d["cloze"][i] for d in docs) for i in (0, 1))
        arm["seeds"].append(k / n)
        arm["items"] = n
        for dom in sorted({d["domain"] for d in docs}):
            n, k = (sum(d["cloze"][i] for d in docs if d["domain"] == dom) for i in (0, 1))
            if n:
                arm["domains"].setdefault(dom, []).append(k / n)
    return {arm: {"items": v["items"], "accuracy": round(float(np.mean(v["seeds"])), 4),
                  "per_seed": [round(a, 4) for a in v["seeds"]],
                  "domains": {d: round(float(np.mean(a)), 4) for d, a in v["domains"].items()}}
            for arm, v in per.items()}


def mixture_of(corpus: dict) -> dict:
    """Token share and epochs per domain of one arm's corpus (its mixture report)."""
    rep = read_json(Path(corpus["run_dir"]) / "mixture" / "report.json")
    return {d: {"share": round(v["achieved_token_share"], 4), "epochs": round(v["epochs"], 3),
                "tokens": v["selected_tokens"]} for d, v in rep["domains"].items()}


def build_report(cfg, runs: list[dict], corpora: dict[str, dict], out_dir: Path) -> dict:
    """``runs``: ``[{arm, index, seed, scores}]``; ``corpora``: the corpus summary of each corpus arm."""
    ab = cfg.ablation
    scores = _by_arm(runs)
    base = ab.baseline()
    domains = sorted({s.domain for s in next(iter(scores[base].values()))})
    scopes = ([ab.primary] if ab.primary else [None]) + [d for d in domains if d != ab.primary]
    floor, aa = None, None
    if f"{base}_aa" in scores:
        aa = paired_difference(scores[base], scores[f"{base}_aa"], replicates=ab.replicates, seed=cfg.seed)
        floor = noise_floor(aa)
    control = None
    pair = ab.control_arms()
    if len(pair) == 2 and all(a in scores for a in pair):       # the chain's arm minus the baseline, on junk
        control = paired_difference(scores[pair[0]], scores[pair[1]], replicates=ab.replicates, seed=cfg.seed)
    arms = {}
    detected = control is not None and control_detected(control, floor if floor is not None else math.inf)
    for arm in [a for a in ab.arms if a != base]:
        rows = {}
        for scope in scopes:
            diff = paired_difference(scores[base], scores[arm], domain=scope, replicates=ab.replicates,
                                     seed=cfg.seed)
            rows[scope or "all"] = {**diff.to_dict(), "verdict": verdict(diff, floor if floor is not None
                                                                          else math.inf, control)}
        arms[arm] = rows
    bpb = {arm: {str(i): round(bits_per_byte(docs), 5) for i, docs in sorted(by_seed.items())}
           for arm, by_seed in scores.items()}
    report = {"baseline": base, "primary": ab.primary or "all",
              "noise_floor": floor if floor is not None and math.isfinite(floor) else None,
              "aa": aa.to_dict() if aa else None, "control": control.to_dict() if control else None,
              "control_detected": detected, "control_note": _control_note(control, detected, pair),
              "differences": arms, "bits_per_byte": bpb, "cloze": cloze_of(runs),
              "mixtures": {arm: mixture_of(c) for arm, c in corpora.items()},
              "runs": [{k: r[k] for k in ("arm", "seed", "index")} for r in runs]}
    write_json(out_dir / "report.json", report)
    (out_dir / "report.md").write_text(markdown(report), encoding="utf-8")
    (out_dir / "report.svg").write_text(plot.svg(report), encoding="utf-8")
    return report


def _control_note(control: Interval | None, detected: bool, pair: list[str]) -> str:
    if control is None:
        return "no positive control was run (ablation.control_share: 0), so every verdict is inconclusive"
    lo = "no interval" if control.lo is None else f"[{control.lo:+.4f}, {control.hi:+.4f}]"
    seen = ("detected: the design can see a difference of that size" if detected else
            "NOT detected beyond the noise floor: the ablation is underpowered and every verdict is inconclusive")
    return f"{pair[1]} minus {pair[0]} on the junk-planted corpus {control.mean:+.4f} {lo} bits per byte, {seen}"


def _fmt(iv: dict) -> str:
    if iv["lo"] is None:
        return f"{iv['mean']:+.4f} [no interval: one seed, one source]"
    return f"{iv['mean']:+.4f} [{iv['lo']:+.4f}, {iv['hi']:+.4f}]"


def _floor_line(report: dict) -> str:
    if report["aa"] is None:
        return "Noise floor: not measured (ablation.aa is off)."
    if report["noise_floor"] is None:
        return "Noise floor (A/A): no interval (one seed of one source): every difference is inconclusive."
    return f"Noise floor (A/A): {report['noise_floor']:.4f} bits per byte."


def markdown(report: dict) -> str:
    """The table: one row per arm and scope, the difference against the baseline in bits per byte, its interval,
    the verdict, and each side's token share and epochs in that domain."""
    mix = report["mixtures"]
    base = report["baseline"]
    lines = [f"# Data ablation against `{base}`", "",
             f"Primary number: bits per byte on **{report['primary']}** (declared in the config). Differences are "
             f"arm minus {base}: negative means the arm's model predicts the references better.",
             _floor_line(report),
             f"Positive control: {report['control_note']}.", "",
             "| arm | scope | difference (bpb) [95 % interval] | verdict | share, epochs (arm) | share, epochs "
             f"({base}) |", "|---|---|---|---|---|---|"]
    for arm, rows in report["differences"].items():
        for scope, iv in rows.items():
            side = [mix.get(a.removesuffix("_aa"), {}).get(scope) for a in (arm, base)]
            cells = ["" if s is None else f"{s['share']:.3f}, {s['epochs']:.2f}" for s in side]
            lines.append(f"| {arm} | {scope} | {_fmt(iv)} | {iv['verdict']} | {cells[0]} | {cells[1]} |")
    cloze = report.get("cloze") or {}
    if cloze:
        domains = sorted({d for c in cloze.values() for d in c["domains"]})
        lines += ["", "Last-word cloze, 4-way (distractors: the domain's other last words with as many letters; "
                  "chance 25 %), accuracy averaged over seeds:", "",
                  "| arm | items | all | " + " | ".join(domains) + " |", "|---|---|---|" + "---|" * len(domains)]
        for arm, c in cloze.items():
            cells = [f"{100 * c['domains'][d]:.1f} %" if d in c["domains"] else "" for d in domains]
            lines.append(f"| {arm} | {c['items']} | {100 * c['accuracy']:.1f} % | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


__all__ = ["Interval", "build_report", "markdown"]
