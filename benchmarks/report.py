"""BENCHMARKS.md from ``benchmarks/results.json``: headline targets, machine, runs, and one section per topic.

Every figure in the page is read from results.json (which holds each topic's metrics and the raw results of its
last run); the only text written here is prose: how to read the tables, and the notes the topic authors wrote about
their benchmarks (kept free of figures, which would go stale).  The detail tables under each topic's metrics
(from the raw results of its last run) are ``report_detail.py``'s; ``scaling.py``, ``bench_scale.py`` and
``ablation.py`` render those of their topics.
"""

from __future__ import annotations

from common import table
from report_detail import fmt, render_detail

NOTES = {
    "memory_plan": (
        "Each layout is a real training job on this CPU (GRAPH mode, byte tokens, eval off). *exact_bytes*: the "
        "plan's weight, gradient and optimizer (+ fp32 master) bytes per rank equal the bytes of the tensors the job "
        "built, on every rank. *peak_error*: the plan's total (or the host memory at model build, whichever is "
        "larger) plus the framework floor of the same launch mode, against the peak RSS of the largest rank: on CPU "
        "the host is the device, so RSS stands in for device memory, and the floor (MindSpore, data pipeline, mccl, "
        "compiled graphs) is measured with a near parameter-free model of the same job shape. The distributed "
        "optimizer runs fp16 O2, whose CPU kernels are slow; 125m runs only a few steps at seq 256. Two rows "
        "locate the peak misses: `tiny4_tp1` is the floor model at debug's depth (a per-layer cost that does not "
        "scale with width: graph and kernel objects), and `debug_v260_tp1` is `debug_tp1` with a 260-token "
        "vocabulary (what the 4096-way logits and loss cost on CPU). The plan's activation and logits terms count "
        "the tensors a memory-reusing device backend keeps for the backward; MindSpore's CPU GRAPH backend holds "
        "several times that at its peak, so on CPU the plan is exact for parameters, gradients and optimizer state "
        "and low for the total."),
    "parallel": (
        "Every variant is a real `run_training` job of the debug preset on byte tokens of stdlib source; tokens/s is "
        "the job summary's steady figure (first step, with the compile, excluded). `metrics_every` is the host-sync "
        "period (issue 15): 1 fetches loss and metrics after every step as the trainer did before. TP=2 runs two "
        "msrun ranks with hand-written tensor parallel on the same 2 cores, so it is slower here; on CPU it "
        "demonstrates correctness (tests: within 1e-5 of one process) and memory per rank, not speed. The "
        "`threaded_dispatch` variants run the same jobs with MindSpore's own dispatch thread "
        "(`MS_DEV_HOST_BLOCKING_RUN=0`), whose waiter spins on a core; CPU jobs dispatch on the calling thread."),
    "ingest": (
        "mindloom `ingest` does more than a datatrove reader: normalization, language ID, hashing, zstd Parquet, "
        "rejects and stats; mindloom `reader only` for WARC includes HTML extraction (Resiliparse), datatrove's does "
        "not. Wall-clock MB/s suffers most from other jobs on a shared machine; MB/CPU-s (user + sys of "
        "single-process runs, imports included) is the like-for-like figure. datatrove's WarcReader yields fewer "
        "documents (Docs out): without a `WARC-Identified-Payload-Type` header it sniffs the body with libmagic and "
        "silently drops pages it calls `text/xml` or `application/javascript`, ignoring their HTTP "
        "`Content-Type: text/html`; mindloom keeps them and counts every skip. Input: the seven JSONL files of the "
        "shared corpora and `web.warc.gz` twice; MB are input bytes (WARC uncompressed). The extractor table scores "
        "main-content extraction on the raw pages of `web_html` against each page's own main-content element."),
    "filters": (
        "Differences come from word splitting: datatrove uses spaCy, mindloom one regular expression that imitates it "
        "(inner punctuation kept, hyphens split, abbreviations keep their period); the top disagreements are listed "
        "in `benchmarks/results/filters.json`. The chain row is not like for like in work done: mindloom scores all "
        "four filters for every document (stored for re-tuning), datatrove stops at the first drop. Documents: the "
        "English domains of the shared corpora, normalized as ingest does, round-robin over the domains."),
    "minhash": (
        "Signatures: 112 permutations (14 × 8), word 5-grams, one core; datatrove's `MinhashDedupSignature` with its "
        "default spaCy word tokenizer and with a whitespace tokenizer (the charitable comparison), rensa fed with "
        "mindloom's own Python shingles. Four stages: the whole corpus as Parquet shards, sequential tasks, "
        "datatrove's `LocalPipelineExecutor(workers=1)`. Cluster memory: the corpus plus replicas whose words go "
        "through a per-replica bijection of the vocabulary (same duplicate structure, no shared shingles). Quality: "
        "real documents each with one variant edited to a known label Jaccard, equally many per band 0.5–0.6 … "
        "0.9–1.0; labels use their own tokenization (whitespace 4-grams as written), not the deduplicator's "
        "shingles; a pair is positive at label Jaccard ≥ 0.8 and predicted positive when both documents end in one "
        "cluster."),
    "datasketch": (
        "Plain datasketch is what most in-house scripts use. Both tools hash the same shingles (mindloom's "
        "`pipeline/dedup/minhash/shingles.py`, imported from the repository in the datasketch venv), so the ratio is "
        "the hashing engine alone, and the signatures of the first documents are compared bit for bit."),
    "tokenize": (
        "`tokenizer.encode_texts`: this process plus N−1 spawned children, chunks dealt dynamically, outputs "
        "identical for every N. On a shared 2-core machine two encoding processes compete with every other job, so "
        "the 1 → 2 ratio measured here is a floor; the quiet-host runs (export with `--export DIR`, then "
        "`--encode-only DIR --workers 1,2,4` on that host) show the scaling without that competition. Pool start-up "
        "is hidden because this process encodes while the children start. The encyclopedia byte-fallback share "
        "comes from its Bulgarian Wikipedia sample (Cyrillic is rare in the tokenizer sample)."),
    "mindrecord": (
        "\"Sink\" is what the corpus chain runs (`mindrecord.write_token_set`: pack, 2 shard files, `domain_id` "
        "index field, content hash, sha256 of the files, manifest); payload = int32 rows. The ≥ 0.5× `tofile` "
        "target is out of reach with `FileWriter` itself (the bare writer column): per row it runs Python schema "
        "checks, varint-compresses the ints and inserts an SQLite index row. In context, what matters is that the "
        "sink writes faster than tokenization produces tokens and that reads outpace training by far (headroom). "
        "Two writer processes lose on 2 busy cores (spawn + MindSpore import each); they are for many-core workers."),
    "train": (
        "Throughput: the three variants run interleaved in short blocks in one process with the same thread count, so "
        "they see the same load; the PyTorch model mirrors `pipeline.train.model.model` parameter for parameter and "
        "starts from the same weights (the first-step losses are checked to agree): fp32, AdamW (0.9/0.95, wd 0.1), "
        "global-norm clip 1.0. The separate-process row runs one variant per process, alternating. Memory: each "
        "recompute setting in a fresh GRAPH-mode process, peak RSS sampled every 2 ms during the steady steps."),
    "scaling": (
        "Read the CPU exponent first: wall seconds on a shared machine move with other jobs. Fixed costs (imports, "
        "MindSpore start-up in the MindRecord and validation writers, the tokenizer trained on a fixed-size sample) "
        "dominate the small scales and pull the exponent below 1; the per-stage exponents show which stages grow "
        "with the data (ingest, MinHash, quality, tokenize) and which do not. Every copy beyond 1× is either an "
        "exact copy, a near-duplicate or a heavily edited new document, so dedup and the filters do real work."),
    "scale": (
        "The input is built by `benchmarks/scale_corpus.py`: every generated document is runs of consecutive "
        "paragraphs (lines for short documents) drawn by a seeded RNG from many source documents of one domain of "
        "the shared corpora, with a length drawn from that domain's own documents, so each domain keeps its "
        "language and size profile and no two documents are exact or near copies; in each use of a paragraph its "
        "words are shuffled in blocks of four, so a paragraph used a hundred times does not recur verbatim "
        "(benchmarks/README.md says why). The chain is the real "
        "`corpus_build` DAG under `airflow dags test`, which in Airflow 3.3 runs every task in the CLI process one "
        "after the other: per-stage CPU and wall are sums over the stage's task instances (intervals from the "
        "run's `task_instance` rows, CPU from 0.2 s samples of the process tree), and a task's peak RSS includes "
        "the Airflow process itself (see *RSS at start*). When the tasks write `profile/` files "
        "(`pipeline.profile.measured`) those are used instead. Whole-chain MB/CPU-s counts every CPU-second of "
        "`airflow dags test`, Airflow's own included. datatrove runs FineWeb's filters, its four MinHash stages and "
        "its DocumentTokenizer (local byte-level BPE of the same vocabulary size) with one task per input file; "
        "it does no ingest normalization, exact dedup, mixture, packing or MindRecord writing, its "
        "LanguageFilter drops the Chinese and code documents that mindloom's chains keep, and its English Gopher "
        "rules drop most non-web documents, so its MinHash and tokenizer see far fewer documents (both sides' kept "
        "counts are in the tables)."),
    "cluster_graph": (
        "No corpus of 1 TB fits this machine, so the graph is synthetic and the run is the real one: "
        "`benchmarks/cluster_graph.py` writes what MinHash stages 1 and 2 leave for a corpus with 30 % of its "
        "documents in clusters (cluster sizes with P(size >= s) = (2/s)^2, members scattered over every shard, band "
        "runs where each member agrees with its cluster on a band with probability s^8 for a similarity s uniform in "
        "[0.75, 1], so several bands find a pair and different bands pick different anchors; survivor fields in "
        "signature files of 20,000 rows), and every task of every clustering step runs as the DAG's task body does "
        "(`clusters.run_step`), each in a process of its own forked from one that only imported the pipeline, two "
        "at a time. The Jaccard check is off: there is no text of that size here (its cost on real text is in "
        "*scale*). CPU is the tasks' own, summed; the graph's generation is not counted. The smallest size's "
        "labels are compared node by node with union-find over every band edge in one process."),
    "ablation": (
        "Small-model proxies: the `debug` model and a few hundred thousand tokens per run, far below DCLM's "
        "smallest scale (412 M parameters, 8.2 B tokens) and FineWeb's ablation models (1.8 B parameters, 28 B "
        "tokens), whose method this follows in miniature: the ablation DAG's steps (`mindloom ablation`), every arm "
        "on the same tokens per domain (matched mixture), several seeds, paired differences in bits per byte on "
        "references held out at source level before ingest, an A/A noise floor and a positive control "
        "(docs/ablation.md). A difference is read only when its interval excludes zero, it clears the floor and "
        "the control was detected."),
}


