"""bench-scale's targets (issues 13 and 23): each with its value from the run's figures, the goal and whether it
was met (None: not measured in this invocation).  Computed from a finished run's record, so a record can be
scored again (``targets(res["runs"], res.get("side"), res.get("datatrove"))``)."""

from __future__ import annotations

import statistics

import scale_stats
from common import loglog_slope

TARGETS = {"peak_rss_mb": 2048.0, "peak_move": 0.25, "chain_mb_per_cpu_s": 2.0, "cost_exponent": 1.05,
           "tokenize_1_to_2": 1.8, "mindrecord_vs_filewriter": 0.8, "vs_datatrove": 2.0, "stage_exponent": 1.05,
           "exact_recall": 1.0, "minhash_recall_gap": 0.02, "dag_over_cli": 1.10}


#: Stages under this many CPU-seconds at the large size are left out of the worst exponent (still listed in the
#: stage table and named in the note): the profile samples a process's CPU every 0.2 s, so at a few centiseconds
#: the ratio of two sizes is the sampling, not the stage.
MIN_STAGE_CPU_S = 1.0


#: Targets every run must meet: their value is the worst run's, and results.json judges them on the worst run.
WORST_RUN = ("peak_task_rss_mb", "exact_dedup_recall", "minhash_recall_below_banding")


def _t(name, value, target, op, met, note="", values=None) -> dict:
    """One target; ``values``: the repeats behind ``value`` (a median of them, or the worst for ``WORST_RUN``)."""
    out = {"name": name, "value": value, "target": target, "op": op, "met": met, "note": note}
    if name in WORST_RUN:
        out["judge"] = "worst"
    return {**out, "values": values} if values else out


def _cmp(value, target, op):
    if value is None:
        return None
    return value <= target if op == "<=" else value >= target


