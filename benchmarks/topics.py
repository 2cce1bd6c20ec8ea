"""What each benchmark topic runs and which metrics (with the issues' targets) it yields, for ``run_all.py``.

A topic entry says how to call its script (full and ``--quick``), which interpreter (the project venv, or a peer
venv such as ``torch``), which peers it cannot run without, which results files it writes, how often to repeat it
(scripts that keep per-repeat figures run once with ``--repeats``; the others run ``--repeats`` times), and a
function turning the results of those runs into metric entries.  Ratios are mindloom / peer, so > 1 means mindloom
is faster; where a script interleaves repeats of both tools, the ratio is taken per repeat pair.

Also here: the ``datasketch`` topic (signatures of plain datasketch 2.0 vs mindloom's engine, with a check that they
are identical), run by ``run_all.py --bench datasketch``, because no topic script compared against datasketch itself.
Only the standard library is imported at module level: the datasketch worker runs in the datasketch venv.
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from common import REPO, loglog_slope, metric, spread


def _ratios(ours: list[float], theirs: list[float], higher_is_better: bool = True) -> list[float]:
    """Per interleaved repeat pair; falls back to median / median when the counts differ."""
    if not ours or not theirs:
        return []
    if len(ours) != len(theirs):
        ours, theirs = [statistics.median(ours)], [statistics.median(theirs)]
    return [(o / t if higher_is_better else t / o) for o, t in zip(ours, theirs, strict=True) if o and t]


# ------------------------------------------------------------------------------------------------------------
# Metrics per topic (``runs``: one {results file name: parsed JSON} per run of the script)


def ingest_metrics(runs: list[dict]) -> list[dict]:
    def case(res, tool, what, procs=1):
        return next((c for c in res.get("cases", []) if c["tool"] == tool and c["case"] == what
                     and c["processes"] == procs), None)

    ing = [r["ingest.json"] for r in runs if "ingest.json" in r]
    out = []
    pairs = (("jsonl_vs_datatrove", ("mindloom jsonl", "ingest"), ("datatrove jsonl", "reader → writer"),
              "datatrove 0.10.1 JsonlReader → JsonlWriter, 1 task"),
             ("jsonl_reader_vs_datatrove", ("mindloom jsonl", "reader only"), ("datatrove jsonl", "reader only"),
              "datatrove 0.10.1 JsonlReader alone"),
             ("warc_trafilatura_vs_datatrove", ("mindloom warc (trafilatura)", "ingest"),
              ("datatrove warc", "reader → trafilatura → writer"), "datatrove WarcReader → Trafilatura → JsonlWriter"),
             ("warc_default_vs_datatrove", ("mindloom warc", "ingest"),
              ("datatrove warc", "reader → trafilatura → writer"), "datatrove's WARC pipeline (each tool's default "
              "extractor: Resiliparse vs Trafilatura)"))
    for name, ours, theirs, peer in pairs:
        vals = [(o["mb_s"] / t["mb_s"]) for r in ing if (o := case(r, *ours)) and (t := case(r, *theirs))]
        if vals:
            out.append(metric("ingest", name, "×", vals, compared=peer, headline=True,
                              note="MB/s of input, 1 process; issue 3 asks for the comparison, sets no number"))
    for tool, label in (("mindloom jsonl", "jsonl"), ("mindloom warc", "warc")):
        vals = [c["mb_s"] for r in ing if (c := case(r, tool, "ingest"))]
        if vals:
            out.append(metric("ingest", f"{label}_mb_s", "MB/s", vals, note="mindloom ingest, 1 process, wall clock"))
        vals = [c["mb_per_cpu_s"] for r in ing if (c := case(r, tool, "ingest"))]
        if vals:
            out.append(metric("ingest", f"{label}_mb_per_cpu_s", "MB/CPU-s", vals))
    return out


def filters_metrics(runs: list[dict]) -> list[dict]:
    out = []
    for res in [r["filters.json"] for r in runs if "filters.json" in r][-1:]:
        for name, f in res.get("filters", {}).items():
            out.append(metric("filters", f"{name}_vs_datatrove", "×", _ratios(f["datatrove_s"], f["mindloom_s"]),
                              compared=f"datatrove 0.10.1 {name} filter, same documents", headline=True,
                              note="issue 4 asks for the comparison, sets no number"))
            out.append(metric("filters", f"{name}_same_decision", "share", [f["agree_decision"]],
                              compared="datatrove keep/drop decisions"))
    return out


def minhash_metrics(runs: list[dict]) -> list[dict]:
    out = []
    res = runs[-1].get("minhash.json", {}) if runs else {}
    sig = res.get("signatures", {}).get("mb_per_s", {})
    ours = sig.get("mindloom", {}).get("runs", [])
    for peer, label, target in (("datatrove_whitespace", "datatrove 0.10.1 signatures, whitespace words", 4.0),
                                ("datatrove_spacy", "datatrove 0.10.1 signatures, its default spaCy words", 4.0),
                                ("rensa+python_shingles", "rensa 0.5.0 RMinHash, same Python shingles", 1.5)):
        if peer in sig:
            out.append(metric("minhash", f"signatures_vs_{peer.split('+')[0]}", "×",
                              _ratios(ours, sig[peer]["runs"]), compared=label, target=target))
    if ours:
        out.append(metric("minhash", "signatures_mb_s", "MB/s", ours, note="112 permutations, word 5-grams, 1 core"))
    st = res.get("four_stages", {})
    ml = st.get("mindloom", {}).get("seconds", {}).get("runs", [])
    for peer, label in (("datatrove_whitespace", "datatrove 0.10.1 four stages, whitespace words"),
                        ("datatrove_spacy", "datatrove 0.10.1 four stages, spaCy words")):
        if peer in st:
            out.append(metric("minhash", f"full_dedup_vs_{peer}", "×",
                              _ratios(ml, st[peer]["seconds"]["runs"], higher_is_better=False), compared=label,
                              target=3.0))
    mem = res.get("cluster_memory", {}).get("runs", [])
    if len(mem) >= 2:
        grow = [m["peak_rss_mb"] - m.get("rss_before_mb", 0) for m in mem]
        out.append(metric("minhash", "cluster_memory_exponent", "exponent",
                          [loglog_slope([m["docs"] for m in mem], grow)], target=1.0, op="<",
                          compared=f"corpus {mem[0]['scale']}× → {mem[-1]['scale']}× (docs)",
                          note="slope of log(peak RSS above start) on log(documents); < 1 is sublinear"))
    q = res.get("quality", {}).get("check_on")
    if q:
        labels = "labels by their own tokenization" if res["quality"].get("labels") else "labels by the same shingles"
        compared = f"labelled pairs at known Jaccard ({res['quality'].get('pairs')} pairs, {labels})"
        out.append(metric("minhash", "f1_default_threshold", "F1", [q["f1"]], target=0.97, compared=compared))
        for key in ("precision", "recall"):
            out.append(metric("minhash", f"{key}_default_threshold", key, [q[key]], compared=compared))
        for band, share in q.get("found_share_by_band", {}).items():
            kind = "recall" if float(band.split("-")[0]) >= 0.8 else "found_share"
            out.append(metric("minhash", f"{kind}_jaccard_{band}", "share", [share], compared=compared,
                              note=f"{q['pairs_by_band'][band]} planted pairs with label Jaccard in [{band})"))
    return out


def tokenize_metrics(runs: list[dict]) -> list[dict]:
    out = []
    for res in [r["tokenize.json"] for r in runs if "tokenize.json" in r][-1:]:
        enc = res.get("encode_s", {})
        if "1" in enc and "2" in enc:
            out.append(metric("tokenize", "scaling_1_to_2_processes", "×", _ratios(enc["1"], enc["2"]),
                              compared="the same encode with 1 process", target=1.8,
                              note="per repeat pair; outputs identical: " + str(res.get("outputs_identical"))))
        if res.get("tokens") and "1" in enc:
            out.append(metric("tokenize", "tokens_per_s_1_process", "tokens/s",
                              [res["tokens"] / t for t in enc["1"]]))
    return out


def mindrecord_metrics(runs: list[dict]) -> list[dict]:
    by_len: dict[int, list[dict]] = {}
    for r in runs:
        for row in r.get("mindrecord.json", {}).get("results", []):
            by_len.setdefault(row["seq_len"], []).append(row)
    out = []
    for seq, rows in sorted(by_len.items()):
        out.append(metric("mindrecord", f"write_vs_tofile_seq{seq}", "×",
                          [x["write_ratio_vs_tofile"]["sink_1_process"] for x in rows], target=0.5,
                          compared="numpy ndarray.tofile of the same rows (page cache)",
                          note="the chain's sink (pack + FileWriter + index + sha256), 1 process, best of repeats"))
        out.append(metric("mindrecord", f"read_headroom_seq{seq}", "×",
                          [x["read_headroom_vs_training"] for x in rows], target=20,
                          compared="tokens/s the debug model's training consumes",
                          note="MindDataset read as the trainer reads it (shuffle + batch)"))
        share = [x["megatron_share_of_sink"] for x in rows if "megatron_share_of_sink" in x]
        if share:
            out.append(metric("mindrecord", f"megatron_share_of_sink_seq{seq}", "share", share,
                              compared="the MindRecord sink (1 process) on the same documents",
                              note="time of also writing them as Megatron .bin/.idx (pack.formats [mindrecord, "
                                   "megatron]: same task, same pass), over the sink's own time"))
    return out


def train_metrics(runs: list[dict]) -> list[dict]:
    out = []
    res = runs[-1].get("train.json", {}) if runs else {}
    for key, label in (("throughput", "one process, interleaved blocks"),
                       ("throughput_separate_processes", "one process per variant")):
        v = res.get(key, {}).get("variants", {})
        if {"graph", "torch"} <= set(v):
            g, t = v["graph"], v["torch"]
            med = t["step_s_median"] / g["step_s_median"]
            quant = [t[k] / g[k] for k in ("step_s_p10", "step_s_p90") if g.get(k) and t.get(k)]
            vals = sorted([*quant, med])
            m = metric("train", f"graph_vs_torch_eager_{'separate' if 'separate' in key else 'interleaved'}", "×",
                       [med], compared=f"PyTorch {res.get('machine', {}).get('torch', '')} eager, same model, weights "
                       f"and threads ({label})", target=2.0,
                       note="tokens/s ratio of median steps; min/max: ratio of the p10 and p90 steps")
            m.update(min=round(vals[0], 4), max=round(vals[-1], 4))
            out.append(m)
    mem = res.get("memory", {})
    for key, label in (("peak_rss_saving", "peak RSS"), ("activation_saving", "activation memory")):
        if key in mem:
            out.append(metric("train", f"recompute_{key}", "share", [mem[key]], target=0.30 if key ==
                              "peak_rss_saving" else None, compared=f"{label} without recompute (GRAPH mode)"))
    return out


def parallel_metrics(runs: list[dict]) -> list[dict]:
    res = runs[-1].get("parallel.json", {}) if runs else {}
    if not res:
        return []

    def tok(variant):
        return [r["tokens_per_s"] for r in res["runs"] if r["variant"] == variant]

    def first(variant, key):
        return next(r[key] for r in res["runs"] if r["variant"] == variant)

    every1, every10, tp2 = tok("metrics_every_1"), tok("metrics_every_10"), tok("tp2")
    size = f"debug preset, batch {res['batch_size']} x {res['seq_len']} tokens, {res['steps']} steps, fp32 GRAPH"
    out = [metric("parallel", "tokens_per_s_metrics_every_10", "tokens/s", every10, compared=size),
           metric("parallel", "tokens_per_s_metrics_every_step", "tokens/s", every1, compared=size),
           metric("parallel", "metrics_every_10_vs_every_step", "×", _ratios(every10, every1), headline=True,
                  compared="loss/metrics fetched (host sync) after every step, same job"),
           metric("parallel", "tokens_per_s_tp2", "tokens/s", tp2, compared=f"{size}, 2 msrun ranks on 2 cores"),
           metric("parallel", "tp2_vs_tp1", "×", _ratios(tp2, every10), headline=True,
                  compared="TP=1 one process, metrics every 10 steps",
                  note="2 ranks share the 2 cores and add all-reduces: slower on CPU is expected")]
    p1, p2 = first("metrics_every_10", "param_bytes_per_rank")[0], first("tp2", "param_bytes_per_rank")[0]
    o1, o2 = first("metrics_every_10", "optimizer_bytes_per_rank")[0], first("tp2", "optimizer_bytes_per_rank")[0]
    out += [metric("parallel", "tp2_param_bytes_per_rank", "bytes", [p2], compared=f"TP=1: {p1} bytes",
                   note="RMSNorm gains are replicated, everything else halves"),
            metric("parallel", "tp2_optimizer_bytes_per_rank", "bytes", [o2], compared=f"TP=1: {o1} bytes")]
    return out


def memory_plan_metrics(runs: list[dict]) -> list[dict]:
    """Per layout: plan bytes == allocated bytes (exact), predicted vs measured peak RSS and its error (target 15 %)."""
    res = runs[-1].get("memory_plan.json", {}) if runs else {}
    out = []
    for r in res.get("runs", []):
        if r["layout"].startswith("floor_"):
            out.append(metric("memory_plan", f"{r['layout']}_mb", "MB", [r["floor_bytes"] / 2**20],
                              compared=f"framework floor, {r['workers']} rank(s): peak RSS of a near parameter-free "
                                       "model minus its plan"))
            continue
        size = (f"{r['preset']}, {r['workers']} rank(s), batch {r['global_batch']} x {r['seq_len']}, "
                f"{r['steps']} steps")
        exact = all(r["exact"].values())
        out.append(metric("memory_plan", f"{r['layout']}_exact_bytes", "bool", [1.0 if exact else 0.0], target=1.0,
                          compared=f"{size}: plan weights/gradients/optimizer+master bytes vs the tensors built"))
        out.append(metric("memory_plan", f"{r['layout']}_predicted_mb", "MB", [r["predicted_peak_bytes"] / 2**20],
                          compared="floor + max(plan total, host memory at build)"))
        out.append(metric("memory_plan", f"{r['layout']}_peak_rss_mb", "MB",
                          [max(r["measured"]["peak_rss_bytes"]) / 2**20], compared="peak RSS, largest rank"))
        out.append(metric("memory_plan", f"{r['layout']}_peak_error", "share", [r["peak_error"]], target=0.15,
                          op="<=", compared=f"{size}: abs(peak RSS - predicted) / peak RSS"))
    for h in res.get("host_build", []):
        lay = f"{h['preset']}_tp{h['tensor_parallel']}_rank{h['tp_rank']}"
        out.append(metric("memory_plan", f"host_build_{lay}_mb", "MB", [h["measured_bytes"] / 2**20],
                          compared=f"peak RSS above the framework while rank {h['tp_rank']} of TP {h['tensor_parallel']} "
                                   f"builds and draws its {h['preset']} shard ({h['shard_bytes'] / 2**20:.0f} MB); "
                                   f"building the whole model to slice it held "
                                   f"{h['whole_model_before_bytes'] / 2**20:.0f} MB"))
        out.append(metric("memory_plan", f"host_build_{lay}_within_plan", "bool",
                          [1.0 if h["measured_bytes"] <= h["predicted_bytes"] else 0.0], target=1.0,
                          compared=f"measured <= the plan's host_init ({h['predicted_bytes'] / 2**20:.0f} MB: shard + "
                                   f"2 x its largest parameter + 4 MiB)"))
    out += _preset_70b()
    for m in out:  # one compact table in the README block (readme_block._memory_plan), not 2 headline rows each
        m["headline"] = False
    return out


def _preset_70b() -> list[dict]:
    """The shipped 70b layout (memory_plan.PRESET_LAYOUTS) on 64 GB devices: tokens per step, device and host plan."""
    from pipeline.train.config import ModelConfig
    from pipeline.train.memory_plan import PRESET_LAYOUTS, GiB, plan

    lay = PRESET_LAYOUTS["70b"]
    p = plan(ModelConfig.from_preset("70b"), lay, 64)
    where = (f"TP {lay.tp} x DP {lay.dp}, micro-batch {lay.micro_batch} x accumulation {lay.grad_accum} x seq "
             f"{lay.seq_len}, distributed optimizer, recompute, bf16")
    return [metric("memory_plan", "70b_global_batch_tokens", "tokens",
                   [lay.micro_batch * lay.grad_accum * lay.dp * lay.seq_len], target=1 << 20, compared=where),
            metric("memory_plan", "70b_device_gib", "GiB", [p.total / GiB], target=0.9 * 64, op="<=",
                   compared=f"{where}: plan per 64 GB device"),
            metric("memory_plan", "70b_host_build_gib", "GiB", [p.host_init / GiB],
                   compared="plan: host memory per rank while it builds and draws its shard")]


def datasketch_metrics(runs: list[dict]) -> list[dict]:
    res = runs[-1].get("datasketch.json", {}) if runs else {}
    if not res:
        return []
    return [metric("datasketch", "signatures_vs_datasketch", "×", _ratios(res["mindloom_s"], res["datasketch_s"],
                                                                          higher_is_better=False),
                   compared="datasketch 2.0.0 MinHash.update_batch, same shingles", headline=True,
                   note=f"signatures identical: {res.get('identical')}"),
            metric("datasketch", "signatures_identical", "bool", [1.0 if res.get("identical") else 0.0],
                   compared=f"datasketch hashvalues of {res.get('checked_docs')} documents", target=1.0)]


def task_cost_metrics(runs: list[dict]) -> list[dict]:
    """Per mapped step: one task's CPU-s on a near-empty shard (its fixed cost), warm and cold; the 1 MB shard's
    figures and the wall times in the note."""
    res = runs[-1].get("task_cost.json", {}) if runs else {}
    tiny, big = res.get("cases", {}).get("tiny", {}), res.get("cases", {}).get("1mb", {})
    out = []
    for mode, where in (("warm", "in a process that ran a chain before (airflow dags test, mindloom corpus)"),
                        ("cold", "in a fresh Python process (one task per process, as Celery/LocalExecutor run it)")):
        for step, c in tiny.get(mode, {}).items():
            one = big.get(mode, {}).get(step, {})
            out.append(metric("task_cost", f"{step}_{mode}_cpu_s", "CPU-s", [c["cpu_s"]], compared=where,
                              note=f"near-empty shard: {c['cpu_s']} CPU-s, {c['wall_s']} s wall; "
                                   f"{res.get('mb', 1):g} MB shard: {one.get('cpu_s')} CPU-s, {one.get('wall_s')} s "
                                   f"wall; mean of {c['tasks']} task(s)"))
    return out


def scaling_metrics(runs: list[dict]) -> list[dict]:
    import scaling

    return scaling.metrics(runs[-1].get("scaling.json", {})) if runs else []


SCALE_UNITS = {"parallelism_64_over_8_cpu": "×", "sweep_outputs_identical": "bool", "run_4gb_completes": "bool", "peak_task_rss_mb": "MB", "peak_rss_move": "share",
               "chain_mb_per_cpu_s": "MB/CPU-s", "cost_exponent": "exponent", "tokenize_1_to_2_processes": "×",
               "mindrecord_vs_filewriter": "×", "vs_datatrove_mb_per_cpu_s": "×"}


def scale_metrics(runs: list[dict]) -> list[dict]:
    """Issue #13's targets as bench_scale.py computed them (only those measured in its run), plus context."""
    import scale_stats

    res = runs[-1].get("scale.json", {}) if runs else {}
    sizes = " + ".join(f"{r['size_gb']:g} GB" for r in res.get("runs", []))
    out = [metric("scale", t["name"], SCALE_UNITS.get(t["name"], ""), t.get("values") or [t["value"]],
                  target=t["target"], op=t["op"], compared=f"corpus_build via airflow dags test, {sizes}",
                  note=t["note"], worst=t.get("judge") == "worst")
           for t in res.get("targets", []) if t["value"] is not None]
    mr = res.get("side", {}).get("mindrecord", {})
    if mr.get("ratio_vs_tofile") is not None:
        out.append(metric("scale", "mindrecord_vs_tofile", "×", [mr["ratio_vs_tofile"]],
                          compared=f"ndarray.tofile of the same {mr['rows']} rows of {mr['seq_len'] + 1}"))
    for p in res.get("sweep", []):
        out.append(metric("scale", f"sweep_parallelism_{p['parallelism']}_cpu_s", "CPU-s", [p["cpu_s"]],
                          compared=f"corpus_build via airflow dags test, {p['size_gb']:g} GB ({p['corpus_mb']} MB), "
                                   f"parallelism {p['parallelism']}",
                          note=f"{p['task_instances']} task instances; task bodies {p['profile_cpu_s']} CPU-s; "
                               f"{p['mb_per_cpu_s']} MB/CPU-s; wall {p['wall_s']} s; yardstick "
                               f"{p.get('yardstick_cpu_s')} CPU-s; peak task {p.get('peak_task_rss_mb')} MB"))
    for r in res.get("runs", []):
        if r.get("mb_per_cpu_s"):
            out.append(metric("scale", f"chain_mb_per_cpu_s_{r['size_gb']:g}gb", "MB/CPU-s",
                              scale_stats.repeat_values(r, "mb_per_cpu_s") or [r["mb_per_cpu_s"]],
                              compared=f"{r['corpus_mb']} MB generated corpus"))
    return out


