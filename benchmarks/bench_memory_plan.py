"""The memory plan against what training jobs on this CPU allocate: exact bytes per rank, and peak RSS.

For each layout, a real ``run_training`` job (``msrun`` for 2 ranks; eval off) of a preset on byte tokens of
stdlib source. Two checks per layout (issue 22):

* exact: the plan's weight, gradient and optimizer (+ master) bytes per rank equal the bytes of the tensors the job
  built (``summary.json`` / ``ranks/rank_N.json``: ``param_bytes``, ``gradient_bytes``, ``optimizer_bytes``);
* peak: the plan's total per rank, plus the framework floor, against the peak RSS of each rank's process (CPU: the
  host is the device). The floor is what an almost parameter-free model of the same job shape measures minus its
  own (tiny) plan: MindSpore, the data pipeline, mccl, the compiled graph; it is measured per launch mode (one
  process, two msrun ranks). Predicted peak = floor + max(plan total, host memory at model build).

    .venv/bin/python benchmarks/bench_memory_plan.py [--presets debug,125m] [--out benchmarks/results/memory_plan.json]
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
sys.path.insert(0, os.path.join(REPO, "benchmarks"))

SEQ = 256
FLOOR_MODEL = {"vocab_size": 260, "dim": 16, "n_layers": 1, "n_heads": 2, "n_kv_heads": 2, "multiple_of": 16}

# (name, preset, model overrides, job settings, global batch, steps)
LAYOUTS = [
    ("floor_1", "debug", FLOOR_MODEL, {}, 8, 4),
    ("floor_2", "debug", FLOOR_MODEL, {"world_size": 2, "zero": True}, 8, 4),
    ("tiny4_tp1", "debug", {**FLOOR_MODEL, "n_layers": 4}, {}, 8, 4),  # floor with debug's depth: per-layer cost
    ("debug_v260_tp1", "debug", {"vocab_size": 260}, {}, 8, 4),  # debug_tp1 without its 4096-way logits
    ("debug_tp1", "debug", {}, {}, 8, 4),
    ("debug_tp2", "debug", {}, {"world_size": 2, "tensor_parallel": 2}, 8, 4),
    ("debug_dp2_zero", "debug", {}, {"world_size": 2, "zero": True}, 8, 4),
    ("debug_dp2_distopt_fp16", "debug", {}, {"world_size": 2, "zero": True, "distributed_optimizer": True,
                                             "precision": "fp16", "loss_scale": 1024.0}, 8, 4),
    ("125m_tp1", "125m", {}, {}, 2, 2),
    ("125m_dp2_distopt_fp16", "125m", {}, {"world_size": 2, "zero": True, "distributed_optimizer": True,
                                           "precision": "fp16", "loss_scale": 1024.0}, 2, 2),
]


def run_layout(name: str, preset: str, overrides: dict, kw: dict, batch: int, steps: int, root: str,
               data: str) -> dict:
    from common import launch_train_job

    from pipeline.train.job import TrainJob

    workers = kw.get("world_size", 1)
    out = os.path.join(root, name)
    dp = workers // kw.get("tensor_parallel", 1)
    job = TrainJob(stage=name, data_dir=data, out_dir=out, model={"preset": preset, **overrides}, steps=steps,
                   micro_batch=batch // dp, lr=3e-3, min_lr=3e-4, warmup_steps=1, checkpoint_every=steps,
                   log_every=steps, seed=7, eval_tokens=0, **kw)
    return collect(name, preset, kw, batch, steps, out, launch_train_job(job, out, workers, timeout=3600))


def collect(name: str, preset: str, kw: dict, batch: int, steps: int, out: str, wall_s: float) -> dict:
    """The record of one finished job folder (summary, per-rank files) with its plan."""
    from pipeline.train.job import TrainJob
    from pipeline.train.model.memory_plan import job_layout, plan

    job = TrainJob.from_json(os.path.join(out, "job.json"))
    workers = kw.get("world_size", 1)
    with open(os.path.join(out, "summary.json")) as f:
        s = json.load(f)
    if workers > 1:
        ranks = []
        for i in range(workers):
            with open(os.path.join(out, "ranks", f"rank_{i:05d}.json")) as f:
                ranks.append(json.load(f))
    else:
        ranks = [{"param_bytes": s["param_bytes_per_rank"], "optimizer_bytes": s["optimizer_bytes_per_rank"],
                  "gradient_bytes": s["gradient_bytes_per_rank"], "peak_rss_bytes": s["peak_rss_bytes"]}]
    p = plan(job.model_config(), job_layout(job, workers, SEQ, job.model_config().recompute))
    return {"layout": name, "preset": preset, "workers": workers, "settings": kw, "global_batch": batch,
            "steps": steps, "seq_len": SEQ, "wall_s": round(wall_s, 1), "final_loss": s["final_loss"],
            "plan": p.to_dict(),
            "measured": {k: [rk[k] for rk in ranks] for k in ("param_bytes", "gradient_bytes", "optimizer_bytes",
                                                               "peak_rss_bytes")},
            "load_avg": round(os.getloadavg()[0], 2)}


def compare(runs: list[dict]) -> list[dict]:
    """Adds exact-match flags and the predicted peak (floor of the same launch mode + plan) to every layout."""
    floor = {}
    for r in runs:
        if r["layout"].startswith("floor_"):
            floor[r["workers"]] = (max(r["measured"]["peak_rss_bytes"])
                                   - max(r["plan"]["total"], r["plan"]["host_init"]))
    for r in runs:
        p, m = r["plan"], r["measured"]
        r["exact"] = {"param_bytes": all(v == p["weights"] for v in m["param_bytes"]),
                      "gradient_bytes": all(v == p["gradients"] for v in m["gradient_bytes"]),
                      "optimizer_bytes": all(v == p["optimizer"] + p["master"] for v in m["optimizer_bytes"])}
        r["floor_bytes"] = floor.get(r["workers"])
        if r["floor_bytes"] is not None:
            r["predicted_peak_bytes"] = r["floor_bytes"] + max(p["total"], p["host_init"])
            peak = max(m["peak_rss_bytes"])
            r["peak_error"] = round(abs(peak - r["predicted_peak_bytes"]) / peak, 4)
    return runs


def replan(r: dict) -> dict:
    """The plan of a stored run, from its settings (what ``run_layout`` built the job from)."""
    from pipeline.train.model.config import ModelConfig
    from pipeline.train.model.memory_plan import Layout, plan

    spec = next(x for x in LAYOUTS if x[0] == r["layout"])
    cfg = ModelConfig.from_preset(spec[1], **spec[2])
    kw, workers = r["settings"], r["workers"]
    tp = kw.get("tensor_parallel", 1)
    lay = Layout(tp=tp, dp=workers // tp, zero=kw.get("zero", False), precision=kw.get("precision", "fp32"),
                 seq_len=r["seq_len"], micro_batch=r["global_batch"] // (workers // tp), device="CPU",
                 distributed_optimizer=kw.get("distributed_optimizer", False), recompute=cfg.recompute)
    r["plan"] = plan(cfg, lay).to_dict()
    return r


HOST_BUILD = [("125m", 1, 0), ("125m", 2, 0), ("125m", 2, 1)]  # (preset, tensor parallel, TP rank)
_HOST_CHILD = """
import json, sys
import mindspore as ms
ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
from pipeline.train.model.config import ModelConfig
from pipeline.train.model.model import Transformer
from pipeline.train.model.parallelize import parallelize
from pipeline.train.model.shard_init import init_rank_weights
from pipeline.train.model.tp_layers import NO_TP, TPGroup

def hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024

preset, tp, rank = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
warm = ModelConfig.from_preset("debug", vocab_size=260, dim=16, n_layers=1, n_heads=2, n_kv_heads=2, multiple_of=16)
from mindspore.nn.utils import no_init_parameters
with no_init_parameters():
    small = parallelize(Transformer(warm), TPGroup(tp, rank, "tp_0") if tp > 1 else NO_TP)
init_rank_weights(small, warm, 7, tp, rank)
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # resets VmHWM to the current RSS: what follows is the build alone
base = hwm()
cfg = ModelConfig.from_preset(preset)
with no_init_parameters():  # as parallel_setup.build_parallel builds a rank's model
    net = parallelize(Transformer(cfg), TPGroup(tp, rank, "tp_0") if tp > 1 else NO_TP)
init_rank_weights(net, cfg, 7, tp, rank)
print(json.dumps({"build_bytes": hwm() - base, "shard_bytes": sum(p.size * 4 for p in net.trainable_params())}))
"""


def host_build() -> list[dict]:
    """Host memory one rank takes to build and initialise its model (peak RSS above the framework), against the
    plan's ``host_init`` (shard + twice its largest parameter + one chunk) and what building the whole model to
    slice it cost before (``shard + whole model``)."""
    import subprocess

    from pipeline.train.jobs.launch import env_with_venv
    from pipeline.train.model.config import ModelConfig
    from pipeline.train.model.memory_plan import Layout, plan

    out = []
    for preset, tp, rank in HOST_BUILD:
        r = subprocess.run([sys.executable, "-c", _HOST_CHILD, preset, str(tp), str(rank)], capture_output=True,
                           text=True, env=env_with_venv(), cwd=REPO, timeout=900)
        if r.returncode != 0:
            raise RuntimeError(f"host build {preset} tp {tp}: rc {r.returncode}: {r.stderr[-1500:]}")
        got = json.loads(r.stdout.strip().splitlines()[-1])
        cfg = ModelConfig.from_preset(preset)
        p = plan(cfg, Layout(tp=tp))
        out.append({"preset": preset, "tensor_parallel": tp, "tp_rank": rank, "measured_bytes": got["build_bytes"],
                    "shard_bytes": got["shard_bytes"], "predicted_bytes": p.host_init,
                    "whole_model_before_bytes": got["shard_bytes"] + (4 * cfg.num_params() if tp > 1 else 0)})
        print(f"[memory_plan] host build {preset} tp {tp} rank {rank}: {got['build_bytes'] / 2**20:.0f} MiB "
              f"(plan {p.host_init / 2**20:.0f})", flush=True)
    return out


def _write(res: dict, out: str) -> None:
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out + ".tmp", "w", encoding="utf-8") as f:
        json.dump(res, f, indent=1)
    os.replace(out + ".tmp", out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", default="debug,125m", help="which presets' layouts to run (floors always run)")
    ap.add_argument("--out", default=os.path.join(REPO, "benchmarks", "results", "memory_plan.json"))
    ap.add_argument("--layouts", default="", help="comma list of layout names to run instead of --presets")
    ap.add_argument("--append", action="store_true", help="keep the layouts of an existing --out that this run "
                    "does not measure again (e.g. 125m measured apart from debug)")
    ap.add_argument("--replan", action="store_true", help="recompute the plan side of an existing --out (after a "
                    "change of memory_plan.py); runs nothing, the measurements are kept")
    ap.add_argument("--host-build", action="store_true", help="measure only the host memory at model build "
                    "(125m, TP 1 and 2) and merge it into --out")
    args = ap.parse_args()
    if args.host_build:  # the host-memory-at-build rows alone, merged into an existing --out
        res = {}
        if os.path.exists(args.out):
            with open(args.out, encoding="utf-8") as f:
                res = json.load(f)
        res["host_build"] = host_build()
        res["host_build_date"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        _write(res, args.out)
        return 0
    if args.replan:
        with open(args.out, encoding="utf-8") as f:
            res = json.load(f)
        res["runs"] = compare([replan(r) for r in res["runs"]])
        res["replanned"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        _write(res, args.out)
        return 0
    sys.path.insert(0, os.path.join(REPO, "tests"))
    from bytes_data import pack_bytes, stdlib_text, write_mindrecord

    chosen = set(args.presets.split(","))
    runs = []
    with tempfile.TemporaryDirectory(prefix="bench_memory_plan_") as root:
        data = os.path.join(root, "data")
        write_mindrecord(pack_bytes(stdlib_text("argparse", "typing"), SEQ), data, shards=2)
        for spec in LAYOUTS:
            if spec[0].startswith("floor_") or (spec[0] in args.layouts.split(",") if args.layouts else
                                                spec[1] in chosen):
                print(f"[memory_plan] {spec[0]} ...", flush=True)
                runs.append(run_layout(*spec, root=root, data=data))
                print(f"[memory_plan] {spec[0]}: {runs[-1]['wall_s']} s, peak RSS "
                      f"{[round(v / 2**20) for v in runs[-1]['measured']['peak_rss_bytes']]} MiB", flush=True)
    command = "benchmarks/bench_memory_plan.py " + (f"--layouts {args.layouts}" if args.layouts else
                                                     f"--presets {args.presets}")
    if args.append and os.path.exists(args.out):
        with open(args.out, encoding="utf-8") as f:
            old = json.load(f)
        done = {r["layout"] for r in runs}
        runs = [r for r in old["runs"] if r["layout"] not in done] + runs
        command = f"{old['command']}; {command} --append"
    res = {"command": command, "seq_len": SEQ, "runs": compare(runs),
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "host_build": host_build(),
           "host_build_date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    _write(res, args.out)
    print(json.dumps([{k: r.get(k) for k in ("layout", "exact", "predicted_peak_bytes", "peak_error")}
                      for r in res["runs"]], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