def targets(runs: list[dict], side: dict | None, peer: dict | None) -> list[dict]:
    """Issue #13's targets, each with its value and met (None: not measured in this invocation)."""
    ok = [r for r in runs if r.get("rc") == 0]
    small = min(ok, key=lambda r: r["size_gb"]) if ok else None
    large = max(ok, key=lambda r: r["size_gb"]) if ok else None
    big = [r for r in runs if r["size_gb"] >= 4]
    out = [_t("run_4gb_completes", (1.0 if all(r.get("rc") == 0 for r in big) else 0.0) if big else None, 1.0, ">=",
              (all(r.get("rc") == 0 for r in big)) if big else None,
              "" if big else "no run of 4 GB or more in this invocation")]
    peaks = [r["peak_task_rss_mb"] for r in ok if r.get("peak_task_rss_mb")]
    peaks += [v for r in ok for v in scale_stats.repeat_values(r, "peak_task_rss_mb") or []]
    out.append(_t("peak_task_rss_mb", max(peaks) if peaks else None, TARGETS["peak_rss_mb"], "<=",
                  _cmp(max(peaks) if peaks else None, TARGETS["peak_rss_mb"], "<="),
                  "largest task of every run; includes the Airflow CLI process (dags test runs tasks in-process)"
                  + "".join(f"; {r['size_gb']:g} GB median {_median(r, 'peak_task_rss_mb')}" for r in ok
                            if (r.get("spread") or {}).get("peak_task_rss_mb", {}).get("n", 1) > 1),
                  values=per_pair(ok, "peak_task_rss_mb", max)))
    two = small is not None and large is not None and large["size_gb"] > small["size_gb"]
    move = (abs(large["peak_task_rss_mb"] / small["peak_task_rss_mb"] - 1) if two else None)
    out.append(_t("peak_rss_move", None if move is None else round(move, 3), TARGETS["peak_move"], "<=",
                  _cmp(move, TARGETS["peak_move"], "<="),
                  f"{small['size_gb']:g} GB -> {large['size_gb']:g} GB" if two else "needs two sizes"))
    thr = large["mb_per_cpu_s"] if large else None
    out.append(_t("chain_mb_per_cpu_s", thr, TARGETS["chain_mb_per_cpu_s"], ">=",
                  _cmp(thr, TARGETS["chain_mb_per_cpu_s"], ">="),
                  f"{large['size_gb']:g} GB run, whole airflow dags test process tree"
                  + _range((large.get("spread") or {}).get("mb_per_cpu_s")) if large else "",
                  values=scale_stats.repeat_values(large, "mb_per_cpu_s") if large else None))
    exp = (loglog_slope([small["corpus_mb"], large["corpus_mb"]], [small["cpu_s"], large["cpu_s"]]) if two else None)
    pairs = (scale_stats.pair_exponents(scale_stats.repeat_values(small, "cpu_s"),
                                        scale_stats.repeat_values(large, "cpu_s"),
                                        large["corpus_mb"] / small["corpus_mb"]) if two else None)
    out.append(_t("cost_exponent", exp, TARGETS["cost_exponent"], "<=", _cmp(exp, TARGETS["cost_exponent"], "<="),
                  ("log(cpu_large/cpu_small)/log(size_large/size_small)" + _per_yardstick(small, large, exp)
                   + (f"; each interleaved pair of runs: {', '.join(map(str, pairs))}" if pairs else ""))
                  if two else "needs two sizes", values=pairs))
    tok = (side or {}).get("tokenize", {}).get("speedup")
    out.append(_t("tokenize_1_to_2_processes", tok, TARGETS["tokenize_1_to_2"], ">=",
                  _cmp(tok, TARGETS["tokenize_1_to_2"], ">="), "best of repeats each"))
    mr = (side or {}).get("mindrecord", {}).get("ratio_vs_filewriter")
    out.append(_t("mindrecord_vs_filewriter", mr, TARGETS["mindrecord_vs_filewriter"], ">=",
                  _cmp(mr, TARGETS["mindrecord_vs_filewriter"], ">="),
                  "write_shard MB/s ÷ FileWriter batched MB/s, same rows"))
    ratio = None
    ours = ((peer or {}).get("mindloom") or {}).get("mb_per_cpu_s")
    if peer and peer.get("mb_per_cpu_s") and ours:
        ratio = round(ours / peer["mb_per_cpu_s"], 3)
    out.append(_t("vs_datatrove_mb_per_cpu_s", ratio, TARGETS["vs_datatrove"], ">=",
                  _cmp(ratio, TARGETS["vs_datatrove"], ">="),
                  "same corpus, same steps on both sides (scale_peer.py: shared chain, language ID on both); "
                  "mindloom corpus ÷ datatrove"))
    return out + dedup_and_stage_targets(ok, small, large, two)


def _per_yardstick(small: dict, large: dict, exp: float | None) -> str:
    """The exponent with each size's CPU divided by the machine's yardstick during its runs (scale_stats)."""
    import math

    drift = scale_stats.yardstick_ratio(small, large)
    if not drift or exp is None:
        return ""
    ratio = large["corpus_mb"] / small["corpus_mb"]
    per = math.log(large["cpu_s"] / small["cpu_s"] / drift) / math.log(ratio)
    return f"; per yardstick {per:.3f} (the machine was {drift:.2f}x as slow during the large run)"


