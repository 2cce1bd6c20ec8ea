"""Host-independent job control from the stage folder: lease expiry, the lock refusing a second trainer, a recycled
pid, cancellation from another process, the stall timeout, and the operator refusing to launch into a held folder.

The job side runs in real subprocesses (``python -c``) holding a real :class:`Lease`; nothing here trains a model.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pipeline.io import write_json
from pipeline.tasks.pretrain import STARTUP_GRACE_S, job_state
from pipeline.train.lease import Lease, StageBusy, lease_state, request_cancel

REPO = Path(__file__).resolve().parents[1]


def _running(out: Path, *, heartbeat_age: float, pid: int, host: str | None = None, launch_age: float = 100.0):
    now = time.time()
    write_json(out / "launch.json", {"pid": pid, "host": host or socket.gethostname(), "time": now - launch_age})
    write_json(out / "status.json", {"state": "RUNNING", "step": 7, "pid": pid})
    write_json(out / "lease.json", {"job_id": "j1", "host": host or socket.gethostname(), "pid": pid,
                                    "started_at": now - launch_age + 1, "heartbeat_at": now - heartbeat_age,
                                    "step": 7, "last_step_at": now - heartbeat_age})


def test_a_fresh_heartbeat_is_running_and_an_old_one_is_lost_on_any_host(tmp_path):
    _running(tmp_path, heartbeat_age=3, pid=1, host="trainer-7")
    st = job_state(tmp_path)
    assert st["state"] == "RUNNING" and st["host"] == "trainer-7"
    _running(tmp_path, heartbeat_age=61, pid=1, host="trainer-7")
    st = job_state(tmp_path)
    assert st["state"] == "LOST" and "no heartbeat for 61 s from host trainer-7" in st["error"]


def test_a_recycled_pid_does_not_keep_a_dead_job_alive(tmp_path):
    """The lease names a pid that is alive on this host (ours), but its heartbeat stopped: LOST, not waiting."""
    _running(tmp_path, heartbeat_age=120, pid=os.getpid())
    assert job_state(tmp_path)["state"] == "LOST"


def test_a_dead_local_job_is_lost_at_once_and_a_new_launch_waits_for_its_lease(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    _running(tmp_path, heartbeat_age=2, pid=dead.pid)
    assert job_state(tmp_path)["state"] == "LOST"           # same host, every process gone: no 60 s wait
    # A new launch (later than the old lease) that has not taken its lease yet is PENDING, then LOST after the grace.
    write_json(tmp_path / "status.json", {"state": "PENDING", "step": 0})
    write_json(tmp_path / "launch.json", {"pid": os.getpid(), "host": socket.gethostname(), "time": time.time()})
    assert job_state(tmp_path)["state"] == "PENDING"
    (tmp_path / "lease.json").unlink()              # launched on another host long ago, never took a lease
    write_json(tmp_path / "launch.json", {"pid": None, "host": "elsewhere", "time": time.time() - STARTUP_GRACE_S - 1})
    st = job_state(tmp_path)
    assert st["state"] == "LOST" and "took no lease within" in st["error"]


def test_the_lock_refuses_a_second_trainer_before_it_writes(tmp_path):
    with Lease(tmp_path, heartbeat_s=0.2) as first:
        before = (tmp_path / "lease.json").read_text()
        with pytest.raises(StageBusy, match=f"locked by job {first.job_id} on host"):
            with Lease(tmp_path):
                pass
        assert json.loads((tmp_path / "lease.json").read_text())["job_id"] == json.loads(before)["job_id"]
    assert lease_state(tmp_path)["released"] is True


def _job_process(out: Path, body: str, stall_s: float = 0.0) -> subprocess.Popen:
    code = textwrap.dedent(f"""
        import sys, time, json
        from pipeline.train.lease import Lease, JobCancelled
        from pipeline.io import write_json
        out = {str(out)!r}
        def failed(msg):
            write_json(out + "/status.json", {{"state": "FAILED", "error": msg}})
        with Lease(out, stall_timeout_s={stall_s}, heartbeat_s=0.2, cancel_grace_s=2, on_stall=failed) as lease:
            write_json(out + "/status.json", {{"state": "RUNNING", "step": 0}})
    """) + textwrap.indent(textwrap.dedent(body), "    ")
    return subprocess.Popen([sys.executable, "-c", code], cwd=str(REPO), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})


def _wait_for(pred, timeout: float = 30.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return
        time.sleep(0.1)
    raise TimeoutError


def test_cancellation_from_another_process_stops_the_job_after_its_step(tmp_path):
    proc = _job_process(tmp_path, """
        try:
            for step in range(1, 10_000):
                time.sleep(0.1)
                lease.step_done(step)
        except JobCancelled as e:
            write_json(out + "/status.json", {"state": "FAILED", "error": str(e)})
            sys.exit(3)
    """)
    _wait_for(lambda: (tmp_path / "lease.json").exists())
    assert job_state(tmp_path)["state"] == "RUNNING"
    request_cancel(tmp_path, "marked failed in the UI")
    t0 = time.time()
    assert proc.wait(timeout=30) == 3, proc.stdout.read()
    assert time.time() - t0 < 5
    st = job_state(tmp_path)
    assert st["state"] == "FAILED" and "cancelled after step" in st["error"] and "marked failed in the UI" in st["error"]


def test_a_step_that_never_ends_is_ended_after_the_cancel_grace(tmp_path):
    proc = _job_process(tmp_path, """
        lease.step_done(1)
        time.sleep(600)                      # a step stuck in a collective: never polls the request
    """)
    _wait_for(lambda: (tmp_path / "lease.json").exists())
    request_cancel(tmp_path, "cleared")
    assert proc.wait(timeout=30) == -9                      # ended by the heartbeat thread, bounded
    assert lease_state(tmp_path)["released"] is True


def test_the_stall_timeout_fails_the_job_with_its_last_log_lines(tmp_path):
    (tmp_path / "launcher.try1.log").write_text("compiling graph...\nstep 3 loss 5.1\nwaiting on rank 1\n")
    proc = _job_process(tmp_path, """
        lease.step_done(3)
        time.sleep(600)                      # no step ever finishes again
    """, stall_s=1.0)
    assert proc.wait(timeout=30) == -9
    st = job_state(tmp_path)
    assert st["state"] == "FAILED" and st["error"].startswith("stalled: no step finished for")
    assert "after step 3" in st["error"] and "waiting on rank 1" in st["error"]


def test_the_operator_refuses_to_launch_into_a_held_folder(tmp_path):
    from airflow.sdk.exceptions import AirflowException

    from operators.training import TrainingStageOperator

    op = TrainingStageOperator(task_id="train_main", corpus={}, stage="main")
    op._out_dir = lambda context: tmp_path
    with Lease(tmp_path, heartbeat_s=0.2):
        with pytest.raises(AirflowException, match="is held by job .* not launching a second trainer"):
            op.submit_job({"params": {}, "ti": None})
    assert not (tmp_path / "job.json").exists()
