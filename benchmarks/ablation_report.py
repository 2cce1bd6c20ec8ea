"""The ablation's entries in results.json and its section of BENCHMARKS.md, from ``ablation.json``.

Apart from ``ablation.py`` (which trains the models) so that ``run_all.py`` and ``report.py`` can read the results
without importing the script that records into them.
"""

from __future__ import annotations

import math

from common import metric, table


def metrics(res: dict) -> list[dict]:
    if not res.get("runs"):
        return []
    a, b = res["runs"]["raw"]["eval"], res["runs"]["curated"]["eval"]
    tok = f"{res['budget']['tokens']:,} training tokens each"
    out = [metric("ablation", f"loss_delta_{d}", "nats", [b[d] - a[d]], headline=d == "all",
                  compared=f"(a) raw ingested corpus, {tok}",
                  note="held-out loss of (b) minus (a): negative = mindloom's data trains the better model")
           for d in b if a.get(d) is not None and b[d] is not None]
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


def markdown(res: dict) -> list[str]:
    if not res.get("runs"):
        return []
    a, b = res["runs"]["raw"], res["runs"]["curated"]
    bud = res["budget"]
    sets = res.get("eval_sets", {})
    ex = res["data"]["raw"].get("excluded") or {}
    out = [f"Budget: {bud['steps']} steps × {bud['rows_per_step']} rows × {bud['seq_len']} tokens = "
           f"{bud['tokens']:,} tokens per model (debug preset), the same initial weights and recipe; evaluation: the "
           f"first {bud['eval_tokens_per_domain']:,} tokens of each domain's held-out set (fewer where the set is "
           f"smaller). (a) has {res['data']['raw']['tokens']:,} tokens after excluding {ex.get('heldout')} held-out "
           f"documents, {ex.get('near_duplicates_of_heldout')} near-duplicates of them (MinHash clusters) and every "
           f"document sharing a text hash with those ({ex.get('all_with_their_text_hashes')} documents in all); (b) "
           f"has {res['data']['curated']['tokens']:,} tokens. Both are larger than the budget, so neither repeats "
           "data.", ""]
    rows = []
    for d in b["eval"]:
        la, lb = a["eval"].get(d), b["eval"][d]
        win = "–" if la is None or lb is None else ("(b) mindloom" if lb < la else "(a) raw" if la < lb else "tie")
        docs = sum(v.get("documents", 0) for v in sets.values()) if d == "all" else sets.get(d, {}).get("documents")
        rows.append([d, docs,
                     _f(res["data"]["raw"]["token_share"].get(d)), _f(res["data"]["curated"]["token_share"].get(d)),
                     _f(la, 3), _f(lb, 3), _f(None if la is None or lb is None else lb - la, 3), win])
    out += table(["Domain", "Held-out docs", "(a) token share", "(b) token share", "(a) raw loss", "(b) mindloom loss",
                  "(b) − (a)", "Lower loss"], rows)
    out += ["", f"Training loss: (a) {a['first_loss']:.3f} → {a['final_loss']:.3f}, (b) {b['first_loss']:.3f} → "
            f"{b['final_loss']:.3f} (each on its own data, so not comparable with each other).", ""]
    lc = res.get("long_context", {})
    if lc:
        lens = sorted({int(k) for v in lc.values() for k in v["loss"]})
        out += ["Long context, all held-out tokens pooled (and the `long` and `books` domains), loss at each "
                "context length:", ""]
        hdr = [f"{col} @{n}" for n in lens for col in ("all", "long", "books")]
        out += table(["Variant", "Extra steps", *hdr],
                     [[name, v["extra_steps"], *[_f(v["loss"][str(n)].get(col), 3) for n in lens
                                                 for col in ("all", "long", "books")]] for name, v in lc.items()])
    if res.get("plots"):
        out += ["", *[f"![ablation {k}]({p})" for k, p in res["plots"].items()]]
    t = res.get("timings", {})
    out += ["", "Timings (s): " + ", ".join(f"{k.removesuffix('_s')} {v}" for k, v in t.items()
                                            if k != "chain_reused")
            + (" (chain output and raw set reused from an earlier run with the same data settings)."
               if t.get("chain_reused") else ".")]
    return out


def _f(v, digits: int = 4) -> str:
    return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{digits}f}"
