"""CPU cost of the per-document text statistics: compiled kernels vs the pure-Python reference, and per stage.

    .venv/bin/python benchmarks/bench_quality_kernels.py [--repeats 3]
    .venv/bin/python benchmarks/bench_quality_kernels.py --run-dir RUN --before /path/to/old/checkout [--repeats 3]

Scoring: every document of ``../shared/corpora`` through its domain's default chain (score only), in a fresh
process per repeat, once with the numba kernels and once with the reference path
(``pipeline.quality.filters.text.KERNELS = None``).  The numba cache is warm (one untimed run first); CPU-seconds,
median of the repeats, with the spread.

Stages (``--run-dir``, a finished run of ``mindloom corpus``, e.g. the one ``benchmarks/scale_corpus.py`` data
gives): the MinHash signatures stage (which pre-scores with the quality chains) and the quality stage are re-run
shard by shard with one worker on a copy of the run, in a fresh process per repeat, with this checkout's code and
with ``--before``'s.  Each fresh process pays its numba cache load; it is counted.  ``--cold`` adds one run per
stage with an empty numba cache (``NUMBA_CACHE_DIR``): what the first run on a machine pays to compile.  The copies' outputs are
compared with the run's own files (they must be equal).

Writes ``benchmarks/results/quality_kernels.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CORPORA = REPO.parent / "shared" / "corpora"

_SCORE = r"""
import json, resource, sys
from pathlib import Path
from pipeline.config import DEFAULT_CONFIG, load_config
from pipeline.quality.filters import text as T
from pipeline.quality.filters.chain import Chain
if sys.argv[1] == "reference":
    T.KERNELS = None
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF); return r.ru_utime + r.ru_stime
q = load_config(DEFAULT_CONFIG).quality
docs = [(p.stem, json.loads(line)["text"]) for p in sorted(Path(sys.argv[2]).glob("*.jsonl"))
        for line in p.read_text(encoding="utf-8").splitlines()]
chains = {d: Chain.build(q, d) for d in {d for d, _ in docs}}
for c in chains.values():
    c.filters = [f for f in c.filters if f.name != "language"]
c0 = cpu()
for d, text in docs:
    chains[d].score(T.Doc(text, "x", d))
print(json.dumps({"cpu": cpu() - c0, "mb": sum(len(t.encode("utf-8", "surrogatepass")) for _, t in docs) / 1e6}))
"""

_STAGE = r"""
import json, resource, sys
from pathlib import Path
def cpu():
    s = resource.getrusage(resource.RUSAGE_SELF); c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime
stage, run = sys.argv[1], Path(sys.argv[2])
cfg = json.loads((run / "config.json").read_text())
cfg["quality"]["workers"] = 1
cfg["task_workers"] = 1
(run / "config.json").write_text(json.dumps(cfg))
from pipeline.tasks import corpus as C
fn, out = {"signatures": (C.minhash_signatures, "minhash/signatures"), "quality": (C.quality_shard, "quality")}[stage]
for f in (run / out).glob("*.done"):
    f.unlink()
specs = [{**s, "run_dir": str(run)} for s in json.loads((run / "plan.json").read_text())]
c0 = cpu()
for s in specs:
    fn(s)
print(json.dumps({"cpu": cpu() - c0}))
"""


def _python(code: str, root: Path, *args: str, env_extra: dict | None = None) -> dict:
    env = {**os.environ, "PYTHONPATH": str(root), **(env_extra or {})}
    out = subprocess.run([sys.executable, "-c", code, *args], cwd=root, env=env, check=True, capture_output=True,
                         text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _summary(values: list[float]) -> dict:
    return {"median": round(statistics.median(values), 2), "min": round(min(values), 2),
            "max": round(max(values), 2), "runs": [round(v, 2) for v in values]}


def _equal_outputs(a: Path, b: Path) -> int:
    import pyarrow.parquet as pq

    n = 0
    for sub in ("minhash/signatures", "quality", "quality/scores"):
        for f in sorted((a / sub).glob("*.parquet")):
            ta, tb = pq.read_table(f), pq.read_table(b / sub / f.name)
            if not (ta.equals(tb) and ta.schema.metadata == tb.schema.metadata):
                raise SystemExit(f"{sub}/{f.name}: output differs from the run's own file")
            n += 1
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--run-dir", type=Path)
    ap.add_argument("--before", type=Path, help="checkout with the code to compare against (stages)")
    ap.add_argument("--cold", action="store_true", help="also run each stage once with an empty numba cache")
    args = ap.parse_args()
    result: dict = {}
    if CORPORA.exists():
        _python(_SCORE, REPO, "kernels", str(CORPORA))               # warm the numba cache
        runs = {e: [_python(_SCORE, REPO, e, str(CORPORA)) for _ in range(args.repeats)]
                for e in ("reference", "kernels")}
        result["scoring"] = {"mb": round(runs["kernels"][0]["mb"], 2),
                             **{e: _summary([r["cpu"] for r in rs]) for e, rs in runs.items()}}
        print("scoring", json.dumps(result["scoring"]))
    if args.run_dir:
        roots = {"after": REPO, **({"before": args.before.resolve()} if args.before else {})}
        result["stages"] = {}
        for stage in ("signatures", "quality"):
            for name, root in roots.items():
                values = []
                for _ in range(args.repeats):
                    with tempfile.TemporaryDirectory() as tmp:
                        run = Path(tmp) / "run"
                        shutil.copytree(args.run_dir, run)
                        values.append(_python(_STAGE, root, stage, str(run))["cpu"])
                        _equal_outputs(args.run_dir, run)
                result["stages"].setdefault(stage, {})[name] = _summary(values)
            if args.cold:
                with tempfile.TemporaryDirectory() as tmp:
                    run = Path(tmp) / "run"
                    shutil.copytree(args.run_dir, run)
                    cold = _python(_STAGE, REPO, stage, str(run), env_extra={"NUMBA_CACHE_DIR": str(Path(tmp) / "nb")})
                result["stages"][stage]["after_cold_cache"] = round(cold["cpu"], 2)
            print(stage, json.dumps(result["stages"][stage]))
    out = REPO / "benchmarks" / "results" / "quality_kernels.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
