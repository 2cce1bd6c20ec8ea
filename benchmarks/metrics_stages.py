"""Metric entries of run_all's per-stage topics: ingest, filters, minhash, tokenize, mindrecord, datasketch and
quality_kernels.  Each ``<topic>_metrics`` turns the results files of a topic's runs into results.json rows.

Split out of ``topics.py`` (issue 35), which keeps the registry of how each topic runs (``TOPICS``, which names
these functions) and the datasketch runner; the training and whole-chain topics' metrics are in
``metrics_jobs.py``, which shares ``ratios`` from here.  Ratios are mindloom / peer, so > 1 means mindloom is
faster; where a script interleaves repeats of both tools, the ratio is taken per repeat pair.  Only the standard
library and ``common`` are imported at module level: ``run_all.py`` also runs in the datasketch venv.
"""

from __future__ import annotations

import statistics

from common import last_result, loglog_slope, metric, of_last_run


def ratios(ours: list[float], theirs: list[float], higher_is_better: bool = True) -> list[float]:
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
            out.append(metric("filters", f"{name}_vs_datatrove", "×", ratios(f["datatrove_s"], f["mindloom_s"]),
                              compared=f"datatrove 0.10.1 {name} filter, same documents", headline=True,
                              note="issue 4 asks for the comparison, sets no number"))
            out.append(metric("filters", f"{name}_same_decision", "share", [f["agree_decision"]],
                              compared="datatrove keep/drop decisions"))
    return out


def minhash_metrics(runs: list[dict]) -> list[dict]:
    out = []
    res = last_result(runs, "minhash.json")
    sig = res.get("signatures", {}).get("mb_per_s", {})
    ours = sig.get("mindloom", {}).get("runs", [])
    for peer, label, target in (("datatrove_whitespace", "datatrove 0.10.1 signatures, whitespace words", 4.0),
                                ("datatrove_spacy", "datatrove 0.10.1 signatures, its default spaCy words", 4.0),
                                ("rensa+python_shingles", "rensa 0.5.0 RMinHash, same Python shingles", 1.5)):
        if peer in sig:
            out.append(metric("minhash", f"signatures_vs_{peer.split('+')[0]}", "×",
                              ratios(ours, sig[peer]["runs"]), compared=label, target=target))
    if ours:
        out.append(metric("minhash", "signatures_mb_s", "MB/s", ours, note="112 permutations, word 5-grams, 1 core"))
    st = res.get("four_stages", {})
    ml = st.get("mindloom", {}).get("seconds", {}).get("runs", [])
    for peer, label in (("datatrove_whitespace", "datatrove 0.10.1 four stages, whitespace words"),
                        ("datatrove_spacy", "datatrove 0.10.1 four stages, spaCy words")):
        if peer in st:
            out.append(metric("minhash", f"full_dedup_vs_{peer}", "×",
                              ratios(ml, st[peer]["seconds"]["runs"], higher_is_better=False), compared=label,
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
            out.append(metric("tokenize", "scaling_1_to_2_processes", "×", ratios(enc["1"], enc["2"]),
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


@of_last_run("datasketch.json")
def datasketch_metrics(res: dict) -> list[dict]:
    return [metric("datasketch", "signatures_vs_datasketch", "×", ratios(res["mindloom_s"], res["datasketch_s"],
                                                                          higher_is_better=False),
                   compared="datasketch 2.0.0 MinHash.update_batch, same shingles", headline=True,
                   note=f"signatures identical: {res.get('identical')}"),
            metric("datasketch", "signatures_identical", "bool", [1.0 if res.get("identical") else 0.0],
                   compared=f"datasketch hashvalues of {res.get('checked_docs')} documents", target=1.0)]


def quality_kernels_metrics(runs: list[dict]) -> list[dict]:
    """Issue 34: the CPU of the quality task's per-document parts on the same documents (bench_quality_kernels.py,
    one fresh process per measurement and repeat): the heuristic chains, the classifier's score, the decontamination
    lookup; the last two also as a share of the chains' CPU of the same repeat."""
    res = last_result(runs, "quality_kernels.json")
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
                       note=f"{clf['cpu']['median']} CPU-s (median), "
                            f"model load {clf['load_cpu']['median']} CPU-s apart; "
                            f"floret model trained once per run, untimed ({clf['train_cpu']} CPU-s), default "
                            f"quality.classifier settings on the same corpus: "
                            f"{clf['train']['docs']} training documents, "
                            f"cross-fitted accuracy {held.get('accuracy')} on {held.get('docs')}"),
                *_classifier_held_out(clf, held),
                metric("quality_kernels", "classifier_over_heuristics_cpu", "share", clf["over_heuristics"]["runs"],
                       compared="the heuristic chains' CPU (kernels), same documents, same repeat", issue=34,
                       headline=True, note="issue 34 asks for the classifier's CPU next to the heuristics, sets no "
                                           "number; the quality task computes both in one pass")]
    if "cpu" in dec:
        out += [metric("quality_kernels", "decontamination_mb_per_cpu_s", "MB/CPU-s", dec["mb_per_cpu_s"]["runs"],
                       compared=f"{docs}, Decontaminator.first_hit of each", issue=34,
                       note=f"{dec['cpu']['median']} CPU-s (median), "
                            f"index load {dec['load_cpu']['median']} CPU-s apart; "
                            f"index of {dec['items']} synthesised items of {dec['item_words']} words from "
                            f"{dec['source_docs']} documents ({dec['ngrams']:,} {dec['n']}-grams), built untimed; "
                            f"{dec['docs_hit']} documents hit"),
                metric("quality_kernels", "decontamination_over_heuristics_cpu", "share",
                       dec["over_heuristics"]["runs"],
                       compared="the heuristic chains' CPU (kernels), same documents, same repeat", issue=34)]
    return out


def _classifier_held_out(clf: dict, held: dict) -> list[dict]:
    """The shipped classifier's ranking (AUC) and balanced accuracy on its held-out sample, next to fastText's own
    epochs and lr (5, 0.1) trained on the same sample (absent from results made before they were recorded)."""
    if held.get("auc") is None:
        return []
    ft = clf.get("held_out_fasttext_defaults") or {}
    s = clf["settings"]
    same = (f"cross-fitted scores of the training examples ({held['positives']} positive, {held['negatives']} "
            f"negative documents), epochs {s['epochs']}, lr {s.get('lr')}")
    vs = "fastText's own epochs 5, lr 0.1 on the same sample: {}"
    return [metric("quality_kernels", "classifier_held_out_auc", "AUC", [held["auc"]], compared=same, issue=34,
                   note=vs.format(ft.get("auc"))),
            metric("quality_kernels", "classifier_held_out_balanced_accuracy", "share", [held["balanced_accuracy"]],
                   compared=same, issue=34, note=vs.format(ft.get("balanced_accuracy")))]
