"""The same corpus through ``mindloom corpus`` and through ``airflow dags test corpus_build``: CPU-seconds of both.

Why: users run the DAG, and issue 23 measured it at twice the CLI's CPU on the same input.  Both paths now run the
same task functions over the same batch plan (``pipeline.tasks.steps``), so any difference is orchestration cost
(Airflow's task runner, pools started per task).  This script runs both on one corpus with one config and reports,
per path, the process tree's CPU-seconds (``scale_timeline.measured``: the larger of rusage and a sampled tree) and
the per-stage sums of ``profile/<stage>/*.json``, plus the kept documents and tokens (which must be equal).

    python benchmarks/dag_vs_cli.py --corpus DIR --work DIR [--parallelism 8] [--docs-per-shard 100] [--out F]

``DIR`` holds ``<domain>/*.jsonl`` (as ``bench_scale`` builds them).  ``--paths cli,dag`` runs only some.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_scale import airflow_env, chain_config  # noqa: E402
from scale_timeline import measured  # noqa: E402


def _profile_cpu(rdir: Path) -> dict:
    from pipeline.profile import read_profiles

    return {stage: round(sum(p.get("cpu_s", 0.0) for p in units), 2) for stage, units in read_profiles(rdir).items()}


def _outcome(rdir: Path) -> dict:
    from pipeline.io import read_json
    from pipeline.tasks.corpus import collect_stats

    stats = collect_stats(rdir)
    kept = {stage: sum(d["kept_docs"] for d in doms.values()) for stage, doms in stats.items()}
    return {"kept_docs": kept, "tokens": read_json(rdir / "mindrecord" / "manifest.json")["tokens"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", type=Path, required=True)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--parallelism", type=int, default=8)
    ap.add_argument("--docs-per-shard", type=int, default=100)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--paths", default="cli,dag")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    a.work.mkdir(parents=True, exist_ok=True)
    res: dict = {"corpus": str(a.corpus), "corpus_mb": round(sum(p.stat().st_size for p in a.corpus.rglob("*.jsonl"))
                                                              / 1e6, 2), "paths": {}}
    for path in a.paths.split(","):
        data_root = a.work / path / "data"
        shutil.rmtree(data_root, ignore_errors=True)
        cfg = chain_config(a.corpus, data_root, a.seq_len, a.parallelism, f"dagcli-{path}")
        cfg["ingest"]["docs_per_shard"] = a.docs_per_shard
        cfg_path = a.work / path / "mindloom.yaml"
        cfg_path.parent.mkdir(parents=True, exist_ok=True)
        cfg_path.write_text(yaml.safe_dump(cfg))
        home = a.work / path / "airflow"
        env = airflow_env(home, cfg_path, a.corpus.parent)
        env["PYTHONPATH"] = str(REPO)
        log = a.work / path / "run.log"
        if path == "dag":
            if not (home / "airflow.db").exists():
                home.mkdir(parents=True, exist_ok=True)
                subprocess.run([str(Path(sys.executable).parent / "airflow"), "db", "migrate"], env=env, check=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            argv_ = [str(Path(sys.executable).parent / "airflow"), "dags", "test", "corpus_build"]
        else:
            argv_ = [sys.executable, "-m", "pipeline.cli", "corpus", "--config", str(cfg_path), "--run-id", "cli"]
        r = measured(argv_, log=log, env=env, timeout=3600, cwd=REPO)
        r.pop("samples")
        runs = sorted((data_root / "runs").glob("*"))
        if r["rc"] != 0 or not runs:
            print(f"[dag_vs_cli] {path} failed (rc {r['rc']}); log {log}", flush=True)
            return 1
        r.update(profile_cpu_s=_profile_cpu(runs[-1]), **_outcome(runs[-1]))
        r["profile_cpu_total"] = round(sum(r["profile_cpu_s"].values()), 1)
        res["paths"][path] = r
        print(f"[dag_vs_cli] {path}: {r['cpu_s']} CPU-s (tree), {r['profile_cpu_total']} CPU-s in task profiles, "
              f"{r['wall_s']} s wall, {r['tokens']} tokens", flush=True)
    if a.out:
        a.out.write_text(json.dumps(res, indent=1))
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
