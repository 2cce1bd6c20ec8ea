"""Process pools inside a task: allowed under Celery, and workers that start light.

A Celery worker (prefork) runs Airflow's task supervisor in a daemonic process, and a process that multiprocessing
marks daemonic may not start children ("daemonic processes are not allowed to have children"): every pipeline pool
failed on Celery workers as soon as a task had more than one shard.  Our pools are always joined before the task
returns (context managers), so the rule's reason (orphans when a daemon exits) does not apply; :func:`task_pools`
lifts the flag while a task runs, and gives the process a multiprocessing authentication key in place of
billiard's (which refuses to be pickled into a spawned worker).

Spawned and forkserver workers should also not re-import the parent's ``__main__``.

Pools are also what made the same work cost more through Airflow than through the CLI: every batch task started
its own pools, and each ingest and quality *shard* started another.  While a task runs (:func:`task_pools`),
:func:`task_executor` hands out forkserver pools that later calls with the same settings reuse (the shards of a
batch share one pool) and shuts them all down when the task ends, so no idle worker outlives its task.  Workers
fork from one server process that has already imported the stage's modules, instead of each spawned worker
starting an interpreter and importing numpy, pyarrow and the pipeline again.

A process that runs task after task (``airflow dags test``, ``mindloom corpus``) also keeps the idle pools of
one task for the next task of the same step (:func:`task_pools` with ``step``): at the shipped ``parallelism`` a
step has 64 tasks, and each started and stopped its own workers (a pool's start-up CPU, spent per task; the
tokenizer's workers also loaded the SentencePiece model again).  The pools are shut down as soon as a task of
another step starts, so the next step's memory does not carry them; so are the step caches (:func:`step_cache`:
the sink scatter's mapping of the held-out index, whose mapped pages grow with the corpus and which the writer
tasks need not hold).  A process made for one task (LocalExecutor, Celery: forked per task and left through
``os._exit``) never keeps a pool: only a process that has already run a task does.

``multiprocessing`` prepares every spawned (and the forkserver) process by importing the parent's main script
as ``__mp_main__``.  Inside an Airflow task that script is the ``airflow`` CLI: each pool worker imported all of
Airflow (its memory and its import CPU, in every worker, under ``airflow dags test``) before doing any work.
Pipeline pools only ever run functions of ``pipeline.*`` modules, which workers import by name, so
:func:`main_hidden` hides the main script's path and spec while a task runs and its pools start.
"""

from __future__ import annotations

import atexit
import os
import pickle
import sys
from collections.abc import Iterator
from contextlib import contextmanager

_MISSING = object()
_SCOPES: list[dict] = []       # one {settings: executor} per running task (innermost last), least recently used first
_BUSY: dict[int, int] = {}     # id(pool) -> maps running on it (never evicted while one runs)
#: Shared pools a task keeps alive between uses.  Each holds its workers (and what their last batch left) until the
#: task ends, so settings that differ per shard would grow the task's memory with its shard count; the least
#: recently used idle pool is shut down when a new one would exceed this.
MAX_SHARED_POOLS = 2
#: the idle pools the last task of ``step`` left for that step's next task in this process
_KEPT: dict = {"step": None, "pools": {}}
#: what a step's tasks keep in this process for its next task besides pools (:func:`step_cache`): cleared with them
_STEP_CACHES: list = []
_TASKS_RUN = [0]               # chain tasks this process has finished


