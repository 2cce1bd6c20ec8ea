"""Training throughput (MindSpore GRAPH vs PYNATIVE vs the same model in PyTorch eager) and recompute memory, CPU.

Why one process for the throughput comparison: on a shared 2-core machine back-to-back processes measured anything
from 0.27x to 0.98x (docs notes §11); interleaving short blocks of steps of the three variants in one process, with
the same thread count, exposes them to the same load. The PyTorch model mirrors ``pipeline.train.model.model``
parameter for parameter and starts from the *same weights* (copied from the MindSpore model), and the script checks
that the first-step losses agree, so the comparison is of the same computation: fp32, AdamW (0.9/0.95, wd 0.1 on
matrices), global-norm clip 1.0, batch 4 x 256 tokens.

Memory: each recompute setting runs in a fresh GRAPH-mode subprocess; peak RSS is sampled every 2 ms during the
steady steps (after the compile step, which has its own transient peak), minus the RSS before the first step.
``activation_bound`` does the same at a shape where activations dominate (dim 256, 4 layers, 4 heads, seq 2048,
batch 1, fp32) in GRAPH and in PYNATIVE: MindSpore 2.10's CPU GRAPH backend does not turn ``Cell.recompute()`` into
a saving (a 16-op chain in 4 recomputed cells: -5 % in GRAPH, -36 % in PYNATIVE), so the figure is per mode.

``document_mask`` (#50) times the throughput model in GRAPH mode on packed rows of documents that end in an EOD id,
causal only against document-aware attention (the block-diagonal causal mask the model builds from the EOD ids,
the math path), interleaved in one process like the throughput variants; it needs no PyTorch, so
``--skip throughput,separate`` runs in the project venv.

Run (PyTorch lives in its own venv, never the project's; a .pth file there adds the project venv's packages)::

    python3.11 -m venv .cache/bench-venvs/torch && .cache/bench-venvs/torch/bin/pip install torch==2.13.0 numpy==1.26.4
    site=.cache/bench-venvs/torch/lib/python3.11/site-packages
    echo "$PWD/.venv/lib/python3.11/site-packages" > $site/zz-mindloom.pth
    .cache/bench-venvs/torch/bin/python benchmarks/bench_train.py
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import threading
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from torch_llama import copy_weights, torch_model, torch_step_fn  # noqa: E402 - needs the path above

MODEL = dict(vocab_size=8000, dim=256, n_layers=4, n_heads=8, n_kv_heads=4, multiple_of=32, max_seq_len=256)
BATCH, SEQ = 4, 256


def _job(steps: int):
    from pipeline.train.job import TrainJob

    return TrainJob(stage="bench", data_dir="-", out_dir="-", model={"preset": "debug", **MODEL}, steps=steps,
                    micro_batch=BATCH, lr=3e-4, min_lr=3e-5, warmup_steps=2)


# ---- throughput -------------------------------------------------------------------------------------------------

def _variants(threads: int, steps_total: int, only: str | None = None):
    """{name: (ms mode or None, step(batch) callable)}, first-step results, params, batches."""
    import mindspore as ms
    from mindspore.device_context.cpu.op_tuning import threads_num

    from pipeline.train.model.model import CausalLMLoss, Transformer, count_cell_params
    from pipeline.train.optim.optim import TrainStep, build_optimizer

    ms.set_device("CPU")
    threads_num(threads)
    job = _job(steps=steps_total)
    cfg = job.model_config()
    rng = np.random.RandomState(0)
    batches = [rng.randint(0, cfg.vocab_size, (BATCH, SEQ + 1)).astype(np.int32) for _ in range(8)]
    variants, first, params = {}, {}, None
    for mode, jit in (("graph", True), ("pynative", False)):
        if only not in (None, mode):
            continue
        ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE)
        ms.set_seed(0)
        net = Transformer(cfg)
        params = count_cell_params(net)
        step = TrainStep(CausalLMLoss(net), build_optimizer(net, job), grad_clip=1.0, jit=jit)
        t0 = time.time()
        first[mode] = {"loss": step([batches[0]])["loss"], "first_step_s": time.time() - t0}
        variants[mode] = (mode, step)
    if only in (None, "torch"):
        import torch

        torch.set_num_threads(threads)
        ms.set_context(mode=ms.PYNATIVE_MODE)
        ms.set_seed(0)
        ms_net = Transformer(cfg)
        params = count_cell_params(ms_net)
        tnet = torch_model(cfg)
        copy_weights(ms_net, tnet)  # same seed -> the same initial weights as the MindSpore variants
        del ms_net
        tstep = torch_step_fn(tnet)
        t0 = time.time()
        first["torch"] = {"loss": tstep(batches[0]), "first_step_s": time.time() - t0}
        variants["torch"] = (None, tstep)
    return variants, first, params, batches


def _time_blocks(variants: dict, batches: list, rounds: int, block: int) -> dict[str, list[float]]:
    import mindspore as ms

    times: dict[str, list[float]] = {k: [] for k in variants}
    order = list(variants)
    for r in range(rounds):
        for name in order[r % len(order):] + order[:r % len(order)]:  # rotate who goes first
            mode, fn = variants[name]
            if mode:
                ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE)
            for i in range(block):
                b = batches[(i + r) % len(batches)]
                t0 = time.perf_counter()
                fn([b]) if mode else fn(b)
                times[name].append(time.perf_counter() - t0)
    return times


def _summarise(times: dict[str, list[float]], first: dict) -> dict:
    tok = BATCH * SEQ
    res = {name: {"tokens_per_s_median": tok / statistics.median(ts), "tokens_per_s_best": tok / min(ts),
                  "step_s_min": min(ts), "step_s_median": statistics.median(ts),
                  "step_s_p10": float(np.percentile(ts, 10)), "step_s_p90": float(np.percentile(ts, 90)),
                  "steps": len(ts), **first.get(name, {})} for name, ts in times.items()}
    out = {"variants": res}
    if {"graph", "pynative", "torch"} <= set(res):
        # best (fastest) step: the least load-distorted estimate on a shared machine (as timeit's min); median: typical
        for stat in ("best", "median"):
            v = {k: r[f"tokens_per_s_{stat}"] for k, r in res.items()}
            out.update({f"graph_vs_torch_{stat}": v["graph"] / v["torch"],
                        f"pynative_vs_torch_{stat}": v["pynative"] / v["torch"],
                        f"graph_vs_pynative_{stat}": v["graph"] / v["pynative"]})
    return out


def throughput(threads: int, rounds: int, block: int) -> dict:
    """All three variants interleaved in this process (same load for all)."""
    variants, first, params, batches = _variants(threads, 10 * rounds * block + 10)
    out = _summarise(_time_blocks(variants, batches, rounds, block), first)
    out.update(params=params, tokens_per_step=BATCH * SEQ, threads=threads, rounds=rounds, block=block,
               first_loss_max_abs_diff=max(abs(first[a]["loss"] - first[b]["loss"]) for a in first for b in first))
    return out


def separate(threads: int, rounds: int, block: int) -> dict:
    """Each variant in its own process (no other framework's threads around), processes alternating."""
    times: dict[str, list[float]] = {"graph": [], "pynative": [], "torch": []}
    first: dict[str, dict] = {}
    for r in range(rounds):
        for name in list(times)[r % 3:] + list(times)[:r % 3]:
            cmd = [sys.executable, __file__, "--variant-child", name, "--threads", str(threads), "--block",
                   str(block)]
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
            if p.returncode:
                raise RuntimeError(f"{name} child failed: {p.stderr[-2000:]}")
            child = json.loads(p.stdout.strip().splitlines()[-1])
            times[name] += child["times"]
            first.setdefault(name, child["first"])
    out = _summarise(times, first)
    out.update(threads=threads, rounds=rounds, block=block)
    return out


def variant_child(name: str, threads: int, block: int) -> dict:
    variants, first, _, batches = _variants(threads, 10 * block + 10, only=name)
    return {"times": _time_blocks(variants, batches, 1, block)[name], "first": first[name]}


# ---- memory -------------------------------------------------------------------------------------------------------

MEM_MODEL = dict(vocab_size=8000, dim=256, n_layers=6, n_heads=8, n_kv_heads=4, multiple_of=32, max_seq_len=512)


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


_THREADS_SET: list[int] = []


def _step_at(model: dict, mode: str, threads: int, steps: int, micro_batch: int):
    """A training step of the ``debug`` preset with ``model`` overrides on the CPU in ``mode`` (graph or pynative),
    and one fixed random batch for it: what the memory and activation children measure."""
    import mindspore as ms
    from mindspore.device_context.cpu.op_tuning import threads_num

    from pipeline.train.job import TrainJob
    from pipeline.train.model.model import CausalLMLoss, Transformer
    from pipeline.train.optim.optim import TrainStep, build_optimizer

    ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    if not _THREADS_SET:          # MindSpore takes the thread count once per process
        threads_num(threads)
        _THREADS_SET.append(threads)
    job = TrainJob(stage="m", data_dir="-", out_dir="-", model={"preset": "debug", **model},
                   steps=steps + 1, micro_batch=micro_batch, warmup_steps=1)
    cfg = job.model_config()
    ms.set_seed(0)
    net = Transformer(cfg)
    step = TrainStep(CausalLMLoss(net), build_optimizer(net, job), grad_clip=1.0, jit=mode == "graph")
    rows = np.random.RandomState(0).randint(0, cfg.vocab_size, (micro_batch, cfg.max_seq_len + 1))
    return step, rows.astype(np.int32)


def memory_child(recompute: bool, threads: int, steps: int) -> dict:
    step, tokens = _step_at({**MEM_MODEL, "recompute": recompute}, "graph", threads, steps, micro_batch=4)
    base = _rss_mb()
    t0 = time.time()
    loss0 = step([tokens])["loss"]
    compile_s = time.time() - t0
    after_compile = _rss_mb()
    times, losses = [], []
    with _peak_rss(after_compile) as peak:
        for _ in range(steps):
            t0 = time.perf_counter()
            losses.append(step([tokens])["loss"])
            times.append(time.perf_counter() - t0)
    return {"recompute": recompute, "rss_before_first_step_mb": base, "rss_after_compile_mb": after_compile,
            "steady_peak_rss_mb": peak[0], "steady_activation_mb": peak[0] - base,
            "process_max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "compile_s": compile_s, "step_s_median": statistics.median(times), "first_loss": loss0,
            "losses": losses}


@contextlib.contextmanager
def _peak_rss(start: float):
    """``[peak]``: this process's RSS in MB, sampled every 2 ms by a thread while the block runs (from ``start``)."""
    peak, stop = [start], threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], _rss_mb())
            time.sleep(0.002)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    try:
        yield peak
    finally:
        stop.set()
        th.join()


