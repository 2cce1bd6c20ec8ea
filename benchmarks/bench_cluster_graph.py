"""MinHash clustering at the shape of a 1 TB corpus: the real stage-3 tasks on a synthetic duplicate graph.

    .venv/bin/python benchmarks/bench_cluster_graph.py [--sizes 1e7,1e8] [--parallelism 64] [--quick]

For each size (documents in clusters), ``cluster_graph.write_graph`` writes what stages 1 and 2 leave behind
(manifest, signature files with the survivor fields, band runs), in a child process.  Then every task of every
clustering step (``pipeline.dedup.minhash.clusters.STEPS``) runs as the DAG's task body runs it
(``clusters.run_step``), each in a process of its own forked from a parent that has only imported the pipeline
(as a Celery prefork worker runs a task), two at a time on this 2-core machine, each measured by
``pipeline.profile.measured`` (CPU of the process and its children, peak RSS of the tree sampled every 0.1 s, and
the process's own ``VmHWM``).  The config is the shipped one (``minhash.memory_mb`` 1024, 14 bands × 8 rows)
with the Jaccard check off: there is no text at this size.

At the smallest size it also checks the components: every node's label from the ``labels`` step equals the
smallest id of its component by union-find over all of stage 2's edges in one process.

Writes ``benchmarks/results/cluster_graph.json``: per size the graph, per step the tasks' CPU, wall and peak
RSS, the largest task, the disk each step wrote, and the CPU exponent between the sizes, also divided by how much
slower the machine was during the large run (``scale_stats.yardstick``, a fixed workload timed before and after
each size's tasks).
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import REPO, RESULTS_DIR, machine, now  # noqa: E402

CACHE = REPO / ".cache" / "bench-cluster"
TARGET_RSS_MB = 2048
TARGET_EXPONENT = 1.05


def _own_hwm_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _task(args: tuple) -> dict:
    """One clustering task in this (forked) process: the DAG's task body, measured."""
    step, item = args
    from pipeline.dedup.minhash import MinhashConfig, check_config, clusters
    from pipeline.profile import measured

    cfg = check_config(MinhashConfig(jaccard_check=False))
    with measured(None, f"minhash_{step}", str(item["task"])) as prof:
        out = clusters.run_step(step, item, cfg)
    return {"step": step, "task": item["task"], "wall_s": prof["wall_s"], "cpu_s": prof["cpu_s"],
            "peak_rss_mb": round(max(prof["peak_rss_mb"], _own_hwm_mb()), 1),
            **{k: v for k, v in out.items() if k in ("ranges", "skipped", "residual", "open")}}


def _generate(args: tuple) -> dict:
    import cluster_graph

    rdir, clustered = args
    t0 = time.time()
    info = cluster_graph.write_graph(Path(rdir), clustered)
    return {**info, "generate_s": round(time.time() - t0, 1)}


def _plan(args: tuple) -> list[dict]:
    from pipeline.dedup.minhash import MinhashConfig, check_config, clusters

    rdir, parallelism = args
    return clusters.plan_tasks(Path(rdir), check_config(MinhashConfig(jaccard_check=False)), parallelism)


def _check_components(rdir: str) -> dict:
    """Labels of the ``labels`` step against union-find over every band edge in one process."""
    import numpy as np

    from pipeline.dedup.minhash import MinhashConfig, check_config
    from pipeline.dedup.minhash.clusters import Context, planned_tasks, runs
    from pipeline.dedup.minhash.clusters.components import union
    from pipeline.dedup.minhash.clusters.decide import member_schema
    from pipeline.dedup.minhash.clusters.pairs import distinct, edge_schema

    cfg = check_config(MinhashConfig(jaccard_check=False))
    ctx = Context(Path(rdir), cfg, planned_tasks(Path(rdir), cfg))
    t = runs.read_range(ctx.band_runs(), 0, runs.SLOTS, edge_schema())
    a, b = distinct(t.column("a").to_numpy(), t.column("b").to_numpy())
    del t
    nodes = np.unique(np.concatenate([a, b]))
    root = nodes[union(np.arange(len(nodes)), np.searchsorted(nodes, a), np.searchsorted(nodes, b))]
    del a, b
    m = runs.read_range(ctx.inputs("labels", "members"), 0, runs.SLOTS, member_schema())
    node, label = m.column("node").to_numpy(), m.column("label").to_numpy()
    order = np.argsort(node)
    node, label = node[order], label[order]
    return {"nodes": int(len(nodes)), "labelled": int(len(node)), "components": int(len(np.unique(root))),
            "equal": bool(np.array_equal(node, nodes) and np.array_equal(label, root))}


def _du_mb(path: Path) -> float:
    return round(sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20, 1)


