"""BENCHMARKS.md's per-topic detail tables (``render_detail``, called by ``report.render``), from the raw results
of each topic's last run, and ``fmt``, the one way the page prints a metric value.

Split out of ``report.py`` (issue 35), which keeps the page itself: headline targets, machine, runs, the metric
table and notes of every topic.  ``fmt`` lives here, in the module ``report`` imports, because both the metric
tables and these detail tables use it; ``report.fmt`` stays the name callers use.  Sections of ``scaling``,
``scale`` and ``ablation`` are rendered by their own modules.
"""

from __future__ import annotations

from common import table


def fmt(v, unit: str) -> str:
    """How a metric value is printed (the smoke test formats the JSON median the same way)."""
    if v is None:
        return "–"
    if unit == "×":
        return f"{v:,.0f}×" if abs(v) >= 100 else f"{v:.2f}×" if abs(v) >= 0.1 else f"{v:.2g}×"
    if unit == "share":
        return f"{100 * v:.1f} %"
    if unit == "bool":
        return "yes" if v >= 1 else "no"
    if unit == "nats":
        return f"{v:+.3f}"
    if unit in ("F1",):
        return f"{v:.4f}"
    if unit == "exponent":
        return f"{v:.2f}"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.2f}"


# ------------------------------------------------------------------------------------------------------------
# Per-topic detail tables, from the raw results of the topic's last run


def render_detail(name: str, rec: dict) -> list[str]:
    fn = {"ingest": _ingest, "tokenize": _tokenize}.get(name)
    if fn:
        return fn(rec["results"], rec)
    if name in ONE_FILE:                # a topic with one results file: its table, or nothing before its first run
        r = rec["results"].get(f"{name}.json")
        return ONE_FILE[name](r) if r else []
    if name == "scaling":
        import scaling

        return scaling.markdown(rec["results"].get("scaling.json", {}))
    if name == "scale":
        import bench_scale

        return bench_scale.markdown(rec["results"].get("scale.json", {}))
    if name == "ablation":
        import ablation

        return ablation.markdown(rec["results"].get("ablation.json", {})).splitlines()
    return []


def _n(v, digits: int = 2):
    return "–" if v is None else (f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.{digits}f}")


def _ingest(res: dict, rec: dict) -> list[str]:
    out = []
    ing = res.get("ingest.json")
    if ing:
        out += ["Last run, every case:", ""]
        out += table(["Tool", "Case", "Input MB", "Processes", "Docs out", "Wall s", "MB/s", "MB/CPU-s"],
                     [[c["tool"], c["case"], c["mb"], c["processes"], c.get("docs"), c["wall_s"], c["mb_s"],
                       c.get("mb_per_cpu_s")] for c in ing.get("cases", [])])
    ext = res.get("html_extractors.json")
    if ext:
        out += ["", f"HTML main-content extraction on the {ext['pages']} pages of `web_html` ({ext['mb']} MB), "
                "bag-of-words against each page's main-content element (`bench_ingest.py --extractors`):", ""]
        out += table(["Extractor", "Precision", "Recall", "F1", "ms/page", "MB/s"],
                     [[k, e["precision"], e["recall"], e["f1"], e["ms_per_page"], e["mb_s"]]
                      for k, e in ext.get("extractors", {}).items()])
    return out


def _filters(f: dict) -> list[str]:
    out = [f"{f['docs']} documents ({f['mb']:.1f} MB), {f['repeats']} interleaved runs per tool, datatrove with "
           f"spaCy {f.get('spacy')}:", ""]
    out += table(["Filter", "mindloom MB/s", "datatrove MB/s", "Speed-up (median times)", "Same keep/drop",
                  "Same reason", "Drops mindloom / datatrove"],
                 [[k, _n(r["mindloom_mb_s"]), _n(r["datatrove_mb_s"]), fmt(r["speedup"], "×"),
                   fmt(r["agree_decision"], "share"), fmt(r["agree_reason"], "share"),
                   f"{r['mindloom_drops']} / {r['datatrove_drops']}"] for k, r in f.get("filters", {}).items()])
    return out


