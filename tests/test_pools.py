"""Pools inside a task: they start in a daemonic process (a Celery prefork worker runs tasks in one) and their
spawned workers do not import the parent's main script."""

from __future__ import annotations

import multiprocessing as mp
import sys


def _in_daemon(q) -> None:
    from concurrent.futures import ProcessPoolExecutor

    from pipeline.profile import measured

    try:
        with measured(None, "test", "daemon"):
            with ProcessPoolExecutor(2, mp_context=mp.get_context("spawn")) as pool:
                q.put(("ok", sorted(pool.map(abs, [-1, -2, -3]))))
    except Exception as exc:       # what the parent asserts on
        q.put(("error", repr(exc)))


def test_a_task_in_a_daemonic_process_can_run_its_pool():
    q = mp.get_context("spawn").Queue()
    p = mp.get_context("spawn").Process(target=_in_daemon, args=(q,), daemon=True)
    p.start()
    got = q.get(timeout=120)
    p.join(30)
    assert got == ("ok", [1, 2, 3])


def test_main_script_is_hidden_only_inside_the_block():
    from pipeline.pools import task_pools

    main = sys.modules["__main__"]
    before = (getattr(main, "__file__", None), getattr(main, "__spec__", None))
    with task_pools():
        assert getattr(main, "__spec__", None) is None and not hasattr(main, "__file__")
        assert not mp.current_process()._config.get("daemon")
    assert (getattr(main, "__file__", None), getattr(main, "__spec__", None)) == before


def test_a_task_in_a_celery_prefork_process_can_run_its_pool():
    """Celery's prefork pool is billiard: its processes are daemonic and carry billiard's authentication key, which
    multiprocessing's spawn refuses to pickle unless the task's pools swap it (seen on the live Celery workers)."""
    import pytest

    billiard = pytest.importorskip("billiard")
    q = billiard.get_context("fork").Queue()
    p = billiard.get_context("fork").Process(target=_in_daemon, args=(q,), daemon=True)
    p.start()
    got = q.get(timeout=120)
    p.join(30)
    assert got == ("ok", [1, 2, 3])
