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
import threading
import time
from pathlib import Path

import pytest

from pipeline.io import write_json
from pipeline.tasks.pretrain import STARTUP_GRACE_S, job_state
from pipeline.train.jobs.lease import JobCancelled, Lease, StageBusy, lease_state, request_cancel

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
        from pipeline.train.jobs.lease import Lease, JobCancelled
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
    assert st["state"] == "FAILED"
    assert "cancelled after step" in st["error"] and "marked failed in the UI" in st["error"]


def test_a_step_that_never_ends_is_ended_after_the_cancel_grace(tmp_path):
    proc = _job_process(tmp_path, """
        lease.step_done(1)
        open(out + "/stepped", "w").close()
        time.sleep(600)                      # a step stuck in a collective: never polls the request
    """)
    _wait_for(lambda: (tmp_path / "stepped").exists())
    request_cancel(tmp_path, "cleared")
    assert proc.wait(timeout=30) == -9, proc.stdout.read()  # ended by the heartbeat thread, bounded
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


# --- fencing, atomic acquisition, every rank ---------------------------------------------------------------------

def test_a_job_that_lost_its_lease_stops_without_writing(tmp_path):
    """Another job's id written into the lease: fence() refuses, the heartbeat stops rewriting it, the exit writes
    no release over it."""
    from pipeline.train.jobs.lease import LeaseLost

    with Lease(tmp_path, heartbeat_s=0.1) as lease:
        lease.fence()                                         # ours: passes
        taken = {"job_id": "other", "generation": 2, "beat": 0, "host": "h2", "released": False}
        write_json(tmp_path / "lease.json", taken)
        with pytest.raises(LeaseLost, match="lease now names job other on host h2"):
            lease.fence()
        with pytest.raises(LeaseLost):
            lease.step_done(5)
        time.sleep(0.5)                                       # five heartbeats: none overwrote the other job's lease
        assert json.loads((tmp_path / "lease.json").read_text()) == taken
    assert json.loads((tmp_path / "lease.json").read_text()) == taken


def test_a_newer_claim_fences_even_when_the_stale_holder_rewrites_the_lease(tmp_path):
    """The claim file of the next generation is the fencing token: a holder that comes back after a takeover and
    rewrites lease.json with its own id still sees that it lost."""
    from pipeline.train.jobs.lease import CLAIMS, LeaseLost

    with Lease(tmp_path, heartbeat_s=60) as lease:
        assert lease.generation == 1 and sorted(p.name for p in (tmp_path / CLAIMS).iterdir()) == ["0000000001"]
        (tmp_path / CLAIMS / "0000000002").write_text("{}")
        with pytest.raises(LeaseLost, match="another job claimed lease generation 2"):
            lease.fence()


def test_a_stale_lease_from_another_host_is_taken_over_only_when_its_counter_stands_still(tmp_path):
    from pipeline.train.jobs.lease import CLAIMS

    write_json(tmp_path / "lease.json", {"job_id": "crashed", "generation": 3, "beat": 41, "host": "gone-host",
                                         "pid": 1, "released": False})
    t0 = time.monotonic()
    with Lease(tmp_path, heartbeat_s=60, takeover_wait_s=1.0) as lease:
        assert time.monotonic() - t0 >= 1.0                   # watched the counter for the wait first
        assert lease.generation == 4 and (tmp_path / CLAIMS / "0000000004").exists()
        assert lease_state(tmp_path)["job_id"] == lease.job_id
    # A lease on another host whose counter moves is a live job: refused, nothing written.
    write_json(tmp_path / "lease.json", {"job_id": "alive", "generation": 5, "beat": 0, "host": "busy-host",
                                         "pid": 1, "released": False})
    stop = threading.Event()

    def beat():
        n = 0
        while not stop.wait(0.2):
            n += 1
            write_json(tmp_path / "lease.json", {"job_id": "alive", "generation": 5, "beat": n,
                                                 "host": "busy-host", "pid": 1, "released": False})

    t = threading.Thread(target=beat)
    t.start()
    try:
        with pytest.raises(StageBusy, match="live lease of job alive on host busy-host"):
            with Lease(tmp_path, heartbeat_s=60, takeover_wait_s=3.0):
                pass
    finally:
        stop.set()
        t.join()
    assert not (tmp_path / CLAIMS / "0000000006").exists() and lease_state(tmp_path)["job_id"] == "alive"