def _spr(s: dict | None, digits: int = 2) -> str:
    if not s or s.get("median") is None:
        return "–"
    return f"{_n(s['median'], digits)} ({_n(s['min'], digits)} – {_n(s['max'], digits)})"


def _minhash(r: dict) -> list[str]:
    out = []
    sig = r.get("signatures")
    if sig:
        out += [f"Signatures on {sig['docs']} documents ({sig['mb']} MB), MB/s median (min – max):", ""]
        out += table(["Tool", "MB/s"], [[k, _spr(v)] for k, v in sig.get("mb_per_s", {}).items()])
    st = r.get("four_stages")
    if st:
        out += ["", f"Four stages on {st['docs']} documents, {st['shards']} shards ({st['mb']} MB), seconds median "
                "(min – max):", ""]
        tools = [k for k, v in st.items() if isinstance(v, dict) and "seconds" in v]
        out += table(["Tool", "Seconds", "Removed", "Signatures s", "Buckets s", "Clusters s", "Removal s"],
                     [[k, _spr(st[k]["seconds"]), st[k].get("removed"),
                       *(st[k].get("stages_median", {}).get(s) for s in ("signatures", "buckets", "clusters",
                                                                         "removal"))] for k in tools])
    mem = r.get("cluster_memory", {}).get("runs", [])
    if mem:
        out += ["", "Cluster stage as the corpus grows (fresh process per scale):", ""]
        out += table(["Scale", "Documents", "Docs in clusters", "Peak RSS MB", "RSS before MB", "Seconds"],
                     [[f"{m['scale']}×", m["docs"], m.get("docs_in_clusters"), m["peak_rss_mb"],
                       m.get("rss_before_mb"), _n(m.get("seconds"))] for m in mem])
    q = r.get("quality")
    if q:
        out += ["", f"Precision / recall on {q.get('pairs')} labelled pairs ({q.get('positives')} positive):", ""]
        out += table(["Jaccard check", "Precision", "Recall", "F1", "TP / FP / FN"],
                     [[k.replace("check_", ""), v["precision"], v["recall"], v["f1"],
                       f"{v['tp']} / {v['fp']} / {v['fn']}"] for k, v in q.items() if k.startswith("check_")])
        on = q.get("check_on", {})
        if on.get("found_share_by_band"):
            out += ["", f"Labels: {q.get('labels', 'word 5-gram Jaccard')}. Share of planted pairs found per label "
                    "Jaccard band (recall at ≥ 0.8, false-positive rate below):", ""]
            out += table(["Label Jaccard", "Pairs", "Found, check on", "Found, check off"],
                         [[b, on["pairs_by_band"][b], on["found_share_by_band"][b],
                           q.get("check_off", {}).get("found_share_by_band", {}).get(b)]
                          for b in on["found_share_by_band"]])
    return out


def _datasketch(r: dict) -> list[str]:
    return [f"{r['docs']} documents ({r['mb']} MB); signatures of the first {r['checked_docs']} identical: "
            f"**{'yes' if r['identical'] else 'no'}**.", ""] + table(
        ["Tool", "Seconds per run", "MB/s median (min – max)"],
        [[t, " ".join(map(str, r[f"{t}_s"])), _spr(r["mb_per_s"][t])] for t in ("mindloom", "datasketch")])


