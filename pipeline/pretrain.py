"""Bridge from a published corpus and the typed config to one training job, and how to launch and watch it.

The training process never shares Python objects with the orchestrator: :func:`build_job` writes a
``job.json`` (:class:`pipeline.train.job.TrainJob`) and :func:`launch_argv` builds the command line — plain
``python -m pipeline.train`` for one rank, ``msrun`` for several — as an argument list, never a shell string.
The job reports through files in its folder: ``status.json``, ``metrics.jsonl``, ``eval.json`` and ``summary.json``.

Stages (``train.stages``, e.g. warmup -> main -> long_context) run one job each, in order, in sibling folders
``<data_root>/train/<run id>/<stage>``. Per stage the orchestrator calls, in this order: :func:`build_job` (which
finds the preceding stage's final checkpoint and the validation sets itself), :func:`launch_argv` +
:func:`launch_env` to start it, :func:`job_state` / :func:`read_metrics` while it runs, and :func:`stage_result`
(the summary, with ``"eval": {"per_domain": {domain: {"loss", "ppl", ...}}}``) when it has ended.
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


def stage_names(cfg: MindloomConfig) -> list[str]:
    """Stages in the order they must run (``train.stages``; one stage ``main`` when none are configured)."""
    return [s.name for s in cfg.train.stage_list()]


def find_eval_sets(corpus: dict) -> dict[str, str]:
    """Validation MindRecord folders per domain for the stage evaluation, looked up in this order:

    1. ``corpus["val_mindrecord_dirs"]``: an explicit ``{domain: dir}`` in the corpus summary;
    2. ``corpus["val_mindrecord_dir"]``, else ``<corpus["run_dir"]>/mindrecord_val``: every sub-folder holding
       ``*.mindrecord*`` data files is one domain, named after the folder.

    Empty when none exist (the stage then reports ``eval.skipped``); a listed folder that is missing is an error.
    """
    explicit = corpus.get("val_mindrecord_dirs")
    if explicit:
        missing = {d: p for d, p in explicit.items() if not Path(p).is_dir()}
        if missing:
            d, p = next(iter(missing.items()))
            raise FileNotFoundError(f"corpus val_mindrecord_dirs[{d!r}]: {p} is not a folder")
        return {d: str(p) for d, p in sorted(explicit.items())}
    root = corpus.get("val_mindrecord_dir") or (Path(corpus["run_dir"]) / "mindrecord_val" if corpus.get("run_dir")
                                                 else None)
    if not root or not Path(root).is_dir():
        return {}
    return {sub.name: str(sub) for sub in sorted(Path(root).iterdir())
            if sub.is_dir() and any(not f.name.endswith(".db") for f in sub.glob("*.mindrecord*"))}


def previous_checkpoint(out_dir: str | Path, previous: str) -> str:
    """Final checkpoint of stage ``previous`` of the same run (its ``summary.json``), or a clear error."""
    prev_dir = Path(out_dir).parent / previous
    summary = prev_dir / "summary.json"
    if not summary.exists():
        raise FileNotFoundError(f"stage {Path(out_dir).name!r} starts from stage {previous!r}, but {summary} does "
                                f"not exist: run stage {previous!r} of the same run first (mindloom train --stage "
                                f"{previous} --run-id {Path(out_dir).parent.name})")
    ckpt = read_json(summary).get("checkpoint")
    if not ckpt or not Path(ckpt).exists():
        raise FileNotFoundError(f"stage {previous!r} finished without a usable final checkpoint ({ckpt})")
    return str(ckpt)


def build_job(cfg: MindloomConfig, corpus: dict, out_dir: str | Path, stage: str = "main",
              init_from: str | None = None, fail_at_step: int | None = None) -> Path:
    """Write ``<out_dir>/job.json`` for ``stage`` over the corpus summary returned by ``publish``.

    The stage's settings are ``train.*`` with the stage's overrides (``TrainConfig.stage_settings``). Unless
    ``init_from`` is given, a stage after the first starts from the final checkpoint of the preceding stage in the
    sibling folder ``<out_dir>/../<previous>`` (``init: previous`` = weights, ``continue`` = full state); the
    stage's own newest checkpoint, when there is one, always wins (the trainer resumes it).
    """
    from pipeline.train.job import TrainJob

    st = cfg.train.stage_settings(stage)
    corpus_seq = int(corpus["seq_len"])
    seq_len = st["seq_len"] or corpus_seq
    if st["seq_len"]:
        ratio_ok = (seq_len % corpus_seq == 0) if seq_len >= corpus_seq else (corpus_seq % seq_len == 0)
        if not ratio_ok:
            raise ValueError(f"train.stages[{st['index']}].seq_len: {seq_len} is neither a multiple nor a divisor of "
                             f"the corpus seq_len {corpus_seq}")
    model = {"preset": st["preset"], "vocab_size": int(corpus["vocab_size"]), "max_seq_len": seq_len,
             **st["model_overrides"]}
    if st["recompute"]:
        model["recompute"] = True
    if corpus.get("pad_id") is not None:
        model.setdefault("pad_id", int(corpus["pad_id"]))
    if st["workers"] % st["tensor_parallel"]:
        raise ValueError(f"train.tensor_parallel: {st['tensor_parallel']} (stage {stage}) does not divide "
                         f"train.workers = {st['workers']}")
    dp = st["workers"] // st["tensor_parallel"]  # data-parallel ranks: each TP group reads one batch
    per_rank = dp * st["grad_accum"]
    if st["batch_size"] % per_rank:
        raise ValueError(f"train.batch_size: {st['batch_size']} (stage {stage}) is not divisible by data-parallel "
                         f"ranks x grad_accum = {dp} x {st['grad_accum']}")
    init_mode = "continue" if st["init"] == "continue" else "weights"
    if init_from is None and st["previous"] and st["init"] != "scratch":
        try:
            init_from = previous_checkpoint(out_dir, st["previous"])
        except FileNotFoundError:
            if not any((Path(out_dir) / "checkpoints").glob("step_*.ckpt")):
                raise  # nothing of its own to resume either
    job = TrainJob(stage=stage, data_dir=corpus["mindrecord_dir"], out_dir=str(out_dir), model=model,
                   init_from=init_from, init_mode=init_mode if init_from else "weights", steps=st["steps"],
                   batch_size=st["batch_size"] // per_rank, grad_accum=st["grad_accum"], world_size=st["workers"],
                   seq_len=seq_len if seq_len != corpus_seq else 0, lr=st["lr"], min_lr=st["min_lr"],
                   warmup_steps=st["warmup_steps"], weight_decay=st["weight_decay"], grad_clip=st["grad_clip"],
                   precision=st["precision"], loss_scale=st["loss_scale"], loss_scale_window=st["loss_scale_window"],
                   seed=cfg.seed, mode=st["mode"], device=st["device"], threads=st["threads"],
                   checkpoint_every=st["checkpoint_every"], keep_checkpoints=st["keep_checkpoints"], log_every=1,
                   peak_flops=st["peak_tflops"] * 1e12, eval_data=find_eval_sets(corpus),
                   eval_tokens=st["eval_tokens"], fail_at_step=fail_at_step,
                   tensor_parallel=st["tensor_parallel"], zero=st["zero"], device_memory_gb=st["device_memory_gb"],
                   metrics_every=st["metrics_every"])
    path = Path(out_dir) / "job.json"
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    job.to_json(path)
    return path


def launch_argv(job_path: str | Path, workers: int | None = None, *, master_port: int = 8118,
                argv: list[str] | None = None) -> list[str]:
    """The command that runs a job: one process, or one-host ``msrun`` with one worker per rank (``workers``
    defaults to the job's ``world_size``); a multi-node ``argv`` from ``pipeline.launcher`` is checked and passed
    through."""
    from pipeline.train.launch import train_command

    if workers is None:
        workers = max(1, int(read_json(job_path).get("world_size") or 1))
    return train_command(str(job_path), workers, master_port=master_port, argv=argv)


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
    """The stage summary written by the trainer (what goes to XCom), including ``"eval"``."""
    path = Path(out_dir) / "summary.json"
    if not path.exists():
        raise FileNotFoundError(f"{path}: the training job ended without a summary")
    return read_json(path)


def stage_eval(out_dir: str | Path) -> dict:
    """The evaluation of a finished stage: ``{"per_domain": {domain: {"loss", "ppl", "tokens", "rows"}},
    "all": {...}, "seq_len", "checkpoint"}`` (``{"per_domain": {}, "skipped": reason}`` without validation sets)."""
    return stage_result(out_dir)["eval"]


def stage_eval_for_run(params: dict, run_id: str, stage: str) -> dict:
    """``stage_eval`` of ``stage`` in this run's training folder (what the DAG's ``eval_<stage>`` task returns)."""
    from pipeline.form import config_from_params

    cfg = config_from_params(params)
    return {"stage": stage, **stage_eval(stage_dir(cfg.data_root, run_id, stage))}


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
    from pipeline.form import config_from_params

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
    from pipeline.form import config_from_params
    from pipeline.report import write_report as write_html

    cfg = config_from_params(params)
    run_root = Path(cfg.data_root) / "train" / safe_run_id(run_id)
    keys = ("state", "steps", "resumed_from", "first_loss", "final_loss", "min_loss", "tokens", "tokens_per_s",
            "checkpoint", "eval")
    compact = {name: {k: s.get(k) for k in keys} for name, s in stages.items()}
    write_json(run_root / "report.json", {"run_id": run_id, "corpus": corpus, "stages": stages,
                                         "stage_order": list(stages)})
    html_path = write_html(run_root / "report.html", f"mindloom run {run_id}",
                           Path(corpus["run_dir"]) if corpus else None,
                           {name: stage_dir(cfg.data_root, run_id, name) for name in stages})
    return {"report": str(run_root / "report.json"), "report_html": str(html_path), "stages": compact}
