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
import time
from datetime import timedelta
from pathlib import Path

from pipeline.config import MindloomConfig
from pipeline.io import read_json, safe_run_id, write_json
from pipeline.tasks.corpus_choice import corpus_eos_id, find_eval_sets
from pipeline.tasks.release_training import release_checkpoint, release_eval_sets, replay_files

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




def previous_checkpoint(out_dir: str | Path, previous: str) -> str:
    """Commit marker of the final step of stage ``previous`` of the same run, or a clear error.

    A marker, not a file: with tensor parallelism or ZeRO every rank wrote its own file, and rank r of the next
    stage must load rank r's (or, for weights only with another TP degree, the merged shards); the marker lists
    every rank's file with its digest (``pipeline.train.checkpoint.commit``).
    """
    from pipeline.train.checkpoint.commit import commit_file, committed_steps

    prev_dir = Path(out_dir).parent / previous
    summary = prev_dir / "summary.json"
    if not summary.exists():
        raise FileNotFoundError(f"stage {Path(out_dir).name!r} starts from stage {previous!r}, but {summary} does "
                                f"not exist: run stage {previous!r} of the same run first (mindloom train --stage "
                                f"{previous} --run-id {Path(out_dir).parent.name})")
    final = read_json(summary).get("steps")
    steps = committed_steps(str(prev_dir))
    if not steps or steps[0] != final:
        raise FileNotFoundError(f"stage {previous!r} finished at step {final} without a committed final checkpoint "
                                f"(newest committed step in {prev_dir / 'checkpoints'}: "
                                f"{steps[0] if steps else None})")
    return commit_file(str(prev_dir), final)