def dedup_and_stage_targets(ok: list[dict], small, large, two: bool) -> list[dict]:
    """Issue #23's targets: per-stage exponents, dedup against the planted truth, DAG vs CLI CPU."""
    out = []
    rows = scale_stats.stage_exponents(small, large) if two else []
    tiny = [r for r in rows if r["exponent"] is not None and r["cpu_large"] < MIN_STAGE_CPU_S]
    worst = max((r for r in rows if r["exponent"] is not None and r not in tiny), key=lambda r: r["exponent"],
                default=None)
    out.append(_t("worst_stage_exponent", worst["exponent"] if worst else None, TARGETS["stage_exponent"], "<=",
                  _cmp(worst["exponent"] if worst else None, TARGETS["stage_exponent"], "<="),
                  (f"stage {worst['stage']} (median CPU of the repeats)" + (
                      f"; per yardstick {worst['exponent_per_yardstick']}" if "exponent_per_yardstick" in worst
                      else "") + "".join(
                      f"; {r['stage']} {r['cpu_small']} → {r['cpu_large']} CPU-s (exponent {r['exponent']}) is "
                      f"under the {MIN_STAGE_CPU_S:g} CPU-s floor" for r in tiny)
                      + (f"; each interleaved pair of runs: {', '.join(map(str, worst['values']))}"
                         if worst.get("values") else "") + _worst_in_a_pair(rows, tiny))
                  if worst else "needs two sizes",
                  values=worst.get("values") if worst else None))
    truths = [r["dedup_truth"] for r in ok if r.get("dedup_truth")]
    rec = min((t["exact"]["recall"] for t in truths if t["exact"]["recall"] is not None), default=None)
    out.append(_t("exact_dedup_recall", rec, TARGETS["exact_recall"], ">=", _cmp(rec, TARGETS["exact_recall"], ">="),
                  "planted exact copies, smallest over the sizes; precision " + ", ".join(
                      str(t["exact"]["precision"]) for t in truths), values=per_pair(ok, "exact_recall", min)))
    gaps = [t["minhash"]["predicted_at_or_above"] - t["minhash"]["recall_at_or_above"] for t in truths
            if t["minhash"]["recall_at_or_above"] is not None]
    gap = round(max(gaps), 4) if gaps else None
    out.append(_t("minhash_recall_below_banding", gap, TARGETS["minhash_recall_gap"], "<=",
                  _cmp(gap, TARGETS["minhash_recall_gap"], "<="),
                  "predicted − measured recall of planted near pairs with J >= threshold; precision " + ", ".join(
                      str(t["minhash"]["precision"]) for t in truths),
                  values=per_pair(ok, "minhash_recall_gap", max)))
    per_size = [(r["size_gb"], _median(r, "dag_over_cli"), (r.get("spread") or {}).get("dag_over_cli"))
                for r in ok if _median(r, "dag_over_cli")]
    worst = max(per_size, key=lambda p: p[1], default=None)
    over = worst[1] if worst else None
    out.append(_t("dag_cpu_over_cli", over, TARGETS["dag_over_cli"], "<=", _cmp(over, TARGETS["dag_over_cli"], "<="),
                  "airflow dags test CPU ÷ mindloom corpus CPU, same corpus and config; the worst size's median: "
                  + ", ".join(f"{size:g} GB {m}" + _range(sp) for size, m, sp in per_size) if over else
                  "needs --cli", values=worst[2].get("values") if worst and worst[2] and worst[2]["n"] > 1 else None))
    return out


def _worst_in_a_pair(rows: list[dict], tiny: list[dict]) -> str:
    """The highest exponent any stage (over the floor) reached in a single pair of runs: the median hides it."""
    pairs = [(v, r["stage"]) for r in rows if r not in tiny for v in r.get("values") or []]
    if not pairs:
        return ""
    v, stage = max(pairs)
    return f"; the highest in any one pair: {stage} {v}"


def per_pair(runs: list[dict], key: str, pick) -> list | None:
    """``pick`` (max, min) over the sizes of each interleaved run: the repeats behind a figure that is the worst
    size's (None unless every size has the same number of repeats, two or more)."""
    vals = [scale_stats.repeat_values(r, key) for r in runs]
    if not vals or any(v is None for v in vals) or len({len(v) for v in vals}) != 1:
        return None
    return [pick(group) for group in zip(*vals, strict=True)]


def _median(run: dict, key: str):
    """A headline figure's median over the size's repeats (the run's own value for a single run)."""
    return ((run.get("spread") or {}).get(key) or {}).get("median", run.get(key))


def _range(sp: dict | None) -> str:
    return f" ({sp['min']}-{sp['max']}, {sp['n']} runs)" if sp and sp.get("n", 1) > 1 else ""


#: issue 33: the shipped parallelism may cost at most this much CPU over parallelism 8 at the smallest size
SWEEP_OVER_8 = 1.15