def test_two_trainers_taking_over_the_same_generation_one_wins(tmp_path):
    """Where flock does not reach (simulated: the claim of the next generation is already there), the
    create-exclusive claim refuses the second trainer before it writes."""
    from pipeline.train.jobs.lease import CLAIMS

    write_json(tmp_path / "lease.json", {"job_id": "old", "generation": 1, "beat": 2, "released": True})
    (tmp_path / CLAIMS).mkdir()
    os.close(os.open(tmp_path / CLAIMS / "0000000002", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    # Our view of the folder is stale: we read generation 1, computed 2 ... and lost the O_EXCL race.
    import pipeline.train.jobs.lease as lease_mod

    real = lease_mod._claims
    lease_mod._claims = lambda d: []
    try:
        with pytest.raises(StageBusy, match="claimed lease generation 2 at the same time"):
            with Lease(tmp_path, heartbeat_s=60):
                pass
    finally:
        lease_mod._claims = real
    assert json.loads((tmp_path / "lease.json").read_text())["job_id"] == "old"


def test_every_rank_stops_on_cancel_and_on_rank_0s_end(tmp_path):
    """Ranks > 0 follow the lease: rank 0 answers a cancel request with ``stop_after`` and every rank stops at the
    same later step, whichever saw the request first; a rank stuck in a collective (its peer left) is ended by its
    watcher as soon as rank 0's final lease says the job stopped."""
    with Lease(tmp_path, job_id="J", heartbeat_s=0.1, ranks=2) as rank0:
        follower = Lease(tmp_path, job_id="J", rank=1, heartbeat_s=0.1)
        with follower:
            _wait_for(lambda: follower.generation == rank0.generation)
            request_cancel(tmp_path, "someone else's", job_id="OTHER")     # addressed to another job: ignored
            for lease in (follower, rank0):
                lease.step_done(1)
            request_cancel(tmp_path, "stop all ranks", job_id="J")
            follower.step_done(2)            # rank 1 reached step 2 before rank 0 saw the request: carries on
            rank0.step_done(2)               # rank 0 sees it: every rank stops after the next step, rank 0 too
            assert lease_state(tmp_path)["stop_after"] == 2
            for lease in (follower, rank0):
                with pytest.raises(JobCancelled, match="cancelled after step 3: stop all ranks"):
                    lease.step_done(3)
    stuck = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import time
        from pipeline.train.jobs.lease import Lease
        with Lease({str(tmp_path)!r}, job_id="K", rank=1, heartbeat_s=0.1):
            open({str(tmp_path / "ready")!r}, "w").close()
            time.sleep(600)                      # in a collective whose peer is gone
    """)], cwd=str(REPO), env={**os.environ, "PYTHONPATH": str(REPO)}, stderr=subprocess.PIPE, text=True)
    try:
        with pytest.raises(RuntimeError):
            with Lease(tmp_path, job_id="K", heartbeat_s=0.1):
                _wait_for(lambda: (tmp_path / "ready").exists())
                raise RuntimeError("rank 0 failed")
        t0 = time.time()
        assert stuck.wait(timeout=30) == -9
        assert time.time() - t0 < 10                # one watcher tick and its 0.1 s pause, on a loaded machine
        assert "rank 0 ended job K: RuntimeError: rank 0 failed" in stuck.stderr.read()
    finally:
        stuck.kill()


def test_metrics_are_read_from_a_byte_offset_and_a_partial_line_waits(tmp_path):
    from pipeline.tasks.pretrain import read_metrics

    assert read_metrics(tmp_path, 0) == ([], 0)
    rows = [json.dumps({"step": s, "loss": 1.0 / s}) + "\n" for s in (1, 2)]
    path = tmp_path / "metrics.jsonl"
    path.write_text(rows[0] + rows[1] + '{"step": 3, "lo')          # the trainer is mid-write of step 3
    got, off = read_metrics(tmp_path, 0)
    assert [r["step"] for r in got] == [1, 2] and off == len(rows[0]) + len(rows[1])
    assert read_metrics(tmp_path, off) == ([], off)                   # the partial line is not consumed
    with open(path, "a") as fh:
        fh.write('ss": 0.25}\n')
    got, off2 = read_metrics(tmp_path, off)
    assert got == [{"step": 3, "loss": 0.25}] and off2 == path.stat().st_size
    # Only the new bytes are read: a prefix that is no longer valid JSON is never looked at again.
    with open(path, "r+b") as fh:
        fh.write(b"\0" * off)
    with open(path, "a") as fh:
        fh.write(json.dumps({"step": 4}) + "\n")
    assert read_metrics(tmp_path, off2)[0] == [{"step": 4}]
    path.write_text(rows[0])                                           # rewritten shorter (resume): from 0
    assert read_metrics(tmp_path, off2) == ([json.loads(rows[0])], len(rows[0]))


def test_a_rank_above_0_ends_itself_on_a_stall_and_writes_nothing(tmp_path):
    with Lease(tmp_path, job_id="S", heartbeat_s=0.1):
        write_json(tmp_path / "status.json", {"state": "RUNNING", "step": 3, "job_id": "S"})
        before = (tmp_path / "status.json").read_bytes()
        proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
            import time
            from pipeline.train.jobs.lease import Lease
            with Lease({str(tmp_path)!r}, job_id="S", rank=1, heartbeat_s=0.1, stall_timeout_s=1.0) as lease:
                lease.step_done(3)
                time.sleep(600)                  # no step ever finishes again on this rank
        """)], cwd=str(REPO), env={**os.environ, "PYTHONPATH": str(REPO)}, stderr=subprocess.PIPE, text=True)
        assert proc.wait(timeout=30) == -9
        assert "rank 1: stalled: no step finished for" in proc.stderr.read()
        assert (tmp_path / "status.json").read_bytes() == before and lease_state(tmp_path)["job_id"] == "S"


def test_a_final_status_written_between_the_status_and_lease_reads_is_not_lost(tmp_path, monkeypatch):
    """The job writes SUCCEEDED, then releases its lease, between the reader's read of status.json (RUNNING) and of
    the lease (released): the reader reads the status again before calling the job LOST."""


    from pipeline.tasks import pretrain

    (tmp_path / "launch.json").write_text(json.dumps({"job_id": "j1"}))
    (tmp_path / "status.json").write_text(json.dumps({"state": "SUCCEEDED", "step": 10, "job_id": "j1"}))
    lost = {"state": "LOST", "step": 9, "error": "the job released its lease without a final status"}
    monkeypatch.setattr(pretrain, "_read_job_state", lambda *a, **k: dict(lost))
    assert pretrain.job_state(tmp_path)["state"] == "SUCCEEDED"
    (tmp_path / "status.json").write_text(json.dumps({"state": "SUCCEEDED", "step": 10, "job_id": "other"}))
    assert pretrain.job_state(tmp_path)["state"] == "LOST"           # another job's row is not this job's end
