"""Issue 33: what one mapped task of each step costs before and beside its work.

    .venv/bin/python benchmarks/bench_task_cost.py [--mb 1] [--out benchmarks/results/task_cost.json]

Every mapped step of the corpus chain (``pipeline.tasks.steps``) runs once per batch of shards, so at the shipped
``parallelism`` (64) its fixed cost is paid 64 times per run.  This measures, per mapped step, the CPU-seconds and
wall seconds of one task:

* on a **near-empty** shard (three short documents: the fixed cost) and on a **1 MB** shard (``--mb``) of real text
  (the first documents of ``academic.jsonl`` of ``../shared/corpora``, else the demo corpus' ``docs.jsonl``;
  under that domain's quality chain);
* **warm**: in a process that has already run a chain, as ``airflow dags test`` and ``mindloom corpus`` run tasks
  (one process, task after task: imports done, the pool server started, its kernels loaded);
* **cold**: in a fresh Python process that only runs that task, as a Celery or LocalExecutor worker starts one
  per task (imports, configuration, a pool server of its own when the task uses one).  Airflow's own task-runner
  start-up is not included (about 0.1 CPU-s per task instance under ``dags test``, measured by ``bench-scale``'s
  parallelism sweep).

The chain runs with ``parallelism: 1``, so each batch step is one task over the one shard; map steps (exact-dedup
partitions, MinHash bands, writer batches) report the mean over their tasks.  CPU counts the task's whole process
tree (``pipeline.profile.measured`` warm; the sampled tree of the subprocess cold).  The tokenizer trained on the
1 MB input is reused for the near-empty one (SentencePiece cannot learn 4,000 pieces from one document).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import REPO, RESULTS_DIR, machine, source_corpus  # noqa: E402

#: the near-empty shard: three short documents that pass the default quality chain (a shard whose documents all
#: fail leaves later stages nothing to do, and the validation split needs two documents)
TINY_DOCS = [
    "The harbour master keeps a log of every ship that enters the port, with its cargo, its crew and the hour of its "
    "arrival. On stormy nights the log is short, and the lamps in the office burn until the morning. In the summer "
    "the fishing boats come back at dusk, and the master walks along the quay to count them before he goes home.",
    "Our village library opened a reading room for children this spring. It has low tables, a carpet with a map of "
    "the world on it, and shelves that the children can reach without help. On Saturdays a volunteer reads a story "
    "aloud, and afterwards the children draw what they heard and pin the pictures to the wall by the door.",
    "The old railway line through the valley was closed many years ago, but the path that replaced it is now one of "
    "the most popular walks in the county. It is flat and wide, so families with small children and people on "
    "bicycles share it easily, and the stone bridges over the river still carry the names of the men who built them.",
]


def _inputs(work: Path, mb: float) -> dict[str, Path]:
    """``{case: source folder}``: one ``<domain>.jsonl`` each, the first documents of the source up to ``mb`` MB, and
    one short document."""
    src = source_corpus()
    if src is None:
        raise SystemExit("bench_task_cost: no ../shared/corpora and no demo corpus (make corpus)")
    path = next((src / n for n in ("academic.jsonl", "books.jsonl", "docs.jsonl") if (src / n).exists()),
                sorted(src.glob("*.jsonl"))[0])
    lines, size = [], 0
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if size >= mb * 1e6:
                break
            doc = json.loads(line)
            lines.append(json.dumps({"id": doc["id"], "text": doc["text"]}, ensure_ascii=False) + "\n")
            size += len(doc["text"].encode("utf-8"))
    out = {}
    tiny = "".join(json.dumps({"id": f"tiny/{i}", "text": t}) + "\n" for i, t in enumerate(TINY_DOCS))
    for case, body in (("1mb", "".join(lines)), ("tiny", tiny)):
        (work / case).mkdir(parents=True, exist_ok=True)
        (work / case / f"{path.stem}.jsonl").write_text(body, encoding="utf-8")
        out[case] = work / case
    return out


def _config(work: Path, source: Path, tokenizer: str = "") -> Path:
    import yaml

    from pipeline.config import DEFAULT_CONFIG, load_config

    d = load_config(DEFAULT_CONFIG).to_dict()
    (src,) = source.glob("*.jsonl")
    d.update(sources=[{"domain": src.stem, "reader": "jsonl", "paths": [str(src)]}], domains=[],
             data_root=str(work / "data"), parallelism=1, run_name="task-cost")
    d["ingest"]["docs_per_shard"] = 1_000_000                  # the whole input is one shard
    d["tokenizer"]["model_path"] = tokenizer
    d["pack"]["shard_num"] = 1                                 # three short documents make a row or two
    path = work / f"config-{source.name}-{time.time_ns()}.yaml"
    path.write_text(yaml.safe_dump(d, sort_keys=False), encoding="utf-8")
    return path


def _subprocess_task(task_id: str, item, work: Path) -> dict:
    """One task in a fresh interpreter: its process tree's CPU and wall (scale_timeline.measured)."""
    from scale_timeline import measured

    code = ("import json, sys; from pipeline.tasks.corpus import run_step; "
            "run_step(sys.argv[1], json.loads(sys.argv[2]))")
    m = measured([sys.executable, "-c", code, task_id, json.dumps(item)], log=work / "cold.log",
                 env={**__import__("os").environ, "MINDLOOM_ALLOWED_ROOTS": str(work)}, timeout=1800, cwd=REPO)
    if m["rc"] != 0:
        raise SystemExit(f"bench_task_cost: {task_id} failed in a fresh process (rc {m['rc']}); see {work}/cold.log")
    return {"cpu_s": m["cpu_s"], "wall_s": m["wall_s"]}


