"""MinHash benchmark: mindloom vs datatrove 0.10.1 and rensa 0.5.0 on the same documents and parameters.

    .venv/bin/python benchmarks/bench_minhash.py [--repeats 3] [--stage-repeats 3] [--sig-mb 12] [--scales 1,2,4,8]

Peers run in their own virtual environments under ``.cache/bench-venvs/`` (created on first use from PyPI
by ``minhash_peers.py``, which also holds the workers that run in them):
``datatrove[processing]==0.10.1`` + ``spacy`` (its English word tokenizer) + ``pyarrow`` (its ParquetReader), and
``rensa==0.5.0``.  Every measurement is a fresh process; measurements of different tools are interleaved and
repeated (min / median / max are reported; ratios use medians) because other jobs share this machine.

1. Signature throughput, 112 permutations (14 × 8), word 5-grams, one core: mindloom's engine (datasketch-exact
   SHA-1 signatures) vs datatrove's ``MinhashDedupSignature`` (get_shingles + get_signature; its default xxhash,
   with its default spaCy tokenizer and with a whitespace tokenizer) vs rensa ``RMinHash`` fed with mindloom's
   Python shingles (``pipeline.dedup.minhash.shingles.shingles``).  Documents: the shared corpus, round-robin over
   domains up to ``--sig-mb``.
2. Four-stage wall time on the whole corpus as Parquet shards, one process each, sequential tasks: mindloom
   (signatures → bands → clusters → removal) vs datatrove's four steps with LocalPipelineExecutor(workers=1).
3. Peak memory of the cluster stage as the corpus grows 1× → 8×: the corpus plus k−1 replicas in which every
   word is replaced through a per-replica random bijection of the vocabulary (same lengths, same duplicate
   structure, no shingles shared with other replicas).
4. Precision / recall / F1 on a labelled set: real documents (no ``dup_group``), each with one variant edited
   (word substitutions, deletions, insertions) to a target label Jaccard, equally many in each band 0.5–0.6, …,
   0.9–1.0.  Labels use their own tokenization (:func:`label_shingles`: whitespace 4-grams as written), not the
   deduplicator's shingles, so precision is not 1.0 by construction.  A pair is positive when its label Jaccard
   is ≥ the threshold (0.8), predicted positive when both documents end in one cluster; the found share is
   reported per band (recall in the bands ≥ 0.8).  Also with the Jaccard check off.

Writes ``benchmarks/results/minhash.json``; the numbers go into BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import REPO, RESULTS_DIR, SHARED_CORPORA, spread
from minhash_peers import ensure_venv, parquet_texts, w_sig_datatrove, w_sig_rensa, w_stages_datatrove

CACHE = REPO / ".cache" / "bench" / "minhash"


# ------------------------------------------------------------------------------------------------------------
# mindloom's workers (the peers' are in minhash_peers.py): each runs in a fresh process; imports stay inside so
# any venv can load this file.


def _rss_mb(key: str = "VmHWM") -> float:
    """Peak (VmHWM) or current (VmRSS) resident memory; ru_maxrss would include the parent's, inherited on exec."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return round(int(line.split()[1]) / 1024, 1)
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def w_sig_ours(a: dict) -> dict:
    sys.path.insert(0, str(REPO))
    from pipeline.dedup.minhash import MinhashConfig, SignatureEngine

    texts = parquet_texts(a["texts"])
    eng = SignatureEngine(MinhashConfig(shingle_kind="word", domain_shingles=[]), a.get("engine"))
    eng.compute(texts[:20])                                  # load the compiled kernel (cached on disk)
    t0 = time.perf_counter()
    for i in range(0, len(texts), 2000):
        eng.compute(texts[i:i + 2000])
    return {"seconds": time.perf_counter() - t0}