def quality_kernels_metrics(runs: list[dict]) -> list[dict]:
    """Issue 34: the CPU of the quality task's per-document parts on the same documents (bench_quality_kernels.py,
    one fresh process per measurement and repeat): the heuristic chains, the classifier's score, the decontamination
    lookup; the last two also as a share of the chains' CPU of the same repeat."""
    res = runs[-1].get("quality_kernels.json", {}) if runs else {}
    sc = res.get("scoring")
    if not sc or "kernels_mb_per_cpu_s" not in sc:
        return []
    docs = f"{sc.get('docs')} documents ({sc['mb']:g} MB)"
    out = [metric("quality_kernels", "heuristics_mb_per_cpu_s", "MB/CPU-s", sc["kernels_mb_per_cpu_s"]["runs"],
                  compared=f"{docs}, each through its domain's default chain (score only), numba kernels", issue=34,
                  note=f"{sc['kernels']['median']} CPU-s (median); the language filter is left out"),
           metric("quality_kernels", "heuristics_kernels_vs_reference", "×", sc["reference_over_kernels"]["runs"],
                  compared="the pure-Python reference path (KERNELS = None), same documents", issue=34,
                  note=f"CPU-s reference / kernels: {sc['reference']['median']} / {sc['kernels']['median']}")]
    clf, dec = res.get("classifier", {}), res.get("decontamination", {})
    if "cpu" in clf:
        held = clf.get("held_out", {})
        out += [metric("quality_kernels", "classifier_score_mb_per_cpu_s", "MB/CPU-s", clf["mb_per_cpu_s"]["runs"],
                       compared=f"{docs}, Scorer.score of each (its first {clf['settings']['max_chars']:,} "
                                f"characters: {clf['mb_read']:g} MB read)", issue=34,
                       note=f"{clf['cpu']['median']} CPU-s (median), model load {clf['load_cpu']['median']} CPU-s apart; "
                            f"floret model trained once per run, untimed ({clf['train_cpu']} CPU-s), default "
                            f"quality.classifier settings on the same corpus: {clf['train']['docs']} training documents, "
                            f"held-out accuracy {held.get('accuracy')} on {held.get('docs')}"),
                metric("quality_kernels", "classifier_over_heuristics_cpu", "share", clf["over_heuristics"]["runs"],
                       compared="the heuristic chains' CPU (kernels), same documents, same repeat", issue=34,
                       headline=True, note="issue 34 asks for the classifier's CPU next to the heuristics, sets no "
                                           "number; the quality task computes both in one pass")]
    if "cpu" in dec:
        out += [metric("quality_kernels", "decontamination_mb_per_cpu_s", "MB/CPU-s", dec["mb_per_cpu_s"]["runs"],
                       compared=f"{docs}, Decontaminator.first_hit of each", issue=34,
                       note=f"{dec['cpu']['median']} CPU-s (median), index load {dec['load_cpu']['median']} CPU-s apart; "
                            f"index of {dec['items']} synthesised items of {dec['item_words']} words from "
                            f"{dec['source_docs']} documents ({dec['ngrams']:,} {dec['n']}-grams), built untimed; "
                            f"{dec['docs_hit']} documents hit"),
                metric("quality_kernels", "decontamination_over_heuristics_cpu", "share", dec["over_heuristics"]["runs"],
                       compared="the heuristic chains' CPU (kernels), same documents, same repeat", issue=34)]
    return out


