"""Issue #13: the whole corpus chain through the real Airflow DAG at 1 GB and 4 GB, against datatrove on 1 GB.

    .venv/bin/python benchmarks/bench_scale.py [--sizes 1,4] [--quick] [--no-peer] [--work .cache/bench-scale]
    make bench-scale [SCALE_SIZES=1,4]          # then merges the results into results.json / BENCHMARKS.md

Input: ``benchmarks/scale_corpus.py`` recombines the real text of ``../shared/corpora`` into distinct documents of
the same domains (how: that module's docstring) at each size in GB (``--quick``: one 30 MB corpus), then plants
about 30 % duplicates with known truth (15 % exact copies, 15 % near copies with 2 % of the tokens replaced;
``--dup-exact``/``--dup-near``), so both dedup stages do real work; ``scale_truth.py`` scores what they removed
(recall, precision, MinHash recall per true-Jaccard bucket against the banding's prediction).  Without the shared
corpora the script stops with a message saying so.

Each size runs ``--runs`` times (default 3; ``scale_stats.py``): the figures are the median run's, with the
median, min and max of every headline figure, and each stage's CPU exponent between the smallest and largest size
from the stages' median CPU.  After each DAG run the same config also runs through ``mindloom corpus``
(``--no-cli`` skips it), for the DAG-vs-CLI CPU ratio.  Every run is also saved alone under
``<work>/repeats/``; ``--add-runs`` combines such runs of an earlier invocation (same code, same corpora) with this
one's, so three runs per size can span sessions (the result's ``added_runs`` says which).

The chain: ``airflow dags test corpus_build`` in an isolated ``AIRFLOW_HOME`` (SQLite, under ``--work``), with
``MINDLOOM_CONFIG`` pointing at a YAML written here: ``configs/default.yaml`` (default quality chains, tokenizer,
mixture, validation split) with the sources replaced by the generated files, ``data_root`` under ``--work``,
``pack.seq_len: 2048`` and ``parallelism`` mapped tasks per per-shard stage (``--parallelism``, default 8).

What the numbers mean.  In Airflow 3.3 ``dags test`` runs every task instance **in the CLI's own process, one after
the other** (``DAG.test`` → ``_run_task`` → ``supervisor.run_task_in_process`` → ``InProcessTestSupervisor``: no fork,
the Execution API served in-process); only the pools a task starts itself are separate processes.  Hence:

* a stage's wall and CPU seconds are sums over its task instances (start/end from the run's ``task_instance`` rows
  in the bench's SQLite ``airflow.db``; CPU = growth of the process tree's CPU time sampled every 0.2 s, a process
  that exits keeps its last sample);
* a task's peak RSS is the largest tree RSS sampled during its interval: **it includes the Airflow CLI process
  itself** (imports, parsed DAG, heap kept from earlier tasks; the column *RSS at start* shows that baseline), so
  it is what a worker running that task would need, give or take Airflow's own ~300 MB;
* *growth* (peak − RSS at the task's start, the largest over the stage's tasks) is the part a task adds itself; a
  worker that forks a fresh process per task (LocalExecutor, Celery) would need about Airflow's task-runner baseline
  plus that;
* when the tasks write ``<run>/profile/<stage>/<unit>.json`` (``pipeline.profile.measured``), those figures are
  used instead (same meaning: the process tree while the block runs) and the source column says so;
* whole-chain MB per CPU-second = generated text MB ÷ CPU seconds of the whole ``airflow dags test`` process tree,
  Airflow's own work included (the larger of ``RUSAGE_CHILDREN`` and the sampled tree, see
  ``scale_timeline.measured``: a pool started through a forkserver is invisible to rusage); per-stage MB/CPU-s
  divides the same corpus MB by the stage's CPU; the cost exponent is ``log(cpu_4/cpu_1) / log(size_4/size_1)`` on
  that whole-chain CPU.

Also measured: tokenization 1 → 2 processes (``bench_tokenize.scaling``) on a sample of the smallest run's
quality-kept text with that run's tokenizer; MindRecord writing (``bench_mindrecord.compare_writers``: our
``write_shard`` vs MindSpore's ``FileWriter`` in its fastest batched use vs ``ndarray.tofile``) on the rows packed at
2048 from those tokens; and datatrove (``scale_datatrove.py``) on the smallest corpus.  Targets with met / not met
are computed in :func:`targets`.  Writes ``benchmarks/results/scale.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import scale_corpus  # noqa: E402
import scale_peer  # noqa: E402
import scale_stage  # noqa: E402
import scale_stats  # noqa: E402
import scale_targets  # noqa: E402
import scale_truth  # noqa: E402
from common import REPO, RESULTS_DIR, SHARED_CORPORA, machine  # noqa: E402
from scale_report import markdown  # noqa: E402,F401  (report.py renders the topic through bench_scale)
from scale_sweep import merge_sweep, sweep  # noqa: E402
from scale_targets import TARGETS, targets  # noqa: E402,F401  (bench_scale.targets: tests, re-scoring)
from scale_timeline import measured, profile_rows, stage_rows, task_instances  # noqa: E402

QUICK_GB = 0.03
SHIPPED_PARALLELISM = 64          # pipeline.config's default: the bench runs what users run
WORK = REPO / ".cache" / "bench-scale"


# ------------------------------------------------------------------------------------------------------------
# One size: corpus, config, airflow dags test


def chain_config(corpus: Path, data_root: Path, seq_len: int, parallelism: int, name: str) -> dict:
    from pipeline.config import DEFAULT_CONFIG, load_config

    d = load_config(DEFAULT_CONFIG).to_dict()
    d["sources"] = [{"domain": p.name, "reader": "jsonl", "paths": [str(p / "*.jsonl")],
                     **({"lang": "code"} if p.name == "code" else {})}
                    for p in sorted(corpus.iterdir()) if p.is_dir()]
    d.update(data_root=str(data_root), run_name=name, parallelism=parallelism, domains=[])
    d["pack"]["seq_len"] = seq_len
    return d


def airflow_env(home: Path, config: Path, allowed: Path) -> dict:
    import pipeline

    code = Path(pipeline.__file__).resolve().parents[1]      # the checkout, also from run_all's staged copy
    return {**os.environ, "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__DAGS_FOLDER": str(code / "dags"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor", "MINDLOOM_CONFIG": str(config), "MINDLOOM_TRAIN_EXECUTOR": "",
            "MINDLOOM_ALLOWED_ROOTS": str(allowed), "PYTHONUNBUFFERED": "1",
            "MALLOC_ARENA_MAX": "2",          # as the deployment sets it (docker/airflow.env, Makefile)
            "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}


def run_size(size_gb: float, a: argparse.Namespace) -> dict:
    import yaml

    tag = f"{size_gb:g}gb"
    corpus_dir = a.work / f"corpus-{tag}"
    print(f"[scale] {tag}: corpus -> {corpus_dir}", flush=True)
    corpus = scale_corpus.build(a.source, corpus_dir, size_gb * 1000, seed=a.seed, file_mb=a.file_mb,
                                dup_exact=a.dup_exact, dup_near=a.dup_near)
    corpus_mb = corpus["text_bytes"] / 1e6
    run = a.work / f"run-{tag}-p{a.parallelism}"       # each parallelism of a sweep keeps its own run
    shutil.rmtree(run, ignore_errors=True)
    home = run / "airflow"
    home.mkdir(parents=True)
    cfg_path = run / "config.yaml"
    cfg_path.write_text(yaml.safe_dump(
        chain_config(corpus_dir, run / "data", a.seq_len, a.parallelism, f"scale-{tag}"), sort_keys=False))
    env = airflow_env(home, cfg_path, a.work)
    airflow = str(Path(sys.executable).parent / "airflow")
    t0 = time.perf_counter()
    with open(run / "db_migrate.log", "wb") as log:
        subprocess.run([airflow, "db", "migrate"], env=env, stdout=log, stderr=subprocess.STDOUT, check=True)
    migrate_s = round(time.perf_counter() - t0, 1)
    print(f"[scale] {tag}: {corpus['docs']} docs, {corpus_mb:.1f} MB; airflow dags test corpus_build ...", flush=True)
    m = measured([airflow, "dags", "test", "corpus_build"], log=run / "dags_test.log", env=env, timeout=a.timeout,
                 cwd=run)
    rc, wall, cpu, samples = m["rc"], m["wall_s"], m["cpu_s"], m.pop("samples")
    (run / "timeline.csv").write_text("unix_time,tree_rss_mb,tree_cpu_s\n" + "".join(
        f"{t:.2f},{r:.1f},{c:.2f}\n" for t, r, c in samples))            # for re-attribution later
    res = {"size_gb": size_gb, "parallelism": a.parallelism, "corpus": corpus, "corpus_mb": round(corpus_mb, 1), **m,
           "db_migrate_s": migrate_s,
           "peak_tree_rss_mb": m["peak_rss_mb"], "mb_per_cpu_s": round(corpus_mb / cpu, 3) if cpu else None,
           "config": str(cfg_path), "log": str(run / "dags_test.log")}
    run_id, tis = task_instances(home / "airflow.db")
    res["run_id"] = run_id
    res["task_states"] = {s: sum(1 for t in tis if t["state"] == s) for s in {t["state"] for t in tis}}
    res["stages_external"] = stage_rows(tis, samples, corpus_mb)
    from pipeline.io import run_dir

    rdir = run_dir(run / "data", run_id)
    res["run_dir"] = str(rdir)
    res["stages_profile"] = profile_rows(rdir, corpus_mb)
    res["stages"] = res["stages_profile"] or res["stages_external"]
    res["tasks_cpu_s"] = round(sum(s["cpu_s"] for s in res["stages_external"]), 1)
    res["peak_task_rss_mb"] = max((s["peak_rss_mb"] for s in res["stages"]), default=None)
    if rc == 0:
        from pipeline.tasks.corpus import collect_stats

        stats = collect_stats(rdir)
        res["docs"] = {stage: {"in": sum(v["in_docs"] for v in doms.values()),
                               "kept": sum(v["kept_docs"] for v in doms.values())} for stage, doms in stats.items()}
        res["quality_by_domain"] = {d: [v["in_docs"], v["kept_docs"]] for d, v in stats.get("quality", {}).items()}
        man = rdir / "mindrecord" / "manifest.json"
        manifest = json.loads(man.read_text()) if man.exists() else {}
        res["tokens"] = manifest.get("tokens")
        res["outputs_sha256"] = manifest.get("rows_sha256")        # every row of every file, in order
        mh = json.loads((rdir / "config.json").read_text())["minhash"]
        res["dedup_truth"] = scale_truth.evaluate(rdir, corpus_dir / "truth.jsonl", mh["bands"], mh["rows"],
                                                  mh["threshold"])
    if a.cli and size_gb <= a.cli_max_gb:
        res.update(cli_path(cfg_path, run, env, a, corpus_mb, res.get("tokens")))
        res["dag_over_cli"] = round(res["cpu_s"] / res["cli_cpu_s"], 3) if res.get("cli_cpu_s") else None
    print(f"[scale] {tag}: rc {rc}, {wall} s, {cpu} CPU-s, {res['mb_per_cpu_s']} MB/CPU-s, peak task RSS "
          f"{res['peak_task_rss_mb']} MB", flush=True)
    return res


def cli_path(cfg_path: Path, run: Path, env: dict, a: argparse.Namespace, corpus_mb: float, tokens) -> dict:
    """The same config through ``mindloom corpus`` (no Airflow): its CPU, and the DAG path's CPU over it."""
    data = run / "data"
    argv = [str(Path(sys.executable).parent / "mindloom"), "corpus", "--config", str(cfg_path), "--run-id", "cli"]
    print(f"[scale] {run.name}: mindloom corpus (the CLI path) ...", flush=True)
    m = measured(argv, log=run / "cli.log", env=env, timeout=a.timeout, cwd=run)
    m.pop("samples")
    from pipeline.io import run_dir

    man = run_dir(data, "cli") / "mindrecord" / "manifest.json"
    cli_tokens = json.loads(man.read_text())["tokens"] if man.exists() else None
    cli_stages = profile_rows(run_dir(data, "cli"), corpus_mb)       # per stage, to split the DAG's extra CPU
    shutil.rmtree(run_dir(data, "cli"), ignore_errors=True)
    return {"cli_rc": m["rc"], "cli_wall_s": m["wall_s"], "cli_cpu_s": m["cpu_s"], "cli_stages": cli_stages,
            "cli_mb_per_cpu_s": round(corpus_mb / m["cpu_s"], 3) if m["cpu_s"] else None,
            "cli_tokens_equal": cli_tokens == tokens if tokens is not None else None}


