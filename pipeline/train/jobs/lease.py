"""Host-independent, fenced job control: a job id, a lease with a heartbeat counter, an exclusive stage-folder lock,
cancel requests and a stall timeout, all through files in the stage folder.

Why files: the Airflow task that launched a job, its retry on another Celery worker, the triggerer and a person
clearing the task may all sit on different hosts; the stage folder (shared storage) is the one thing they all see.
A local pid means nothing on another host, a recycled pid lies even on the same one, and two hosts' clocks differ.

* Job id: every launch gets one (``MINDLOOM_JOB_ID``, set by ``pipeline.tasks.pretrain.launch_env``; a job started
  by hand makes its own).  Every rank of the job knows it; status rows and metric rows carry it.
* ``.lock``: ``fcntl.flock`` held by rank 0 for the job's lifetime.  A second trainer in the same folder fails at
  once with :class:`StageBusy`, before it writes anything.  ``flock`` works across hosts on NFSv4 and on
  Lustre/GPFS mounted with locking; the lease below is the second line of defence where it does not.
* ``lease.claims/<generation>``: taking the folder is a create-exclusive (``O_EXCL``) of the next generation's claim
  file, so of two trainers that both found the folder free or stale exactly one wins.  A newer claim than the one a
  job holds means the job lost the folder.
* ``lease.json``: ``{job_id, generation, beat, host, pid, step, released, stop}``, rewritten atomically every
  ``HEARTBEAT_S`` seconds with ``beat`` + 1.  Freshness is the counter's progress as an observer sees it over its
  *own* clock (:func:`lease_state`): LOST when the counter stood still for ``LEASE_TIMEOUT_S`` of the observer's
  time.  No two hosts' clocks are ever compared.
* Fencing: before each checkpoint, status and metrics write the job calls :meth:`Lease.fence`, which reads the lease
  back (job id, generation, no newer claim) and raises :class:`LeaseLost` when the job no longer holds it; the job
  then stops without writing anything more (the heartbeat thread also stops, and ends the process after
  ``CANCEL_GRACE_S`` if the main thread is stuck).
* ``cancel.json``: written by :func:`request_cancel` from any host.  Rank 0 polls it after each step; with more
  ranks it writes ``stop_after`` (its current step) into the lease, and every rank, rank 0 included, stops
  (:class:`JobCancelled`) at its first sync point past that step: the ranks' collectives stay paired, since rank 0
  wrote ``stop_after`` before it entered the next step that the others wait for.  A rank whose step does not end is
  ended by its watcher thread once rank 0 has stopped, or ``CANCEL_GRACE_S`` after the request: a bounded stop of
  every rank.
* Stall timeout: no finished step for ``stall_timeout_s`` (the first step includes the graph compile) fails the job
  with the last lines of its log; every rank watches its own steps and rank 0's decision.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
import uuid
from pathlib import Path

from pipeline.io import write_json

from . import fenced

log = logging.getLogger("mindloom.train")

HEARTBEAT_S = 5.0
LEASE_TIMEOUT_S = 60.0          # 12 heartbeats without progress: a stopped host, not a slow disk
CANCEL_GRACE_S = 60.0
STARTUP_S = 300.0               # how long ranks > 0 wait for rank 0 to take the lease
LOCK, LEASE, CANCEL, CLAIMS = ".lock", "lease.json", "cancel.json", "lease.claims"
JOB_ID_ENV = "MINDLOOM_JOB_ID"
#: flock errors that mean "this filesystem has no locks" (NFS nolock, some Lustre mounts), not "busy"
NO_LOCKS = tuple(getattr(errno, n) for n in ("ENOLCK", "ENOSYS", "EOPNOTSUPP", "ENOTSUP") if hasattr(errno, n))


def boot_id() -> str | None:
    """This kernel's boot id: two processes with the same one share a kernel, where a granted flock is exact."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="utf-8") as f:
            return f.read().strip()
    except OSError:
        return None


class StageBusy(RuntimeError):
    """Another job holds the stage folder; nothing was written."""


class JobCancelled(RuntimeError):
    """A cancel request (``cancel.json``) or rank 0's end stopped the job."""


class LeaseLost(RuntimeError):
    """This job no longer holds the stage folder's lease: it stops without another write."""


def new_job_id() -> str:
    return uuid.uuid4().hex


def env_job_id() -> str | None:
    return os.environ.get(JOB_ID_ENV) or None


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


