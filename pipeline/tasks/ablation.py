"""The ablation's task functions: what the ``ablation`` DAG's tasks and ``mindloom ablation`` call, in order.

1. :func:`split` ingests the sources once and holds the references out (``pipeline.ablation.plan``);
2. :func:`build_arm`, one per arm: the arm's corpus through the same chain as ``corpus_build``
   (:func:`pipeline.tasks.corpus.run_all`: the same task functions, in one task; arms are proxy-sized);
3. :func:`plan_runs`: arms x seeds (and the A/A pair), each with its corpus;
4. one training run each: :func:`run_config` and :func:`run_dir` tell the training operator (or the CLI) what to
   build and where; a rerun resumes from the run's newest checkpoint like any stage;
5. :func:`score`, one per run: bits per byte on every reference document, in its own process;
6. :func:`report`: the differences, intervals, noise floor and verdicts (``pipeline.ablation.report``).

Every step is idempotent: a rerun of a finished step returns what it wrote.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from pipeline.ablation.plan import ablation_dir, arm_config, arm_runs, split_references
from pipeline.config import MindloomConfig, config_from_dict
from pipeline.io import read_json, write_json


def _cfg(params: dict | MindloomConfig) -> MindloomConfig:
    if isinstance(params, MindloomConfig):
        return params
    from pipeline.form import config_from_params

    return config_from_params(dict(params))


def _frozen(params: dict | MindloomConfig, run_id: str) -> tuple[MindloomConfig, Path]:
    """The run's config as the split froze it (later tasks and reruns use the same), and the run folder."""
    cfg = _cfg(params)
    root = ablation_dir(cfg.data_root, run_id)
    path = root / "config.json"
    if path.is_file():
        return config_from_dict(read_json(path)), root
    return cfg, root


def split(params: dict | MindloomConfig, run_id: str) -> dict:
    """Freeze the config, ingest once, hold the references out; returns the arms to build and the split."""
    cfg, root = _frozen(params, run_id)
    root.mkdir(parents=True, exist_ok=True)
    if not (root / "config.json").is_file():
        write_json(root / "config.json", cfg.to_dict())
    result = split_references(cfg, root)
    return {"arms": [*cfg.ablation.arms, *cfg.ablation.control_arms()], "domains": result["domains"],
            "root": str(root)}


def build_arm(params: dict | MindloomConfig, run_id: str, arm: str) -> dict:
    """The arm's corpus: the chain over the split's documents with the arm's overrides; its corpus summary."""
    from pipeline.tasks.corpus import run_all

    cfg, root = _frozen(params, run_id)
    summary = run_all(arm_config(cfg, root, arm), arm, progress=False)
    corpus = {k: v for k, v in summary.items() if k != "stats"}
    return {"arm": arm, "corpus": corpus}


def plan_runs(params: dict | MindloomConfig, run_id: str, built: list[dict]) -> list[dict]:
    """Every training run with its corpus (the A/A arm trains on the baseline's)."""
    cfg, _ = _frozen(params, run_id)
    corpora = {b["arm"]: b["corpus"] for b in built}
    runs = []
    for run in arm_runs(cfg):
        index = (run["seed"] - cfg.seed) % 1000
        runs.append({**run, "index": index, "corpus": corpora[run["corpus_arm"]]})
    return runs


def run_dir(params: dict | MindloomConfig, run_id: str, run: dict) -> Path:
    """Where one training run writes: ``train/<arm>/seed<k>`` of the ablation run."""
    _, root = _frozen(params, run_id)
    return root / "train" / run["arm"] / f"seed{run['seed']}"


def run_config(params: dict | MindloomConfig, run_id: str, run: dict) -> MindloomConfig:
    """The config one training run's job is built from: its corpus arm's, with the run's seed."""
    cfg, root = _frozen(params, run_id)
    arm = arm_config(cfg, root, run["corpus_arm"])
    return config_from_dict({**arm.to_dict(), "seed": run["seed"]})


def score(params: dict | MindloomConfig, run_id: str, run: dict) -> dict:
    """Bits per byte of the run's final checkpoint on every reference document (``python -m
    pipeline.ablation.score``, its own process); reused when its scores exist."""
    cfg, root = _frozen(params, run_id)
    out = root / "scores" / f"{run['arm']}-seed{run['seed']}.json"
    result = {k: run[k] for k in ("arm", "seed", "index")} | {"scores": str(out)}
    if out.is_file():
        return result
    job = run_dir(params, run_id, run) / "job.json"
    tokenizer = Path(run["corpus"]["run_dir"]) / "tokenizer" / "spm.model"
    p = subprocess.run([sys.executable, "-m", "pipeline.ablation.score", "--job", str(job), "--tokenizer",
                        str(tokenizer), "--references", str(root / "references"), "--out", str(out),
                        "--cloze-items", str(cfg.ablation.cloze_items)],
                       capture_output=True, text=True)
    if p.returncode:
        raise RuntimeError(f"scoring {run['arm']} seed {run['seed']} failed (rc {p.returncode}): "
                           f"{p.stderr.strip()[-2000:]}")
    return result


def report(params: dict | MindloomConfig, run_id: str, scored: list[dict], built: list[dict]) -> dict:
    """Write ``report.json`` / ``report.md``; return the headline for the task's XCom."""
    from pipeline.ablation.report import build_report

    cfg, root = _frozen(params, run_id)
    rep = build_report(cfg, sorted(scored, key=lambda r: (r["arm"], r["index"])),
                       {b["arm"]: b["corpus"] for b in built}, root)
    primary = "all" if not cfg.ablation.primary else cfg.ablation.primary
    return {"report": str(root / "report.json"), "noise_floor": rep["noise_floor"],
            "primary": {arm: rows[primary] for arm, rows in rep["differences"].items()}}


def train_blocking(params: dict | MindloomConfig, run_id: str, run: dict, poll_s: float = 1.0) -> dict:
    """The CLI's training run: the same job the DAG's operator builds, started the same way, waited for."""
    import time

    from pipeline.tasks.pretrain import TERMINAL, build_job, job_state, stage_result
    from pipeline.tasks.submit import start_or_reattach

    out = run_dir(params, run_id, run)
    if (out / "summary.json").is_file() and (out / "completed.json").is_file():
        return stage_result(out)
    cfg = run_config(params, run_id, run)
    ext, proc, _ = start_or_reattach(cfg, lambda: build_job(cfg, run["corpus"], out, stage="main"), out,
                                     "launcher.cli.log")
    while True:
        if proc is not None and proc.poll() is not None:
            break
        if proc is None and job_state(out, job_id=ext["job_id"])["state"] in TERMINAL:
            break
        time.sleep(poll_s)
    state = job_state(out, job_id=ext["job_id"])
    if state["state"] != "SUCCEEDED":
        raise RuntimeError(f"training {run['arm']} seed {run['seed']} {state['state']}: {state.get('error')} "
                           f"(log {ext.get('log')})")
    write_json(out / "completed.json", {"by": "mindloom ablation"})
    return stage_result(out)


def run_all(params: dict | MindloomConfig, run_id: str) -> dict:
    """``mindloom ablation``: every step in order, in this process (training and scoring in child processes)."""
    first = split(params, run_id)
    built = [build_arm(params, run_id, arm) for arm in first["arms"]]
    runs = plan_runs(params, run_id, built)
    for run in runs:
        train_blocking(params, run_id, run)
    scored = [score(params, run_id, run) for run in runs]
    return report(params, run_id, scored, built)


__all__ = ["build_arm", "plan_runs", "report", "run_all", "run_config", "run_dir", "score", "split"]