def w_stages_ours(a: dict) -> dict:
    t0 = time.perf_counter()
    sys.path.insert(0, str(REPO))
    from pipeline.dedup.minhash import (
        MinhashConfig,
        build_manifest,
        run_band,
        run_clusters,
        run_removal_shard,
        run_signatures_shard,
        write_report,
    )

    rdir, shards = Path(a["rdir"]), a["shards"]
    cfg = MinhashConfig(**a.get("cfg", {}))
    times = {}
    t = time.perf_counter()
    for s in shards:
        run_signatures_shard(rdir, s, cfg)
    times["signatures"] = time.perf_counter() - t
    t = time.perf_counter()
    for spec in build_manifest(rdir, shards, cfg, a["data_root"]):
        run_band(rdir, spec["band"], cfg)
    times["buckets"] = time.perf_counter() - t
    t = time.perf_counter()
    summary = run_clusters(rdir, cfg)
    times["clusters"] = time.perf_counter() - t
    t = time.perf_counter()
    for s in shards:
        run_removal_shard(rdir, s, cfg)
    times["removal"] = time.perf_counter() - t
    write_report(rdir, cfg)
    return {"seconds": time.perf_counter() - t0, "stages": times, "removed": sum(summary["removed"].values())}


def w_clusters_ours(a: dict) -> dict:
    sys.path.insert(0, str(REPO))
    from pipeline.dedup.minhash import MinhashConfig, run_clusters

    base = _rss_mb("VmRSS")
    t = time.perf_counter()
    summary = run_clusters(Path(a["rdir"]), MinhashConfig())
    return {"seconds": time.perf_counter() - t, "peak_rss_mb": _rss_mb(), "rss_before_mb": base,
            "docs": summary["docs"], "docs_in_clusters": summary["docs_in_clusters"],
            "distinct_pairs": summary["distinct_pairs"], "clusters": summary["clusters"]}


WORKERS = {f.__name__[2:]: f for f in (w_sig_ours, w_sig_rensa, w_sig_datatrove, w_stages_ours,
                                          w_stages_datatrove, w_clusters_ours)}


# ------------------------------------------------------------------------------------------------------------
# Orchestration (mindloom's venv)


def run_worker(python: str | Path, name: str, args: dict, timeout: int = 1800) -> dict:
    proc = subprocess.run([str(python), __file__, "--worker", name, json.dumps(args)], capture_output=True,
                          text=True, timeout=timeout, cwd=str(REPO))
    if proc.returncode != 0:
        raise RuntimeError(f"worker {name} ({python}) failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def load_records() -> dict[str, list[dict]]:
    if not SHARED_CORPORA.is_dir():
        sys.exit(f"{SHARED_CORPORA} is missing: the benchmark needs the shared sample corpus")
    return {f.stem: [json.loads(x) for x in f.read_text(encoding="utf-8").splitlines()]
            for f in sorted(SHARED_CORPORA.glob("*.jsonl"))}


def write_shards(rdir: Path, records: dict[str, list[dict]], per_shard: int = 500, tag: str = "") -> list[str]:
    """The corpus as exact-dedup-stage shards (ingest schema) — the input of stage 1 for every tool."""
    import hashlib

    import pyarrow as pa

    from pipeline.io import write_marker, write_parquet

    shards = []
    for dom, recs in sorted(records.items()):
        for k in range(0, len(recs), per_shard):
            part, name = recs[k:k + per_shard], f"{dom}{tag}-{k // per_shard:05d}"
            path = rdir / "exact_dedup" / f"{name}.parquet"
            if not path.exists():
                write_parquet(pa.table({
                    "doc_id": [r["id"] for r in part], "domain": [dom] * len(part),
                    "source": [r["source"] for r in part], "text": pa.array([r["text"] for r in part],
                                                                            pa.large_string()),
                    "n_chars": pa.array([len(r["text"]) for r in part], pa.int64()),
                    "text_hash": [hashlib.sha256(r["text"].encode()).hexdigest() for r in part],
                    "meta": [json.dumps(r.get("meta", {}), ensure_ascii=False) for r in part],
                    "origin": [f"{dom}.jsonl:{k + i + 1}" for i in range(len(part))]}), path)
                write_marker(path)
            shards.append(name)
    return shards


def cipher_replica(records: dict[str, list[dict]], replica: int) -> dict[str, list[dict]]:
    """Every whitespace token replaced through a seeded bijection of the corpus vocabulary."""
    import random
    import re

    vocab = sorted({tok for recs in records.values() for r in recs for tok in r["text"].split()})
    shuffled = vocab[:]
    random.Random(replica).shuffle(shuffled)
    table = dict(zip(vocab, shuffled, strict=True))
    token = re.compile(r"\S+")
    return {dom: [{**r, "id": f"{r['id']}#r{replica}", "text": token.sub(lambda m: table[m.group()], r["text"])}
                  for r in recs] for dom, recs in records.items()}


def signature_sample(records: dict[str, list[dict]], mb: float) -> tuple[Path, int, int]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = CACHE / f"sig-sample-{mb}mb.parquet"
    queues = {d: list(rs) for d, rs in sorted(records.items())}
    texts, size = [], 0
    while size < mb * 1e6 and any(queues.values()):
        for q in queues.values():
            if q:
                t = q.pop(0)["text"]
                texts.append(t)
                size += len(t.encode("utf-8"))
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"text": texts}), path)
    return path, len(texts), size


