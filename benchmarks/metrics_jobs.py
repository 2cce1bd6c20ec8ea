"""Metric entries of run_all's whole-job topics: training (train, parallel, memory_plan) and the whole data
chain (task_cost, scaling, scale).  Each ``<topic>_metrics`` turns the results files of a topic's runs into
results.json rows.

Split out of ``topics.py`` (issue 35), which keeps the registry of how each topic runs (``TOPICS``); the per-stage
topics' metrics are in ``metrics_stages.py`` (imported here for ``ratios`` only, never the other way round).  The
heavier imports (pipeline.train, scaling, scale_stats) stay inside the functions that need them.
"""

from __future__ import annotations

from common import last_result, metric, of_last_run
from metrics_stages import ratios

# ------------------------------------------------------------------------------------------------------------
# Metrics per topic (``runs``: one {results file name: parsed JSON} per run of the script)


def train_metrics(runs: list[dict]) -> list[dict]:
    out = []
    res = last_result(runs, "train.json")
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
    dm = res.get("document_mask", {})
    if "step_cost" in dm:                    # #50: document-aware attention's price on the CPU math path
        v = dm["variants"]
        m = metric("train", "document_mask_step_cost", "×", [dm["step_cost"]], issue=50,
                   compared="causal mask only, same model, weights and packed batches (GRAPH, CPU, interleaved)",
                   note=f"median step time with document-aware attention (the block-diagonal causal mask built "
                   f"from EOD ids, math path) over the causal-only one; documents of {dm['mean_doc_tokens']} tokens "
                   f"on average in rows of {dm['model']['seq_len']}; fastest steps' ratio "
                   f"{dm['step_cost_best']:.3f}; min/max: ratio of the p10 and p90 steps")
        quant = sorted(v["document_mask"][k] / v["causal"][k] for k in ("step_s_p10", "step_s_p90"))
        m.update(min=round(min(quant[0], dm["step_cost"]), 4), max=round(max(quant[-1], dm["step_cost"]), 4))
        out.append(m)
    act = res.get("activation_bound", {})
    shape = act.get("model", {})
    for mode in ("graph", "pynative"):  # per mode: MindSpore 2.10's CPU GRAPH backend does not honour recompute
        if "activation_saving" in act.get(mode, {}):
            base = act[mode]["baseline"]["activation_mb"]
            out.append(metric("train", f"recompute_activation_bound_saving_{mode}", "share",
                              [act[mode]["activation_saving"]], target=0.30,
                              compared=f"activation memory without recompute ({mode.upper()}, {base:.0f} MB): dim "
                              f"{shape.get('dim')}, {shape.get('n_layers')} layers, seq {shape.get('seq_len')}, batch "
                              f"{shape.get('batch')}, fp32, CPU", note="peak RSS during steady steps minus RSS "
                              "before the first step, one fresh process per setting"))
    return out


@of_last_run("parallel.json")
def parallel_metrics(res: dict) -> list[dict]:

    def tok(variant):
        return [r["tokens_per_s"] for r in res["runs"] if r["variant"] == variant]

    def first(variant, key):
        return next(r[key] for r in res["runs"] if r["variant"] == variant)

    every1, every10, tp2 = tok("metrics_every_1"), tok("metrics_every_10"), tok("tp2")
    size = f"debug preset, batch {res['batch_size']} x {res['seq_len']} tokens, {res['steps']} steps, fp32 GRAPH"
    out = [metric("parallel", "tokens_per_s_metrics_every_10", "tokens/s", every10, compared=size),
           metric("parallel", "tokens_per_s_metrics_every_step", "tokens/s", every1, compared=size),
           metric("parallel", "metrics_every_10_vs_every_step", "×", ratios(every10, every1), headline=True,
                  compared="loss/metrics fetched (host sync) after every step, same job"),
           metric("parallel", "tokens_per_s_tp2", "tokens/s", tp2, compared=f"{size}, 2 msrun ranks on 2 cores"),
           metric("parallel", "tp2_vs_tp1", "×", ratios(tp2, every10), headline=True,
                  compared="TP=1 one process, metrics every 10 steps",
                  note="2 ranks share the 2 cores and add all-reduces: slower on CPU is expected")]
    threaded, tp2_threaded = tok("threaded_dispatch"), tok("tp2_threaded_dispatch")
    if threaded and tp2_threaded:  # results before the dispatch variants existed have neither
        out += [metric("parallel", "inline_vs_threaded_dispatch", "×", ratios(every10, threaded), headline=True,
                       compared="TP=1, MindSpore's dispatch thread (MS_DEV_HOST_BLOCKING_RUN=0)",
                       note="CPU jobs dispatch on the calling thread: no waiter spinning on a core the kernels need"),
                metric("parallel", "tp2_inline_vs_threaded_dispatch", "×", ratios(tp2, tp2_threaded),
                       headline=True,
                       compared="TP=2, 2 ranks, MindSpore's dispatch thread (MS_DEV_HOST_BLOCKING_RUN=0)")]
    p1, p2 = first("metrics_every_10", "param_bytes_per_rank")[0], first("tp2", "param_bytes_per_rank")[0]
    o1, o2 = first("metrics_every_10", "optimizer_bytes_per_rank")[0], first("tp2", "optimizer_bytes_per_rank")[0]
    out += [metric("parallel", "tp2_param_bytes_per_rank", "bytes", [p2], compared=f"TP=1: {p1} bytes",
                   note="RMSNorm gains are replicated, everything else halves"),
            metric("parallel", "tp2_optimizer_bytes_per_rank", "bytes", [o2], compared=f"TP=1: {o1} bytes")]
    return out


