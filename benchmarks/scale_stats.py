"""Repeated bench-scale runs: median and spread per size, and each stage's cost exponent between two sizes.

Why: one run on a shared 2-core machine moves by 10-20 % with the load, so issue #23 asks for every figure from at
least three runs (median, min, max), and for the cost exponent of each stage, not only of the whole chain (the
chain's 0.99 hid four stages between 1.15 and 1.32).
"""

from __future__ import annotations

import statistics

SPREAD_KEYS = ("wall_s", "cpu_s", "mb_per_cpu_s", "peak_tree_rss_mb", "peak_task_rss_mb", "cli_cpu_s",
               "dag_over_cli")


def spread(values: list[float]) -> dict | None:
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    return {"median": round(statistics.median(vals), 3), "min": round(min(vals), 3), "max": round(max(vals), 3),
            "n": len(vals)}


def combine(repeats: list[dict]) -> dict:
    """One size's result from its repeats: the run with the median CPU (its stages, docs and truth as they are)
    plus ``spread`` of every headline figure over the repeats and the per-stage CPU medians."""
    ok = [r for r in repeats if r.get("rc") == 0] or repeats
    rep = sorted(ok, key=lambda r: r.get("cpu_s") or 0)[(len(ok) - 1) // 2]
    out = {**rep, "repeats": len(repeats), "rcs": [r.get("rc") for r in repeats]}
    out["spread"] = {k: spread([r.get(k) for r in ok]) for k in SPREAD_KEYS if any(r.get(k) is not None for r in ok)}
    stages: dict[str, list[float]] = {}
    for r in ok:
        for s in r.get("stages", []):
            stages.setdefault(s["stage"], []).append(s["cpu_s"])
    out["stage_cpu_spread"] = {k: spread(v) for k, v in stages.items()}
    return out


def stage_exponents(small: dict, large: dict) -> list[dict]:
    """Per stage: median CPU-s at both sizes and ``log(cpu_large/cpu_small) / log(mb_large/mb_small)``."""
    import math

    a, b = small.get("stage_cpu_spread") or {}, large.get("stage_cpu_spread") or {}
    ratio = large["corpus_mb"] / small["corpus_mb"]
    rows = []
    for stage in [s for s in b if s in a]:
        ca, cb = a[stage]["median"], b[stage]["median"]
        exp = round(math.log(cb / ca) / math.log(ratio), 3) if ca > 0 and cb > 0 and ratio > 1 else None
        rows.append({"stage": stage, "cpu_small": ca, "cpu_large": cb, "growth": round(cb / ca, 2) if ca else None,
                     "exponent": exp})
    return rows