def bench_signatures(records, repeats: int, mb: float, quick: bool) -> dict:
    path, docs, nbytes = signature_sample(records, mb)
    tools = {"mindloom": (sys.executable, "sig_ours", {}),
             "rensa+python_shingles": (ensure_venv("rensa"), "sig_rensa", {}),
             "datatrove_whitespace": (ensure_venv("datatrove"), "sig_datatrove", {"tokenizer": "whitespace"}),
             "datatrove_spacy": (ensure_venv("datatrove"), "sig_datatrove", {"tokenizer": "spacy"})}
    if not quick:
        tools["mindloom_numpy_engine"] = (sys.executable, "sig_ours", {"engine": "numpy"})
    runs: dict[str, list[float]] = {k: [] for k in tools}
    for rep in range(repeats):
        for name, (py, worker, extra) in tools.items():
            if quick and name == "datatrove_spacy" and rep > 0:
                continue
            res = run_worker(py, worker, {"texts": str(path), **extra})
            runs[name].append(nbytes / 1e6 / res["seconds"])
            print(f"  signatures {name:24s} rep {rep}: {runs[name][-1]:.2f} MB/s", flush=True)
    out = {"docs": docs, "mb": round(nbytes / 1e6, 2), "mb_per_s": {k: spread(v, 3) for k, v in runs.items()}}
    med = {k: statistics.median(v) for k, v in runs.items()}
    out["speedup_vs"] = {k: round(med["mindloom"] / med[k], 2) for k in med if k != "mindloom"}
    return out


def bench_stages(records, repeats: int, quick: bool) -> dict:
    import shutil

    base = CACHE / "stages-1x"
    shards = write_shards(base / "input", records)
    # "mindloom": datatrove's parameters (word 5-grams for every domain, 14 × 8); "mindloom_default_config": code
    # token 8-grams for code and character 5-grams for CJK documents (more shingles), as a run would use.
    tools = {"mindloom": "stages_ours", "datatrove_whitespace": "stages_datatrove"}
    if not quick:
        tools["datatrove_spacy"] = "stages_datatrove"
        tools["mindloom_default_config"] = "stages_ours"
    runs: dict[str, list[dict]] = {k: [] for k in tools}
    for rep in range(repeats):
        for name, worker in tools.items():
            if name in ("datatrove_spacy", "mindloom_default_config") and rep > 0:
                continue                     # spaCy: ~2 minutes per run, once is enough to rank it
            work = base / f"work-{name}"
            shutil.rmtree(work, ignore_errors=True)
            if name.startswith("mindloom"):
                shutil.copytree(base / "input" / "exact_dedup", work / "runs" / "bench" / "exact_dedup")
                cfg = {} if name == "mindloom_default_config" else {"shingle_kind": "word", "domain_shingles": []}
                res = run_worker(sys.executable, worker, {"rdir": str(work / "runs" / "bench"), "shards": shards,
                                                          "data_root": str(work), "cfg": cfg})
            else:
                res = run_worker(ensure_venv("datatrove"), worker, {
                    "input": str(base / "input" / "exact_dedup"), "work": str(work), "tasks": len(shards),
                    "tokenizer": "spacy" if name.endswith("spacy") else "whitespace"}, timeout=3600)
            runs[name].append(res)
            print(f"  4 stages   {name:24s} rep {rep}: {res['seconds']:.1f} s, removed {res['removed']}", flush=True)
    out = {"docs": sum(len(r) for r in records.values()), "shards": len(shards),
           "mb": round(sum(len(r["text"].encode()) for rs in records.values() for r in rs) / 1e6, 2)}
    for name, rs in runs.items():
        out[name] = {"seconds": spread([r["seconds"] for r in rs], 3), "removed": rs[0]["removed"],
                     "stages_median": {k: round(statistics.median(r["stages"][k] for r in rs), 2)
                                       for k in rs[0]["stages"]}}
    med = {k: out[k]["seconds"]["median"] for k in runs}
    out["speedup_vs"] = {k: round(med[k] / med["mindloom"], 2) for k in med if not k.startswith("mindloom")}
    return out


