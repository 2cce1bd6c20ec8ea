"""Every benchmark against its peers in one run, then ``benchmarks/results.json`` and ``BENCHMARKS.md`` from it.

    python benchmarks/run_all.py                  # what `make bench` runs: peers installed when missing, all topics
    python benchmarks/run_all.py --quick          # small inputs, 1 repeat, in a staged copy (repo results untouched)
    python benchmarks/run_all.py --topics tokenize,filters --no-install
    python benchmarks/run_all.py --report-only    # re-render BENCHMARKS.md from results.json

Each topic is its own script (``bench_<topic>.py``, written by the engineer of that stage), which already runs
mindloom and its peers interleaved on the same input and writes ``benchmarks/results/<topic>.json``.  This driver
runs them one after the other — never two at once, they share the cores — each under a sampler of the peak memory
of its whole process tree; scripts that keep no per-repeat figures are run ``--repeats`` times.  It then turns the
results files into metrics (one entry per figure, with min / median / max over repeats, the peer it is compared
with, the target of the issue that set it, and whether the median meets it) and renders BENCHMARKS.md from them:
no figure is typed by hand.  results.json names each topic's results files; their content lives once, under
``results/`` (``common.read_results``).  Topic notes (the prose the topic authors wrote) live in ``report.NOTES``.

``--quick`` runs every script on a tiny slice of the corpus (``common.tiny_corpus``) inside a staged copy of the
repository (``common.stage_tree``) and writes results.json/BENCHMARKS.md to ``--out`` (default: a temp folder).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402
import report  # noqa: E402
import topics  # noqa: E402
from common import REPO  # noqa: E402

TOPIC_ORDER = ("ingest", "filters", "quality_kernels", "minhash", "datasketch", "tokenize", "mindrecord", "train",
               "parallel", "memory_plan", "scaling", "task_cost", "cluster_graph")
OPT_IN = tuple(n for n, t in topics.TOPICS.items() if t.opt_in)  # only when named (make bench-scale, make ablation)


def _python_for(topic: topics.Topic, peers: dict) -> Path | None:
    return Path(sys.executable) if topic.python == "project" else peers.get(topic.python)


def run_topic(name: str, repo: Path, quick: bool, repeats: int, peers: dict, peer_status: dict,
              corpus: Path | None, log: Path) -> tuple[dict, list[dict]]:
    """Run one topic's script(s); returns (topic record for results.json, one {file: json} per outer run)."""
    spec = topics.TOPICS[name]
    record = {"title": spec.title, "issue": spec.issue, "commands": [], "wall_s": [], "peak_rss_mb": [],
              "cpu_s": [], "load_avg_before": [], "status": "ok", "date": common.now()}
    missing = [p for p in spec.needs if peers.get(p) is None]
    if spec.needs_shared and not (corpus and (corpus / "web.warc.gz").exists()):
        missing.append("the shared corpora (../shared/corpora with web.warc.gz)")
    if missing:
        why = "; ".join(peer_status.get(p, p) if p in common.PEERS else p for p in missing)
        record["status"] = f"skipped: needs {', '.join(missing)} ({why})"
        return record, []
    python = _python_for(spec, peers)
    argv_sets = spec.argv(quick, repeats)
    outer = 1 if quick else spec.outer_runs(repeats)
    runs: list[dict] = []
    results = repo / "benchmarks" / "results"
    started = time.time() - 1
    for i in range(outer):
        for k, argv in enumerate(argv_sets):
            if i > 0 and k in spec.once:           # e.g. ingest --extractors: not a timing, run once
                continue
            cmd = [str(python), *argv]
            record["load_avg_before"].append(round(os.getloadavg()[0], 2))
            print(f"[run_all] {name} run {i + 1}/{outer}: {' '.join(cmd[1:])}", flush=True)
            res = common.run_measured(cmd, cwd=repo, log=log, timeout=spec.timeout)
            shown = f"{_shown_python(python)} {' '.join(cmd[1:])}".replace(str(repo) + "/", "")
            if shown not in record["commands"]:
                record["commands"].append(shown)
            for key in ("wall_s", "peak_rss_mb", "cpu_s"):
                record[key].append(res[key])
            print(f"[run_all]   rc {res['rc']}, {res['wall_s']} s, peak tree RSS {res['peak_rss_mb']} MB",
                  flush=True)
            if res["rc"] != 0:
                record["status"] = f"failed (rc {res['rc']}): {common.tail(log, 6)}"
                return record, runs
        runs.append({f: json.loads((results / f).read_text()) for f in spec.files      # written by this run only
                     if (results / f).exists() and (results / f).stat().st_mtime >= started})
    if spec.reference_glob:            # earlier runs elsewhere (e.g. a quiet host), shown apart, never mixed in
        record["reference"] = {f.name: json.loads(f.read_text())
                               for f in sorted(common.RESULTS_DIR.glob(spec.reference_glob))}
    return record, runs