ORDER = ("ingest", "filters", "quality_kernels", "minhash", "cluster_graph", "datasketch", "tokenize", "mindrecord",
         "train", "scaling", "scale", "ablation")


def _ordered(topics: dict) -> list[tuple[str, dict]]:
    return sorted(topics.items(), key=lambda kv: ORDER.index(kv[0]) if kv[0] in ORDER else len(ORDER))


def _met(m: dict) -> str:
    return {True: "yes", False: "**no**", None: "–"}[m["met"]]


def metric_rows(metrics: list[dict], with_topic_issue: bool) -> list[list]:
    rows = []
    for m in metrics:
        rng = f"{fmt(m['min'], m['unit'])} – {fmt(m['max'], m['unit'])}"
        row = [f"`{m['name']}`", m["target"] or "–", fmt(m["median"], m["unit"]), rng, len(m["runs"]) or 1,
               m["compared"] or "–", _met(m)]
        if with_topic_issue:
            row.insert(1, f"#{m['issue']}")
        rows.append(row)
    return rows


def headline(results: dict) -> str:
    ms = [m for m in results.get("metrics", []) if m.get("headline")]
    return "\n".join(table(["Metric", "Issue", "Target", "Median", "Min – max", "Runs", "Compared with", "Met"],
                           metric_rows(ms, True)))