PARTS = ("throughput", "separate", "memory", "activation", "skip", "docmask")
ACT_MODEL = dict(vocab_size=8000, dim=256, n_layers=4, n_heads=4, n_kv_heads=4, multiple_of=32, max_seq_len=2048)


def activation_child(recompute: bool, mode: str, threads: int, steps: int) -> dict:
    """One recompute setting at the activation-bound shape in one mode; peak RSS during steps 2.. minus before."""
    step, tokens = _step_at({**ACT_MODEL, "recompute": recompute}, mode, threads, steps, micro_batch=1)
    base = _rss_mb()
    losses = [step([tokens])["loss"]]
    with _peak_rss(_rss_mb()) as peak:
        losses += [step([tokens])["loss"] for _ in range(steps)]
    return {"recompute": recompute, "mode": mode, "rss_before_first_step_mb": base, "peak_rss_mb": peak[0],
            "activation_mb": peak[0] - base, "losses": losses}


def activation_bound(threads: int, steps: int) -> dict:
    """Activation memory with and without recompute at ACT_MODEL, GRAPH and PYNATIVE, each in a fresh process."""
    out = {"model": ACT_MODEL | {"batch": 1, "seq_len": ACT_MODEL["max_seq_len"], "precision": "fp32"}}
    for mode in ("graph", "pynative"):
        runs = {}
        for rc in (False, True):
            r = subprocess.run([sys.executable, __file__, "--activation-child", f"{mode}:{int(rc)}", "--threads",
                                str(threads), "--mem-steps", str(steps)], capture_output=True, text=True, timeout=1800)
            if r.returncode:
                raise RuntimeError(f"activation child failed: {r.stderr[-2000:]}")
            runs["recompute" if rc else "baseline"] = json.loads(r.stdout.strip().splitlines()[-1])
        b, c = runs["baseline"], runs["recompute"]
        out[mode] = {**runs, "activation_saving": 1 - c["activation_mb"] / b["activation_mb"],
                     "losses_equal": bool(np.allclose(b["losses"], c["losses"], atol=1e-4))}
    return out