@contextmanager
def task_pools(step: str | None = None) -> Iterator[None]:
    """While a task runs: its pools may start children in a daemonic process, and start without ``__main__``.

    ``step``: the chain step this task belongs to (``pipeline.tasks.corpus.run_step``).  The task starts with the
    pools the previous task of the same step left in this process, and leaves its own idle pools for the next one
    when this process has run a task before; a task of another step shuts them down first.  Nested inside a task
    (a stage's :func:`pipeline.profile.measured`), the task's scope holds the pools.
    """
    if _SCOPES:
        yield
        return
    import multiprocessing
    from multiprocessing.process import AuthenticationString

    if _KEPT["step"] != step:
        shutdown_kept()
    config = multiprocessing.current_process()._config      # where multiprocessing keeps the daemon flag
    daemon = config.pop("daemon", None)
    authkey = config.get("authkey")
    if authkey is not None and type(authkey) is not AuthenticationString:     # billiard's (Celery) cannot be
        config["authkey"] = AuthenticationString(bytes(authkey))             # pickled into a spawned worker
    _SCOPES.append(_KEPT["pools"])
    _KEPT["step"], _KEPT["pools"] = None, {}
    failed = True
    try:
        with main_hidden():
            yield
        failed = False
    finally:
        keep = step is not None and _TASKS_RUN[0] and not failed     # a failed task's pools may hold abandoned work
        for key, pool in _SCOPES.pop().items():
            if keep and not getattr(pool, "_broken", False):
                _KEPT["pools"][key] = pool
            else:
                pool.shutdown(wait=True, cancel_futures=True)
        if keep:               # the step's next task keeps its pools and step caches; any other task drops them
            _KEPT["step"] = step
        if step is not None:
            _TASKS_RUN[0] += 1
        if daemon is not None:
            config["daemon"] = daemon
        if authkey is not None:
            config["authkey"] = authkey


def shutdown_kept() -> None:
    """Shut down the pools kept for the next task of a step (a task of another step starts, or the process ends),
    and empty the step caches."""
    pools, _KEPT["step"], _KEPT["pools"] = list(_KEPT["pools"].values()), None, {}
    for pool in pools:
        pool.shutdown(wait=True, cancel_futures=True)
    for cache in _STEP_CACHES:
        cache.clear()


def step_cache() -> list:
    """A list a module may fill with what the next task of the same step reuses in this process (the sink
    scatter's held-out index); it is emptied when a task of another step starts, as the kept pools are shut down,
    so the next step's memory does not carry it."""
    cache: list = []
    _STEP_CACHES.append(cache)
    return cache


atexit.register(shutdown_kept)


@contextmanager
def main_hidden() -> Iterator[None]:
    """While the block runs, workers started by ``spawn``/``forkserver`` skip importing ``__main__``."""
    main = sys.modules.get("__main__")
    if main is None:
        yield
        return
    saved = {k: vars(main).get(k, _MISSING) for k in ("__file__", "__spec__")}
    main.__spec__ = None
    if saved["__file__"] is not _MISSING:
        del main.__file__
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is _MISSING:
                vars(main).pop(k, None)
            else:
                setattr(main, k, v)


def _forget_forkserver(inherited: bool = True) -> None:
    """Forget the forkserver handle's server; the next pool starts this process's own.  ``inherited``: this is a
    child made by ``fork``, whose handle is the parent's, and so is its lock, which another thread of the parent may
    have held at the fork (it would never be released here): the lock is replaced, not taken."""
    import os
    import threading
    from multiprocessing import forkserver

    fs = forkserver._forkserver        # multiprocessing's per-process server handle (private, stable since 3.4)
    if inherited:
        fs._lock = threading.Lock()
    with fs._lock:
        if fs._forkserver_alive_fd is not None:
            try:
                os.close(fs._forkserver_alive_fd)
            except OSError:
                pass
        fs._forkserver_address = fs._forkserver_alive_fd = fs._forkserver_pid = None


def _forkserver_of_this_process() -> None:
    """Forget a forkserver inherited through ``fork`` (a Celery or LocalExecutor worker that had started one before
    forking this task's process, where this module was not imported before the fork): multiprocessing would
    ``waitpid`` a process that is not our child and fail with ``ChildProcessError``.  A server of our own that died
    is forgotten too; the next pool starts a fresh one."""
    import os
    from multiprocessing import forkserver

    pid = forkserver._forkserver._forkserver_pid
    if pid is None:
        return
    try:
        if not os.waitpid(pid, os.WNOHANG)[0]:
            return                     # our own, alive
    except ChildProcessError:
        _forget_forkserver(inherited=True)
        return
    _forget_forkserver(inherited=False)