def build_job(cfg: MindloomConfig, corpus: dict, out_dir: str | Path, stage: str = "main",
              init_from: str | None = None, fail_at_step: int | None = None) -> Path:
    """Write ``<out_dir>/job.json`` for ``stage`` over the corpus summary returned by ``publish``.

    The stage's settings are ``train.*`` with the stage's overrides (``TrainConfig.stage_settings``). Unless
    ``init_from`` is given, a stage after the first starts from the final committed checkpoint (its commit marker)
    of the preceding stage in the sibling folder ``<out_dir>/../<previous>`` (``init: previous`` = weights, each rank
    its own slice; ``continue`` = each rank's full state); the stage's own newest committed checkpoint, when there
    is one, always wins (the trainer resumes it).
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
    eos = corpus_eos_id(corpus)
    if st["document_attention"] and eos is not None:
        model.setdefault("eod_id", eos)
    if st["reset_positions"]:
        if model.get("eod_id", -1) < 0:
            raise ValueError(f"train.reset_positions (stage {stage}): needs document boundaries, but "
                             + ("train.document_attention is false" if not st["document_attention"]
                                else "the corpus manifest names no eos_id"))
        model["reset_positions"] = True
    if st["workers"] % st["tensor_parallel"]:
        raise ValueError(f"train.tensor_parallel: {st['tensor_parallel']} (stage {stage}) does not divide "
                         f"train.workers = {st['workers']}")
    dp = st["workers"] // st["tensor_parallel"]  # data-parallel ranks: each TP group reads one batch
    per_rank = dp * st["grad_accum"]
    if st["batch_size"] % per_rank:
        raise ValueError(f"train.batch_size: {st['batch_size']} (stage {stage}) is not divisible by data-parallel "
                         f"ranks x grad_accum = {dp} x {st['grad_accum']}")
    init_mode = "continue" if st["init"] == "continue" else "weights"
    if init_from is None and not st["previous"] and cfg.train.from_release == "weights" \
            and not any((Path(out_dir) / "checkpoints").glob("step_*.commit.json")):
        init_from = release_checkpoint(cfg.data_root, corpus, stage_names(cfg)[-1])  # weights only: a new corpus
        init_mode = "weights"
    elif init_from is None and st["previous"] and st["init"] != "scratch":
        try:
            init_from = previous_checkpoint(out_dir, st["previous"])
        except FileNotFoundError:
            if not any((Path(out_dir) / "checkpoints").glob("step_*.commit.json")):
                raise  # nothing of its own to resume either
    job = TrainJob(stage=stage, data_dir=corpus["mindrecord_dir"], out_dir=str(out_dir), model=model,
                   replay_files=replay_files(cfg, corpus) if seq_len == corpus_seq else [],
                   init_from=init_from, init_mode=init_mode if init_from else "weights", steps=st["steps"],
                   micro_batch=st["batch_size"] // per_rank, grad_accum=st["grad_accum"], world_size=st["workers"],
                   seq_len=seq_len if seq_len != corpus_seq else 0, lr=st["lr"], min_lr=st["min_lr"],
                   warmup_steps=st["warmup_steps"], weight_decay=st["weight_decay"], grad_clip=st["grad_clip"],
                   precision=st["precision"], loss_scale=st["loss_scale"], loss_scale_window=st["loss_scale_window"],
                   seed=cfg.seed, mode=st["mode"], device=st["device"], threads=st["threads"],
                   checkpoint_every=st["checkpoint_every"], keep_checkpoints=st["keep_checkpoints"], log_every=1,
                   stall_timeout_min=st["stall_timeout_min"],
                   peak_flops=st["peak_tflops"] * 1e12,
                   eval_data={**find_eval_sets(corpus), **release_eval_sets(cfg, corpus)},
                   eval_tokens=st["eval_tokens"], fail_at_step=fail_at_step,
                   tensor_parallel=st["tensor_parallel"], zero=st["zero"], device_memory_gb=st["device_memory_gb"],
                   distributed_optimizer=st["distributed_optimizer"], grad_reduce=st["grad_reduce"],
                   metrics_every=st["metrics_every"])
    path = Path(out_dir) / "job.json"
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    job.to_json(path)
    return path


def launch_argv(job_path: str | Path, workers: int | None = None, *, master_port: int | None = None,
                argv: list[str] | None = None) -> list[str]:
    """The command that runs a job: one process, or one-host ``msrun`` with one worker per rank (``workers``
    defaults to the job's ``world_size``) on a port free at launch (two jobs on one host never share one); a
    multi-node ``argv`` from ``pipeline.train.jobs.launcher`` is checked and passed through."""
    from pipeline.train.jobs.launch import free_port, train_command

    if workers is None:
        workers = max(1, int(read_json(job_path).get("world_size") or 1))
    return train_command(str(job_path), workers, master_port=master_port or free_port(), argv=argv)


def launch_env(job_id: str | None = None) -> dict[str, str]:
    """Environment for the job: msrun starts workers with the ``python`` on PATH, so put ours first; and the job's
    id (``MINDLOOM_JOB_ID``, a new one unless given), which every rank reads and the lease holds."""
    from pipeline.train.jobs.launch import env_with_venv
    from pipeline.train.jobs.lease import JOB_ID_ENV, new_job_id

    return {**env_with_venv(), JOB_ID_ENV: job_id or new_job_id()}


#: How long a launched job may take to take its lease (interpreter start, imports, msrun rendezvous), measured on
#: the observer's own clock from when it first saw the launch without a lease.
STARTUP_GRACE_S = 300.0
#: The same while Slurm says the job runs: its ranks may still be sourcing CANN's setup, starting a container and
#: meeting at the scheduler (``MS_TOPO_TIMEOUT``, 3,600 s by default in ``pipeline.train.jobs.slurm``); a rank that
#: gives up there ends the job, which Slurm then reports.
SLURM_STARTUP_GRACE_S = 3600.0 + STARTUP_GRACE_S


def job_state(out_dir: str | Path, launcher_pid: int | None = None, now: float | None = None,
              lease_timeout: float | None = None, *, job_id: str | None = None, seen: dict | None = None) -> dict:
    """:func:`_read_job_state`, with ``status.json`` read again before a LOST verdict: a job that writes its final
    status and then releases its lease between this reader's two reads must not look LOST (seen once under
    Slurm: status read as RUNNING, then the lease read as released)."""
    state = _read_job_state(out_dir, launcher_pid, now, lease_timeout, job_id=job_id, seen=seen)
    if state["state"] != "LOST" or not (path := Path(out_dir) / "status.json").exists():
        return state
    again = read_json(path)
    launch = Path(out_dir) / "launch.json"
    mine = job_id or (read_json(launch).get("job_id") if launch.exists() else None)
    if again.get("state") not in ("RUNNING", "PENDING") and (not mine or again.get("job_id") in (None, mine)):
        return again
    return state


def _read_job_state(out_dir: str | Path, launcher_pid: int | None = None, now: float | None = None,
                    lease_timeout: float | None = None, *, job_id: str | None = None,
                    seen: dict | None = None) -> dict:
    """The state of job ``job_id`` (default: the one ``launch.json`` names) from the stage folder alone, on any host.

    Returns its ``status.json`` row, with ``"observed"``: pass it back as ``seen`` on the next call.  Rows of another
    job id are not this job's (it is PENDING until it writes its own).  A job that claims RUNNING or PENDING is
    RUNNING while its lease's heartbeat counter moves, and LOST once the counter stood still for the lease timeout
    of *this observer's* clock (``now``, default ``time.monotonic()``; the job's clock is never read).  Before it
    has taken its lease it is PENDING for ``STARTUP_GRACE_S`` of the observer's clock (``SLURM_STARTUP_GRACE_S`` while
    Slurm says it runs).  On the host that launched
    it, a launcher and trainer that are both gone make it LOST at once; a released lease without a final status
    is LOST at once.
    """
    import socket

    from pipeline.train.jobs.lease import LEASE_TIMEOUT_S, lease_state, pid_alive

    out_dir = Path(out_dir)
    now = time.monotonic() if now is None else now
    seen = seen or {}
    launch = read_json(out_dir / "launch.json") if (out_dir / "launch.json").exists() else {}
    job_id = job_id or launch.get("job_id")
    status = read_json(out_dir / "status.json") if (out_dir / "status.json").exists() else None
    if status is None or (job_id and status.get("job_id") not in (None, job_id)):
        status = {"state": "PENDING", "step": 0}          # no row of this job yet (another job's row is not ours)
    if status["state"] not in ("RUNNING", "PENDING"):
        return status
    sid = launch.get("slurm_job_id") if launch.get("job_id") in (None, job_id) else None
    sstate = _slurm_state(sid) if sid else None
    lease = lease_state(out_dir, seen.get("lease"), now, lease_timeout or LEASE_TIMEOUT_S)
    observed = {"lease": lease["seen"] if lease else None}
    if sid and sstate != "active":  # Slurm says the job is queued, or over: that outranks the folder's clocks
        if sstate == "queued":
            return {**status, "state": "PENDING", "observed": observed, "slurm_job_id": sid}
        return {**status, "state": "LOST", "observed": observed, "slurm_job_id": sid, "error": status.get("error")
                or f"Slurm job {sid} ended ({sstate}) without a final status; see {out_dir}/slurm-{sid}.log"}
    other = lease if lease is not None and job_id and lease.get("job_id") != job_id else None
    lease = None if other is not None else lease          # another job's lease (an earlier one, or a live holder)
    here = socket.gethostname()
    same_host = launch.get("host") in (None, here) and (lease is None or lease.get("host") == here)
    pids = [p for p in (launcher_pid, launch.get("pid"),
                        lease.get("pid") if lease and lease.get("host") == here else None) if p]
    held = f" (the stage folder is held by job {other.get('job_id')} on host {other.get('host')}: a second " \
           f"trainer there is refused)" if other is not None and not other.get("released") else ""
    if same_host and pids and not any(pid_alive(p) for p in pids):
        return {**status, "state": "LOST", "observed": observed, "error": status.get("error") or
                f"the job's processes ended without a final status (killed?){held}; see the launcher log"}
    if lease is not None:
        if lease.get("released"):
            stop = f": {lease['stop']}" if lease.get("stop") else ""
            return {**status, "state": "LOST", "observed": observed,
                    "error": status.get("error") or f"the job released its lease without a final status{stop}"}
        if lease["fresh"]:
            return {**status, "state": "RUNNING", "observed": observed, "heartbeat": lease.get("beat"),
                    "heartbeat_still_s": round(lease["stalled_s"], 1), "host": lease.get("host")}
        return {**status, "state": "LOST", "observed": observed, "error": status.get("error") or
                f"the lease heartbeat of host {lease.get('host')} stood at {lease.get('beat')} for "
                f"{lease['stalled_s']:.0f} s (observed here)"}
    observed["pending_since"] = pending_since = float(seen.get("pending_since", now))
    grace = SLURM_STARTUP_GRACE_S if sid else STARTUP_GRACE_S
    if now - pending_since > grace:
        return {**status, "state": "LOST", "observed": observed, "error": status.get("error") or
                f"the job took no lease within {grace:.0f} s{held}"}
    return {**status, "observed": observed}


def _slurm_state(sid: str) -> str:
    """``queued``, ``active`` (running or completing) or the final Slurm state of job ``sid`` ("forgotten" when
    Slurm no longer knows it)."""
    from pipeline.train.jobs import slurm

    st = slurm.state(sid)
    if st is None:
        return "forgotten by Slurm"
    if st.startswith(("PENDING", "CONFIGURING", "REQUEUED")):
        return "queued"
    return "active" if slurm.is_active(st) else st


def read_metrics(out_dir: str | Path, offset: int = 0) -> tuple[list[dict], int]:
    """Metric rows appended since byte ``offset`` and the offset to pass next time.

    Reads only the new bytes (a long run's file is never re-read); a partial last line (being written) is left for
    the next call.  An offset past the end (the trainer rewrote the file on resume) starts over from 0.
    """
    path = Path(out_dir) / "metrics.jsonl"
    try:
        fh = open(path, "rb")  # noqa: SIM115 - closed below
    except FileNotFoundError:
        return [], offset
    with fh:
        size = os.fstat(fh.fileno()).st_size
        offset = 0 if offset > size else offset
        fh.seek(offset)
        data = fh.read(size - offset)
    end = data.rfind(b"\n") + 1                 # complete lines only
    rows = [json.loads(line) for line in data[:end].splitlines() if line.strip()]
    return rows, offset + end


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
                  launched: float | None = None, job_id: str | None = None, slurm_job_id: str | None = None) -> dict:
    """``launch.json``: which job (id) the stage's current launch is, who started it and when (the time is for
    people; rows and leases are matched by job id); ``slurm_job_id`` for the Slurm backend."""
    import socket

    info = {"pid": pid, "argv": argv, "out_dir": str(out_dir), "try_number": try_number, "job_id": job_id,
            "host": socket.gethostname(), "time": launched if launched is not None else time.time()}
    if slurm_job_id is not None:
        info["slurm_job_id"] = str(slurm_job_id)
    write_json(Path(out_dir) / "launch.json", info)
    return info


def resume_point(out_dir: str | Path) -> dict:
    """Where a new job in ``out_dir`` resumes, read from the folder alone (no MindSpore import):

    ``checkpoint_step``: the newest committed step (its commit marker; the trainer checks every rank's file against
    it and falls back to an older committed step on every rank if one does not match), or None;
    ``stopped_at_step``: the last step the previous job reported; ``launched_by_try``: the task try that launched it.
    """
    from pipeline.train.checkpoint.commit import committed_steps

    out_dir = Path(out_dir)
    steps = committed_steps(str(out_dir))
    status = read_json(out_dir / "status.json") if (out_dir / "status.json").exists() else {}
    launch = read_json(out_dir / "launch.json") if (out_dir / "launch.json").exists() else {}
    return {"checkpoint_step": steps[0] if steps else None, "stopped_at_step": status.get("step"),
            "launched_by_try": launch.get("try_number")}


def archive_stage(out_dir: str | Path) -> Path:
    """Move a finished stage folder aside (``<stage>.cleared-<n>``) so the stage can be trained again from its
    start; returns where the old output now is. Its re-packed rows (``data/``, derived from the corpus alone) move
    back into the new stage folder, so a re-trained stage does not re-pack."""
    out_dir = Path(out_dir)
    n = 1
    while (kept := out_dir.with_name(f"{out_dir.name}.cleared-{n}")).exists():
        n += 1
    os.replace(out_dir, kept)
    if (kept / "data").is_dir():
        out_dir.mkdir(parents=True)
        os.replace(kept / "data", out_dir / "data")
    return kept


def repack_stages(cfg: MindloomConfig) -> list[str]:
    """Stages with their own ``seq_len``: the ``pretrain`` DAG gives each a ``repack_<stage>`` data task."""
    return [name for name in stage_names(cfg) if cfg.train.stage_settings(name)["seq_len"]]


def prepare_stage_data(cfg: MindloomConfig, corpus: dict, out_dir: str | Path, stage: str) -> dict:
    """Re-pack the corpus rows to the stage's ``seq_len`` before its job starts (``repack.stage_data``), on a data
    worker while earlier stages train, instead of on rank 0 while every device of the job waits. Idempotent: a copy
    with the source's fingerprint is kept. Nothing to do when the stage reads the corpus rows as stored."""
    from pipeline.train.repack import repack, repacked_dir

    seq_len = int(cfg.train.stage_settings(stage)["seq_len"] or 0)
    if not seq_len or seq_len == int(corpus["seq_len"]):
        return {"stage": stage, "repacked": False, "seq_len": int(corpus["seq_len"])}
    t0 = time.time()
    dst = repacked_dir(str(out_dir), seq_len)
    m = repack(corpus["mindrecord_dir"], dst, seq_len)
    return {"stage": stage, "repacked": True, "dir": dst, "seq_len": seq_len, "rows": m["samples"],
            "source_rows": m.get("source_rows"), "seconds": round(time.time() - t0, 3),
            "contiguous_verified": m.get("contiguous_verified")}