def render(results: dict) -> str:
    m = results.get("machine", {})
    load = m.get("load_avg_start") or []
    lines = ["# Benchmarks", "",
             "<!-- Generated by benchmarks/run_all.py from benchmarks/results.json: "
             "edit the scripts, not this file. -->",
             "",
             f"Generated from `benchmarks/results.json` (mode **{results.get('mode', '?')}**, run started "
             f"{results.get('started', '?')}, {results.get('wall_s', '?')} s, repeats {results.get('repeats', '?')}). "
             "Re-run everything with `make bench` (installs the peers in `.cache/bench-venvs/` when missing, runs "
             "every topic one after the other, regenerates this page), the data ablation with `make ablation`, a "
             "smoke run with `.venv/bin/python benchmarks/run_all.py --quick`, and only this page with "
             "`.venv/bin/python benchmarks/run_all.py --report-only`. Ratios are mindloom ÷ peer (> 1: mindloom "
             "faster); min – max are over repeats; *Met* compares the median with the target (the worst run where "
             "every run must meet it: peak memory, dedup recall).", "",
             "## Machine", "",
             f"Read at the start of the last invocation of `run_all.py` (topics: "
             f"{', '.join(results.get('last_invocation') or ['?'])}); the load average before every script run is in "
             "the Runs table.", ""]
    lines += table(["CPU", "Cores", "RAM", "Load average at start (1/5/15 min)", "at end", "Python", "OS"],
                   [[m.get("cpu"), m.get("cores"), f"{m.get('ram_gb')} GiB", " / ".join(map(str, load)),
                     " / ".join(map(str, results.get("load_avg_end") or [])) or "–", m.get("python"), m.get("os")]])
    lines += ["", "Other jobs share this machine (see the load averages): wall-clock figures and multi-process "
              "ratios are pessimistic; repeats are interleaved between tools so both see the same load.", "",
              "## Targets from the issues", "", headline(results), "", "## Runs", ""]
    rows = []
    for name, rec in _ordered(results.get("topics", {})):
        wall = rec.get("wall_s") or []
        rows.append([name, f"#{rec.get('issue')}", rec.get("date"), len(wall), f"{sum(wall):.0f}" if wall else "–",
                     f"{max(rec.get('peak_rss_mb') or [0]):.0f}" if rec.get("peak_rss_mb") else "–",
                     " / ".join(str(x) for x in rec.get("load_avg_before", [])[:4]) or "–",
                     rec.get("status", "")[:160].replace("|", "/").replace("\n", " ")])
    lines += table(["Topic", "Issue", "Measured (UTC)", "Script runs", "Wall s (all runs)",
                    "Peak RSS of the process tree, MB", "Load avg before", "Status"], rows)
    for name, rec in _ordered(results.get("topics", {})):
        lines += ["", f"## {rec.get('title', name)} (issue {rec.get('issue')})", ""]
        if rec.get("commands"):
            lines += ["Commands (from the repository root):", "", "```", *rec["commands"], "```", ""]
        ms = [x for x in results.get("metrics", []) if x["topic"] == name]
        if ms:
            lines += table(["Metric", "Target", "Median", "Min – max", "Runs", "Compared with", "Met"],
                           metric_rows(ms, False)) + [""]
            lines += [f"- `{x['name']}`: {x['note']}" for x in ms if x.get("note")] + [""]
        if not rec.get("status", "ok").startswith("ok") and not rec.get("results"):
            lines += [f"Not measured: {rec['status']}", ""]
        if rec.get("results"):
            try:
                lines += render_detail(name, rec)
            except Exception as exc:  # noqa: BLE001 - a changed results format must not lose the whole page
                lines += [f"(detail table unavailable: {type(exc).__name__}: {exc})"]
        if rec.get("last_attempt"):
            lines += ["", f"Last attempt {rec['last_attempt']['date']}: {rec['last_attempt']['status']}"]
        if name in NOTES:
            lines += ["", f"Notes: {NOTES[name]}"]
    return "\n".join(lines).rstrip() + "\n"
