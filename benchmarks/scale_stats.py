"""Repeated bench-scale runs: median and spread per size, and each stage's cost exponent between two sizes.

Why: one run on a shared 2-core machine moves by 10-20 % with the load, so issue #23 asks for every figure from at
least three runs (median, min, max), and for the cost exponent of each stage, not only of the whole chain (the
chain's 0.99 hid four stages between 1.15 and 1.32).

This machine's CPU also drifts by more than that between hours: the same 1 GB corpus through the same stages cost
388, 448 and 696 CPU-seconds on three runs (2026-11-30 to 12-02), every stage slower by about the same factor.  So
each run also records a yardstick (:func:`yardstick`: a fixed mix of Python, regex, zlib and numpy work, timed in
the bench's own process right before and after the run), and the exponents are also given per yardstick: the
CPU-seconds of each size divided by its yardstick.  The targets stay on the raw figures.
"""

from __future__ import annotations

import statistics

SPREAD_KEYS = ("wall_s", "cpu_s", "mb_per_cpu_s", "peak_tree_rss_mb", "peak_task_rss_mb", "cli_cpu_s",
               "dag_over_cli", "yardstick_cpu_s")


def yardstick(rounds: int = 10) -> float:
    """CPU-seconds of this process for a fixed, deterministic workload shaped like the chain's (0.33 s a round
    here): word counting with a regex and a dict, zlib, sha1, JSON and a numpy sort over 2.4 MB of text."""
    import hashlib
    import json
    import re
    import time
    import zlib

    import numpy as np

    rng = np.random.default_rng(0)
    vocab = ["".join(chr(97 + c) for c in rng.integers(0, 26, int(n))) for n in rng.integers(2, 10, 5000)]
    text = " ".join(vocab[i] for i in rng.integers(0, len(vocab), 400_000))
    t0 = time.process_time()
    for _ in range(rounds):
        counts: dict[str, int] = {}
        for tok in re.findall(r"\w+", text):
            counts[tok] = counts.get(tok, 0) + 1
        raw = text.encode()
        zlib.compress(raw, 6)
        hashlib.sha1(raw).hexdigest()
        json.loads(json.dumps([{"w": w, "n": n} for w, n in counts.items()]))
        np.sort(np.frombuffer(raw, np.uint8).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15))
    return round(time.process_time() - t0, 3)


def spread(values: list[float], digits: int = 3) -> dict | None:
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    return {"median": round(statistics.median(vals), digits), "min": round(min(vals), digits),
            "max": round(max(vals), digits), "n": len(vals), "values": [round(v, digits) for v in vals]}


def repeat_values(run: dict, key: str) -> list | None:
    """A size's figure over its repeats (:func:`spread` keeps them), or None for a single run."""
    sp = (run.get("spread") or {}).get(key) or {}
    return sp.get("values") if sp.get("n", 1) > 1 else None


