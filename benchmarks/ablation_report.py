"""The ablation's entries in results.json, its section of BENCHMARKS.md, and the README's table, from
``ablation.json``.

Apart from ``ablation.py`` (which trains the models) so that ``run_all.py``, ``report.py`` and ``readme_block.py``
can read the results without importing the script that records into them.
"""

from __future__ import annotations

import math

from ablation_data import ARMS
from ablation_eval import mean_ci
from common import metric, table

PAIRS = {"loss_delta": ("heuristics", "raw"), "classifier_delta": ("classifier", "heuristics"),
         "classifier_only_delta": ("classifier_only", "heuristics")}


def _paired(res: dict, kind: str, hi: str, lo: str, domain: str) -> list:
    """Per seed, ``hi`` minus ``lo`` (same seed, same reference items); None where either is missing."""
    out = []
    for a, b in zip(res["arms"][hi], res["arms"][lo], strict=True):
        x, y = a[kind].get(domain), b[kind].get(domain)
        out.append(None if x is None or y is None else x - y)
    return out


def _row(topic_name: str, unit: str, values: list, **kw) -> dict:
    s = mean_ci(values)
    ci = "" if s["ci"] is None else f" ± {s['ci']:.3f}"
    m = metric("ablation", topic_name, unit, values, issue=34,
               note=(f"mean {s['mean']:+.3f}{ci} (95 % t interval over {s['n']} seeds); " if s["mean"] is not None
                     else "") + kw.pop("note", ""), **kw)
    m.update(values=values, mean=s["mean"], ci95=s["ci"])
    return m


def metrics(res: dict) -> list[dict]:
    if not res.get("arms"):
        return []
    tok = f"{res['budget']['tokens']:,} training tokens each, {len(res['seeds'])} seeds"
    domains = list(res["arms"]["heuristics"][0]["loss"])
    out = []
    for name, (hi, lo) in PAIRS.items():
        for d in domains:
            out.append(_row(f"{name}_{d}", "nats", _paired(res, "loss", hi, lo, d), headline=d == "all",
                            compared=f"{ARMS[lo]}, {tok}",
                            note=f"reference-text loss of {ARMS[hi]} minus {ARMS[lo]}: negative = {ARMS[hi]} is "
                                 "better"))
    for arm, runs in res["arms"].items():
        out.append(_row(f"mc_accuracy_{arm}", "share", [r["mc"]["all"] for r in runs],
                        compared="chance 0.25",
                        note=f"{ARMS[arm]}: 4-way continuation choice on the reference texts, "
                             f"{sum(v['mc_items'] for v in res['reference'].values())} items"))
    lc = res.get("long_context", {})
    names = list(lc)
    if len(names) == 4:
        at = str(res["budget"]["long_seq_len"])
        base, stage, ctrl = (lc[names[i]]["loss"][at]["all"] for i in (0, 2, 3))
        out.append(metric("ablation", "long_context_gain_at_4x", "nats", [base - stage], headline=True,
                          compared="same checkpoint without the stage, plain RoPE",
                          note="loss at 4× context without the stage minus with it: positive = the stage helps"))
        out.append(metric("ablation", "long_context_gain_vs_control", "nats", [ctrl - stage],
                          compared="the same extra tokens at base context"))
    return out


def _ci(values: list, digits: int = 3, pct: bool = False) -> str:
    s = mean_ci(values)
    if s["mean"] is None:
        return "–"
    k = 100 if pct else 1
    return f"{k * s['mean']:.{digits}f}" + ("" if s["ci"] is None else f" ± {k * s['ci']:.{digits}f}")


def _verdict(values: list) -> str:
    s = mean_ci(values)
    if s["mean"] is None or s["ci"] is None:
        return "–"
    if s["mean"] + s["ci"] < 0:
        return "better"
    if s["mean"] - s["ci"] > 0:
        return "worse"
    return "no difference shown"


