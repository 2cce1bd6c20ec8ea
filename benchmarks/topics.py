"""What each benchmark topic runs and which metrics (with the issues' targets) it yields, for ``run_all.py``.

A topic entry says how to call its script (full and ``--quick``), which interpreter (the project venv, or a peer
venv such as ``torch``), which peers it cannot run without, which results files it writes, how often to repeat it
(scripts that keep per-repeat figures run once with ``--repeats``; the others run ``--repeats`` times), and a
function turning the results of those runs into metric entries: those functions live in ``metrics_stages.py``
(one stage of the chain per topic) and ``metrics_jobs.py`` (training and whole-chain topics).

Also here: the ``datasketch`` topic (signatures of plain datasketch 2.0 vs mindloom's engine, with a check that they
are identical), run by ``run_all.py --bench datasketch``, because no topic script compared against datasketch itself.
Only the standard library and benchmark modules that import only it are imported at module level: the
datasketch worker runs in the datasketch venv.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from common import REPO, spread
from metrics_jobs import (
    cluster_graph_metrics,
    memory_plan_metrics,
    parallel_metrics,
    scale_metrics,
    scaling_metrics,
    task_cost_metrics,
    train_metrics,
)
from metrics_stages import (
    datasketch_metrics,
    filters_metrics,
    ingest_metrics,
    mindrecord_metrics,
    minhash_metrics,
    quality_kernels_metrics,
    tokenize_metrics,
)


def _bench(script: str, full: list[str], quick: list[str]):
    return lambda q, r: [[f"benchmarks/{script}", *(quick if q else [a.replace("{r}", str(r)) for a in full])]]


TOPICS: dict[str, dict] = {
    "ingest": {"title": "Ingest throughput vs datatrove", "issue": 3, "python": "project", "needs": [],
               "peers": ["datatrove"], "needs_shared": True, "files": ["ingest.json", "html_extractors.json"],
               "argv": lambda q, r: [["benchmarks/bench_ingest.py"]] + (
                   [] if q else [["benchmarks/bench_ingest.py", "--extractors"]]),
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
    "cluster_graph": {"title": "MinHash clustering on a duplicate graph at 1 TB shape", "issue": 49,
                      "python": "project", "needs": [], "files": ["cluster_graph.json"], "timeout": 6 * 3600,
                      "argv": _bench("bench_cluster_graph.py", [], ["--quick"]), "outer_runs": lambda r: 1,
                      "metrics": cluster_graph_metrics},
    "scaling": {"title": "The whole data chain at 1×–8×", "issue": 10, "python": "project", "needs": [],
                "files": ["scaling.json"], "argv": _bench("scaling.py", [], ["--quick"]),
                "outer_runs": lambda r: 1, "metrics": scaling_metrics},
    # opt-in (not in run_all's default topics): hours at 1 + 4 GB; `make bench-scale` runs it
    "scale": {"title": "The corpus DAG at scale (1 GB, 4 GB) vs datatrove", "issue": 13, "python": "project",
              "needs": [], "peers": ["datatrove"], "files": ["scale.json"], "timeout": 12 * 3600,
              "argv": lambda q, r: [["benchmarks/bench_scale.py",
                                     *(["--quick", "--out", "benchmarks/results/scale.json"]
                                       if q else ["--sizes", os.environ.get("SCALE_SIZES", "1,4")])]],
              "outer_runs": lambda r: 1, "metrics": scale_metrics},
}


# ------------------------------------------------------------------------------------------------------------
# datasketch topic: mindloom's signature engine vs plain datasketch, same documents, same shingles


def _load_shingles():
    """mindloom's ``shingles`` function: what both tools hash, so only the hashing differs.  Imported from the
    repository by ``minhash_peers.mindloom_shingles`` (why and what it loads: see there), as the rensa worker does."""
    from minhash_peers import mindloom_shingles

    return mindloom_shingles()


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