def memory(threads: int, steps: int) -> dict:
    out = {}
    for rc in (False, True):
        r = subprocess.run([sys.executable, __file__, "--memory-child", str(int(rc)), "--threads", str(threads),
                            "--mem-steps", str(steps)], capture_output=True, text=True, timeout=1800)
        if r.returncode:
            raise RuntimeError(f"memory child failed: {r.stderr[-2000:]}")
        out["recompute" if rc else "baseline"] = json.loads(r.stdout.strip().splitlines()[-1])
    b, c = out["baseline"], out["recompute"]
    out["activation_saving"] = 1 - c["steady_activation_mb"] / b["steady_activation_mb"]
    out["peak_rss_saving"] = 1 - c["steady_peak_rss_mb"] / b["steady_peak_rss_mb"]
    out["losses_equal"] = bool(np.allclose(b["losses"], c["losses"], atol=1e-4))
    out["model"] = MEM_MODEL | {"batch": 4}
    return out


# ---- data resume cost -------------------------------------------------------------------------------------------

EOD = 2  # the end-of-document id of the document-mask batches


def _documents(rng, vocab: int, mean_len: int) -> np.ndarray:
    """A batch of packed rows whose documents (geometric lengths, mean ``mean_len``) each end with ``EOD``."""
    rows = rng.randint(3, vocab, (BATCH, SEQ + 1)).astype(np.int32)
    for row in rows:
        pos = -1
        while (pos := pos + 1 + rng.geometric(1.0 / mean_len)) < SEQ + 1:
            row[pos] = EOD
    return rows


