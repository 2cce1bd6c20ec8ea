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
from collections.abc import Callable
from dataclasses import dataclass
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


def _one_run(repeats: int) -> int:
    return 1                    # the script repeats inside itself (``--repeats``) and keeps every repeat's figures


def _each_repeat(repeats: int) -> int:
    return repeats              # the script keeps one figure per run: run_all runs it ``--repeats`` times


def _ablation_metrics(runs: list[dict]) -> list[dict]:
    import ablation  # imports the product's pipeline: not at module level (peer venvs import topics)

    return ablation.metrics(runs[-1].get("ablation.json", {})) if runs else []


@dataclass(frozen=True)
class Topic:
    """One benchmark topic: what ``run_all`` runs for it and how its results become metric rows.

    ``argv(quick, repeats)`` gives the command lines (scripts under ``benchmarks/``) run with the topic's ``python``
    (``project`` or a peer venv named in ``common.PEERS``); ``outer_runs(repeats)`` how many times to run them
    (argv indices in ``once`` only the first time); ``files`` the results files they write under ``results/``,
    the one copy of every figure; ``metrics(runs)`` the rows, with the issue's targets, from one ``{file: json}``
    per run. A topic whose ``needs`` (peers) are missing, or that ``needs_shared`` corpora absent here, is skipped
    with the reason. ``opt_in`` topics run only when named (``make bench-scale``, ``make ablation``)."""
    title: str
    issue: int
    files: tuple[str, ...]
    argv: Callable[[bool, int], list[list[str]]]
    metrics: Callable[[list[dict]], list[dict]]
    python: str = "project"
    needs: tuple[str, ...] = ()
    peers: tuple[str, ...] = ()
    needs_shared: bool = False
    outer_runs: Callable[[int], int] = _one_run
    once: tuple[int, ...] = ()
    timeout: int = 5400
    reference_glob: str | None = None
    opt_in: bool = False


TOPICS: dict[str, Topic] = {
    "ingest": Topic("Ingest throughput vs datatrove", 3, ("ingest.json", "html_extractors.json"),
                    lambda q, r: [["benchmarks/bench_ingest.py"]] + (
                        [] if q else [["benchmarks/bench_ingest.py", "--extractors"]]),
                    ingest_metrics, peers=("datatrove",), needs_shared=True, once=(1,), outer_runs=_each_repeat),
    "filters": Topic("Quality filters vs datatrove", 4, ("filters.json",),
                     _bench("bench_filters.py", ["--mb", "4", "--repeats", "{r}"], ["--mb", "0.3", "--repeats", "1"]),
                     filters_metrics, needs=("datatrove",)),
    "minhash": Topic("MinHash near-dedup vs datatrove and rensa", 5, ("minhash.json",),
                     _bench("bench_minhash.py", ["--repeats", "{r}"],
                            ["--quick", "--repeats", "1", "--sig-mb", "0.3", "--scales", "1,2", "--pairs", "30"]),
                     minhash_metrics, needs=("datatrove", "rensa"), timeout=7200),
    "datasketch": Topic("MinHash signatures vs plain datasketch", 5, ("datasketch.json",),
                        _bench("run_all.py", ["--bench", "datasketch", "--repeats", "{r}"],
                               ["--bench", "datasketch", "--repeats", "1", "--sig-mb", "0.3"]),
                        datasketch_metrics, needs=("datasketch",)),
    "tokenize": Topic("Tokenization scaling", 6, ("tokenize.json",),
                      _bench("bench_tokenize.py", ["--repeats", "{r}"], ["--repeats", "1", "--vocab", "2000"]),
                      tokenize_metrics, reference_glob="tokenize_device_*.json"),
    "mindrecord": Topic("MindRecord write and read", 6, ("mindrecord.json",),
                        _bench("bench_mindrecord.py", ["--repeats", "2"], ["--repeats", "1", "--seq-lens", "128"]),
                        mindrecord_metrics, outer_runs=_each_repeat),
    "train": Topic("Training throughput and recompute memory", 7, ("train.json",),
                   _bench("bench_train.py", ["--rounds", "4", "--block", "4", "--separate-rounds", "3",
                                             "--mem-steps", "3"],
                          ["--rounds", "1", "--block", "2", "--skip", "separate,skip", "--mem-steps", "1"]),
                   train_metrics, python="torch", needs=("torch",), timeout=7200),
    "parallel": Topic("Training layouts on CPU: host-sync period, TP=1 vs TP=2", 15, ("parallel.json",),
                      _bench("bench_parallel.py", ["--repeats", "{r}"], ["--steps", "6", "--repeats", "1"]),
                      parallel_metrics, timeout=3600),
    "memory_plan": Topic("Memory plan vs measured bytes and peak RSS on CPU", 22, ("memory_plan.json",),
                         _bench("bench_memory_plan.py", ["--presets", "debug,125m"], ["--presets", "debug"]),
                         memory_plan_metrics),
    "task_cost": Topic("Fixed cost of one mapped task per step", 33, ("task_cost.json",),
                       _bench("bench_task_cost.py", [], ["--mb", "0.3"]), task_cost_metrics),
    "quality_kernels": Topic("Quality scoring CPU: heuristic chains, classifier, decontamination", 34,
                             ("quality_kernels.json",),
                             _bench("bench_quality_kernels.py", ["--repeats", "{r}"], ["--repeats", "1"]),
                             quality_kernels_metrics),
    "cluster_graph": Topic("MinHash clustering on a duplicate graph at 1 TB shape", 49, ("cluster_graph.json",),
                           _bench("bench_cluster_graph.py", [], ["--quick"]), cluster_graph_metrics,
                           timeout=6 * 3600),
    "scaling": Topic("The whole data chain at 1×–8×", 10, ("scaling.json",), _bench("scaling.py", [], ["--quick"]),
                     scaling_metrics),
    # opt-in: hours at 1 + 4 GB (make bench-scale)
    "scale": Topic("The corpus DAG at scale (1 GB, 4 GB) vs datatrove", 13, ("scale.json",),
                   lambda q, r: [["benchmarks/bench_scale.py",
                                  *(["--quick", "--out", "benchmarks/results/scale.json"]
                                    if q else ["--sizes", os.environ.get("SCALE_SIZES", "1,4")])]],
                   scale_metrics, peers=("datatrove",), timeout=12 * 3600, opt_in=True),
    # opt-in: 20 proxy trainings, over an hour (make ablation, which runs the product's ablation DAG steps)
    "ablation": Topic("Data ablation: raw text against the shipped chain on a proxy model", 51, ("ablation.json",),
                      _bench("ablation.py", [], []), _ablation_metrics, timeout=6 * 3600, opt_in=True),
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
