"""Process pools inside a task: allowed under Celery, and workers that start light.

A Celery worker (prefork) runs Airflow's task supervisor in a daemonic process, and a process that multiprocessing
marks daemonic may not start children ("daemonic processes are not allowed to have children"): every pipeline pool
failed on Celery workers as soon as a task had more than one shard.  Our pools are always joined before the task
returns (context managers), so the rule's reason (orphans when a daemon exits) does not apply; :func:`task_pools`
lifts the flag while a task runs, and gives the process a multiprocessing authentication key in place of
billiard's (which refuses to be pickled into a spawned worker).

Spawned and forkserver workers should also not re-import the parent's ``__main__``.

``multiprocessing`` prepares every spawned (and the forkserver) process by importing the parent's main script
as ``__mp_main__``.  Inside an Airflow task that script is the ``airflow`` CLI: each pool worker imported all of
Airflow (measured: about 300 MB of RSS and 1-2 CPU-seconds per worker under ``airflow dags test``) before doing any
work.  Pipeline pools only ever run functions of ``pipeline.*`` modules, which workers import by name, so
:func:`main_hidden` hides the main script's path and spec while a task runs and its pools start.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

_MISSING = object()


@contextmanager
def task_pools() -> Iterator[None]:
    """While a task runs: its pools may start children in a daemonic process, and start without ``__main__``."""
    import multiprocessing
    from multiprocessing.process import AuthenticationString

    config = multiprocessing.current_process()._config      # where multiprocessing keeps the daemon flag
    daemon = config.pop("daemon", None)
    authkey = config.get("authkey")
    if authkey is not None and type(authkey) is not AuthenticationString:     # billiard's (Celery) cannot be
        config["authkey"] = AuthenticationString(bytes(authkey))             # pickled into a spawned worker
    try:
        with main_hidden():
            yield
    finally:
        if daemon is not None:
            config["daemon"] = daemon
        if authkey is not None:
            config["authkey"] = authkey


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


def ordered_map(fn, batches, workers: int, preload: str, initializer, initargs: tuple):
    """Yield ``fn(batch)`` for every batch, in input order, from ``workers`` forkserver processes.

    forkserver: workers fork from a clean server process (no inherited pyarrow threads, unlike fork) that preloads
    ``preload`` instead of the caller's ``__main__``.  At most ``2 * workers`` batches are in flight, so memory is
    bounded by the batch size.  A dead worker raises ``BrokenProcessPool`` for the caller to name.
    """
    import multiprocessing as mp
    from collections import deque
    from concurrent.futures import ProcessPoolExecutor

    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload([preload])
    with ProcessPoolExecutor(workers, mp_context=ctx, initializer=initializer, initargs=initargs) as pool:
        window: deque = deque()
        for batch in batches:
            window.append(pool.submit(fn, batch))
            if len(window) >= 2 * workers:
                yield window.popleft().result()
        while window:
            yield window.popleft().result()
