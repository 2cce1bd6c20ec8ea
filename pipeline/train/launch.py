"""Launching a TrainJob: plain process or ``msrun`` data parallel.

Why a separate script file: ``msrun`` starts ``python <script> args`` on every worker and cannot run ``-m module``;
this file works as that script (it puts the repo root on ``sys.path`` itself). It also builds the command lines, so
the orchestrator does not hard-code msrun flags. Workers use the ``python`` on ``PATH``: the caller must put the
MindSpore venv's ``bin/`` first (``env_with_venv``). No MindSpore import here.
"""

from __future__ import annotations

import os
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def train_command(job_path: str, workers: int = 1, python: str = sys.executable, log_dir: str | None = None,
                  master_port: int = 8118, cluster_timeout_s: int = 600) -> list[str]:
    """argv that runs ``job_path``: ``python -m pipeline.train`` for 1 worker, else one-host ``msrun``."""
    if workers <= 1:
        return [python, "-m", "pipeline.train", "--job", job_path]
    msrun = os.path.join(os.path.dirname(python), "msrun")
    log_dir = log_dir or os.path.join(os.path.dirname(os.path.abspath(job_path)), "msrun_log")
    return [msrun, f"--worker_num={workers}", f"--local_worker_num={workers}", "--master_addr=127.0.0.1",
            f"--master_port={master_port}", f"--log_dir={log_dir}", "--join=True",
            f"--cluster_time_out={cluster_timeout_s}", os.path.abspath(__file__), "--job", job_path]


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
