"""Bridge from a published corpus and the typed config to one training job, and how to launch and watch it.

The training process never shares Python objects with the orchestrator: :func:`build_job` writes a
``job.json`` (:class:`pipeline.train.job.TrainJob`) and :func:`launch_argv` builds the command line — plain
``python -m pipeline.train`` for one rank, ``msrun`` for several — as an argument list, never a shell string.
The job reports through files in its folder: ``status.json``, ``metrics.jsonl`` and ``summary.json``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from pipeline.config import MindloomConfig
from pipeline.io import read_json, safe_run_id, write_json

TERMINAL = ("SUCCEEDED", "FAILED", "LOST")


def stage_dir(data_root: str | Path, run_id: str, stage: str) -> Path:
    """Training output of one stage of one run: retries and clears of that run reuse (and resume) it."""
    return Path(data_root) / "train" / safe_run_id(run_id) / stage


def build_job(cfg: MindloomConfig, corpus: dict, out_dir: str | Path, stage: str = "main",
              init_from: str | None = None, fail_at_step: int | None = None) -> Path:
    """Write ``<out_dir>/job.json`` for ``stage`` over the corpus summary returned by ``publish``."""
    from pipeline.train.job import TrainJob

    t = cfg.train
    seq_len = int(corpus["seq_len"])
    model = {"preset": t.preset, "vocab_size": int(corpus["vocab_size"]), "max_seq_len": seq_len,
             **t.model_overrides}
    if t.batch_size % t.workers:
        raise ValueError(f"train.batch_size: {t.batch_size} is not divisible by train.workers={t.workers}")
    job = TrainJob(stage=stage, data_dir=corpus["mindrecord_dir"], out_dir=str(out_dir), model=model,
                   init_from=init_from, steps=t.steps, batch_size=t.batch_size // t.workers, lr=t.lr,
                   min_lr=t.min_lr, warmup_steps=t.warmup_steps, weight_decay=t.weight_decay,
                   grad_clip=t.grad_clip, seed=cfg.seed, mode=t.mode, threads=t.threads,
                   checkpoint_every=t.checkpoint_every, keep_checkpoints=t.keep_checkpoints, log_every=1,
                   fail_at_step=fail_at_step)
    path = Path(out_dir) / "job.json"
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    job.to_json(path)
    return path


def launch_argv(job_path: str | Path, workers: int = 1, *, master_port: int = 8118) -> list[str]:
    """The command that runs a job: one process, or one-host ``msrun`` with one worker per rank."""
    from pipeline.train.launch import train_command

    return train_command(str(job_path), workers, master_port=master_port)


def launch_env() -> dict[str, str]:
    """Environment for the job: msrun starts workers with the ``python`` on PATH, so put ours first."""
    from pipeline.train.launch import env_with_venv

    return env_with_venv()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child of ours counts as dead
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def job_state(out_dir: str | Path, launcher_pid: int | None = None) -> dict:
    """The job's status.json, with state LOST when it claims to run but neither it nor its launcher lives."""
    out_dir = Path(out_dir)
    status_file = out_dir / "status.json"
    status = read_json(status_file) if status_file.exists() else {"state": "PENDING", "step": 0}
    alive = any(_pid_alive(p) for p in (status.get("pid"), launcher_pid) if p)
    if status["state"] in ("RUNNING", "PENDING") and not alive:
        status = {**status, "state": "LOST"}
    return status


def read_metrics(out_dir: str | Path, start_line: int = 0) -> tuple[list[dict], int]:
    """Metric rows appended since ``start_line`` (complete lines only) and the next line number."""
    path = Path(out_dir) / "metrics.jsonl"
    if not path.exists():
        return [], start_line
    rows = []
    with open(path, encoding="utf-8") as fh:
        lines = fh.readlines()
    n = start_line
    for line in lines[start_line:]:
        if not line.endswith("\n"):
            break
        rows.append(json.loads(line))
        n += 1
    return rows, n


def stage_result(out_dir: str | Path) -> dict:
    """The stage summary written by the trainer (what goes to XCom)."""
    path = Path(out_dir) / "summary.json"
    if not path.exists():
        raise FileNotFoundError(f"{path}: the training job ended without a summary")
    return read_json(path)


def record_launch(out_dir: str | Path, argv: list[str], pid: int) -> dict:
    info = {"pid": pid, "argv": argv, "out_dir": str(out_dir)}
    write_json(Path(out_dir) / "launch.json", info)
    return info


def resolve_corpus(params: dict, asset_extras: list[dict] | None = None,
                   cfg: MindloomConfig | None = None) -> dict:
    """Which corpus to train on: an explicit summary file, else the triggering Asset event, else the latest.

    The shards are checked against their manifest (sha256 of every file) before any training starts, because
    MindRecord itself cannot detect corrupt rows.
    """
    from pipeline import corpus as corpus_mod
    from pipeline import mindrecord
    from pipeline.config import config_from_params

    cfg = cfg or config_from_params(params)
    if params.get("corpus_manifest"):
        summary = read_json(params["corpus_manifest"])
    elif asset_extras and any("mindrecord_dir" in e for e in asset_extras):
        summary = [e for e in asset_extras if "mindrecord_dir" in e][-1]
    else:
        summary = corpus_mod.latest_corpus(cfg.data_root)
    mindrecord.verify(summary["mindrecord_dir"], full_read=False)
    return {k: v for k, v in summary.items() if k != "stats"}


def write_report(params: dict, run_id: str, stages: dict[str, dict], corpus: dict | None = None) -> dict:
    """Write ``report.json`` and ``report.html`` for the training run; return the compact metrics for XCom."""
    from pipeline.config import config_from_params
    from pipeline.report import write_report as write_html

    cfg = config_from_params(params)
    run_root = Path(cfg.data_root) / "train" / safe_run_id(run_id)
    keys = ("state", "steps", "resumed_from", "first_loss", "final_loss", "min_loss", "tokens", "tokens_per_s",
            "checkpoint", "eval")
    compact = {name: {k: s.get(k) for k in keys} for name, s in stages.items()}
    write_json(run_root / "report.json", {"run_id": run_id, "corpus": corpus, "stages": stages})
    html_path = write_html(run_root / "report.html", f"mindloom run {run_id}",
                           Path(corpus["run_dir"]) if corpus else None,
                           {name: stage_dir(cfg.data_root, run_id, name) for name in stages})
    return {"report": str(run_root / "report.json"), "report_html": str(html_path), "stages": compact}
