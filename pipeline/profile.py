"""What a task cost: wall time, CPU-seconds and peak memory of its process tree, written next to its outputs.

Every corpus task runs inside :func:`measured`, which writes ``<run>/profile/<stage>/<unit>.json``.  The figures
are what ``make bench-scale`` reports per stage and what a user reads when a task is slower or larger than expected:

* ``wall_s``: elapsed time of the block;
* ``cpu_s``: user + system time of this process and of every descendant seen while sampling (process pools,
  forkserver workers, readers; a descendant's time is its last sample, so up to ``SAMPLE_S`` of CPU per process
  can be missed at its exit), or of the children it waited for when that is larger;
* ``peak_rss_mb``: the largest sum of resident memory over this process and its live descendants, sampled every
  ``SAMPLE_S`` seconds (a pool's workers count together, as they would against a worker's memory limit);
* ``input_bytes`` when the caller knows it, and whatever the caller adds to the yielded dict.

Inside the block, process pools may start even in a daemonic process (a Celery worker) and their workers do not
re-import the parent's main script (:mod:`pipeline.pools`).

Sampling costs one ``/proc`` read per process per 0.1 s; a short spike between samples can be missed, so peaks are
a lower bound within one sampling period.
"""

from __future__ import annotations

import functools
import gc
import os
import platform
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pipeline.io import write_json
from pipeline.pools import task_pools

SAMPLE_S = 0.1
PROFILE_DIR = "profile"
_DEPTH: list[str] = []       # stages of the measured blocks now open in this process (outermost first)


def tree_rss(proc, cpu: dict | None = None) -> int:
    """Resident bytes of ``proc`` plus its live descendants (0 for any that exited meanwhile); with ``cpu``, also
    record each descendant's user + system seconds by (pid, start time)."""
    import psutil

    total = 0
    procs = [proc, *_descendants(proc)]
    skip = unexeced_children([p.pid for p in procs])
    for p in procs:
        if p.pid in skip:            # started, not yet exec'd: its parent's memory, already counted
            continue
        try:
            total += p.memory_info().rss
            if cpu is not None and p.pid != proc.pid:
                t = p.cpu_times()
                cpu[(p.pid, p.create_time())] = t.user + t.system
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return total


def _ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return int(fh.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _same_address_space(a: int, b: int) -> bool:
    """Whether processes ``a`` and ``b`` share one address space: ``kcmp(KCMP_VM)`` on Linux, exact and atomic.

    A child that a process starts (``subprocess``, a ``spawn`` pool's worker) runs in its parent's address space
    (vfork) until it calls exec, and reports the parent's whole resident size meanwhile: a process starting
    workers showed a tree about twice its size at a fine sampling period, and ``tokenize`` at bench-scale read far
    more than the bench's own sampler.  Where ``kcmp`` is missing, virtual size, resident pages and stack start
    read from ``/proc`` are compared instead (the same for a shared address space, racing with its other threads).
    """
    if (syscall := _kcmp()) is not None:
        got = syscall(_KCMP_NR[platform.machine()], a, b, 1, 0, 0)             # KCMP_VM = 1
        if got >= 0:
            return got == 0
    sigs = [_mm_signature(pid) for pid in (a, b)]
    return None not in sigs and sigs[0] == sigs[1]


_KCMP_NR = {"x86_64": 312, "aarch64": 272}


@functools.cache
def _kcmp():
    """libc's ``syscall`` where the kcmp number of this machine is known (looked up once, not per sample)."""
    import ctypes

    if platform.machine() not in _KCMP_NR:
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).syscall
    except (OSError, AttributeError):
        return None


def _mm_signature(pid: int) -> tuple | None:
    """(virtual size, resident pages, stack start) from ``/proc/<pid>/stat``; None where unreadable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
        return int(fields[20]), int(fields[21]), int(fields[25])
    except (OSError, IndexError, ValueError):
        return None


def unexeced_children(pids: list[int]) -> set[int]:
    """The processes among ``pids`` whose parent is also among them and that still run in the parent's address
    space: their resident size is the parent's, and a tree sum must skip them (:func:`_same_address_space`)."""
    parents = {pid: _ppid(pid) for pid in pids}
    return {pid for pid, ppid in parents.items() if ppid in parents and _same_address_space(pid, ppid)}