def sweep_point(run: dict) -> dict:
    """One parallelism of the sweep: what it cost (the whole ``airflow dags test`` tree) and what it made.  A point
    of the main runs, which repeat, also keeps every repeat's CPU (``cpu_s_runs``): its other figures are those of
    one run, and with two repeats that is the cheaper one."""
    inst = run.get("task_states") or {}
    point = {"parallelism": run.get("parallelism"), "size_gb": run["size_gb"], "corpus_mb": run["corpus_mb"],
             "rc": run.get("rc"), "cpu_s": run["cpu_s"], "wall_s": run["wall_s"],
             "mb_per_cpu_s": run.get("mb_per_cpu_s"),
             "task_instances": sum(inst.values()), "tasks_cpu_s": run.get("tasks_cpu_s"),
             "profile_cpu_s": round(sum(s["cpu_s"] for s in run.get("stages_profile") or []), 1),
             "tokens": run.get("tokens"), "outputs_sha256": run.get("outputs_sha256"),
             "peak_task_rss_mb": run.get("peak_task_rss_mb"),
             "yardstick_cpu_s": (round(sum(run["yardstick"]) / len(run["yardstick"]), 3)
                                 if run.get("yardstick") else None)}
    runs = ((run.get("spread") or {}).get("cpu_s") or {}).get("values") or []
    return point | {"cpu_s_runs": runs} if len(runs) > 1 else point


def sweep_targets(points: list[dict], shipped: int) -> list[dict]:
    """CPU of the shipped parallelism over parallelism 8 on the same corpus, and whether every point made the same
    corpus (the MindRecord manifest's sha256, which lists every file's digest)."""
    by = {p["parallelism"]: p for p in points if p.get("rc") == 0}
    if 8 not in by or shipped not in by or shipped == 8:
        return []
    runs = by[shipped].get("cpu_s_runs") or [by[shipped]["cpu_s"]]
    ratio = round(statistics.median(runs) / by[8]["cpu_s"], 3)       # the median of the shipped runs, not the cheaper
    each = [round(c / by[8]["cpu_s"], 3) for c in runs]
    per_task = [(p["cpu_s"] - by[8]["cpu_s"]) / (p["task_instances"] - by[8]["task_instances"])
                for k, p in sorted(by.items()) if k != 8 and p["task_instances"] > by[8]["task_instances"]]
    digests = {p["outputs_sha256"] for p in by.values()}
    ys = by[shipped].get("yardstick_cpu_s"), by[8].get("yardstick_cpu_s")
    per_yard = (f"; per yardstick (that run's CPU over the fixed workload timed around it: {ys[0]} and {ys[1]} "
                f"CPU-s) {by[shipped]['cpu_s'] / ys[0] / (by[8]['cpu_s'] / ys[1]):.3f}") if all(ys) else ""
    same = len(digests) == 1 and None not in digests
    return [_t(f"parallelism_{shipped}_over_8_cpu", ratio, SWEEP_OVER_8, "<=", _cmp(ratio, SWEEP_OVER_8, "<="),
               f"{by[8]['size_gb']:g} GB, whole airflow dags test tree: {statistics.median(runs):g} CPU-s at "
               f"{shipped} ({by[shipped]['task_instances']} task instances"
               + (f"; median of {len(runs)} runs: {', '.join(f'{c:g}' for c in runs)}, each over 8: "
                  f"{', '.join(f'{e:.3f}' for e in each)}" if len(runs) > 1 else "")
               + f") vs {by[8]['cpu_s']} at 8 ({by[8]['task_instances']}); slope (the run with the sweep's other "
               "figures) " + ", ".join(f"{v:.3f}" for v in per_task)
               + " CPU-s per extra task instance" + per_yard, each if len(runs) > 1 else None),
            _t("sweep_outputs_identical", 1.0 if same else 0.0, 1.0, ">=", same,
               "MindRecord manifest sha256 at parallelism " + ", ".join(str(k) for k in sorted(by)))]
