"""Host-independent job control: a lease with a heartbeat, an exclusive stage-folder lock, cancel requests and a
stall timeout, all through files in the stage folder.

Why files: the Airflow task that launched a job, its retry on another Celery worker, the triggerer and a person
clearing the task may all sit on different hosts; the stage folder (shared storage) is the one thing they all see.
A local pid means nothing on another host, and a recycled pid lies even on the same one.

* ``.lock``: ``fcntl.flock`` held for the job's lifetime.  A second trainer in the same folder fails at once with
  :class:`StageBusy`, before it writes anything.  ``flock`` works across hosts on NFSv4 and on Lustre/GPFS
  mounted with locking; the lease below is the second line of defence where it does not.
* ``lease.json``: ``{job_id, host, pid, started_at, heartbeat_at, step, last_step_at}``, rewritten atomically every
  ``HEARTBEAT_S`` seconds by a daemon thread.  Anyone decides RUNNING vs LOST from its age alone
  (:func:`lease_state`): LOST only when the heartbeat is older than ``LEASE_TIMEOUT_S``.
* ``cancel.json``: written by :func:`request_cancel` from any host (``on_kill``, a Clear, a person).  The job polls
  it with the heartbeat, stops after the current step (:class:`JobCancelled`), and if that step does not end within
  ``CANCEL_GRACE_S`` the heartbeat thread ends the process itself: a bounded stop.
* Stall timeout: no finished step for ``stall_timeout_s`` (the first step includes the graph compile) fails the job
  with the last lines of its log, instead of a poll loop that waits forever.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import threading
import time
import uuid
from pathlib import Path

from pipeline.io import read_json, write_json

HEARTBEAT_S = 5.0
LEASE_TIMEOUT_S = 60.0          # 12 missed heartbeats: a stopped host, not a slow disk
CANCEL_GRACE_S = 60.0
LOCK, LEASE, CANCEL = ".lock", "lease.json", "cancel.json"


class StageBusy(RuntimeError):
    """Another job holds the stage folder's lock."""


class JobCancelled(RuntimeError):
    """A cancel request (``cancel.json``) stopped the job."""


