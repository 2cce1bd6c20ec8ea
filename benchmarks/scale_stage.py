"""Issue #33: the sink's two steps re-run alone at two corpus sizes, interleaved, so their exponents are not the
machine's drift.

A whole-chain run at 4 GB takes about 20 minutes, and this machine's speed moves by 20-35 % between runs, so a
stage's exponent from three chain runs per size carries that drift (the writer's went 1.007, 1.112 and 0.85 in
three interleaved pairs).  Here the sink's scatter step (``sink_scatter``: every shard's copies into key-range
buckets, with the held-out overlap check), the same step without that check (``sink_scatter_no_check``), both a
scatter task at a time (its shards, then their merge into the task's part), and the writer step (``sink_write``:
every output file packed, written and verified, from the scatter without the check) run again on the kept outputs
of the chain runs at two sizes, alternately, each step of each repeat
in a fresh process that handles every shard or file in turn, as ``airflow dags test`` runs task after task in one
process.  Its CPU is read from ``RUSAGE_CHILDREN`` (``common.run_measured``: the step and the verify children
it waits for).

Each size's kept run folder (``<work>/run-<size>gb-p<parallelism>``, what ``bench_scale.py`` leaves) is mirrored
into ``<work>/stage-<size>gb``: the large read-only stage outputs linked, the rest copied.  The mixture plan runs
there once with this checkout's code; then the steps repeat.  Nothing in the kept run changes.

Why the writer reads the scatter without the check: what the check drops depends on how much of the corpus repeats
the held-out sample (on the verbatim format-4 corpus, 23 % of the training documents at 1 GB and 82 % at 4 GB; on
format 6, 1 and 18 documents), which would leave the writer a different workload at each size.  The check's own
cost is the difference of the two scatter rows; it grows with the matches it finds and with the held-out index,
which grows with the held-out sample up to ``mixture.val_max_docs`` per domain.

    .venv/bin/python benchmarks/bench_scale.py --stage-repeats 4     # into the existing --out (scale.json)
"""

from __future__ import annotations

import json
import math
import shutil
import sys
from pathlib import Path

from common import REPO, run_measured

LINKED = ("ingest", "exact_dedup", "minhash", "quality", "tokenize", "tokenizer")
REBUILT = ("sink", "mindrecord", "mindrecord_val", "profile", "mixture")
_SCATTER = """
import sys
from pathlib import Path
from pipeline.sink import heldout_overlap
from pipeline.ingest.output import output_specs
from pipeline.tasks import batches, sink_steps
from pipeline.tasks.run_state import load_run_config
if sys.argv[2:] == ["no-check"]:
    heldout_overlap.plan_index = lambda rdir: None      # the scatter as before the held-out check: all copies kept
rdir = Path(sys.argv[1])
for h in batches.plan_batches(rdir, len(batches.shard_names(rdir)), load_run_config(rdir).parallelism):
    plan = [{**spec, "run_dir": str(rdir)} for spec in batches.batch_specs(h)]    # the mirror, not the kept run
    sink_steps.sink_scatter_batch(h, output_specs(plan))                          # each scatter task in turn
"""
STEPS = {
    "sink_scatter": _SCATTER,
    "sink_scatter_no_check": _SCATTER,
    "sink_write": """
import sys
from pathlib import Path
from pipeline.sink import mindrecord
from pipeline.tasks import sink_steps
rdir = Path(sys.argv[1])
n = sink_steps._sink_layout(rdir)["n_files"]
args = sink_steps._write_args(rdir)
parts = sink_steps.scatter_parts(rdir)
for k in range(n):
    mindrecord.write_file_job((rdir, k, n, parts, args))
"""}
ARGS = {"sink_scatter_no_check": ("no-check",)}
#: What a step writes, removed before it runs again (its completion markers would skip the work).
OUTPUTS = {"sink_scatter": ("sink/scatter", "removed/overlaps_heldout", "stats/overlaps_heldout"),
           "sink_scatter_no_check": ("sink/scatter",), "sink_write": ("sink/out",)}


def mirror(run: Path, dest: Path) -> Path:
    """``dest/<run folder>``: the kept run's read-only stage outputs linked, its small files copied, sink redone."""
    src = next((run / "data" / "runs").iterdir())
    rdir = dest / src.name
    shutil.rmtree(dest, ignore_errors=True)
    rdir.mkdir(parents=True)
    for p in src.iterdir():
        if p.name in REBUILT:
            continue
        if p.name in LINKED:
            (rdir / p.name).symlink_to(p.resolve())
        elif p.is_dir():
            shutil.copytree(p, rdir / p.name, symlinks=True)
        else:
            shutil.copy2(p, rdir / p.name)
    return rdir