def _descendants(proc) -> list:
    """Live descendants of ``proc``, from Linux's per-thread ``children`` lists: a few small reads instead of
    psutil's scan of every process on the machine (which grows with the machine's process count, 10 samples a
    second, in every task, and cost several times these reads).  Elsewhere, psutil."""
    import psutil

    if not os.path.exists(f"/proc/{proc.pid}/task/{proc.pid}/children"):
        return proc.children(recursive=True)
    found: list = []
    stack = [proc.pid]
    while stack:
        pid = stack.pop()
        kids: set[int] = set()
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:                            # the process ended meanwhile
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/children", "rb") as fh:
                    kids.update(int(k) for k in fh.read().split())
            except OSError:                        # the thread ended meanwhile
                pass
        for k in sorted(kids):
            try:
                found.append(psutil.Process(k))
                stack.append(k)
            except psutil.NoSuchProcess:
                pass
    return found


class _Sampler(threading.Thread):
    def __init__(self):
        import psutil

        super().__init__(daemon=True, name="mindloom-rss-sampler")
        self.proc = psutil.Process()
        self.before: dict = {}
        self.peak = tree_rss(self.proc, self.before)     # descendants that predate the block (a forkserver)
        self.cpu: dict = {}
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(SAMPLE_S):
            self.peak = max(self.peak, tree_rss(self.proc, self.cpu))

    def descendants_cpu(self) -> float:
        return sum(v - self.before.get(k, 0.0) for k, v in self.cpu.items())


def own_peak_rss_mb() -> float:
    """This process's own peak resident memory in MB: ``VmHWM`` of its address space.

    Not ``ru_maxrss``: Linux folds the pre-exec address space's peak into it at ``execve``, and a child that
    ``subprocess`` starts with vfork runs in its parent's address space until then, so a small child of a 2 GB
    process reports 2 GB (a small MindRecord reader read as its own size plus its parent's under a pytest worker
    that had trained)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def release_memory() -> None:
    """Hand freed heap back to the OS (Python's gc, glibc's arenas, pyarrow's pool) at the end of a task, so a
    process that runs many tasks (``airflow dags test``, a long-lived worker) does not carry one task's peak into
    the next.

    Inside :func:`measured` the objects that existed before the task are frozen (``gc.freeze``), so the
    collection scans only what the task created: a full collection of a process that holds Airflow (every object
    of parsing the DAGs, more during ``airflow dags test``) in every task was most of the CPU of short tasks under
    Airflow and none of it under the CLI.
    """
    import ctypes
    import sys

    gc.collect()
    if "pyarrow" in sys.modules:
        sys.modules["pyarrow"].default_memory_pool().release_unused()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):      # not glibc
        pass


def _cpu() -> tuple[float, float]:
    """(this process, the children it waited for) in user + system seconds."""
    t = os.times()
    return t.user + t.system, t.children_user + t.children_system


@contextmanager
def measured(rdir: str | Path | None, stage: str, unit: str, input_bytes: int | None = None) -> Iterator[dict]:
    """Measure the block; write ``<rdir>/profile/<stage>/<unit>.json`` (not when ``rdir`` is None).

    Yields the dict that is written, so the block can add its own counts (documents, tokens, shards).
    """
    out: dict = {"stage": stage, "unit": unit}
    if input_bytes is not None:
        out["input_bytes"] = int(input_bytes)
    sampler = _Sampler()
    sampler.start()
    t0, c0 = time.perf_counter(), _cpu()
    outer = not _DEPTH
    _DEPTH.append(stage)
    if outer:       # what existed before the task: its end-of-task collection skips it (see release_memory)
        gc.freeze()
    try:
        with task_pools():       # the task's pools work on Celery workers and start light (pipeline/pools.py)
            yield out
    finally:
        release_memory()
        _DEPTH.pop()
        if outer:
            gc.unfreeze()
        sampler.stop.set()
        sampler.join()
        peak = max(sampler.peak, tree_rss(sampler.proc, sampler.cpu))
        own, waited = (a - b for a, b in zip(_cpu(), c0, strict=True))
        out.update(wall_s=round(time.perf_counter() - t0, 3),
                   cpu_s=round(own + max(waited, sampler.descendants_cpu()), 3),
                   peak_rss_mb=round(peak / 2**20, 1), pid=os.getpid(), finished=time.time())
        if rdir is not None:
            safe = unit.replace("/", "_").replace(" ", "_")
            write_json(Path(rdir) / PROFILE_DIR / stage / f"{safe}.json", out)


def read_profiles(rdir: str | Path) -> dict[str, list[dict]]:
    """Every profile of a run, by stage."""
    from pipeline.io import read_json

    base = Path(rdir) / PROFILE_DIR
    return {d.name: [read_json(f) for f in sorted(d.glob("*.json"))] for d in sorted(base.glob("*")) if d.is_dir()}
