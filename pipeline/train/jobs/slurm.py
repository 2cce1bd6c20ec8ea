"""The Slurm backend: a training stage as one ``sbatch`` job, one ``srun`` task per rank, on any number of nodes.

Why one task per rank rather than one ``msrun`` per node: msrun decides whether it is the master by asking whether
``--master_addr`` is a local address, so two Slurm nodes on one host (this project's test cluster) would both start
a scheduler. The tasks here set MindSpore's dynamic-cluster variables themselves, which is what msrun does for each
worker it spawns: ``MS_ROLE=MS_WORKER``, ``MS_NODE_ID`` = ``RANK_ID`` = ``SLURM_PROCID``, ``MS_WORKER_NUM`` =
``SLURM_NTASKS``, ``MS_SCHED_HOST``/``MS_SCHED_PORT``; task 0 also starts the scheduler process (``MS_SCHED``).

* master address: ``SLURM_LAUNCH_NODE_IPADDR``, the node that runs the batch script, which is the first node of
  the allocation (``MINDLOOM_MASTER_ADDR`` overrides it);
* master port: derived from the Slurm job id (:func:`master_port`), so two jobs sharing a node never collide and
  every task computes the same port without talking to the others; 10000-29999, below Linux's ephemeral range
  (32768-60999), so an outgoing connection cannot hold it;
* the environment: the job starts empty (``#SBATCH --export=NONE``: nothing of the Airflow worker's, whose
  variables hold its connections and secrets), the script exports the few the trainer needs (``PATH``, the job id
  ``MINDLOOM_JOB_ID`` ...) and ``train.env``, then runs ``train.slurm_setup`` (CANN's ``set_env.sh``, ``module
  load``), and ``srun --export=ALL`` passes that to every task, so every rank on every node takes the same lease
  and writes the same job id;
* ``srun --distribution=block``: consecutive ranks on one node, so a tensor-parallel group (consecutive ranks,
  ``train.tensor_parallel`` dividing the ranks per node) never spans nodes; ``--cpus-per-task`` and a container
  image when configured.

The operator keeps the Slurm job id in ``launch.json``; :func:`state` reads ``squeue`` and then ``scontrol`` (which
keeps a finished job for ``MinJobAge``; ``sacct`` needs slurmdbd), and :func:`cancel` runs ``scancel``. No
MindSpore import here, except in :func:`rank_main`, which runs inside the job.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

SCRIPT = "slurm.sbatch"
PORT_BASE, PORT_SPAN = 10000, 20000
#: seconds the ranks wait for each other at the scheduler (``MS_TOPO_TIMEOUT``; ``train.env`` may set it): a
#: 128-rank start on a busy file system (imports, CANN, a container) takes minutes; mindformers' launches use
#: 3,000-7,200
TOPO_TIMEOUT_S = 3600
#: what the batch script exports of the submitting process's environment (then ``train.env``): nothing else
KEEP = ("PATH", "PYTHONPATH", "MINDLOOM_JOB_ID", "MALLOC_ARENA_MAX", "PYTHONUNBUFFERED", "GLOG_v",
        "MINDLOOM_MASTER_ADDR", "HOME", "LANG")
ACTIVE = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING")


class SlurmError(RuntimeError):
    """A Slurm command failed: its argv and stderr in one line."""


def master_port(slurm_job_id: int | str) -> int:
    return PORT_BASE + int(slurm_job_id) % PORT_SPAN


def batch_script(job_path: str | Path, out_dir: str | Path, *, nodes: int, tasks_per_node: int, env: dict,
                 python: str = sys.executable, stage: str = "train", partition: str = "",
                 extra: list[str] | tuple = (), setup: list[str] | tuple = (), rank_env: list[str] | tuple = (),
                 cpus_per_task: int = 0, container: str = "") -> str:
    """The ``sbatch`` script of one stage: the allocation, a clean environment (``KEEP`` of ``env``, then
    ``rank_env`` pairs), the ``setup`` lines, one srun task per rank."""
    import shutil

    out_dir = Path(out_dir)
    lines = ["#!/bin/bash",
             f"#SBATCH --job-name={job_name(stage, env.get('MINDLOOM_JOB_ID'))}",
             f"#SBATCH --nodes={nodes}",
             f"#SBATCH --ntasks-per-node={tasks_per_node}",
             f"#SBATCH --output={out_dir}/slurm-%j.log",
             f"#SBATCH --chdir={out_dir}",
             "#SBATCH --open-mode=append",
             "#SBATCH --export=NONE"]
    if partition:
        lines.append(f"#SBATCH --partition={partition}")
    lines += [f"#SBATCH {a}" for a in extra]
    lines += [f"export {k}={shlex.quote(str(env[k]))}" for k in KEEP if env.get(k) is not None]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in (pair.split("=", 1) for pair in rank_env)]
    if cpus_per_task:
        lines.append(f"export SRUN_CPUS_PER_TASK={int(cpus_per_task)}")
    lines += [*setup, "set -u"]
    srun = [shutil.which("srun") or "srun", "--kill-on-bad-exit=1", "--export=ALL", "--distribution=block"]
    if cpus_per_task:
        srun.append(f"--cpus-per-task={int(cpus_per_task)}")
    if container:
        srun.append(f"--container-image={container}")
    lines.append(f"exec {' '.join(shlex.quote(a) for a in srun)} {shlex.quote(python)} -m pipeline.train.jobs.slurm "
                 f"--job {shlex.quote(str(job_path))}")
    return "\n".join(lines) + "\n"


def job_name(stage: str, job_id: str | None) -> str:
    """``mindloom-<stage>-<job id>``: a try that died between ``sbatch`` and recording the Slurm id finds the job
    by this name (:func:`find_job`)."""
    return f"mindloom-{stage}" + (f"-{job_id}" if job_id else "")


def find_job(name: str) -> str | None:
    """The id of the queued or running Slurm job named ``name``, or None."""
    ids = _run(["squeue", "-h", "-n", name, "-o", "%i"]).split()
    return ids[0] if ids else None


def _run(argv: list[str], timeout: float = 30.0) -> str:
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SlurmError(f"{' '.join(argv)}: {type(e).__name__}: {e}") from None
    if p.returncode:
        raise SlurmError(f"{' '.join(argv)}: exit {p.returncode}: {p.stderr.strip() or p.stdout.strip()}")
    return p.stdout


def submit(script: str, out_dir: str | Path) -> str:
    """Write the script into the stage folder and ``sbatch`` it; the Slurm job id."""
    path = Path(out_dir) / SCRIPT
    path.write_text(script, encoding="utf-8")
    out = _run(["sbatch", "--parsable", str(path)]).strip()
    job_id = out.split(";")[0]
    if not job_id.isdigit():
        raise SlurmError(f"sbatch --parsable {path}: unexpected answer {out!r}")
    return job_id


def state(slurm_job_id: str) -> str | None:
    """The job's Slurm state (``RUNNING``, ``COMPLETED``, ``CANCELLED``, ``FAILED``, ...), or None when Slurm no
    longer knows it (finished longer than ``MinJobAge`` ago). ``squeue`` first (it exits 1 for a forgotten id:
    an answer, not an error), then ``scontrol``, which still shows a job that ended recently."""
    for argv, pick in ((["squeue", "-h", "-j", str(slurm_job_id), "-o", "%T"], lambda t: t.split()[0]),
                       (["scontrol", "-o", "show", "job", str(slurm_job_id)], _job_state_field)):
        try:
            text = _run(argv).strip()
        except SlurmError:
            continue
        if text and (got := pick(text)):
            return got
    return None


def _job_state_field(text: str) -> str | None:
    return next((f.split("=", 1)[1] for f in text.split() if f.startswith("JobState=")), None)


def is_active(slurm_state: str | None) -> bool:
    return slurm_state is not None and slurm_state.split("+")[0] in ACTIVE


def cancel(slurm_job_id: str) -> None:
    _run(["scancel", str(slurm_job_id)])


def rank_env(env: dict) -> tuple[dict, bool]:
    """(this task's MindSpore environment, whether it also starts the scheduler) from the Slurm task variables."""
    rank, world = int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"])
    host = env.get("MINDLOOM_MASTER_ADDR") or env.get("SLURM_LAUNCH_NODE_IPADDR") or "127.0.0.1"
    common = {"MS_WORKER_NUM": str(world), "MS_SCHED_HOST": host,
              "MS_SCHED_PORT": str(master_port(env["SLURM_JOB_ID"])),
              "RANK_SIZE": str(world), "MS_TOPO_TIMEOUT": env.get("MS_TOPO_TIMEOUT", str(TOPO_TIMEOUT_S))}
    out = {**env, **common, "MS_ROLE": "MS_WORKER", "MS_NODE_ID": str(rank), "RANK_ID": str(rank),
           "DEVICE_ID": env.get("SLURM_LOCALID", "0")}
    return out, rank == 0


def rank_main(argv: list[str] | None = None) -> int:
    """One srun task: start the scheduler on task 0, then become this rank's trainer."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2 or argv[0] != "--job":
        print("usage: python -m pipeline.train.jobs.slurm --job JOB.json (inside an srun task)", file=sys.stderr)
        return 2
    env, sched = rank_env(dict(os.environ))
    program = [sys.executable, "-m", "pipeline.train", "--job", argv[1]]
    if sched:
        sched_env = {**env, "MS_ROLE": "MS_SCHED", "RANK_ID": "0"}
        sched_env.pop("MS_NODE_ID", None)
        log = open(f"scheduler.{env['SLURM_JOB_ID']}.log", "ab")  # noqa: SIM115 - held by the child
        subprocess.Popen(program, env=sched_env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    os.execve(sys.executable, program, env)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(rank_main())