def prepare(rdir: Path) -> dict:
    """The mixture plan, in this process (once per size; not what is measured)."""
    sys.path.insert(0, str(REPO))
    from pipeline.io import read_json
    from pipeline.tasks import sink_steps
    from pipeline.tasks.run_state import run_of

    specs = [{"run_dir": str(rdir)}]
    _, shards = run_of(specs)
    sink_steps.plan_mixture(specs)
    index = read_json(rdir / "mixture" / "plan.json").get("heldout_index") or {}
    return {"shards": len(shards), "n_files": sink_steps._sink_layout(rdir)["n_files"],
            "heldout_docs": index.get("heldout_docs"), "heldout_runs": index.get("runs")}


def dropped(rdir: Path) -> dict:
    """Training documents in and dropped by the held-out overlap check (its stats files)."""
    docs = [json.loads(p.read_text()) for p in (rdir / "stats" / "overlaps_heldout").glob("*.json")]
    return {"in_docs": sum(d["in_docs"] for d in docs), "dropped": sum(d["in_docs"] - d["kept_docs"] for d in docs)}


def run_step(rdir: Path, step: str) -> dict:
    """One fresh process doing ``step`` for every shard or output file of the run: its CPU-seconds (with the
    children it waits for), wall seconds and peak tree RSS."""
    for rel in OUTPUTS[step]:
        shutil.rmtree(rdir / rel, ignore_errors=True)
    r = run_measured([sys.executable, "-c", STEPS[step], str(rdir), *ARGS.get(step, ())], cwd=REPO,
                     log=rdir.parent / f"{step}.log", timeout=3600)
    if r["rc"]:
        raise RuntimeError(f"{step} on {rdir} exited {r['rc']}; see {rdir.parent / f'{step}.log'}")
    return r


def stage_repeats(work: Path, sizes: list[float], parallelism: int, repeats: int, corpus_mb: dict) -> dict:
    """``repeats`` interleaved runs of both sink steps per size; per step the exponent of the medians and of each
    pair of runs."""
    import scale_stats

    dirs, setup = {}, {}
    for size in sizes:
        dirs[size] = mirror(work / f"run-{size:g}gb-p{parallelism}", work / f"stage-{size:g}gb")
        setup[f"{size:g}"] = prepare(dirs[size])
    cpu: dict[str, dict[float, list[float]]] = {step: {s: [] for s in sizes} for step in STEPS}
    sticks = []
    for _ in range(repeats):
        for size in sizes:
            for step in STEPS:                    # in this order: the writer reads the last scatter's output
                cpu[step][size].append(run_step(dirs[size], step)["cpu_s"])
        sticks.append(scale_stats.yardstick(3))
    small, large = sizes[0], sizes[-1]
    ratio = corpus_mb[large] / corpus_mb[small]
    steps = {}
    for step, by_size in cpu.items():
        med = {s: scale_stats.spread(v) for s, v in by_size.items()}
        steps[step] = {"cpu_s": {f"{s:g}": med[s] for s in sizes},
                       "exponent": round(math.log(med[large]["median"] / med[small]["median"]) / math.log(ratio), 3),
                       "pair_exponents": scale_stats.pair_exponents(by_size[small], by_size[large], ratio)}
    return {"what": "each sink step alone over every shard or output file, one fresh process per step and repeat, "
            "sizes interleaved", "repeats": repeats, "parallelism": parallelism,
            "corpus_mb": {f"{s:g}": corpus_mb[s] for s in sizes}, "setup": setup, "steps": steps,
            "overlaps_heldout": {f"{s:g}": dropped(dirs[s]) for s in sizes},
            "yardstick_cpu_s": scale_stats.spread(sticks)}


def merge(out: Path, work: Path, parallelism: int, repeats: int) -> int:
    """``--stage-repeats``: the writer's repeats into an existing results file, its runs' sizes and corpus MB."""
    res = json.loads(out.read_text())
    runs = res["runs"]
    sizes = [r["size_gb"] for r in runs]
    if len(sizes) < 2:
        print(f"[scale] {out}: needs runs at two sizes, has {sizes}", file=sys.stderr)
        return 2
    res["stage_repeats"] = stage_repeats(work, [sizes[0], sizes[-1]], parallelism, repeats,
                                         {r["size_gb"]: r["corpus_mb"] for r in runs})
    out.write_text(json.dumps(res, indent=1, default=str) + "\n", encoding="utf-8")
    print(json.dumps(res["stage_repeats"], indent=1))
    return 0