def pid_alive(pid: int) -> bool:
    """Only meaningful on the host that launched the job; a zombie child of ours counts as dead."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def request_cancel(out_dir: str | Path, reason: str) -> Path:
    """Ask the job in ``out_dir`` to stop (from any host); it stops within one step or ``CANCEL_GRACE_S``."""
    path = Path(out_dir) / CANCEL
    write_json(path, {"reason": reason, "host": socket.gethostname(), "pid": os.getpid(), "time": time.time()})
    return path


def lease_state(out_dir: str | Path, now: float | None = None, timeout: float = LEASE_TIMEOUT_S) -> dict | None:
    """The lease with ``age_s`` and ``fresh`` added, or None when no job ever took the folder."""
    path = Path(out_dir) / LEASE
    if not path.exists():
        return None
    try:
        lease = read_json(path)
    except (OSError, ValueError):
        return None
    age = (now if now is not None else time.time()) - float(lease.get("heartbeat_at", 0.0))
    return {**lease, "age_s": age, "fresh": age <= timeout}


def _tail(path: Path, n: int = 20) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 8192))
            return "\n".join(fh.read().decode("utf-8", "replace").splitlines()[-n:])
    except OSError:
        return ""


class Lease:
    """The running job's hold on its stage folder (rank 0 only).  Use as a context manager around training."""

    def __init__(self, out_dir: str | Path, stall_timeout_s: float = 0.0, heartbeat_s: float = HEARTBEAT_S,
                 cancel_grace_s: float = CANCEL_GRACE_S, on_stall=None):
        self.out_dir = Path(out_dir)
        self.stall_timeout_s = stall_timeout_s
        self.heartbeat_s = heartbeat_s
        self.cancel_grace_s = cancel_grace_s
        self.on_stall = on_stall            # callback(message) before the process ends on a stall
        self.job_id = uuid.uuid4().hex
        self.step = 0
        self.last_step_at = time.time()
        self.cancel_reason: str | None = None
        self._cancel_seen_at: float | None = None
        self._fh = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------------------------

    def __enter__(self) -> Lease:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.out_dir / LOCK, "a+")  # noqa: SIM115 - held until __exit__
        try:
            fcntl.flock(self._fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = lease_state(self.out_dir) or {}
            self._fh.close()
            raise StageBusy(f"stage folder {self.out_dir} is locked by job {holder.get('job_id')} on host "
                            f"{holder.get('host')} (pid {holder.get('pid')}, heartbeat {holder.get('age_s', 0):.0f} s "
                            f"ago); refusing to start a second trainer there") from None
        stale = lease_state(self.out_dir)
        if stale and stale["fresh"] and stale.get("host") != socket.gethostname():
            self._fh.close()        # the lock did not reach us (no locking on this mount), the lease does
            raise StageBusy(f"stage folder {self.out_dir} has a live lease of job {stale.get('job_id')} on host "
                            f"{stale.get('host')} (heartbeat {stale['age_s']:.0f} s ago); refusing to start a second "
                            f"trainer there")
        (self.out_dir / CANCEL).unlink(missing_ok=True)      # a request for an earlier job does not apply
        self.started_at = time.time()
        self._write()
        self._thread = threading.Thread(target=self._beat, name="mindloom-lease", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.heartbeat_s + 5)
        self._write(final=True)
        if self._fh is not None:
            fcntl.flock(self._fh, fcntl.LOCK_UN)
            self._fh.close()

    # -- what the training loop calls ------------------------------------------------------------------------

    def step_done(self, step: int) -> None:
        """Record progress; raise :class:`JobCancelled` when a cancel request has arrived."""
        self.step, self.last_step_at = step, time.time()
        self.check_cancel()

    def check_cancel(self) -> None:
        if self.cancel_reason is None:
            self._poll_cancel()
        if self.cancel_reason is not None:
            raise JobCancelled(f"cancelled after step {self.step}: {self.cancel_reason}")

    # -- the heartbeat thread --------------------------------------------------------------------------------

    def _write(self, final: bool = False) -> None:
        write_json(self.out_dir / LEASE, {
            "job_id": self.job_id, "host": socket.gethostname(), "pid": os.getpid(), "started_at": self.started_at,
            "heartbeat_at": 0.0 if final else time.time(), "step": self.step, "last_step_at": self.last_step_at,
            "released": final})

    def _poll_cancel(self) -> None:
        path = self.out_dir / CANCEL
        if path.exists():
            try:
                req = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                req = {}
            self.cancel_reason = (f"{req.get('reason') or 'cancel requested'} (from {req.get('host')}, "
                                  f"pid {req.get('pid')})")

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            self._write()
            now = time.time()
            if self.cancel_reason is None:
                self._poll_cancel()
            if self.cancel_reason is not None:
                self._cancel_seen_at = self._cancel_seen_at or now
                if now - self._cancel_seen_at > self.cancel_grace_s:
                    self._end(f"cancelled: {self.cancel_reason}; the current step did not finish within "
                              f"{self.cancel_grace_s:.0f} s, so the job was ended")
            elif self.stall_timeout_s and now - self.last_step_at > self.stall_timeout_s:
                logs = sorted(self.out_dir.glob("launcher.try*.log"), key=lambda p: p.stat().st_mtime)
                log_tail = (_tail(logs[-1]) if logs else "") or "(no launcher log)"
                self._end(f"stalled: no step finished for {now - self.last_step_at:.0f} s "
                          f"(stall timeout {self.stall_timeout_s:.0f} s) after step {self.step}; "
                          f"last log lines:\n{log_tail}")

    def _end(self, message: str) -> None:
        if self.on_stall is not None:
            try:
                self.on_stall(message)
            except Exception:  # noqa: BLE001 - the process ends either way
                pass
        self._write(final=True)
        os.kill(os.getpid(), signal.SIGKILL)