def delta_table(res: dict) -> list[str]:
    """Per domain, the paired loss differences with their intervals (the README's table)."""
    domains = list(res["arms"]["heuristics"][0]["loss"])
    rows = []
    for d in domains:
        cells = [d, res["reference"].get(d, {}).get("docs", sum(v["docs"] for v in res["reference"].values()))]
        for hi, lo in PAIRS.values():
            v = _paired(res, "loss", hi, lo, d)
            cells.append(f"{_ci(v)} ({_verdict(v)})")
        rows.append(cells)
    return table(["Reference domain", "Docs", "(b) − (a)", "(c) − (b)", "(d) − (b)"], rows)


def markdown(res: dict) -> list[str]:
    if not res.get("arms"):
        return []
    bud, arms, seeds = res["budget"], res["arms"], res["seeds"]
    ref = res["reference"]
    out = [f"Budget: {bud['steps']} steps × {bud['rows_per_step']} rows × {bud['seq_len']} tokens = "
           f"{bud['tokens']:,} tokens per model (debug preset), seeds {', '.join(map(str, seeds))} (initialisation "
           "and data order; the same per seed in every arm). Reference texts: "
           f"{sum(v['docs'] for v in ref.values())} documents held out per domain before ingest, never filtered; "
           f"loss on the first {bud['eval_tokens_per_domain']:,} tokens of each domain's references; "
           f"{sum(v['mc_items'] for v in ref.values())} multiple-choice items (chance 25 %). Mean ± 95 % t interval "
           "over seeds. Small-model proxies: the absolute numbers say nothing about a large model.", ""]
    rows = []
    for arm, d in res["data"].items():
        dec = d.get("decontaminated") or (d.get("excluded") or {}).get("decontaminated") or {}
        rows.append([ARMS[arm], f"{d['tokens']:,}", d.get("documents"),
                     ", ".join(f"{k} {100 * v:.1f}" for k, v in d["token_share"].items()),
                     sum(dec.values()) if dec else 0])
    out += table(["Arm", "Tokens", "Documents", "Token share % per domain", "Decontaminated docs"], rows) + [""]
    domains = list(arms["heuristics"][0]["loss"])
    out += table(["Domain", "Docs", *[ARMS[a] for a in arms]],
                 [[d, ref.get(d, {}).get("docs", "–"), *[_ci([r["loss"][d] for r in runs]) for runs in arms.values()]]
                  for d in domains]) + ["", "Paired differences (same seed), nats per token; negative = the first "
                                        "arm is better:", ""]
    out += delta_table(res) + ["", "Multiple-choice continuation accuracy, % (chance 25):", ""]
    out += table(["Domain", "Items", *[ARMS[a] for a in arms]],
                 [[d, ref.get(d, {}).get("mc_items", sum(v["mc_items"] for v in ref.values())),
                   *[_ci([r["mc"][d] for r in runs], 1, pct=True) for runs in arms.values()]] for d in domains])
    lc = res.get("long_context", {})
    if lc:
        lens = sorted({int(k) for v in lc.values() for k in v["loss"]})
        out += ["", "Long context (from (b), first seed), all validation tokens pooled (and the `long` and `books` "
                "domains), loss at each context length:", ""]
        hdr = [f"{col} @{n}" for n in lens for col in ("all", "long", "books")]
        out += table(["Variant", "Extra steps", *hdr],
                     [[name, v["extra_steps"], *[_f(v["loss"][str(n)].get(col), 3) for n in lens
                                                 for col in ("all", "long", "books")]] for name, v in lc.items()])
    if res.get("plots"):
        out += ["", *[f"![ablation {k}]({p})" for k, p in res["plots"].items()]]
    t = res.get("timings", {})
    out += ["", "Timings (s): " + ", ".join(f"{k.removesuffix('_s')} {v}" for k, v in t.items()) + "."]
    return out


def _f(v, digits: int = 4) -> str:
    return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{digits}f}"
