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
import re
import time
from datetime import timedelta
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


def stage_timeout(cfg: MindloomConfig, stage: str) -> timedelta | None:
    """The Airflow ``execution_timeout`` of stage ``stage`` (``train.stage_timeout_h``; None: no limit)."""
    hours = float(cfg.train.stage_settings(stage)["stage_timeout_h"])
    return timedelta(hours=hours) if hours > 0 else None


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
                   micro_batch=st["batch_size"] // per_rank, grad_accum=st["grad_accum"], world_size=st["workers"],
                   seq_len=seq_len if seq_len != corpus_seq else 0, lr=st["lr"], min_lr=st["min_lr"],
                   warmup_steps=st["warmup_steps"], weight_decay=st["weight_decay"], grad_clip=st["grad_clip"],
                   precision=st["precision"], loss_scale=st["loss_scale"], loss_scale_window=st["loss_scale_window"],
                   seed=cfg.seed, mode=st["mode"], device=st["device"], threads=st["threads"],
                   checkpoint_every=st["checkpoint_every"], keep_checkpoints=st["keep_checkpoints"], log_every=1,
                   stall_timeout_min=st["stall_timeout_min"],
                   peak_flops=st["peak_tflops"] * 1e12, eval_data=find_eval_sets(corpus),
                   eval_tokens=st["eval_tokens"], fail_at_step=fail_at_step,
                   tensor_parallel=st["tensor_parallel"], zero=st["zero"], device_memory_gb=st["device_memory_gb"],
                   distributed_optimizer=st["distributed_optimizer"],
                   metrics_every=st["metrics_every"])
    path = Path(out_dir) / "job.json"
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    job.to_json(path)
    return path


def launch_argv(job_path: str | Path, workers: int | None = None, *, master_port: int = 8118,
                argv: list[str] | None = None) -> list[str]:
    """The command that runs a job: one process, or one-host ``msrun`` with one worker per rank (``workers``
    defaults to the job's ``world_size``); a multi-node ``argv`` from ``pipeline.train.launcher`` is checked and passed
    through."""
    from pipeline.train.launch import train_command

    if workers is None:
        workers = max(1, int(read_json(job_path).get("world_size") or 1))
    return train_command(str(job_path), workers, master_port=master_port, argv=argv)


def launch_env() -> dict[str, str]:
    """Environment for the job: msrun starts workers with the ``python`` on PATH, so put ours first."""
    from pipeline.train.launch import env_with_venv

    return env_with_venv()


#: How long a launched job may take to take its lease (interpreter start, imports, msrun rendezvous).
STARTUP_GRACE_S = 300.0


def job_state(out_dir: str | Path, launcher_pid: int | None = None, now: float | None = None,
              lease_timeout: float | None = None) -> dict:
    """The job's ``status.json``, decided from the stage folder alone, on any host.

    A job that claims RUNNING or PENDING is RUNNING while its lease (``lease.json``) has a fresh heartbeat, and
    LOST once the heartbeat is older than the lease timeout, whatever any pid says (pids mean nothing on another
    host and can be recycled on this one).  Before the current launch has taken its lease (a lease older than
    ``launch.json`` belongs to an earlier job) it is PENDING for ``STARTUP_GRACE_S``.  On the host that launched
    it, a launcher and trainer that are both gone make it LOST at once instead of after the timeout.
    """
    import socket

    from pipeline.train.lease import LEASE_TIMEOUT_S, lease_state, pid_alive

    out_dir = Path(out_dir)
    now = time.time() if now is None else now
    status_file = out_dir / "status.json"
    status = read_json(status_file) if status_file.exists() else {"state": "PENDING", "step": 0}
    if status["state"] not in ("RUNNING", "PENDING"):
        return status
    launch = read_json(out_dir / "launch.json") if (out_dir / "launch.json").exists() else {}
    lease = lease_state(out_dir, now, lease_timeout or LEASE_TIMEOUT_S)
    if lease is not None and float(lease.get("started_at", 0.0)) < float(launch.get("time", 0.0)):
        lease = None                                     # an earlier job's lease, not the current launch's
    same_host = launch.get("host") in (None, socket.gethostname()) and \
        (lease is None or lease.get("host") == socket.gethostname())
    here = socket.gethostname()
    pids = [p for p in (launcher_pid, launch.get("pid"),
                        lease.get("pid") if lease and lease.get("host") == here else None) if p]
    if same_host and pids and not any(pid_alive(p) for p in pids):
        return {**status, "state": "LOST", "error": status.get("error") or "the job's processes ended without a "
                "final status (killed?); see the launcher log"}
    if lease is not None:
        if lease["fresh"] and not lease.get("released"):
            return {**status, "state": "RUNNING", "heartbeat_age_s": round(lease["age_s"], 1),
                    "host": lease.get("host")}
        why = "released its lease without a final status" if lease.get("released") else \
            f"no heartbeat for {lease['age_s']:.0f} s from host {lease.get('host')}"
        return {**status, "state": "LOST", "error": status.get("error") or f"the job {why}"}
    if launch and now - float(launch.get("time", now)) > STARTUP_GRACE_S:
        return {**status, "state": "LOST", "error": status.get("error") or f"the job took no lease within "
                f"{STARTUP_GRACE_S:.0f} s of its launch"}
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


