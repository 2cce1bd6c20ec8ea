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


def _running(out: Path, *, beat: int, pid: int, host: str | None = None, job_id: str = "j1",
             written_at: float | None = None):
    """The folder of a job as its trainer leaves it: launch, RUNNING row and lease (``written_at``: its own clock)."""
    write_json(out / "launch.json", {"pid": pid, "host": host or socket.gethostname(), "job_id": job_id,
                                     "time": time.time() - 100})
    write_json(out / "status.json", {"state": "RUNNING", "step": 7, "pid": pid, "job_id": job_id})
    write_json(out / "lease.json", {"job_id": job_id, "generation": 1, "beat": beat, "pid": pid,
                                    "host": host or socket.gethostname(), "step": 7, "released": False,
                                    "written_at": time.time() if written_at is None else written_at})


def test_freshness_is_the_counters_progress_on_the_observers_clock(tmp_path):
    """The job host's clock is an hour off (its written_at says so); only the counter and our own clock count."""
    skewed = time.time() + 3600
    _running(tmp_path, beat=4, pid=1, host="trainer-7", written_at=skewed)
    st = job_state(tmp_path, now=1000.0)                      # first sight: one look cannot call it stale
    assert st["state"] == "RUNNING" and st["host"] == "trainer-7" and st["heartbeat"] == 4
    _running(tmp_path, beat=5, pid=1, host="trainer-7", written_at=skewed - 7200)   # moved: alive, whatever its clock
    st = job_state(tmp_path, now=1059.0, seen=st["observed"])
    assert st["state"] == "RUNNING" and st["heartbeat_still_s"] == 0.0
    st = job_state(tmp_path, now=1118.0, seen=st["observed"])  # 59 s of our clock without progress
    assert st["state"] == "RUNNING" and st["heartbeat_still_s"] == 59.0
    st = job_state(tmp_path, now=1120.0, seen=st["observed"])
    assert st["state"] == "LOST"
    assert st["error"] == "the lease heartbeat of host trainer-7 stood at 5 for 61 s (observed here)"


def test_a_recycled_pid_does_not_keep_a_dead_job_alive(tmp_path):
    """The lease names a pid that is alive on this host (ours), but its counter stopped: LOST, not waiting."""
    _running(tmp_path, beat=9, pid=os.getpid())
    st = job_state(tmp_path, now=0.0)
    assert st["state"] == "RUNNING"
    assert job_state(tmp_path, now=61.0, seen=st["observed"])["state"] == "LOST"


def test_a_dead_local_job_is_lost_at_once_and_a_new_launch_waits_for_its_lease(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    _running(tmp_path, beat=3, pid=dead.pid)
    assert job_state(tmp_path)["state"] == "LOST"           # same host, every process gone: no 60 s wait
    # A new launch (job j2) that has not taken its lease yet is PENDING: j1's RUNNING row and lease are not its own.
    write_json(tmp_path / "launch.json", {"pid": os.getpid(), "host": socket.gethostname(), "job_id": "j2"})
    st = job_state(tmp_path, now=0.0)
    assert st["state"] == "PENDING" and st["step"] == 0
    # Launched on another host, never took a lease: LOST after the grace, counted on the observer's clock.
    (tmp_path / "lease.json").unlink()
    write_json(tmp_path / "launch.json", {"pid": None, "host": "elsewhere", "job_id": "j2", "time": 0.0})
    st = job_state(tmp_path, now=10.0)
    assert st["state"] == "PENDING"
    st = job_state(tmp_path, now=10.0 + STARTUP_GRACE_S + 1, seen=st["observed"])
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