def _tokenize(res: dict, rec: dict) -> list[str]:
    r = res.get("tokenize.json")
    out = []
    if r:
        out += [f"{r.get('docs')} documents, {r.get('text_mb')} MB, {r.get('tokens'):,} tokens, vocab "
                f"{r.get('vocab_size')}; outputs identical for every process count: {r.get('outputs_identical')}.", ""]
        out += table(["Processes", "Encode seconds (each repeat)", "MB/s (best)", "tokens/s (best)"],
                     [[w, " ".join(map(str, ts)), r["encode_mb_per_s"].get(w), f"{r['encode_tokens_per_s'].get(w):,}"]
                      for w, ts in r.get("encode_s", {}).items()])
        pd = r.get("per_domain", {})
        if pd:
            out += ["", "Bytes per token per domain (byte-fallback share of tokens):", ""]
            out += table(["Domain", "Docs", "Bytes/token", "Byte fallback"],
                         [[d, v["docs"], v["bytes_per_token"], fmt(v["byte_fallback_share"], "share")]
                          for d, v in pd.items()])
    ref = rec.get("reference") or {}
    if ref:
        out += ["", "Earlier `--encode-only` runs on a quiet host (results files kept in `benchmarks/results/`; not "
                "part of this run):", ""]
        out += table(["File", "Host", "Text MB", "Chunk chars", "1 process s", "2 processes s", "Ratio of medians"],
                     [[f, f"{x['machine'].get('cpus')} cores, load {x['machine'].get('load_avg_1m_at_start')}",
                       x.get("text_mb"), x.get("chunk_chars"), " ".join(map(str, x["encode_s"].get("1", []))),
                       " ".join(map(str, x["encode_s"].get("2", []))), fmt(_median_ratio(x["encode_s"]), "×")]
                      for f, x in sorted(ref.items())])
    return out


def _median_ratio(enc: dict) -> float | None:
    import statistics

    if not enc.get("1") or not enc.get("2"):
        return None
    return statistics.median(enc["1"]) / statistics.median(enc["2"])


def _mindrecord(r: dict) -> list[str]:
    out = [f"Last run: {r.get('tokens'):,} tokens (vocab {r.get('vocab_size')}), best of repeats:", ""]
    rows = r.get("results", [])
    keys = ["numpy_tofile", "numpy_tofile_fsync", "filewriter_bare", "sink_1_process", "sink_2_processes"]
    out += table(["seq_len", *[f"write {k} MB/s" for k in keys], "sink ÷ tofile"],
                 [[x["seq_len"], *[x["write_mb_per_s"].get(k) for k in keys],
                   fmt(x["write_ratio_vs_tofile"]["sink_1_process"], "×")] for x in rows])
    out += ["", ""]
    out += table(["seq_len", "MindDataset plain tok/s", "trainer-like tok/s", "numpy memmap tok/s",
                  "training consumes tok/s", "headroom"],
                 [[x["seq_len"], f"{x['read_tokens_per_s']['minddataset_plain']:,}",
                   f"{x['read_tokens_per_s']['minddataset_trainer_like']:,}",
                   f"{x['read_tokens_per_s']['numpy_memmap_random_rows']:,}",
                   f"{x['training_tokens_per_s']:,} ({x.get('training_rate_source')})",
                   fmt(x["read_headroom_vs_training"], "×")] for x in rows])
    return out


def _train(r: dict) -> list[str]:
    out = [f"Model {r.get('model')}; MindSpore {r.get('machine', {}).get('mindspore')}, PyTorch "
           f"{r.get('machine', {}).get('torch')}.", ""]
    for key, label in (("throughput", "interleaved in one process"),
                       ("throughput_separate_processes", "one process per variant")):
        v = r.get(key, {}).get("variants", {})
        if v:
            out += [f"Throughput, {label}:", ""]
            out += table(["Variant", "tokens/s (median step)", "step s median", "step s p10", "step s p90", "steps",
                          "first step s"],
                         [[k, _n(x.get("tokens_per_s_median")), _n(x.get("step_s_median"), 3),
                           _n(x.get("step_s_p10"), 3), _n(x.get("step_s_p90"), 3), x.get("steps"),
                           _n(x.get("first_step_s"))] for k, x in v.items()]) + [""]
    mem = r.get("memory", {})
    if "baseline" in mem:
        out += [f"Memory, model {mem.get('model')}:", ""]
        out += table(["Recompute", "Steady peak RSS MB", "Activation MB (peak − before)", "Compile s",
                      "Step s median"],
                     [[k, _n(x.get("steady_peak_rss_mb")), _n(x.get("steady_activation_mb")), _n(x.get("compile_s")),
                       _n(x.get("step_s_median"), 3)] for k, x in ((k, mem[k]) for k in ("baseline", "recompute"))])
        out += ["", f"Losses equal with and without recompute: {mem.get('losses_equal')}."]
    return out


ONE_FILE = {"filters": _filters, "minhash": _minhash, "datasketch": _datasketch, "mindrecord": _mindrecord,
            "train": _train}