def _bench(script: str, full: list[str], quick: list[str]):
    return lambda q, r: [[f"benchmarks/{script}", *(quick if q else [a.replace("{r}", str(r)) for a in full])]]


TOPICS: dict[str, dict] = {
    "ingest": {"title": "Ingest throughput vs datatrove", "issue": 3, "python": "project", "needs": [],
               "peers": ["datatrove"], "needs_shared": True, "files": ["ingest.json", "html_extractors.json"],
               "argv": lambda q, r: [["benchmarks/bench_ingest.py"]] + ([] if q else
                                                                        [["benchmarks/bench_ingest.py", "--extractors"]]),
               "once": (1,), "outer_runs": lambda r: r, "metrics": ingest_metrics},
    "filters": {"title": "Quality filters vs datatrove", "issue": 4, "python": "project", "needs": ["datatrove"],
                "files": ["filters.json"], "argv": _bench("bench_filters.py", ["--mb", "4", "--repeats", "{r}"],
                                                          ["--mb", "0.3", "--repeats", "1"]),
                "outer_runs": lambda r: 1, "metrics": filters_metrics},
    "minhash": {"title": "MinHash near-dedup vs datatrove and rensa", "issue": 5, "python": "project",
                "needs": ["datatrove", "rensa"], "files": ["minhash.json"], "timeout": 7200,
                "argv": _bench("bench_minhash.py", ["--repeats", "{r}"],
                               ["--quick", "--repeats", "1", "--sig-mb", "0.3", "--scales", "1,2", "--pairs", "30"]),
                "outer_runs": lambda r: 1, "metrics": minhash_metrics},
    "datasketch": {"title": "MinHash signatures vs plain datasketch", "issue": 5, "python": "project",
                   "needs": ["datasketch"], "files": ["datasketch.json"],
                   "argv": _bench("run_all.py", ["--bench", "datasketch", "--repeats", "{r}"],
                                  ["--bench", "datasketch", "--repeats", "1", "--sig-mb", "0.3"]),
                   "outer_runs": lambda r: 1, "metrics": datasketch_metrics},
    "tokenize": {"title": "Tokenization scaling", "issue": 6, "python": "project", "needs": [],
                 "files": ["tokenize.json"], "argv": _bench("bench_tokenize.py", ["--repeats", "{r}"],
                                                            ["--repeats", "1", "--vocab", "2000"]),
                 "reference_glob": "tokenize_device_*.json", "outer_runs": lambda r: 1, "metrics": tokenize_metrics},
    "mindrecord": {"title": "MindRecord write and read", "issue": 6, "python": "project", "needs": [],
                   "files": ["mindrecord.json"], "argv": _bench("bench_mindrecord.py", ["--repeats", "2"],
                                                                ["--repeats", "1", "--seq-lens", "128"]),
                   "outer_runs": lambda r: r, "metrics": mindrecord_metrics},
    "train": {"title": "Training throughput and recompute memory", "issue": 7, "python": "torch", "needs": ["torch"],
              "files": ["train.json"], "timeout": 7200,
              "argv": _bench("bench_train.py", ["--rounds", "4", "--block", "4", "--separate-rounds", "3",
                                                "--mem-steps", "3"],
                             ["--rounds", "1", "--block", "2", "--skip", "separate,skip", "--mem-steps", "1"]),
              "outer_runs": lambda r: 1, "metrics": train_metrics},
    "parallel": {"title": "Training layouts on CPU: host-sync period, TP=1 vs TP=2", "issue": 15, "python": "project",
                 "needs": [], "files": ["parallel.json"], "timeout": 3600,
                 "argv": _bench("bench_parallel.py", ["--repeats", "{r}"], ["--steps", "6", "--repeats", "1"]),
                 "outer_runs": lambda r: 1, "metrics": parallel_metrics},
    "memory_plan": {"title": "Memory plan vs measured bytes and peak RSS on CPU", "issue": 22, "python": "project",
                    "needs": [], "files": ["memory_plan.json"], "timeout": 5400,
                    "argv": _bench("bench_memory_plan.py", ["--presets", "debug,125m"], ["--presets", "debug"]),
                    "outer_runs": lambda r: 1, "metrics": memory_plan_metrics},
    "task_cost": {"title": "Fixed cost of one mapped task per step", "issue": 33, "python": "project", "needs": [],
                  "files": ["task_cost.json"], "argv": _bench("bench_task_cost.py", [], ["--mb", "0.3"]),
                  "outer_runs": lambda r: 1, "metrics": task_cost_metrics},
    "quality_kernels": {"title": "Quality scoring CPU: heuristic chains, classifier, decontamination", "issue": 34,
                        "python": "project", "needs": [], "files": ["quality_kernels.json"],
                        "argv": _bench("bench_quality_kernels.py", ["--repeats", "{r}"], ["--repeats", "1"]),
                        "outer_runs": lambda r: 1, "metrics": quality_kernels_metrics},
    "scaling": {"title": "The whole data chain at 1×–8×", "issue": 10, "python": "project", "needs": [],
                "files": ["scaling.json"], "argv": _bench("scaling.py", [], ["--quick"]),
                "outer_runs": lambda r: 1, "metrics": scaling_metrics},
    # opt-in (not in run_all's default topics): hours at 1 + 4 GB; `make bench-scale` runs it
    "scale": {"title": "The corpus DAG at scale (1 GB, 4 GB) vs datatrove", "issue": 13, "python": "project",
              "needs": [], "peers": ["datatrove"], "files": ["scale.json"], "timeout": 12 * 3600,
              "argv": lambda q, r: [["benchmarks/bench_scale.py", *(["--quick", "--out", "benchmarks/results/scale.json"]
                                                                    if q else ["--sizes", os.environ.get(
                                                                        "SCALE_SIZES", "1,4")])]],
              "outer_runs": lambda r: 1, "metrics": scale_metrics},
}