def combine(repeats: list[dict]) -> dict:
    """One size's result from its repeats: the run with the median CPU (its stages, docs and truth as they are)
    plus ``spread`` of every headline figure over the repeats and the per-stage CPU medians."""
    ok = [r for r in repeats if r.get("rc") == 0] or repeats
    rep = sorted(ok, key=lambda r: r.get("cpu_s") or 0)[(len(ok) - 1) // 2]
    out = {**rep, "repeats": len(repeats), "rcs": [r.get("rc") for r in repeats]}
    out["spread"] = {k: spread([r.get(k) for r in ok]) for k in SPREAD_KEYS if any(r.get(k) is not None for r in ok)}
    truth = [truth_figures(r.get("dedup_truth")) for r in ok]
    for k in TRUTH_KEYS:
        if all(t.get(k) is not None for t in truth):
            out["spread"][k] = spread([t[k] for t in truth], digits=6)    # a recall of 0.99995 is not 1.0
    stages: dict[str, list[float]] = {}
    for r in ok:
        for s in r.get("stages", []):
            stages.setdefault(s["stage"], []).append(s["cpu_s"])
    out["stage_cpu_spread"] = {k: spread(v) for k, v in stages.items()}
    return out


TRUTH_KEYS = ("exact_recall", "minhash_recall_gap")


def truth_figures(truth: dict | None) -> dict:
    """A run's dedup scores against the planted truth: exact recall, and how far MinHash recall fell under what the
    banding predicts (positive: under)."""
    if not truth:
        return {}
    m = truth.get("minhash") or {}
    gap = (round(m["predicted_at_or_above"] - m["recall_at_or_above"], 4)
           if m.get("recall_at_or_above") is not None else None)
    return {"exact_recall": (truth.get("exact") or {}).get("recall"), "minhash_recall_gap": gap}


def pair_exponents(small_values: list | None, large_values: list | None, ratio: float) -> list[float] | None:
    """The exponent of each interleaved (small, large) pair of runs: the spread behind an exponent of medians."""
    import math

    if not small_values or not large_values or len(small_values) != len(large_values) or len(small_values) < 2:
        return None
    if ratio <= 1 or min(small_values) <= 0 or min(large_values) <= 0:
        return None
    return [round(math.log(b / a) / math.log(ratio), 3) for a, b in zip(small_values, large_values, strict=True)]


def stage_exponents(small: dict, large: dict) -> list[dict]:
    """Per stage: median CPU-s at both sizes and ``log(cpu_large/cpu_small) / log(mb_large/mb_small)``, and (with
    repeats) each interleaved pair's own exponent as ``values``."""
    import math

    a, b = small.get("stage_cpu_spread") or {}, large.get("stage_cpu_spread") or {}
    ratio = large["corpus_mb"] / small["corpus_mb"]
    rows = []
    for stage in [s for s in b if s in a]:
        ca, cb = a[stage]["median"], b[stage]["median"]
        exp = round(math.log(cb / ca) / math.log(ratio), 3) if ca > 0 and cb > 0 and ratio > 1 else None
        row = {"stage": stage, "cpu_small": ca, "cpu_large": cb, "growth": round(cb / ca, 2) if ca else None,
               "exponent": exp}
        if (drift := yardstick_ratio(small, large)) and exp is not None:
            row["exponent_per_yardstick"] = round(math.log(cb / ca / drift) / math.log(ratio), 3)
        if pairs := pair_exponents(a[stage].get("values"), b[stage].get("values"), ratio):
            row["values"] = pairs
        rows.append(row)
    return rows


def yardstick_ratio(small: dict, large: dict) -> float | None:
    """How much slower the machine was during the large run than during the small one (median yardsticks)."""
    ya = ((small.get("spread") or {}).get("yardstick_cpu_s") or {}).get("median")
    yb = ((large.get("spread") or {}).get("yardstick_cpu_s") or {}).get("median")
    return yb / ya if ya and yb else None


COMBINED_KEYS = ("repeats", "rcs", "spread", "stage_cpu_spread")


def earlier_runs(docs: list[tuple[str, dict]], sizes: list[float]) -> dict[float, list[dict]]:
    """Single runs from earlier invocations (``--add-runs``), by size, to combine with this invocation's.

    Why: one 1 + 4 GB pair takes about 40 minutes here, so three runs per size may span sessions.  Each document is
    a raw run (``<work>/repeats/*.json``, written after every run) or a results file whose runs each hold one
    repeat; a combined entry of several repeats is refused, since its other runs are no longer there."""
    out: dict[float, list[dict]] = {size: [] for size in sizes}
    for name, doc in docs:
        for r in doc["runs"] if "runs" in doc else [doc]:
            if r.get("repeats", 1) != 1:
                raise ValueError(f"{name}: the {r.get('size_gb')} GB entry combines {r['repeats']} runs; "
                                 "add the raw runs from <work>/repeats/ instead")
            if r.get("size_gb") in out:
                out[r["size_gb"]].append({k: v for k, v in r.items() if k not in COMBINED_KEYS})
    return out