def _forget_kept() -> None:
    """A forked child neither owns its parent's kept pools nor has run a task of its own yet."""
    _KEPT["step"], _KEPT["pools"] = None, {}
    _TASKS_RUN[0] = 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_forkserver)
    os.register_at_fork(after_in_child=_forget_kept)


def task_executor(workers: int, preload: str, initializer=None, initargs: tuple = ()):
    """``(pool, owned)``: a forkserver pool of ``workers`` processes whose server preloads ``preload``.

    While a task runs (inside :func:`task_pools`) the pool is shared with later calls that ask for the same
    settings and shut down when the task ends (``owned`` False); outside a task the caller owns it and must shut it
    down.  forkserver: workers fork from a clean server process (no inherited pyarrow threads, unlike fork) that
    has imported ``preload`` once, instead of the caller's ``__main__``.
    """
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    ctx = mp.get_context("forkserver")
    # only the server's first start reads this; the chain's task module imports every stage's module, so whichever
    # stage starts the server first, the others' workers find their code already imported, and pipeline.warm loads
    # the compiled kernels once in the server instead of once in every worker (each paid its own load)
    ctx.set_forkserver_preload(list(dict.fromkeys([preload, "pipeline.tasks.corpus", "pipeline.warm"])))
    _forkserver_of_this_process()
    if not _SCOPES:
        return ProcessPoolExecutor(workers, mp_context=ctx, initializer=initializer, initargs=initargs), True
    init = f"{initializer.__module__}.{initializer.__qualname__}" if initializer else ""
    key = (workers, init, pickle.dumps(initargs))
    scope = _SCOPES[-1]
    pool = scope.pop(key, None)            # re-inserted below: the dict's order is the use order
    if pool is None or getattr(pool, "_broken", False):
        _evict_idle(scope, MAX_SHARED_POOLS - 1)
        pool = ProcessPoolExecutor(workers, mp_context=ctx, initializer=initializer, initargs=initargs)
    scope[key] = pool
    return pool, False


def _evict_idle(scope: dict, keep: int) -> None:
    """Shut down the least recently used idle pools of ``scope`` until at most ``keep`` remain."""
    for key in list(scope):
        if len(scope) <= keep:
            return
        if not _BUSY.get(id(scope[key])):
            scope.pop(key).shutdown(wait=True, cancel_futures=True)


def _discard(pool) -> None:
    """Drop a shared pool after an error (it may be broken or still busy with abandoned work)."""
    for scope in _SCOPES:
        for key in [k for k, v in scope.items() if v is pool]:
            del scope[key]
    pool.shutdown(wait=False, cancel_futures=True)


def ordered_map(fn, batches, workers: int, preload: str, initializer, initargs: tuple):
    """Yield ``fn(batch)`` for every batch, in input order, from ``workers`` processes (:func:`task_executor`).

    At most ``2 * workers`` batches are in flight, so memory is bounded by the batch size.  A dead worker raises
    ``BrokenProcessPool`` for the caller to name.
    """
    from collections import deque

    pool, owned = task_executor(workers, preload, initializer, initargs)
    window: deque = deque()
    _BUSY[id(pool)] = _BUSY.get(id(pool), 0) + 1
    try:
        for batch in batches:
            window.append(pool.submit(fn, batch))
            if len(window) >= 2 * workers:
                yield window.popleft().result()
        while window:
            yield window.popleft().result()
    except BaseException:       # includes GeneratorExit: a consumer that stops early leaves no work behind
        if not owned:
            _discard(pool)
        raise
    finally:
        if _BUSY.get(id(pool), 0) <= 1:
            _BUSY.pop(id(pool), None)
        else:
            _BUSY[id(pool)] -= 1
        if owned:
            pool.shutdown(wait=True, cancel_futures=True)