def docmask(threads: int, rounds: int, block: int, mean_len: int = 64) -> dict:
    """Document-aware attention's cost (#50): the throughput model in GRAPH mode, causal only against the
    block-diagonal causal mask built from the ``EOD`` ids of the same packed batches (the math path, as on CPU),
    interleaved blocks in this one process."""
    import mindspore as ms

    rng = np.random.RandomState(0)
    batches = [_documents(rng, MODEL["vocab_size"], mean_len) for _ in range(8)]
    variants, first = {}, {}
    for name, eod in (("causal", -1), ("document_mask", EOD)):
        step, _ = _step_at({**MODEL, "eod_id": eod}, "graph", threads, 10 * rounds * block + 10, micro_batch=BATCH)
        t0 = time.time()
        first[name] = {"loss": step([batches[0]])["loss"], "first_step_s": time.time() - t0}
        variants[name] = ("graph", step)
    ms.set_context(mode=ms.GRAPH_MODE)
    out = _summarise(_time_blocks(variants, batches, rounds, block), first)
    v = out["variants"]
    docs = [int((b[:, :SEQ] == EOD).sum()) + BATCH for b in batches]
    out.update(step_cost=v["document_mask"]["step_s_median"] / v["causal"]["step_s_median"],
               step_cost_best=v["document_mask"]["step_s_min"] / v["causal"]["step_s_min"],
               mean_doc_tokens=round(BATCH * SEQ * len(docs) / sum(docs), 1), threads=threads, rounds=rounds,
               block=block, model=MODEL | {"batch": BATCH, "seq_len": SEQ})
    return out


def skip_speed(tmp: str, rows: int = 20000) -> dict:
    from pipeline.train.data import DataPosition, TokenBatches
    from pipeline.train.repack import write_rows

    write_rows(np.random.RandomState(0).randint(0, 8000, (rows, SEQ + 1)).astype(np.int32), tmp, shards=2)
    t0 = time.time()
    tb = TokenBatches(tmp, 8, 1, start=DataPosition(0, rows - 8 * 10, rows - 8 * 10))
    next(iter(tb.steps(1)))
    return {"rows": rows, "row_tokens": SEQ + 1, "skipped_rows": rows - 80,
            "skip_rows_per_s": (rows - 80) / (time.time() - t0)}