def chain(cfg_path: Path, run_id: str, cold: bool, work: Path) -> dict[str, dict]:
    """The chain step by step (as ``run_all``); every mapped task warm in this process, or cold in a subprocess.
    Returns ``{task_id: {tasks, cpu_s, wall_s}}`` per mapped step, CPU and wall as the mean per task."""
    import os

    from pipeline.config import load_config
    from pipeline.io import run_dir
    from pipeline.profile import read_profiles
    from pipeline.tasks import steps
    from pipeline.tasks.corpus import run_step

    os.environ["MINDLOOM_ALLOWED_ROOTS"] = str(work)
    out: dict = {}
    cost: dict[str, list[dict]] = {}
    for step in steps.STEPS:
        if step.kind == "plan":
            out[step.task_id] = run_step(step.task_id, params=load_config(cfg_path), run_id=run_id,
                                         config_path=str(cfg_path))
        elif step.mapped:
            items = out["plan"] if step.kind == "batch" else out[step.over]
            res = []
            for it in items:
                if cold:
                    cost.setdefault(step.task_id, []).append(_subprocess_task(step.task_id, it, work))
                    res.append(None)
                else:
                    t0 = time.perf_counter()
                    res.append(run_step(step.task_id, it))
                    cost.setdefault(step.task_id, []).append({"wall_s": time.perf_counter() - t0})
            out[step.task_id] = res
        else:
            out[step.task_id] = run_step(step.task_id, out["plan"])
    if not cold:                              # warm CPU from the tasks' own profiles (every stage of a fused step)
        cfg = load_config(cfg_path)
        prof = read_profiles(run_dir(cfg.data_root, run_id))
        for step in steps.STEPS:
            if step.task_id in cost:
                stages = (step.stage, *step.then) if step.kind == "batch" else (step.call,)
                cpu = sum(p["cpu_s"] for s in stages for p in prof.get(_profile_name(s), []))
                n = len(cost[step.task_id])
                cost[step.task_id] = [{"cpu_s": cpu / n, "wall_s": sum(c["wall_s"] for c in cost[step.task_id]) / n}]
    return {k: {"tasks": len(v), "cpu_s": round(sum(c["cpu_s"] for c in v) / len(v), 3),
                "wall_s": round(sum(c["wall_s"] for c in v) / len(v), 3)} for k, v in cost.items()}


def _profile_name(call: str) -> str:
    """The profile/ folder a map step's function writes (its ``@profiled`` stage name)."""
    return {"write_file_batch": "sink_write"}.get(call, call)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=1.0, help="MB of text in the non-empty shard")
    ap.add_argument("--out", type=Path, default=RESULTS_DIR / "task_cost.json")
    a = ap.parse_args(argv)
    res: dict = {"command": "benchmarks/bench_task_cost.py " + " ".join(argv or sys.argv[1:]), "machine": machine(),
                 "mb": a.mb, "cases": {}}
    with tempfile.TemporaryDirectory(prefix="task-cost-") as tmp:
        work = Path(tmp).resolve()
        inputs = _inputs(work, a.mb)
        big = _config(work, inputs["1mb"])
        chain(big, "warmup", cold=False, work=work)            # imports, the pool server and its kernels, once
        from pipeline.io import run_dir

        spm = str(run_dir(work / "data", "warmup") / "tokenizer" / "spm.model")
        for case in ("1mb", "tiny"):
            cfg = _config(work, inputs[case], tokenizer=spm)
            (src,) = inputs[case].glob("*.jsonl")
            res["cases"][case] = {"input_bytes": src.stat().st_size, "domain": src.stem}
            for mode in ("warm", "cold"):
                print(f"[task_cost] {case} {mode} ...", flush=True)
                res["cases"][case][mode] = chain(cfg, f"{case}-{mode}", cold=mode == "cold", work=work)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(res, indent=1) + "\n", encoding="utf-8")
    for case, c in res["cases"].items():
        for mode in ("warm", "cold"):
            print(case, mode, {k: (v["cpu_s"], v["wall_s"]) for k, v in c[mode].items()})
    print(f"[task_cost] wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