def _shown_python(python: Path) -> str:
    try:
        return str(python.relative_to(REPO))
    except ValueError:
        return ".venv/bin/python" if Path(python) == Path(sys.executable) else str(python)


# ------------------------------------------------------------------------------------------------------------
# results.json


def load_results(path: Path) -> dict:
    """results.json with each topic's results files read in from ``results/`` (their one copy)."""
    if path.exists():
        return common.read_results(path)
    return {"generated_by": "benchmarks/run_all.py", "topics": {}, "metrics": []}


def merge_topic(results: dict, name: str, record: dict, runs: list[dict], metrics: list[dict]) -> dict:
    """Replace one topic's record, raw results and metrics; other topics keep theirs (with their own dates)."""
    if runs:
        record["results"] = runs[-1]
        # earlier runs of the script (metrics span all of them), without the files the last run kept unchanged (a
        # command run once, such as ingest --extractors): every figure is kept once
        record["all_results"] = [{f: c for f, c in r.items() if c != runs[-1].get(f)} for r in runs[:-1]]
    elif name in results["topics"] and record["status"].startswith("skipped"):
        old = results["topics"][name]                      # a skipped topic keeps its last measurement
        old["last_attempt"] = {"date": record["date"], "status": record["status"]}
        return results
    results["topics"][name] = record
    results["metrics"] = [m for m in results["metrics"] if m["topic"] != name] + metrics
    return results


def topic_metrics(name: str, runs: list[dict]) -> list[dict]:
    return topics.TOPICS[name].metrics(runs) if name in topics.TOPICS and runs else []


def recompute_metrics(results: dict) -> dict:
    """Metrics again from the raw results kept in results.json (after a change of a metric's definition)."""
    for name, rec in results["topics"].items():
        if rec.get("results") and "all_results" in rec:
            results["metrics"] = [m for m in results["metrics"] if m["topic"] != name] + topic_metrics(
                name, [*rec["all_results"], rec["results"]])
    return results


def refresh_topic(results: dict, name: str) -> dict:
    """The topic's latest results files as its last run (a partial re-run of its script), metrics recomputed."""
    spec = topics.TOPICS[name]
    latest = {f: json.loads((common.RESULTS_DIR / f).read_text()) for f in spec.files
              if (common.RESULTS_DIR / f).exists()}
    if name not in results["topics"]:                  # first results of a topic run on its own (make bench-scale)
        results["topics"][name] = {"title": spec.title, "issue": spec.issue, "wall_s": [], "peak_rss_mb": [],
                                   "cpu_s": [], "load_avg_before": [], "status": "ok", "date": common.now(),
                                   "commands": [v["command"] for v in latest.values() if v.get("command")]}
    rec = results["topics"][name]
    rec.update(title=spec.title, issue=spec.issue, results=latest)          # the topic's registry entry is the truth
    rec.setdefault("refreshed", []).append({"date": common.now(), "files": sorted(latest)})
    results["metrics"] = [m for m in results["metrics"] if m["topic"] != name] + topic_metrics(
        name, [*rec.get("all_results", []), latest])
    return results


def save_results(results: dict, path: Path, md_path: Path) -> None:
    results["metrics"].sort(key=lambda m: (_order(m["topic"]), m["name"]))
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(common.results_on_disk(results, path), indent=1, ensure_ascii=False) + "\n",
                   encoding="utf-8")
    os.replace(tmp, path)
    md = report.render(results)
    tmp = md_path.with_suffix(".md.tmp")
    tmp.write_text(md, encoding="utf-8")
    os.replace(tmp, md_path)
    if md_path == common.BENCHMARKS_MD:                 # the repository's own results: the docs' headline block too
        import readme_block

        readme_block.update_readme(REPO / "docs" / "benchmarks.md", results)
        readme_block.update_readme(REPO / "README.md", results, readme_block.ABL_START, readme_block.ABL_END,
                                   readme_block.render_ablation)


def _order(topic: str) -> int:
    return report.ORDER.index(topic) if topic in report.ORDER else len(report.ORDER)


