"""Starting and stopping a stage's job on its backend (``train.backend``): the one path the operator and the CLI use.

* ``local``: ``python -m pipeline.train`` or one-host ``msrun`` in its own session (stdin closed), so the job
  outlives the process that started it; ``launch.json`` holds its launcher pid;
* ``slurm``: one ``sbatch`` job of ``train.nodes`` nodes x ``workers / nodes`` tasks (``pipeline.train.jobs.slurm``);
  ``launch.json`` holds the Slurm job id, which a later try reconnects to instead of submitting another.

Either way ``launch.json`` is written before the job can start (so a try that dies right after knows a launch was
made) and again with the pid or Slurm id; the job id (``MINDLOOM_JOB_ID``) reaches every rank of every node.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from pipeline.config import MindloomConfig
from pipeline.io import read_json

from .pretrain import launch_argv, launch_env, record_launch


def start_stage_job(cfg: MindloomConfig, job_path: str | Path, out_dir: str | Path, *, try_number: int | None,
                    log_name: str, job_id: str) -> tuple[dict, subprocess.Popen | None]:
    """Start the job of ``job_path``; ``(external id for the task state store, the local Popen or None)``."""
    out_dir = Path(out_dir)
    launched = time.time()
    if cfg.train.backend == "slurm":
        from pipeline.train.jobs import slurm

        stage = read_json(job_path).get("stage") or "train"
        layout = cfg.train.layout(stage)
        env = launch_env(job_id)
        t = cfg.train
        script = slurm.batch_script(job_path, out_dir, nodes=layout.nodes, tasks_per_node=layout.per_node, env=env,
                                    python=t.python or sys.executable, stage=stage, partition=t.slurm_partition,
                                    extra=t.slurm_args, setup=t.slurm_setup, rank_env=t.env,
                                    cpus_per_task=t.slurm_cpus_per_task, container=t.slurm_container)
        argv = ["sbatch", "--parsable", str(out_dir / slurm.SCRIPT)]
        record_launch(out_dir, argv, None, try_number=try_number, launched=launched, job_id=job_id)
        sid = slurm.submit(script, out_dir)
        record_launch(out_dir, argv, None, try_number=try_number, launched=launched, job_id=job_id,
                      slurm_job_id=sid)
        return {"out_dir": str(out_dir), "slurm_job_id": sid, "job_id": job_id,
                "log": str(out_dir / f"slurm-{sid}.log")}, None
    argv = launch_argv(job_path)
    log_path = out_dir / log_name
    record_launch(out_dir, argv, None, try_number=try_number, launched=launched, job_id=job_id)
    with open(log_path, "ab") as log_fh:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log_fh, stderr=subprocess.STDOUT,
                                env=launch_env(job_id), start_new_session=True, close_fds=True, cwd=str(out_dir))
    record_launch(out_dir, argv, proc.pid, try_number=try_number, launched=launched, job_id=job_id)
    return {"out_dir": str(out_dir), "pid": proc.pid, "log": str(log_path), "job_id": job_id}, proc


def stop_stage_job(out_dir: str | Path, ext: dict | None, reason: str) -> list[str]:
    """Ask the job to stop through its stage folder (every backend: the trainer polls the cancel request) and,
    for a Slurm job, ``scancel`` it, so its allocation is released even if no rank reads the request. What was
    done, one line each."""
    from pipeline.train.jobs.lease import request_cancel

    done = []
    out_dir = Path(out_dir)
    if out_dir.exists():
        request_cancel(out_dir, reason, job_id=(ext or {}).get("job_id"))
        done.append(f"requested cancellation of the training job in {out_dir}")
    sid = (ext or {}).get("slurm_job_id") or _launched_slurm_id(out_dir)
    if sid:
        from pipeline.train.jobs import slurm

        try:
            slurm.cancel(sid)
            done.append(f"scancel {sid}")
        except slurm.SlurmError as e:
            done.append(f"scancel of Slurm job {sid} failed: {e}")
    return done


def launched_slurm_job(out_dir: str | Path) -> dict | None:
    """The Slurm job an earlier try of this stage submitted that Slurm still queues or runs, or None.

    A try can die after ``sbatch`` and before Airflow's task state store keeps the job's id (or even before
    ``launch.json`` does): the retry finds the job through ``launch.json`` (its Slurm id, else its job id in the
    Slurm job's name) and reattaches to it instead of submitting a second one."""
    from pipeline.train.jobs import slurm

    out_dir = Path(out_dir)
    launch = read_json(out_dir / "launch.json") if (out_dir / "launch.json").exists() else {}
    if (launch.get("argv") or [""])[0] != "sbatch" or not launch.get("job_id"):
        return None
    try:
        sid = launch.get("slurm_job_id") or slurm.find_job(
            slurm.job_name(read_json(out_dir / "job.json").get("stage") or "train", launch["job_id"]))
        if not sid or not slurm.is_active(slurm.state(sid)):
            return None
    except (slurm.SlurmError, OSError):
        return None
    if not launch.get("slurm_job_id"):
        record_launch(out_dir, launch["argv"], None, try_number=launch.get("try_number"), launched=launch.get("time"),
                      job_id=launch["job_id"], slurm_job_id=sid)
    return {"out_dir": str(out_dir), "slurm_job_id": sid, "job_id": launch["job_id"],
            "log": str(out_dir / f"slurm-{sid}.log"), "launched_by_try": launch.get("try_number")}


def start_or_reattach(cfg, build, out_dir: str | Path, log_name: str) -> tuple[dict, object, str]:
    """What ``mindloom train`` and ``mindloom ablation`` do where the operator submits: reattach to the Slurm job
    an earlier, killed start of this stage left running (:func:`launched_slurm_job`), refuse a folder another live
    job holds, else build the job (``build()``, returning its ``job.json``) and start it. Returns ``(ext, proc,
    what)``, ``what`` being ``"reattached"`` or ``"started"``."""
    from pipeline.train.jobs.lease import live_lease, new_job_id

    if cfg.train.backend == "slurm" and (ext := launched_slurm_job(out_dir)):
        return ext, None, "reattached"
    held = live_lease(out_dir)
    if held:
        raise RuntimeError(f"stage folder {out_dir} is held by job {held.get('job_id')} on host {held.get('host')}: "
                           f"not starting a second trainer there")
    ext, proc = start_stage_job(cfg, build(), out_dir, try_number=None, log_name=log_name, job_id=new_job_id())
    return ext, proc, "started"


def _launched_slurm_id(out_dir: Path) -> str | None:
    path = out_dir / "launch.json"
    return read_json(path).get("slurm_job_id") if path.exists() else None