# ------------------------------------------------------------------------------------------------------------
# datasketch topic: mindloom's signature engine vs plain datasketch, same documents, same shingles


def _load_shingles():
    """mindloom's shingling module alone (numpy + re): what both tools hash, so only the hashing differs."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("shingles", REPO / "pipeline" / "minhash" / "shingles.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.shingles


def w_datasketch(a: dict) -> dict:
    from datasketch import MinHash

    shingles = _load_shingles()
    texts = json.loads(Path(a["texts"]).read_text(encoding="utf-8"))
    h, t0 = hashlib.sha256(), time.perf_counter()
    for i, text in enumerate(texts):
        m = MinHash(num_perm=112, seed=1, scheme="affine32")
        m.update_batch([s.encode("utf-8") for s in shingles(text, "word", 5)])
        if i < a["check"]:
            h.update(m.hashvalues.astype("<u4").tobytes())
    return {"seconds": time.perf_counter() - t0, "digest": h.hexdigest()}


def w_mindloom(a: dict) -> dict:
    sys.path.insert(0, str(REPO))
    from pipeline.dedup.minhash import MinhashConfig, SignatureEngine

    texts = json.loads(Path(a["texts"]).read_text(encoding="utf-8"))
    eng = SignatureEngine(MinhashConfig(shingle_kind="word", domain_shingles=[], scheme="affine32"))
    eng.compute(texts[:20])                                   # load the compiled kernel, as the peers warm up
    h, t0 = hashlib.sha256(), time.perf_counter()
    sigs = [eng.compute(texts[i:i + 2000]).sig for i in range(0, len(texts), 2000)]
    seconds = time.perf_counter() - t0
    for row in [r for s in sigs for r in s][:a["check"]]:
        h.update(row.astype("<u4").tobytes())
    return {"seconds": seconds, "digest": h.hexdigest()}


WORKERS = {"datasketch": w_datasketch, "mindloom": w_mindloom}


def bench_datasketch(repeats: int, sig_mb: float) -> dict:
    """Interleaved fresh processes of both tools on the corpus, round-robin over domains up to ``sig_mb``."""
    import tempfile

    from common import machine, peer_python

    corpus = REPO.parent / "shared" / "corpora"
    pools = {f.stem: [json.loads(x)["text"] for x in f.read_text(encoding="utf-8").splitlines()]
             for f in sorted(corpus.glob("*.jsonl"))}
    texts, size, i = [], 0, 0
    while size < sig_mb * 1e6 and any(i < len(p) for p in pools.values()):
        for p in pools.values():
            if i < len(p) and size < sig_mb * 1e6:
                texts.append(p[i])
                size += len(p[i].encode("utf-8"))
        i += 1
    out = {"command": " ".join(["benchmarks/run_all.py", *sys.argv[1:]]), "machine": machine(), "docs": len(texts),
           "mb": round(size / 1e6, 2), "check": min(len(texts), 200), "mindloom_s": [], "datasketch_s": []}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False, encoding="utf-8") as fh:
        json.dump(texts, fh)
    args = json.dumps({"texts": fh.name, "check": out["check"]})
    digests = {}
    for rep in range(repeats):
        order = [("mindloom", sys.executable), ("datasketch", str(peer_python("datasketch")))]
        for tool, py in (order if rep % 2 == 0 else order[::-1]):
            p = subprocess.run([py, str(Path(__file__).with_name("run_all.py")), "--worker", tool, args],
                               capture_output=True, text=True, timeout=3600)
            if p.returncode:
                raise RuntimeError(f"{tool} worker failed: {p.stderr[-2000:]}")
            res = json.loads(p.stdout.strip().splitlines()[-1])
            out[f"{tool}_s"].append(round(res["seconds"], 3))
            digests[tool] = res["digest"]
            print(f"  {tool} rep {rep}: {res['seconds']:.2f} s", flush=True)
    Path(fh.name).unlink()
    out["checked_docs"] = out.pop("check")
    out["identical"] = digests["mindloom"] == digests["datasketch"]
    out["mb_per_s"] = {t: spread([out["mb"] / s for s in out[f"{t}_s"]], 3) for t in ("mindloom", "datasketch")}
    return out