def record_launch(out_dir: str | Path, argv: list[str], pid: int | None, try_number: int | None = None,
                  launched: float | None = None) -> dict:
    """``launch.json``: who started the stage's current job and when (rows older than ``time`` are not its own)."""
    import socket

    info = {"pid": pid, "argv": argv, "out_dir": str(out_dir), "try_number": try_number,
            "host": socket.gethostname(), "time": launched if launched is not None else time.time()}
    write_json(Path(out_dir) / "launch.json", info)
    return info


_CKPT = re.compile(r"^step_(\d{8})\.ckpt$")


def resume_point(out_dir: str | Path) -> dict:
    """Where a new job in ``out_dir`` resumes, read from the folder alone (no MindSpore import):

    ``checkpoint_step``: the newest checkpoint with its ``.sha256`` sidecar (the trainer verifies the checksum and
    falls back further if it does not match), or None; ``stopped_at_step``: the last step the previous job
    reported; ``launched_by_try``: the task try that launched it.
    """
    out_dir = Path(out_dir)
    steps = [int(m.group(1)) for p in (out_dir / "checkpoints").glob("step_*.ckpt")
             if (m := _CKPT.match(p.name)) and p.with_name(p.name + ".sha256").exists()]
    status = read_json(out_dir / "status.json") if (out_dir / "status.json").exists() else {}
    launch = read_json(out_dir / "launch.json") if (out_dir / "launch.json").exists() else {}
    return {"checkpoint_step": max(steps) if steps else None, "stopped_at_step": status.get("step"),
            "launched_by_try": launch.get("try_number")}


def archive_stage(out_dir: str | Path) -> Path:
    """Move a finished stage folder aside (``<stage>.cleared-<n>``) so the stage can be trained again from its
    start; returns where the old output now is."""
    out_dir = Path(out_dir)
    n = 1
    while (kept := out_dir.with_name(f"{out_dir.name}.cleared-{n}")).exists():
        n += 1
    os.replace(out_dir, kept)
    return kept


def corpus_summary_of_run(data_root: str | Path, corpus_run: str) -> dict:
    """The ``corpus_summary.json`` of corpus run ``corpus_run``, looked up under ``<data_root>/runs/`` only."""
    path = Path(data_root) / "runs" / safe_run_id(corpus_run) / "corpus_summary.json"
    if not path.is_file():
        raise FileNotFoundError(f"corpus_run: no published corpus for run {corpus_run!r} ({path} does not exist; "
                                f"is it a finished corpus_build or corpus_refresh run?)")
    return read_json(path)


def resolve_corpus(params: dict, asset_extras: list[dict] | None = None,
                   cfg: MindloomConfig | None = None, manifest_path: str | Path | None = None) -> dict:
    """Which corpus to train on, first match wins:

    1. ``manifest_path``, a ``corpus_summary.json`` (the CLI's ``--corpus``; never taken from a run's conf);
    2. the ``corpus_run`` param, a corpus run id resolved under ``<data_root>/runs/``;
    3. the triggering Asset event;
    4. the latest published corpus.

    The shards are checked against their manifest (sha256 of every file) before any training starts, because
    MindRecord itself cannot detect corrupt rows.
    """
    from pipeline import confine
    from pipeline.form import config_from_params
    from pipeline.sink import mindrecord
    from pipeline.tasks import corpus as corpus_mod

    cfg = cfg or config_from_params(params)
    if manifest_path:
        summary = read_json(manifest_path)
    elif params.get("corpus_run"):
        summary = corpus_summary_of_run(cfg.data_root, str(params["corpus_run"]))
    elif asset_extras and any("mindrecord_dir" in e for e in asset_extras):
        summary = [e for e in asset_extras if "mindrecord_dir" in e][-1]
    else:
        summary = corpus_mod.latest_corpus(cfg.data_root)
    if not manifest_path:               # a corpus named by a run's conf or an Asset event stays under data_root
        roots = confine.allowed_roots(cfg.data_root)
        for key in ("mindrecord_dir", "run_dir", "val_mindrecord_dir"):
            if summary.get(key):
                confine.check_path(summary[key], roots, f"corpus {key}")
        for domain, path in (summary.get("val_mindrecord_dirs") or {}).items():
            confine.check_path(path, roots, f"corpus val_mindrecord_dirs[{domain!r}]")
    mindrecord.verify(summary["mindrecord_dir"], full_read=False)
    return {k: v for k, v in summary.items() if k != "stats"}


def write_report(params: dict, run_id: str, stages: dict[str, dict], corpus: dict | None = None) -> dict:
    """Write ``report.json`` and ``report.html`` for the training run; return the compact metrics for XCom."""
    from pipeline.form import config_from_params
    from pipeline.report.html import write_report as write_html

    cfg = config_from_params(params)
    run_root = Path(cfg.data_root) / "train" / safe_run_id(run_id)
    keys = ("state", "steps", "resumed_from", "first_loss", "final_loss", "min_loss", "tokens", "tokens_per_s",
            "checkpoint", "eval")
    compact = {name: {k: s.get(k) for k in keys} for name, s in stages.items()}
    write_json(run_root / "report.json", {"run_id": run_id, "corpus": corpus, "stages": stages,
                                         "stage_order": list(stages)})
    title = f"mindloom run {params.get('run_name') or cfg.run_name} ({run_id})"
    html_path = write_html(run_root / "report.html", title,
                           Path(corpus["run_dir"]) if corpus else None,
                           {name: stage_dir(cfg.data_root, run_id, name) for name in stages})
    return {"report": str(run_root / "report.json"), "report_html": str(html_path), "stages": compact}