# ------------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny inputs, 1 repeat, staged copy of the repo")
    ap.add_argument("--topics", default=",".join(TOPIC_ORDER), help=f"comma list of {', '.join(TOPIC_ORDER)}")
    ap.add_argument("--repeats", type=int, default=3, help="repeats (inside each script, or of the script)")
    ap.add_argument("--no-install", action="store_true", help="skip topics whose peer venv is absent")
    ap.add_argument("--report-only", action="store_true", help="recompute the metrics from the raw results kept "
                    "in results.json and re-render the markdown (runs nothing)")
    ap.add_argument("--refresh", metavar="TOPIC", help="take the topic's benchmarks/results/<file> (re-run alone, "
                    "e.g. bench_minhash.py --only quality) into results.json and re-render; runs nothing")
    ap.add_argument("--out", type=Path, help="folder for results.json + BENCHMARKS.md (quick: a temp folder)")
    ap.add_argument("--corpus", type=Path, help="corpus folder (default ../shared/corpora, else the demo corpus)")
    ap.add_argument("--bench", choices=("datasketch",), help="run the datasketch topic (results/datasketch.json)")
    ap.add_argument("--sig-mb", type=float, default=12.0, help="--bench datasketch: MB of text to sign")
    ap.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:                                 # runs inside a peer venv: topics.py imports stdlib only
        print(json.dumps(topics.WORKERS[args.worker[0]](json.loads(args.worker[1]))))
        return 0
    if args.bench:
        res = topics.bench_datasketch(args.repeats, args.sig_mb)
        common.RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        (common.RESULTS_DIR / "datasketch.json").write_text(json.dumps(res, indent=1) + "\n", encoding="utf-8")
        return 0 if res["identical"] else 1
    out = args.out or (Path(tempfile.mkdtemp(prefix="bench-quick-")) if args.quick else None)
    res_path = out / "results.json" if out else common.RESULTS_JSON
    md_path = out / "BENCHMARKS.md" if out else common.BENCHMARKS_MD
    if out:
        out.mkdir(parents=True, exist_ok=True)
    results = load_results(res_path)
    if args.refresh:
        save_results(refresh_topic(results, args.refresh), res_path, md_path)
        print(f"wrote {res_path} and {md_path}")
        return 0
    if args.report_only:
        save_results(recompute_metrics(results), res_path, md_path)
        print(f"wrote {md_path}")
        return 0
    chosen = [t.strip() for t in args.topics.split(",") if t.strip()]
    unknown = sorted(set(chosen) - set(TOPIC_ORDER) - set(OPT_IN))
    if unknown:
        ap.error(f"--topics: unknown {unknown} (known: {', '.join(TOPIC_ORDER + OPT_IN)})")
    results.update(machine=common.machine(), mode="quick" if args.quick else "full", started=common.now(),
                   repeats=1 if args.quick else args.repeats, last_invocation=chosen)
    t0 = time.time()
    needed = sorted({p for t in chosen for p in topics.TOPICS[t].needs + topics.TOPICS[t].peers}
                    | {topics.TOPICS[t].python for t in chosen} - {"project"})
    peers, peer_status = {}, {}
    for p in needed:
        py, peer_status[p] = common.ensure_peer(p, install=not (args.no_install or args.quick))
        if py:
            peers[p] = py
        print(f"[run_all] peer {p}: {peer_status[p]}", flush=True)
    results["peers"] = peer_status
    corpus = args.corpus or common.source_corpus()
    work = Path(tempfile.mkdtemp(prefix="bench-run-all-"))
    repo = REPO
    if args.quick:
        if corpus is None:
            sys.exit("no corpus: ../shared/corpora is absent and data/demo-corpus is not built (make corpus)")
        corpus = common.tiny_corpus(work / "tiny-corpus", corpus)
        repo = common.stage_tree(work, corpus)
    log = (out or common.RESULTS_DIR) / "run_all.log"
    log.unlink(missing_ok=True)
    try:
        for name in chosen:
            record, runs = run_topic(name, repo, args.quick, args.repeats, peers, peer_status, corpus, log)
            metrics = topic_metrics(name, runs) if record["status"] == "ok" else []
            merge_topic(results, name, record, runs, metrics)
            results["finished"] = common.now()
            results["wall_s"] = round(time.time() - t0, 1)
            save_results(results, res_path, md_path)          # after every topic: a crash keeps what ran
            print(f"[run_all] {name}: {record['status'][:200]}, {len(metrics)} metrics", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    results["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    save_results(results, res_path, md_path)
    print(report.headline(results))
    print(f"wrote {res_path} and {md_path} in {round(time.time() - t0)} s")
    failed = [n for n in chosen if results["topics"].get(n, {}).get("status", "").startswith("failed")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
