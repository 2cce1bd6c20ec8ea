"""Launching a TrainJob: plain process or one-host ``msrun`` data parallel; multi-node argv accepted from elsewhere.

Why a separate script file: ``msrun`` starts ``python <script> args`` on every worker and cannot run ``-m module``;
this file works as that script (it puts the repo root on ``sys.path`` itself). It also builds the command lines, so
the orchestrator does not hard-code msrun flags. Workers use the ``python`` on ``PATH``: the caller must put the
MindSpore venv's ``bin/`` first (``env_with_venv``). No MindSpore import here.

Multi-node layouts (master address, node rank, devices per node, auto-parallel settings) are built by
``pipeline/train/jobs/launcher.py`` (``msrun_argv(layout, program)``); ``train_command(..., argv=...)`` takes such an
argv, checks that it is an argument list that runs this very job, and returns it unchanged, so the callers
(``pipeline.tasks.pretrain.launch_argv``, the Airflow operator) have one entry point for both cases.
"""

from __future__ import annotations

import os
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def train_command(job_path: str, workers: int = 1, python: str = sys.executable, log_dir: str | None = None,
                  master_port: int = 8118, cluster_timeout_s: int = 600, argv: list[str] | None = None) -> list[str]:
    """argv that runs ``job_path``: ``python -m pipeline.train`` for 1 worker, else one-host ``msrun``; or the given
    ``argv`` (e.g. a multi-node msrun command from ``pipeline.train.jobs.launcher``) after checking it runs this
    job."""
    if argv is not None:
        return checked_argv(argv, job_path)
    if workers <= 1:
        return [python, "-m", "pipeline.train", "--job", job_path]
    msrun = os.path.join(os.path.dirname(python), "msrun")
    log_dir = log_dir or os.path.join(os.path.dirname(os.path.abspath(job_path)), "msrun_log")
    return [msrun, f"--worker_num={workers}", f"--local_worker_num={workers}", "--master_addr=127.0.0.1",
            f"--master_port={master_port}", f"--log_dir={log_dir}", "--join=True",
            f"--cluster_time_out={cluster_timeout_s}", os.path.abspath(__file__), "--job", job_path]


def free_port() -> int:
    """A TCP port free on this host now (msrun's scheduler binds it a moment later)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def checked_argv(argv, job_path: str) -> list[str]:
    """``argv`` as a list, if it is a list of strings ending in a program that runs ``--job <job_path>``."""
    if isinstance(argv, (str, bytes)) or not isinstance(argv, (list, tuple)) or not argv:
        raise ValueError("launch argv: must be a non-empty list of arguments, never a shell string")
    bad = [i for i, a in enumerate(argv) if not isinstance(a, str) or "\0" in a]
    if bad:
        raise ValueError(f"launch argv[{bad[0]}]: must be a string without NUL bytes, got {argv[bad[0]]!r}")
    want = {job_path, os.path.abspath(job_path), os.path.realpath(job_path)}
    jobs = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--job"]
    if not jobs or not any(j in want or os.path.realpath(j) in want for j in jobs):
        raise ValueError(f"launch argv: does not run this job (no '--job {job_path}' in {argv})")
    return list(argv)


def env_with_venv(python: str = sys.executable, env: dict | None = None) -> dict:
    """Environment whose PATH starts with the venv of ``python`` (msrun workers run the ``python`` on PATH)."""
    env = dict(os.environ if env is None else env)
    env["PATH"] = os.path.dirname(python) + os.pathsep + env.get("PATH", "")
    env["PYTHONPATH"] = REPO_ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


if __name__ == "__main__":
    sys.path.insert(0, REPO_ROOT)
    from pipeline.train.__main__ import main

    sys.exit(main())