def request_cancel(out_dir: str | Path, reason: str, job_id: str | None = None) -> Path:
    """Ask the job in ``out_dir`` (only job ``job_id``, when given) to stop, from any host: every rank stops within
    one step, or ``CANCEL_GRACE_S``."""
    path = Path(out_dir) / CANCEL
    write_json(path, {"reason": reason, "job_id": job_id, "host": socket.gethostname(), "pid": os.getpid(),
                      "time": time.time()})
    return path


def read_lease(out_dir: str | Path) -> dict | None:
    try:
        lease = json.loads((Path(out_dir) / LEASE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return lease if isinstance(lease, dict) else None


def lease_state(out_dir: str | Path, seen: dict | None = None, now: float | None = None,
                timeout: float = LEASE_TIMEOUT_S) -> dict | None:
    """The lease with what this observer concludes from its counter, or None when no job ever took the folder.

    ``seen`` is the ``"seen"`` of the previous call by the same observer (None at first sight); ``now`` is the
    observer's own clock (``time.monotonic()`` by default).  ``stalled_s``: for how long, on that clock, the
    counter has not moved; ``fresh``: ``stalled_s <= timeout``.  At first sight a lease counts as fresh: one look
    cannot tell a stopped counter from a running one, and comparing its writer's clock with ours is what this
    avoids.
    """
    lease = read_lease(out_dir)
    if lease is None:
        return None
    now = time.monotonic() if now is None else now
    key = [lease.get("job_id"), lease.get("generation"), lease.get("beat")]
    same = seen is not None and [seen.get("job_id"), seen.get("generation"), seen.get("beat")] == key
    since = float(seen["since"]) if same else now
    stalled = now - since
    return {**lease, "stalled_s": stalled, "fresh": stalled <= timeout,
            "seen": {"job_id": key[0], "generation": key[1], "beat": key[2], "since": since}}


def live_lease(out_dir: str | Path, wait_s: float = 2 * HEARTBEAT_S + 1) -> dict | None:
    """The lease if a job visibly holds it now: not released, and its process alive (same host) or its counter
    moving within ``wait_s``.  A one-shot check for launchers; the trainer's own acquisition is the real guard."""
    lease = read_lease(out_dir)
    if lease is None or lease.get("released"):
        return None
    if lease.get("host") == socket.gethostname() and lease.get("pid"):
        return lease if pid_alive(int(lease["pid"])) else None
    return lease if _moves(out_dir, lease, wait_s) else None


def _moves(out_dir: str | Path, lease: dict, wait_s: float) -> bool:
    """Whether the lease file changes (counter, owner, release) within ``wait_s`` of our own clock."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        time.sleep(min(0.5, wait_s / 4))
        now = read_lease(out_dir)
        if now is None or [now.get(k) for k in ("job_id", "generation", "beat", "released")] != \
                [lease.get(k) for k in ("job_id", "generation", "beat", "released")]:
            return True
    return False


def may_write(out_dir: str | Path, job_id: str | None) -> bool:
    """Whether a process outside the training loop (an error before the lease, another rank, msrun's scheduler) may
    record a failure in ``status.json``: the folder is free, or our own job still holds it.  Not when another job
    holds it, and not once our own rank 0 released it (it wrote the final status; a later error is an echo)."""
    lease = read_lease(out_dir)
    if lease is None:
        return True
    ours = job_id is not None and lease.get("job_id") == job_id
    return not lease.get("released") if ours else bool(lease.get("released"))


def _tail(path: Path, n: int = 20) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 8192))
            return "\n".join(fh.read().decode("utf-8", "replace").splitlines()[-n:])
    except OSError:
        return ""


def _claims(out_dir: Path) -> list[int]:
    try:
        return sorted(int(p.name) for p in (out_dir / CLAIMS).iterdir() if p.name.isdigit())
    except OSError:
        return []


class Lease:
    """A rank's part in job control; use as a context manager around training.

    Rank 0 (``rank=0``) holds the stage folder: lock, claim, heartbeat.  Ranks > 0 follow: they know the job id,
    watch the lease (lost, or ended by rank 0), cancel requests and their own stall, and fence their own writes.
    """

    def __init__(self, out_dir: str | Path, job_id: str | None = None, rank: int = 0, stall_timeout_s: float = 0.0,
                 heartbeat_s: float = HEARTBEAT_S, cancel_grace_s: float = CANCEL_GRACE_S, on_stall=None,
                 takeover_wait_s: float = LEASE_TIMEOUT_S, startup_s: float = STARTUP_S, ranks: int = 1):
        self.out_dir = Path(out_dir)
        self.holder = rank == 0
        self.rank, self.ranks = rank, ranks
        self.stop_after: int | None = None     # rank 0's decision: every rank stops at its first sync point past it
        self.job_id = job_id or (new_job_id() if self.holder else None)   # None: adopt rank 0's (hand-run msrun)
        self.stall_timeout_s = stall_timeout_s
        self.heartbeat_s = heartbeat_s
        self.cancel_grace_s = cancel_grace_s
        self.takeover_wait_s = takeover_wait_s
        self.startup_s = startup_s
        self.on_stall = on_stall            # callback(message) of rank 0 before the process ends on a stall
        self.generation: int | None = None
        self.beat = 0
        self.step = 0
        self.last_step_at = time.monotonic()
        self.cancel_reason: str | None = None
        self.lost: str | None = None
        self.rank0_stop: str | None = None
        self._cancel_seen_at: float | None = None
        self._lost_at: float | None = None
        self._fh = None
        self._stop = threading.Event()
        self._write_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._started = time.monotonic()
        self.locked = False                   # flock granted (False where the filesystem has no locks)
        self.compiling_since: float | None = None

    # -- lifecycle -------------------------------------------------------------------------------------------

    def __enter__(self) -> Lease:
        if self.holder:
            self._take()
        self._thread = threading.Thread(target=self._beat if self.holder else self._watch,
                                        name="mindloom-lease", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.heartbeat_s + 5)
        if not self.holder:
            return
        if self.lost is None and self._why_lost() is None:   # never overwrite another job's lease
            with contextlib.suppress(LeaseLost):
                self._write(final=True, stop=f"{exc_type.__name__}: {exc}" if exc_type is not None else None)
        if self._fh is not None:
            fcntl.flock(self._fh, fcntl.LOCK_UN)
            self._fh.close()

    def _take(self) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.out_dir / LOCK, "a+")  # noqa: SIM115 - held until __exit__
        try:
            fcntl.flock(self._fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self.locked = True
        except BlockingIOError:
            self._fh.close()
            holder = read_lease(self.out_dir) or {}
            raise StageBusy(f"stage folder {self.out_dir} is locked by job {holder.get('job_id')} on host "
                            f"{holder.get('host')} (pid {holder.get('pid')}, heartbeat {holder.get('beat')}); "
                            f"refusing to start a second trainer there") from None
        except OSError as e:
            if e.errno not in NO_LOCKS:
                self._fh.close()
                raise
            log.warning("stage folder %s: flock is not available here (%s); the lease's claims and heartbeat "
                        "alone keep a second trainer out", self.out_dir, errno.errorcode.get(e.errno, e.errno))
        try:
            self._claim()
            (self.out_dir / CANCEL).unlink(missing_ok=True)  # a request for an earlier job does not apply
            self.started_at = time.time()
            self._write()
            self.fence()                                     # read back: the lease on disk is ours
        except BaseException:
            fcntl.flock(self._fh, fcntl.LOCK_UN)
            self._fh.close()
            raise

    def _claim(self) -> None:
        """Take the next generation with a create-exclusive claim file, after deciding the current holder is gone."""
        cur = read_lease(self.out_dir)
        if cur and not cur.get("released") and not (self.locked and cur.get("boot_id") == boot_id()):
            # The lock proves the holder gone only within one kernel (same boot id: flock is exact there). A host
            # name proves nothing (pods reuse them), and a lock may not reach across hosts or may not exist: the
            # other holder is alive if its counter moves.
            log.info("stage folder %s: lease of job %s on host %s not released; watching its heartbeat for up to "
                     "%.0f s before taking over", self.out_dir, cur.get("job_id"), cur.get("host"),
                     self.takeover_wait_s)
            if _moves(self.out_dir, cur, self.takeover_wait_s):
                now = read_lease(self.out_dir) or cur
                raise StageBusy(f"stage folder {self.out_dir} has a live lease of job {now.get('job_id')} on host "
                                f"{now.get('host')} (its heartbeat counter moves); refusing to start a second "
                                f"trainer there")
        # Same host: the granted flock proves the holder's process is gone.  Released: it ended.
        gen = max([int(cur.get("generation") or 0) if cur else 0, *_claims(self.out_dir)]) + 1
        (self.out_dir / CLAIMS).mkdir(exist_ok=True)
        try:
            fd = os.open(self.out_dir / CLAIMS / f"{gen:010d}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            raise StageBusy(f"stage folder {self.out_dir}: another trainer claimed lease generation {gen} at the "
                            f"same time; refusing to start a second trainer there") from None
        from ..checkpoint.commit import committed

        adopted = [m["step"] for m in committed(str(self.out_dir))]   # what this generation takes over as valid
        with os.fdopen(fd, "w") as fh:
            json.dump({"job_id": self.job_id, "host": socket.gethostname(), "pid": os.getpid(),
                       "adopted_steps": adopted}, fh)
        self.generation = gen

    # -- fencing and what the training loop calls ------------------------------------------------------------

    def _why_lost(self) -> str | None:
        """None while this job holds the lease, else why not (read from the files, not from memory)."""
        lease = read_lease(self.out_dir)
        gen = self.generation
        if lease is None:
            if gen is None or not self.holder:
                return f"{self.out_dir / LEASE} is gone"
        elif self.job_id is None or lease.get("job_id") != self.job_id:
            other = lease.get("generation")
            # a job of an OLDER generation writing late (it stalled past a fence) does not take the folder: the
            # claim files decide, and the next heartbeat writes this job's lease again
            if not (self.holder and gen is not None and other is not None and int(other) < gen):
                return (f"the stage folder's lease now names job {lease.get('job_id')} on host {lease.get('host')} "
                        f"(generation {other}), not this job {self.job_id}")
        gen = gen if gen is not None else (lease or {}).get("generation")
        if gen is not None and lease is not None and lease.get("job_id") == self.job_id \
                and lease.get("generation") != gen:
            return f"the lease's generation is {lease.get('generation')}, this job holds {gen}"
        if gen is not None and (self.out_dir / CLAIMS / f"{int(gen) + 1:010d}").exists():
            return f"another job claimed lease generation {int(gen) + 1}"
        if not self.holder and lease is not None and lease.get("released") and lease.get("stop"):
            return f"rank 0 ended the job: {lease['stop']}"       # a plain release: rank 0 finished, we may too
        return None

    def _adopt(self, lease: dict | None) -> bool:
        """Ranks > 0: take note of rank 0's lease (and, without a job id from the launcher, of its id)."""
        if self.generation is None and lease and (lease.get("job_id") == self.job_id if self.job_id is not None
                                                  else not lease.get("released")):
            self.job_id, self.generation = lease.get("job_id"), lease.get("generation")
        return self.generation is not None

    def fence(self) -> None:
        """Raise :class:`LeaseLost` unless this job still holds the lease; call right before every write."""
        if not self.holder:
            self._adopt(read_lease(self.out_dir))
        if self.lost is None:
            self.lost = self._why_lost()
            if self.lost is not None:
                self._lost_at = time.monotonic()
        if self.lost is not None:
            raise LeaseLost(f"job {self.job_id} (rank {self.rank}) lost its lease: {self.lost}; stopping without "
                            f"writing")

    def compiling(self) -> None:
        """The job starts its first step (graph compile included): the stall timer runs from now, not from the
        lease's creation, so building a 70b model on the host does not count against it."""
        self.compiling_since = self.last_step_at = time.monotonic()

    def step_done(self, step: int) -> None:
        """Record progress; raise :class:`LeaseLost` or :class:`JobCancelled` when the job must stop."""
        self.step, self.last_step_at = step, time.monotonic()
        if self.lost is not None:
            self.fence()
        self.check_cancel()

    def check_cancel(self) -> None:
        if self.rank0_stop is not None:
            raise JobCancelled(f"rank {self.rank} stopped after step {self.step}: rank 0 ended the job "
                               f"({self.rank0_stop})")
        if not self.holder:                       # rank 0 decides where every rank stops
            lease = read_lease(self.out_dir) or {}
            if lease.get("job_id") == self.job_id and lease.get("stop_after") is not None \
                    and self.step > int(lease["stop_after"]):
                raise JobCancelled(f"cancelled after step {self.step}: {lease.get('cancel')}")
            return
        if self.cancel_reason is None:
            self._poll_cancel()
        if self.cancel_reason is None:
            return
        if self.ranks == 1 or (self.stop_after is not None and self.step > self.stop_after):
            raise JobCancelled(f"cancelled after step {self.step}: {self.cancel_reason}")
        if self.stop_after is None:
            self.stop_after = self.step           # one more sync point, then every rank stops at the same step
            self.fence()
            self._write()

    # -- the heartbeat (rank 0) and watcher (ranks > 0) threads -----------------------------------------------

    def _write(self, final: bool = False, stop: str | None = None) -> None:
        # the training thread (stop_after) and the heartbeat thread both write: one at a time, each with the state
        # as it is when it holds the lock, so a heartbeat built before a decision can never land after it
        # published between two fences (fenced.py): a heartbeat that lost the lease in the window takes its
        # write back instead of leaving it over the new holder's lease
        with self._write_lock:
            fenced.write_json(self.out_dir / LEASE, {
                "job_id": self.job_id, "generation": self.generation, "beat": self.beat,
                "host": socket.gethostname(), "boot_id": boot_id(), "pid": os.getpid(),
                "started_at": self.started_at, "compiling": self.compiling_since is not None or self.step > 0,
                "written_at": time.time(), "step": self.step, "released": final, "stop": stop,
                "stop_after": self.stop_after, "cancel": self.cancel_reason if self.stop_after is not None else None},
                self._fence_quiet)

    def _fence_quiet(self) -> None:
        """The fence of a lease write: the job's own claim decides, as in :meth:`_why_lost`."""
        why = self._why_lost()
        if why is not None:
            self.lost = self.lost or why
            self._lost_at = self._lost_at or time.monotonic()
            raise LeaseLost(f"job {self.job_id} lost its lease: {why}")

    def _poll_cancel(self) -> None:
        if not self.holder and self.generation is None:
            return                                     # rank 0 has not yet cleared an earlier job's request
        path = self.out_dir / CANCEL
        if path.exists():
            try:
                req = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                req = {}
            if req.get("job_id") not in (None, self.job_id):
                return                                 # addressed to another job
            self.cancel_reason = (f"{req.get('reason') or 'cancel requested'} (from {req.get('host')}, "
                                  f"pid {req.get('pid')})")

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            if self.lost is None:
                self.beat += 1
                with contextlib.suppress(LeaseLost):   # the write fences itself; lost in its window: taken back
                    self._write()
            self._bounded_stop()

    def _watch(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            lease = read_lease(self.out_dir)
            if not self._adopt(lease):                 # not yet seen rank 0 take the lease
                if time.monotonic() - self._started > self.startup_s:
                    self._end(f"rank {self.rank}: rank 0 did not take the lease of job {self.job_id} within "
                              f"{self.startup_s:.0f} s")
                continue
            if self.lost is None:
                with contextlib.suppress(LeaseLost):
                    self.fence()
            if lease and lease.get("job_id") == self.job_id and lease.get("stop"):
                self.rank0_stop = lease["stop"]
                self._stop.wait(min(self.heartbeat_s, 2.0))  # room to leave through the normal path first
                self._end(f"rank {self.rank}: rank 0 ended job {self.job_id}: {lease['stop']}")
            self._bounded_stop()

    def _bounded_stop(self) -> None:
        now = time.monotonic()
        if self.lost is not None:
            if now - (self._lost_at or now) > self.cancel_grace_s:
                self._end(f"lost the lease: {self.lost}; the current step did not finish within "
                          f"{self.cancel_grace_s:.0f} s, so the job was ended", write=False)
            return
        if self.cancel_reason is None:
            self._poll_cancel()
        if self.cancel_reason is not None:
            self._cancel_seen_at = self._cancel_seen_at or now
            if now - self._cancel_seen_at > self.cancel_grace_s:
                self._end(f"cancelled: {self.cancel_reason}; the current step did not finish within "
                          f"{self.cancel_grace_s:.0f} s, so the job was ended")
        elif self.stall_timeout_s and (self.step > 0 or self.compiling_since is not None) \
                and now - self.last_step_at > self.stall_timeout_s:
            logs = sorted(self.out_dir.glob("launcher.try*.log"), key=lambda p: p.stat().st_mtime)
            log_tail = (_tail(logs[-1]) if logs else "") or "(no launcher log)"
            self._end(f"stalled: no step finished for {now - self.last_step_at:.0f} s "
                      f"(stall timeout {self.stall_timeout_s:.0f} s) after step {self.step}; "
                      f"last log lines:\n{log_tail}")

    def _end(self, message: str, write: bool = True) -> None:
        """End this process now.  Rank 0 records why (status through ``on_stall``, and a lease whose ``stop`` tells
        the other ranks to end too), unless it lost the lease; other ranks write nothing."""
        print(f"mindloom.train: rank {self.rank}: {message}", file=sys.stderr, flush=True)
        if self.holder and write and self.lost is None:
            if self.on_stall is not None:
                try:
                    self.on_stall(message)
                except Exception:  # noqa: BLE001 - the process ends either way
                    pass
            with contextlib.suppress(Exception):
                if self._why_lost() is None:
                    self._write(final=True, stop=message.split("\n", 1)[0])
        os.kill(os.getpid(), signal.SIGKILL)