def prepare_stage_data_for_run(params: dict, run_id: str, stage: str, corpus: dict) -> dict:
    """The ``repack_<stage>`` task of the ``pretrain`` DAG: :func:`prepare_stage_data` in the stage's folder."""
    from pipeline.form import config_from_params

    cfg = config_from_params(params)
    return prepare_stage_data(cfg, corpus, stage_dir(cfg.data_root, run_id, stage), stage)








def report_run_name(params: dict, corpus: dict | None) -> str:
    """The name a report is titled with: the run name typed into the form; else (an Asset-triggered run, whose
    params are the YAML defaults) the name of the corpus run it trains on; else the config's."""
    from pipeline.form import config_from_params

    typed, default = params.get("run_name"), config_from_params({}).run_name
    if typed and typed != default:
        return str(typed)
    frozen = Path(corpus["run_dir"]) / "config.json" if corpus and corpus.get("run_dir") else None
    if frozen is not None and frozen.is_file():
        return str(read_json(frozen).get("run_name") or default)
    return str(typed or default)


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
    title = f"mindloom run {report_run_name(params, corpus)} ({run_id})"
    html_path = write_html(run_root / "report.html", title,
                           Path(corpus["run_dir"]) if corpus else None,
                           {name: stage_dir(cfg.data_root, run_id, name) for name in stages})
    return {"report": str(run_root / "report.json"), "report_html": str(html_path), "stages": compact}