def bench_cluster_memory(records, scales: list[int]) -> dict:
    """Stages 1–2 per scale (cached), then the cluster stage alone in a fresh process."""
    sys.path.insert(0, str(REPO))
    import shutil

    from pipeline.dedup.minhash import MinhashConfig, build_manifest, run_band, run_signatures_shard

    out = []
    replicas = {0: records}
    for k in scales:
        rdir = CACHE / f"scale-{k}x" / "runs" / "bench"
        shards = []
        for r in range(k):
            if r not in replicas:
                replicas[r] = cipher_replica(records, r)
            shards += write_shards(rdir, replicas[r], tag=f"_r{r}")
        cfg = MinhashConfig()
        for s in shards:
            run_signatures_shard(rdir, s, cfg)
        for spec in build_manifest(rdir, shards, cfg, rdir.parent.parent):
            run_band(rdir, spec["band"], cfg)
        shutil.rmtree(rdir / "minhash" / "clusters", ignore_errors=True)
        res = run_worker(sys.executable, "clusters_ours", {"rdir": str(rdir)})
        res["scale"] = k
        out.append(res)
        print(f"  clusters {k}x: {res['docs']} docs, {res['docs_in_clusters']} in clusters, peak RSS "
              f"{res['peak_rss_mb']} MB (before {res['rss_before_mb']} MB), {res['seconds']:.2f} s", flush=True)
    return {"runs": out}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--stage-repeats", type=int, default=3, help="four-stage runs per tool (spaCy: one)")
    ap.add_argument("--sig-mb", type=float, default=12.0)
    ap.add_argument("--scales", default="1,2,4,8")
    ap.add_argument("--pairs", type=int, default=800)
    ap.add_argument("--quick", action="store_true", help="fewer peers and repeats (smoke run)")
    ap.add_argument("--only", default="signatures,stages,memory,quality")
    ap.add_argument("--worker", nargs=2, metavar=("NAME", "ARGS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(WORKERS[args.worker[0]](json.loads(args.worker[1]))))
        return
    sys.path.insert(0, str(REPO))
    records = load_records()
    t0 = time.time()
    load = os.getloadavg()
    result = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                          "python": platform.python_version(), "load_avg_1m_at_start": round(load[0], 2)},
              "command": " ".join([Path(sys.executable).name, *sys.argv]), "repeats": args.repeats}
    only = set(args.only.split(","))
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    out_file = RESULTS_DIR / "minhash.json"
    previous = json.loads(out_file.read_text()) if out_file.exists() else {}
    with tempfile.TemporaryDirectory(prefix="bench-minhash-") as tmp:
        if "signatures" in only:
            print("signature throughput …", flush=True)
            result["signatures"] = bench_signatures(records, args.repeats, args.sig_mb, args.quick)
        if "stages" in only:
            print("four stages …", flush=True)
            result["four_stages"] = bench_stages(records, args.stage_repeats, args.quick)
        if "memory" in only:
            print("cluster-stage memory …", flush=True)
            result["cluster_memory"] = bench_cluster_memory(records, [int(x) for x in args.scales.split(",")])
        if "quality" in only:
            from bench_minhash_labels import bench_quality

            print("precision / recall …", flush=True)
            result["quality"] = bench_quality(records, args.pairs, Path(tmp))
    result["wall_seconds"] = round(time.time() - t0, 1)
    result["load_avg_1m_at_end"] = round(os.getloadavg()[0], 2)
    for key in ("signatures", "four_stages", "cluster_memory", "quality"):
        if key not in result and key in previous:
            result[key] = previous[key]
    out_file.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in result if k in ("signatures", "four_stages")}, indent=1)[:4000])
    print(f"wrote {out_file} in {result['wall_seconds']} s")


if __name__ == "__main__":
    main()