def run_size(clustered: int, parallelism: int, check: bool, keep: bool) -> dict:
    from pipeline.dedup.minhash.clusters import SINGLE, STEPS

    rdir = CACHE / f"graph-{clustered}"
    shutil.rmtree(rdir, ignore_errors=True)
    rdir.mkdir(parents=True)
    fork = mp.get_context("fork")
    with fork.Pool(1, maxtasksperchild=1) as pool:
        graph = pool.apply(_generate, ((str(rdir), clustered),))
    print(f"[cluster_graph] {clustered:,}: {graph}", flush=True)
    with fork.Pool(1, maxtasksperchild=1) as pool:
        items = pool.apply(_plan, ((str(rdir), parallelism),))
    import scale_stats

    stick = [scale_stats.yardstick(3)]          # the machine's speed before and after the tasks (CPU-s)
    tasks, steps = [], {}
    t0 = time.time()
    for step in STEPS:
        todo = [(step, it) for it in (items[:1] if step in SINGLE else items)]
        s0 = time.time()
        with fork.Pool(2, maxtasksperchild=1) as pool:        # a fresh forked process per task
            done = pool.map(_task, todo, chunksize=1)
        tasks.extend(done)
        folder = rdir / "minhash" / "cc" / step
        steps[step] = {"tasks": len(done), "cpu_s": round(sum(d["cpu_s"] for d in done), 2),
                       "wall_s": round(time.time() - s0, 1), "peak_rss_mb": max(d["peak_rss_mb"] for d in done),
                       "disk_mb": _du_mb(folder) if folder.exists() else 0.0,
                       "skipped": sum(1 for d in done if d.get("skipped"))}
        print(f"[cluster_graph]   {step}: {steps[step]}", flush=True)
    stick.append(scale_stats.yardstick(3))
    out = {"clustered": clustered, "graph": graph, "tasks": len(items), "steps": steps, "yardstick_cpu_s": stick,
           "cpu_s": round(sum(s["cpu_s"] for s in steps.values()), 1), "wall_s": round(time.time() - t0, 1),
           "peak_task_rss_mb": max(t["peak_rss_mb"] for t in tasks),
           "largest_task": max(tasks, key=lambda t: t["peak_rss_mb"]),
           "summary": _summary(rdir), "disk_mb": _du_mb(rdir / "minhash")}
    if check:
        with fork.Pool(1, maxtasksperchild=1) as pool:
            out["components_check"] = pool.apply(_check_components, (str(rdir),))
        print(f"[cluster_graph]   components: {out['components_check']}", flush=True)
    if not keep:
        shutil.rmtree(rdir, ignore_errors=True)
    return out


def _summary(rdir: Path) -> dict:
    from pipeline.dedup.minhash import MinhashConfig, check_config
    from pipeline.dedup.minhash.clusters import write_summary

    s = write_summary(rdir, check_config(MinhashConfig(jaccard_check=False)))
    return {k: s[k] for k in ("tasks", "rounds", "residual_edges", "distinct_pairs", "docs_in_clusters", "clusters",
                              "largest_cluster", "removed")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="1e7,1e8", help="documents in clusters, comma-separated (smallest checked)")
    ap.add_argument("--parallelism", type=int, default=64)
    ap.add_argument("--quick", action="store_true", help="1e5,1e6 at parallelism 8")
    ap.add_argument("--keep", action="store_true", help="keep the run folders under .cache/bench-cluster/")
    ap.add_argument("--edges-per-task", type=int, default=None,
                    help="clusters.EDGES_PER_TASK for this run (default: the shipped one)")
    ap.add_argument("--out", default=str(RESULTS_DIR / "cluster_graph.json"))
    a = ap.parse_args(argv)
    sizes = [int(float(x)) for x in ("1e5,1e6" if a.quick else a.sizes).split(",")]
    if a.edges_per_task:
        from pipeline.dedup.minhash import clusters

        clusters.EDGES_PER_TASK = a.edges_per_task          # the forked tasks inherit it
    parallelism = 8 if a.quick else a.parallelism
    res = {"command": " ".join(["benchmarks/bench_cluster_graph.py", *(argv or sys.argv[1:])]), "date": now(),
           "machine": machine(), "parallelism": parallelism, "memory_mb": 1024, "jaccard_check": False,
           "edges_per_task": a.edges_per_task or None,
           "targets": {"peak_task_rss_mb": TARGET_RSS_MB, "cpu_exponent": TARGET_EXPONENT}, "runs": []}
    for i, n in enumerate(sorted(sizes)):
        res["runs"].append(run_size(n, parallelism, check=i == 0, keep=a.keep))
        Path(a.out).write_text(json.dumps(res, indent=1) + "\n")
    if len(res["runs"]) >= 2:
        lo, hi = res["runs"][0], res["runs"][-1]
        span = math.log(hi["graph"]["clustered"] / lo["graph"]["clustered"])
        res["cpu_exponent"] = round(math.log(hi["cpu_s"] / lo["cpu_s"]) / span, 3)
        slower = sum(hi["yardstick_cpu_s"]) / sum(lo["yardstick_cpu_s"])     # the machine during the large run
        res["yardstick_ratio"] = round(slower, 3)
        res["cpu_exponent_per_yardstick"] = round(math.log(hi["cpu_s"] / lo["cpu_s"] / slower) / span, 3)
    res["peak_task_rss_mb"] = max(r["peak_task_rss_mb"] for r in res["runs"])
    Path(a.out).write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps({k: res.get(k) for k in ("cpu_exponent", "peak_task_rss_mb")}), flush=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("MALLOC_ARENA_MAX", "2")
    raise SystemExit(main())
