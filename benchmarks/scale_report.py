"""The Markdown section of ``bench_scale.py``'s results (BENCHMARKS.md, topic ``scale``), kept apart from the
measuring code so each file holds one idea."""

from __future__ import annotations


def markdown(res: dict) -> list[str]:
    from common import table

    out = []
    for r in res.get("runs", []):
        out += ["", f"**{r['size_gb']:g} GB** ({r['corpus_mb']} MB of text, {r['corpus']['docs']:,} documents): rc "
                f"{r['rc']}, {r['wall_s']} s wall, {r['cpu_s']} CPU-s, {r.get('mb_per_cpu_s')} MB/CPU-s for the whole "
                f"`airflow dags test`; peak tree RSS {r['peak_tree_rss_mb']} MB.", ""]
        out += table(["Stage", "Tasks", "Wall s", "CPU s", "MB/CPU-s", "Peak RSS MB", "RSS at start MB",
                      "Largest growth in a task MB", "Source"],
                     [[s["stage"], s["tasks"], s["wall_s"], s["cpu_s"], s.get("mb_per_cpu_s"), s["peak_rss_mb"],
                       s.get("rss_start_mb"), s.get("growth_mb"), s["source"]] for s in r["stages"]])
        if r.get("stages_profile") and r.get("stages_external"):
            out += ["", "The same run by external sampling, per task id (every task, Airflow's own included):", ""]
            out += table(["Task id", "Tasks", "Wall s", "CPU s", "Peak RSS MB", "RSS at start MB"],
                         [[s["stage"], s["tasks"], s["wall_s"], s["cpu_s"], s["peak_rss_mb"], s["rss_start_mb"]]
                          for s in r["stages_external"]])
        if r.get("docs"):
            order = ("ingest", "exact_dedup", "minhash", "quality", "tokenize", "mixture")
            out += ["", "Documents kept: " + " → ".join(f"{k} {r['docs'][k]['kept']:,}" for k in order
                                                      if k in r["docs"])
                    + (f"; {r['tokens']:,} tokens in the MindRecord set." if r.get("tokens") else ".")]
        if r.get("spread"):
            out += ["", f"Over {r['repeats']} runs (median, min–max): " + "; ".join(
                f"{k} {v['median']} ({v['min']}–{v['max']})" for k, v in r["spread"].items() if v) + "."]
        if r.get("dedup_truth"):
            t = r["dedup_truth"]
            out += ["", f"Planted duplicates: exact dedup found {t['exact']['found']:,} of {t['exact']['pairs']:,} "
                    f"exact pairs (recall {t['exact']['recall']}, precision {t['exact']['precision']}); MinHash found "
                    f"{t['minhash']['found_at_or_above']:,} of {t['minhash']['pairs_at_or_above_threshold']:,} near "
                    f"pairs with J >= {t['minhash']['threshold']} (recall {t['minhash']['recall_at_or_above']}, "
                    f"banding predicts {t['minhash']['predicted_at_or_above']}; precision "
                    f"{t['minhash']['precision']}).", ""]
            out += table(["True Jaccard", "Near pairs", "Found", "Recall", "Predicted by banding"],
                         [[k, v["pairs"], v["found"], v["recall"], v["predicted"]]
                          for k, v in t["minhash"]["by_jaccard"].items()])
        if r.get("cli_cpu_s"):
            out += ["", f"The same corpus through `mindloom corpus`: {r['cli_cpu_s']} CPU-s "
                    f"({r.get('cli_mb_per_cpu_s')} MB/CPU-s); the DAG path costs {r.get('dag_over_cli')}× that; "
                    f"tokens equal: {r.get('cli_tokens_equal')}."]
            if r.get("cli_stages") and r.get("stages_profile"):
                out += ["", "Where the DAG path's extra CPU goes: each stage's CPU-seconds from `profile/` on both "
                        "paths (the rest of the difference is Airflow's own work between and around the tasks):", ""]
                out += table(["Stage", "DAG CPU s", "CLI CPU s", "DAG − CLI"], dag_vs_cli(r))
        if r.get("quality_by_domain"):
            out += ["", "Quality filter, kept / in by domain: " + ", ".join(
                f"{d} {k:,} / {n:,}" for d, (n, k) in r["quality_by_domain"].items()) + "."]
    if res.get("stage_exponents"):
        out += ["", "CPU-seconds per stage between the smallest and the largest size (medians of the repeats):", ""]
        out += table(["Stage", "CPU s small", "CPU s large", "Growth", "Exponent", "Per yardstick",
                      "Each pair of runs"],
                     [[x["stage"], x["cpu_small"], x["cpu_large"], x["growth"], x["exponent"],
                       x.get("exponent_per_yardstick", "–"), ", ".join(map(str, x.get("values") or [])) or "–"]
                      for x in res["stage_exponents"]])
        sticks = [(r["size_gb"], (r.get("spread") or {}).get("yardstick_cpu_s")) for r in res["runs"]]
        if all(v for _, v in sticks):
            out += ["", "Yardstick (a fixed workload timed before and after each run, `scale_stats.yardstick`; "
                    "higher is a slower machine): " + ", ".join(f"{g:g} GB {v['median']} CPU-s" for g, v in sticks)
                    + "."]
    if sr := res.get("stage_repeats"):
        sizes = list(sr["corpus_mb"])
        out += ["", f"The sink's steps alone ({sr['what']}; `bench_scale.py --stage-repeats`), {sr['repeats']} "
                "repeats per size on the kept runs' tokenized shards, CPU-seconds:", ""]
        out += table(["Step", "Size", "Corpus MB", "Shards", "Output files", "Held-out runs", "Median", "Min", "Max",
                      "Exponent of medians", "Each pair"],
                     [[step, f"{g} GB", sr["corpus_mb"][g], sr["setup"][g]["shards"], sr["setup"][g]["n_files"],
                       sr["setup"][g].get("heldout_runs"), x["cpu_s"][g]["median"], x["cpu_s"][g]["min"],
                       x["cpu_s"][g]["max"], x["exponent"] if g == sizes[-1] else "",
                       ", ".join(map(str, x.get("pair_exponents") or [])) if g == sizes[-1] else ""]
                      for step, x in sr["steps"].items() for g in sizes])
        if drops := sr.get("overlaps_heldout"):
            out += ["", "The held-out overlap check dropped " + ", ".join(
                f"{v['dropped']:,} of {v['in_docs']:,} training documents at {g} GB" for g, v in drops.items())
                + " (the writer rows read the scatter without the check)."]
    side = res.get("side") or {}
    if side.get("tokenize"):
        t = side["tokenize"]
        out += ["", f"Tokenization of {t['text_mb']} MB of kept text: 1 process {t['encode_s']['1']} s, 2 processes "
                f"{t['encode_s']['2']} s (best ratio {t['speedup']}×; outputs identical: {t['outputs_identical']})."]
    if side.get("mindrecord"):
        m = side["mindrecord"]
        out += ["", f"MindRecord writing, {m['rows']:,} rows of {m['seq_len'] + 1} int32 ({m['payload_mb']} MB), best "
                "of repeats, MB/s:", ""]
        out += table(list(m["mb_per_s"]), [list(m["mb_per_s"].values())])
    peer = res.get("datatrove") or {}
    if peer.get("detail"):
        out += ["", f"datatrove 0.10.1 on the {peer.get('corpus_mb', res['runs'][0]['corpus_mb']):g} MB corpus: "
                f"{peer['wall_s']} s, "
                f"{peer['cpu_s']} CPU-s, {peer.get('mb_per_cpu_s')} MB/CPU-s, peak tree RSS {peer['peak_rss_mb']} MB "
                f"({peer['detail']['tasks']} tasks, {peer['detail']['workers']} workers).", ""]
        out += table(["datatrove stage", "Wall s", "CPU s"],
                     [[k, v["wall_s"], v["cpu_s"]] for k, v in peer["detail"]["stages"].items()])
        kept = [("".join(c for c in k.split(":")[-1] if c.isascii()).strip(), v.get("forwarded", v.get("total")))
                for k, v in peer["detail"]["docs"].items() if k.startswith("s1") and ("FILTER" in k or "WRITER" in k)]
        if kept:
            out += ["", "datatrove documents kept: " + " → ".join(f"{k} {n:,}" for k, n in kept if n is not None)
                    + ". Everything after its filters works on these only."]
    elif peer:
        out += ["", f"datatrove: {peer.get('status')}"]
    if peer.get("mindloom"):
        m = peer["mindloom"]
        out += ["", f"mindloom on the same steps (`mindloom corpus`, shared chain): rc {m['rc']}, {m['wall_s']} s, "
                f"{m['cpu_s']} CPU-s, {m.get('mb_per_cpu_s')} MB/CPU-s, peak tree RSS {m['peak_rss_mb']} MB; "
                f"documents kept after quality {m.get('kept')}."]
    if res.get("memory_rerun"):
        m = res["memory_rerun"]
        out += ["", f"Memory re-run at {m['size_gb']:g} GB with the corrected tree sampler (`{m['command']}`; "
                f"{m['why']}): peak tree RSS {m['peak_tree_rss_mb']} MB, largest task {m['peak_task_rss_mb']} MB "
                f"({m['largest_stage']}). Its CPU figures are not used. Peak RSS per stage, MB:", ""]
        out += table(["Stage", "This re-run", "The chain run above"],
                     [[k, v, m["before"].get(k)] for k, v in m["stages"].items()])
    out += ["", "Targets (computed from the figures above):", ""]
    out += table(["Target", "Value", "Goal", "Met", "Note"],
                 [[t["name"], t["value"], f"{t['op']} {t['target']}",
                   {True: "yes", False: "**no**", None: "–"}[t["met"]], t["note"]] for t in res.get("targets", [])])
    return out


def dag_vs_cli(r: dict) -> list[list]:
    """Per stage: DAG and CLI CPU-seconds (``profile/`` of each run) and the difference, then the stages' total and
    what is outside them (the whole process tree's CPU minus the stages')."""
    dag = {s["stage"]: s["cpu_s"] for s in r["stages_profile"]}
    cli = {s["stage"]: s["cpu_s"] for s in r["cli_stages"]}
    rows = [[k, round(dag.get(k, 0.0), 1), round(cli.get(k, 0.0), 1), round(dag.get(k, 0.0) - cli.get(k, 0.0), 1)]
            for k in sorted(set(dag) | set(cli), key=lambda k: (-abs(dag.get(k, 0.0) - cli.get(k, 0.0)), k))]
    d, c = round(sum(dag.values()), 1), round(sum(cli.values()), 1)
    rows.append(["all stages", d, c, round(d - c, 1)])
    rows.append(["outside the stages", round(r["cpu_s"] - d, 1), round(r["cli_cpu_s"] - c, 1),
                 round(r["cpu_s"] - d - (r["cli_cpu_s"] - c), 1)])
    return rows

