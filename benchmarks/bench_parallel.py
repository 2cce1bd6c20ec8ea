"""Training layouts on CPU: host-sync period, TP=1 vs TP=2, and the CPU dispatch: tokens/s and bytes.

Why these two: issue 15 asks for the effect of fetching loss/metrics every N steps instead of every step, and for
tokens/s and per-rank memory at TP=1 and TP=2. Every variant trains the ``debug`` preset (fp32, GRAPH, batch 8 x 256
tokens of real text) through ``run_training`` / ``msrun`` exactly as the pipeline does; tokens/s is the summary's
steady figure (the first step, which includes the compile, is excluded). The variants alternate ``--repeats`` times
so a loaded machine affects them alike. On 2 shared cores TP=2 is expected to be slower: two ranks split the same
cores and add all-reduces; the point on CPU is correctness and memory per rank, not speed.

The ``*_threaded_dispatch`` variants run the same jobs with ``MS_DEV_HOST_BLOCKING_RUN=0``: MindSpore's own
default, a dispatch thread per process whose waiter spins (``pipeline.train.jobs.cpu_dispatch.THREADED_DISPATCH_ENV``;
CPU jobs now dispatch on the calling thread). The figure is what that choice gains or costs at TP=1 and at TP=2.

    .venv/bin/python benchmarks/bench_parallel.py [--steps 40] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

SEQ = 256


def run_variant(name: str, root: str, data: str, steps: int, env: dict | None = None, **kw) -> dict:
    from common import launch_train_job

    from pipeline.train.job import TrainJob

    out = os.path.join(root, f"{name}_{time.time_ns()}")
    job = TrainJob(stage=name, data_dir=data, out_dir=out, model={"preset": "debug"}, steps=steps, micro_batch=8,
                   lr=3e-3, min_lr=3e-4, warmup_steps=5, checkpoint_every=steps, log_every=steps, seed=7,
                   eval_tokens=0, **kw)
    workers = job.world_size or 1
    t0 = time.time()
    launch_train_job(job, out, workers, timeout=1800, env=env)
    with open(os.path.join(out, "summary.json")) as f:
        s = json.load(f)
    ranks = []
    for i in range(workers if workers > 1 else 0):
        with open(os.path.join(out, "ranks", f"rank_{i:05d}.json")) as f:
            ranks.append(json.load(f))
    return {"variant": name, "tokens_per_s": s["tokens_per_s"], "final_loss": s["final_loss"],
            "first_step_s": s["first_step_s"], "wall_s": round(time.time() - t0, 2),
            "param_bytes_per_rank": [r["param_bytes"] for r in ranks] or [s["param_bytes_per_rank"]],
            "optimizer_bytes_per_rank": [r["optimizer_bytes"] for r in ranks] or [s["optimizer_bytes_per_rank"]],
            "load_avg": round(os.getloadavg()[0], 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", default=os.path.join(REPO, "benchmarks", "results", "parallel.json"))
    args = ap.parse_args()
    sys.path.insert(0, os.path.join(REPO, "tests"))
    from bytes_data import pack_bytes, stdlib_text, write_mindrecord

    from pipeline.train.jobs.cpu_dispatch import THREADED_DISPATCH_ENV

    tp2 = {"metrics_every": 10, "tensor_parallel": 2, "world_size": 2}
    threaded = {"env": THREADED_DISPATCH_ENV}
    variants = [("metrics_every_1", {"metrics_every": 1}), ("metrics_every_10", {"metrics_every": 10}),
                ("tp2", tp2), ("threaded_dispatch", {"metrics_every": 10, **threaded}),
                ("tp2_threaded_dispatch", {**tp2, **threaded})]
    runs = []
    with tempfile.TemporaryDirectory(prefix="bench_parallel_") as root:
        data = os.path.join(root, "data")
        write_mindrecord(pack_bytes(stdlib_text("argparse", "typing", "inspect"), SEQ), data, shards=2)
        for i in range(args.repeats):
            for name, kw in variants:
                res = run_variant(name, root, data, args.steps, **kw)
                res["repeat"] = i
                runs.append(res)
                print(json.dumps(res), flush=True)
    out = {"model": "debug", "seq_len": SEQ, "batch_size": 8, "steps": args.steps, "repeats": args.repeats,
           "runs": runs, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