def memory_plan_metrics(runs: list[dict]) -> list[dict]:
    """Per layout: plan bytes == allocated bytes (exact), predicted vs measured peak RSS and its error (target
    15 %)."""
    res = last_result(runs, "memory_plan.json")
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
                          compared=f"peak RSS above the framework while rank {h['tp_rank']} "
                                   f"of TP {h['tensor_parallel']} "
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
    from pipeline.train.model.config import ModelConfig
    from pipeline.train.model.memory_plan import PRESET_LAYOUTS, GiB, plan

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


def task_cost_metrics(runs: list[dict]) -> list[dict]:
    """Per mapped step: one task's CPU-s on a near-empty shard (its fixed cost), warm and cold; the 1 MB shard's
    figures and the wall times in the note."""
    res = last_result(runs, "task_cost.json")
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


def cluster_graph_metrics(runs: list[dict]) -> list[dict]:
    """Issue #49's targets on the synthetic 1 TB-shape duplicate graph: every clustering task's peak RSS, the CPU
    exponent between the sizes, and the components against one process's union-find."""
    res = last_result(runs, "cluster_graph.json")
    done = res.get("runs", [])
    if not done:
        return []
    sizes = " and ".join(f"{r['graph']['clustered']:.2g}" for r in done)
    where = f"clusters.run_step per task in forked processes, {sizes} clustered documents, check off"
    out = [metric("cluster_graph", "peak_task_rss_mb", "MB", [max(r["peak_task_rss_mb"] for r in done)],
                  target=res["targets"]["peak_task_rss_mb"], op="<=", compared=where, worst=True, headline=True,
                  note="; ".join(f"{r['graph']['clustered']:.2g}: {r['largest_task']['step']} task "
                                 f"{r['largest_task']['task']}, {r['peak_task_rss_mb']} MB" for r in done))]
    if res.get("cpu_exponent") is not None:
        out.append(metric("cluster_graph", "cpu_exponent", "exponent", [res["cpu_exponent"]],
                          target=res["targets"]["cpu_exponent"], op="<=", compared=where, headline=True,
                          note=" → ".join(f"{r['cpu_s']} CPU-s ({r['tasks']} tasks)" for r in done)
                          + (f"; per yardstick {res['cpu_exponent_per_yardstick']} (the machine "
                             f"{res['yardstick_ratio']}x as slow during the large run)"
                             if res.get("cpu_exponent_per_yardstick") is not None else "")))
    checked = [r for r in done if "components_check" in r]
    for r in checked:
        c = r["components_check"]
        out.append(metric("cluster_graph", "components_equal_union_find", "bool", [1.0 if c["equal"] else 0.0],
                          target=1.0, op=">=", compared=f"union-find over every band edge in one process, "
                                                        f"{r['graph']['clustered']:.2g} clustered documents",
                          note=f"{c['nodes']:,} nodes, {c['components']:,} components"))
    for r in done:
        n = f"{r['graph']['clustered']:.0e}".replace("e+0", "e")
        out.append(metric("cluster_graph", f"cpu_s_{n}", "CPU-s", [r["cpu_s"]], compared=where,
                          note=f"{r['tasks']} tasks per step, resolved after round {r['summary']['rounds']}; "
                               + ", ".join(f"{k} {v['cpu_s']}" for k, v in r["steps"].items() if v["cpu_s"] >= 0.5)))
    return out


def scaling_metrics(runs: list[dict]) -> list[dict]:
    import scaling

    return scaling.metrics(runs[-1].get("scaling.json", {})) if runs else []


SCALE_UNITS = {"parallelism_64_over_8_cpu": "×", "sweep_outputs_identical": "bool", "run_4gb_completes": "bool",
               "peak_task_rss_mb": "MB", "peak_rss_move": "share", "chain_mb_per_cpu_s": "MB/CPU-s",
               "cost_exponent": "exponent", "tokenize_1_to_2_processes": "×", "mindrecord_vs_filewriter": "×",
               "vs_datatrove_mb_per_cpu_s": "×"}


def scale_metrics(runs: list[dict]) -> list[dict]:
    """Issue #13's targets as bench_scale.py computed them (only those measured in its run), plus context."""
    import scale_stats

    res = last_result(runs, "scale.json")
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
    if sr := res.get("stage_repeats"):
        g = list(sr["corpus_mb"])
        for step, x in sr["steps"].items():
            out.append(metric("scale", f"{step}_exponent_stage_repeats", "", [x["exponent"]], target=1.05, op="<=",
                              compared=f"{step} alone, {sr['repeats']} interleaved repeats at {g[0]} and {g[-1]} GB",
                              note=f"exponent of the median CPU-s ({x['cpu_s'][g[0]]['median']} → "
                                   f"{x['cpu_s'][g[-1]]['median']}); each pair's: "
                                   f"{', '.join(map(str, x.get('pair_exponents') or []))}"))
    for r in res.get("runs", []):
        if r.get("mb_per_cpu_s"):
            out.append(metric("scale", f"chain_mb_per_cpu_s_{r['size_gb']:g}gb", "MB/CPU-s",
                              scale_stats.repeat_values(r, "mb_per_cpu_s") or [r["mb_per_cpu_s"]],
                              compared=f"{r['corpus_mb']} MB generated corpus"))
    return out