# ------------------------------------------------------------------------------------------------------------
# Tokenization, MindRecord and datatrove on the smallest size


def kept_texts(rdir: Path, mb: float) -> list[str]:
    import pyarrow.parquet as pq

    texts, size = [], 0
    files = sorted((rdir / "quality").glob("*.parquet"))
    for f in files[:: max(1, len(files) // 16)] + files:        # spread over shards first
        for t in pq.read_table(f, columns=["text"]).column("text").to_pylist():
            texts.append(t)
            size += len(t.encode("utf-8"))
            if size >= mb * 1e6:
                return texts
    return texts


def side_benchmarks(first: dict, a: argparse.Namespace) -> dict:
    import bench_mindrecord
    import bench_tokenize
    import numpy as np

    from pipeline.sink import packing

    rdir = Path(first["run_dir"])
    texts = kept_texts(rdir, a.tok_mb)
    print(f"[scale] tokenize 1 -> 2 processes on {len(texts)} kept documents ...", flush=True)
    tok = bench_tokenize.scaling(str(rdir / "tokenizer" / "spm.model"), texts, a.repeats)
    flat, lens = tok.pop("_outputs")
    tok["speedup"] = round(min(tok["encode_s"]["1"]) / min(tok["encode_s"]["2"]), 3)
    starts = np.cumsum(lens) - lens
    n = len(lens)
    rows = packing.pack(flat, starts, lens, np.zeros(n, np.int32), np.arange(n), seq_len=a.seq_len, eos_id=2,
                        bos_id=None, pad_id=3)["rows"]
    print(f"[scale] MindRecord writers on {len(rows)} rows of {a.seq_len + 1} ...", flush=True)
    (a.work / "mr").mkdir(parents=True, exist_ok=True)
    mr = bench_mindrecord.compare_writers(rows, a.work / "mr", a.repeats)
    return {"tokenize": tok, "mindrecord": mr}


# ------------------------------------------------------------------------------------------------------------
def carry(res: dict, path: Path, side: dict | None, peer: dict | None) -> tuple[dict | None, dict | None]:
    """``--carry``: the side checks and the datatrove comparison this invocation skipped, from an earlier results
    file.  ``carried`` names each one's own origin (the invocation that measured it, passed along when that file
    had carried it too), and ``merged_from`` says it in words."""
    old = json.loads(path.read_text())
    origins = old.get("carried") or {}
    labels = {"side": "the side checks (tokenizer scaling, MindRecord writers)",
              "datatrove": "the datatrove comparison"}
    carried = {}
    if side is None and old.get("side"):
        side = res["side"] = old["side"]
        carried["side"] = origins.get("side") or old.get("command")
    if peer is None and old.get("datatrove"):
        peer = res["datatrove"] = old["datatrove"]
        carried["datatrove"] = origins.get("datatrove") or old.get("command")
    if carried:
        res["carried"] = carried
        res["merged_from"] = "; ".join(f"{labels[k]} carried over from {path.name}, measured by {v}"
                                       for k, v in carried.items())
    return side, peer


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1,4", help="corpus sizes in GB (comma list)")
    ap.add_argument("--quick", action="store_true", help=f"one {QUICK_GB * 1000:g} MB corpus, 1 repeat")
    ap.add_argument("--source", type=Path, default=SHARED_CORPORA, help="<domain>.jsonl files to recombine")
    ap.add_argument("--work", type=Path, default=WORK)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--file-mb", type=float, default=256.0, help="max MB per generated JSONL file")
    ap.add_argument("--parallelism", type=int, default=SHIPPED_PARALLELISM,
                    help=f"mapped tasks per per-shard stage (default: the shipped {SHIPPED_PARALLELISM})")
    ap.add_argument("--sweep", default="8,256", help="other parallelisms to run once on the smallest size (issue "
                                                     "33: the fixed cost per task as a slope); '' for none")
    ap.add_argument("--add-sweep", action="append", type=Path, default=[],
                    help="an earlier bench_scale output whose runs or sweep points at other parallelisms (same size) "
                         "stand as sweep points")
    ap.add_argument("--sweep-only", action="store_true",
                    help="run nothing: put the --add-sweep points into the --out file's sweep and targets")
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--tok-mb", type=float, default=64.0, help="MB of kept text for the tokenization / sink checks")
    ap.add_argument("--repeats", type=int, default=2, help="repeats of the tokenization / MindRecord side checks")
    ap.add_argument("--runs", type=int, default=3, help="runs of the chain per size (median and spread reported)")
    ap.add_argument("--add-runs", action="append", type=Path, default=[],
                    help="earlier single runs to combine with this invocation's (same code and corpora): a "
                         "<work>/repeats/*.json file, or a results file whose runs each hold one repeat")
    ap.add_argument("--dup-exact", type=float, default=0.15, help="share of planted exact copies")
    ap.add_argument("--dup-near", type=float, default=0.15, help="share of planted near copies")
    ap.add_argument("--no-cli", dest="cli", action="store_false", help="skip the mindloom corpus comparison run")
    ap.add_argument("--cli-max-gb", type=float, default=float("inf"),
                    help="run the mindloom corpus comparison only on sizes up to this many GB")
    ap.add_argument("--skip", default="", help="comma list of: peer, side (tokenize + mindrecord)")
    ap.add_argument("--carry", type=Path, default=None,
                    help="an earlier results file whose side checks and datatrove comparison stand in for the "
                         "skipped ones (recorded under merged_from)")
    ap.add_argument("--no-install", action="store_true", help="do not install the datatrove venv when missing")
    ap.add_argument("--timeout", type=float, default=6 * 3600)
    ap.add_argument("--stage-repeats", type=int, default=0,
                    help="run nothing else: repeat the sink writer step this many times per size on the kept runs "
                         "under --work, interleaved, into the --out file (scale_stage.py)")
    ap.add_argument("--out", type=Path, default=RESULTS_DIR / "scale.json")
    a = ap.parse_args(argv)
    if a.sweep_only:
        return merge_sweep(a.out, a.add_sweep, a.parallelism)
    if a.stage_repeats:
        return scale_stage.merge(a.out, a.work, a.parallelism, a.stage_repeats)
    if not (a.source.is_dir() and any(a.source.glob("*.jsonl"))):
        print(f"[scale] bench-scale builds its corpus from real text and found no {a.source}/*.jsonl (the shared "
              "corpora are absent on this machine, e.g. in CI); pass --source DIR with <domain>.jsonl files",
              file=sys.stderr)
        return 2
    sizes = [QUICK_GB] if a.quick else [float(x) for x in a.sizes.split(",") if x.strip()]
    if a.quick:
        a.repeats, a.runs, a.tok_mb, a.file_mb = 1, 1, min(a.tok_mb, 4.0), min(a.file_mb, 8.0)
        if a.out == RESULTS_DIR / "scale.json":          # a try, never the topic's results
            a.out = RESULTS_DIR / "scale_quick.json"
    a.work.mkdir(parents=True, exist_ok=True)
    skip = {s.strip() for s in a.skip.split(",") if s.strip()}
    res = {"command": "benchmarks/bench_scale.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "machine": machine(), "sizes_gb": sizes, "quick": a.quick, "seed": a.seed, "seq_len": a.seq_len,
           "parallelism": a.parallelism, "target_values": TARGETS, "runs": []}
    repeats = scale_stats.earlier_runs([(str(p), json.loads(p.read_text())) for p in a.add_runs], sizes)
    if a.add_runs:
        res["added_runs"] = {"files": [str(p) for p in a.add_runs],
                             "per_size": {f"{size:g}": len(repeats[size]) for size in sizes}}
    for i in range(a.runs if a.add_runs else max(1, a.runs)):       # interleaved (1, 4, 1, 4, ...): drift over
        #                                                                hours does not map onto size
        for size in sizes:
            before = scale_stats.yardstick()
            run = run_size(size, a)
            run["yardstick"] = [before, scale_stats.yardstick()]
            run["yardstick_cpu_s"] = round(sum(run["yardstick"]) / 2, 3)
            repeats[size].append(run)
            raw = a.work / "repeats" / f"{size:g}gb-{time.strftime('%Y%m%dT%H%M%S')}-{i}.json"
            raw.parent.mkdir(parents=True, exist_ok=True)        # for --add-runs of a later invocation
            raw.write_text(json.dumps(run, default=str) + "\n", encoding="utf-8")
    res["runs"] = [scale_stats.combine(repeats[size]) for size in sizes]
    res["sweep"] = sweep(res["runs"][0], a, run_size)
    res["sweep_targets"] = scale_targets.sweep_targets(res["sweep"], a.parallelism)
    if len(res["runs"]) > 1:
        res["stage_exponents"] = scale_stats.stage_exponents(res["runs"][0], res["runs"][-1])
    first = res["runs"][0]
    side = peer = None
    if first["rc"] == 0 and "side" not in skip:
        side = res["side"] = side_benchmarks(first, a)
    if "peer" not in skip:
        peer = res["datatrove"] = scale_peer.run_datatrove(first, a, measured)
        if peer.get("mb_per_cpu_s"):
            corpus = a.work / f"corpus-{first['size_gb']:g}gb"
            base = chain_config(corpus, a.work / "unused", a.seq_len, a.parallelism, "scale-shared")
            peer["mindloom"] = scale_peer.run_mindloom_shared(first, a, base, measured)
    if a.carry:
        side, peer = carry(res, a.carry, side, peer)
    res["targets"] = targets(res["runs"], side, peer) + res["sweep_targets"]
    res["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(res, indent=1, default=str) + "\n", encoding="utf-8")
    print("\n".join(markdown(res)))
    print(f"[scale] wrote {a.out}")
    return 0 if all(r["rc"] == 0 for r in res["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