def main() -> int:
    from pipeline.train.jobs.cpu_dispatch import cpu_dispatch_inline

    cpu_dispatch_inline()  # as a CPU training job runs (its subprocesses inherit it); before any MindSpore launch
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--block", type=int, default=5, help="steps per variant per round")
    ap.add_argument("--mem-steps", type=int, default=4)
    ap.add_argument("--skip", default="", help="comma list of parts to skip: throughput,separate,memory,"
                    "activation,skip,docmask")
    ap.add_argument("--out", default=os.path.join(REPO, "benchmarks", "results", "train.json"))
    ap.add_argument("--separate-rounds", type=int, default=3, help="rounds of one process per variant")
    ap.add_argument("--memory-child", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--variant-child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--activation-child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.variant_child:
        print(json.dumps(variant_child(args.variant_child, args.threads, args.block)))
        return 0
    if args.activation_child:
        mode, rc = args.activation_child.split(":")
        print(json.dumps(activation_child(bool(int(rc)), mode, args.threads, args.mem_steps)))
        return 0
    if args.memory_child is not None:
        print(json.dumps(memory_child(bool(args.memory_child), args.threads, args.mem_steps)))
        return 0
    skip = set(filter(None, args.skip.split(",")))
    import tempfile

    import mindspore

    if {"throughput", "separate"} - skip:
        import torch  # the PyTorch venv's (the other parts run in the project venv too)

        torch_version = torch.__version__
    else:
        torch_version = None
    res = {"machine": {"python": platform.python_version(), "cpu_count": os.cpu_count(),
                       "platform": platform.platform(), "mindspore": mindspore.__version__, "torch": torch_version,
                       "loadavg_start": os.getloadavg()},
           "command": " ".join([os.path.relpath(sys.executable, REPO), "benchmarks/bench_train.py", *sys.argv[1:]]),
           "model": MODEL | {"batch": BATCH, "seq_len": SEQ}}
    this_run = {"machine": res["machine"], "command": res["command"], "parts": sorted(set(PARTS) - skip)}
    if os.path.exists(args.out):  # parts skipped in this run keep their previous results and the run's provenance
        with open(args.out, encoding="utf-8") as f:
            prev = json.load(f)
        res = {**prev, **res}
        if skip and "command" in prev:  # a partial run: the full run's command and machine stay, this one is added
            res.update(machine=prev["machine"], command=prev["command"],
                       partial_runs=[*prev.get("partial_runs", []), this_run])
    if "throughput" not in skip:
        res["throughput"] = throughput(args.threads, args.rounds, args.block)
        print(json.dumps(res["throughput"], indent=1), file=sys.stderr)
    if "separate" not in skip:
        res["throughput_separate_processes"] = separate(args.threads, args.separate_rounds, args.block)
        print(json.dumps(res["throughput_separate_processes"], indent=1), file=sys.stderr)
    if "memory" not in skip:
        res["memory"] = memory(args.threads, args.mem_steps)
        print(json.dumps({k: v for k, v in res["memory"].items() if k not in ("baseline", "recompute")}),
              file=sys.stderr)
    if "activation" not in skip:
        res["activation_bound"] = activation_bound(args.threads, args.mem_steps)
        print(json.dumps({k: v.get("activation_saving") for k, v in res["activation_bound"].items() if k != "model"}),
              file=sys.stderr)
    if "docmask" not in skip:
        res["document_mask"] = docmask(args.threads, args.rounds, args.block)
        print(json.dumps({k: v for k, v in res["document_mask"].items() if k != "variants"}), file=sys.stderr)
    if "skip" not in skip:
        with tempfile.TemporaryDirectory() as tmp:
            res["resume_skip"] = skip_speed(tmp)
    this_run["machine"]["loadavg_end"] = os.getloadavg()
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(res, f, indent=1)
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
