"""Pools inside a task: one forkserver pool per settings, shared by the task's calls and gone when the task ends."""

from __future__ import annotations

import os

import pytest

from pipeline import pools
from pipeline.tasks import batches


def test_a_task_shares_one_pool_per_settings_and_shuts_it_down_at_its_end():
    with pools.task_pools():
        first, owned = pools.task_executor(2, "pipeline.io")
        again, _ = pools.task_executor(2, "pipeline.io")
        other, _ = pools.task_executor(1, "pipeline.io")
        assert not owned and again is first and other is not first
        pids = {first.submit(os.getpid).result() for _ in range(4)}
        assert os.getpid() not in pids and 1 <= len(pids) <= 2
    assert first._shutdown_thread and other._shutdown_thread       # no idle worker outlives the task
    outside, owned = pools.task_executor(2, "pipeline.io")
    assert owned and outside is not first
    outside.shutdown()


def test_ordered_map_reuses_the_task_pool_and_keeps_input_order():
    with pools.task_pools():
        out1 = list(pools.ordered_map(abs, [-3, 1, -2], 2, "pipeline.io", None, ()))
        pool, _ = pools.task_executor(2, "pipeline.io")
        out2 = list(pools.ordered_map(abs, range(-5, 0), 2, "pipeline.io", None, ()))
        assert pools.task_executor(2, "pipeline.io")[0] is pool
    assert out1 == [3, 1, 2] and out2 == [5, 4, 3, 2, 1]


def test_an_abandoned_map_drops_its_shared_pool():
    with pools.task_pools():
        gen = pools.ordered_map(abs, range(-20, 0), 2, "pipeline.io", None, ())
        assert next(gen) == 20
        pool, _ = pools.task_executor(2, "pipeline.io")
        gen.close()                                             # consumer stops early: no work is left behind
        assert pools.task_executor(2, "pipeline.io")[0] is not pool


def _loaded_here() -> tuple[int, int, bool]:
    from pipeline.dedup.minhash import kernels as minhash_kernels
    from pipeline.ingest import langid
    from pipeline.quality.filters import kernels as quality_kernels

    return (len(quality_kernels.word_spans.overloads), len(minhash_kernels.signature_batch.overloads),
            bool(langid._DETECTOR))


def test_pool_workers_start_with_the_compiled_kernels_and_language_model_loaded():
    """pipeline.warm runs in the forkserver before it forks: a worker's first shard does not load them again
    (about 1 CPU-s per worker for the quality kernels alone, paid by every task's pool before)."""
    with pools.task_pools():
        pool, _ = pools.task_executor(2, "pipeline.io")
        assert pool.submit(_loaded_here).result() == (1, 1, True)


def test_a_batch_of_one_shard_runs_without_a_pool(tmp_path, monkeypatch):
    handles = batches.plan_batches(tmp_path, 3, 2)
    batches.split_plan([{"shard": f"s{k}", "bytes": k} for k in range(3)], handles)
    monkeypatch.setattr(batches, "task_executor", lambda *a, **k: pytest.fail("a pool for one shard"))
    seen = []
    out = batches.run_batch(lambda spec: seen.append(spec["shard"]), handles[0], workers=4)
    assert seen == ["s0"] and out["shards"] == 1
    seen.clear()
    batches.run_batch(lambda spec: seen.append(spec["shard"]), handles[1], workers=1)    # one worker: in process
    assert seen == ["s1", "s2"]


def test_a_batch_with_less_input_than_the_pool_threshold_runs_in_this_process(tmp_path, monkeypatch):
    """A pool costs ~0.3 CPU-s a task to start and stop: cheap stages keep small batches in the task's process."""
    handles = batches.plan_batches(tmp_path, 4, 1)
    batches.split_plan([{"shard": f"s{k}", "bytes": 10 << 20} for k in range(4)], handles)
    started = []

    class Pool:
        def map(self, fn, specs):
            return [fn(spec) for spec in specs]

    monkeypatch.setattr(batches, "task_executor", lambda n, mod: started.append(n) or (Pool(), False))
    seen = []
    out = batches.run_batch(lambda spec: seen.append(spec["shard"]), handles[0], workers=2, min_pool_bytes=64 << 20)
    assert seen == ["s0", "s1", "s2", "s3"] and out["shards"] == 4 and out["input_bytes"] == 40 << 20
    assert started == []                                   # 40 MB under a 64 MB threshold: no pool
    batches.run_batch(lambda spec: None, handles[0], workers=2, min_pool_bytes=32 << 20)
    assert started == [2]                                  # over it: the task's pool of 2


def _shared_pool_in_daemon(q) -> None:
    import faulthandler

    from pipeline.profile import measured

    faulthandler.dump_traceback_later(100, exit=True)     # a hang shows where, in the test's captured stderr
    try:
        with measured(None, "test", "daemon"):
            pool, _ = pools.task_executor(2, "pipeline.io")
            q.put(("ok", sorted(pool.map(abs, [-1, -2, -3]))))
    except Exception as exc:       # what the parent asserts on
        q.put(("error", repr(exc)))


def test_the_shared_forkserver_pool_runs_in_a_celery_prefork_process():
    """Batch tasks now use the task's forkserver pool (not spawn): it must start where Celery runs tasks too."""
    billiard = pytest.importorskip("billiard")
    q = billiard.get_context("fork").Queue()
    p = billiard.get_context("fork").Process(target=_shared_pool_in_daemon, args=(q,), daemon=True)
    p.start()
    got = q.get(timeout=120)
    p.join(30)
    assert got == ("ok", [1, 2, 3])


def test_a_child_forked_while_a_parent_thread_holds_the_forkserver_lock_starts_its_own_pool():
    """The last CI on record hung here: a task process made by ``fork`` from a process with other threads inherits
    multiprocessing's forkserver handle, lock included.  Held by another thread at the fork, that lock is never
    released in the child, and its first pool waited forever."""
    import multiprocessing
    import threading
    from multiprocessing import forkserver

    parent_pool, _ = pools.task_executor(1, "pipeline.io")     # this process has a forkserver of its own
    assert parent_pool.submit(abs, -1).result() == 1
    held, release = threading.Event(), threading.Event()

    def hold():
        with forkserver._forkserver._lock:
            held.set()
            release.wait(60)

    t = threading.Thread(target=hold)
    t.start()
    try:
        held.wait(10)
        q = multiprocessing.get_context("fork").Queue()
        p = multiprocessing.get_context("fork").Process(target=_shared_pool_in_daemon, args=(q,), daemon=True)
        p.start()
        got = q.get(timeout=90)
        p.join(30)
    finally:
        release.set()
        t.join()
        parent_pool.shutdown()
    assert got == ("ok", [1, 2, 3])


def test_the_profile_sampler_finds_the_same_descendants_as_psutil():
    """measured() samples the process tree 10 times a second: from /proc/<pid>/task/*/children, not a scan of every
    process on the machine (psutil), with the same result."""
    import psutil

    from pipeline.profile import _descendants

    with pools.task_pools():
        pool, _ = pools.task_executor(2, "pipeline.io")
        assert sorted(pool.map(abs, [-1, -2, -3])) == [1, 2, 3]
        me = psutil.Process()
        ours = sorted(p.pid for p in _descendants(me))
        assert ours == sorted(p.pid for p in me.children(recursive=True)) and len(ours) >= 3   # server + 2 workers


def test_a_task_keeps_at_most_two_idle_shared_pools_whatever_its_shard_count():
    """Pools whose settings differ per shard used to live until the task ended: in the 1 GB bench-scale run a
    quality batch of 29 shards held 29 pools (58 workers, a 9.9 GB process tree).  The least recently used idle
    pool now goes when a third is needed, and a pool in use is never shut down under its map."""
    import psutil

    with pools.task_pools():
        for k in range(6):        # six settings, one after the other (a batch task's shards)
            assert list(pools.ordered_map(abs, [-k, -1], 2, "pipeline.io", _set_state, (k,))) == [k, 1]
            assert len(pools._SCOPES[-1]) <= pools.MAX_SHARED_POOLS
        workers = [p for p in psutil.Process().children(recursive=True) if _live_worker(p)]
        assert len(workers) <= 2 * pools.MAX_SHARED_POOLS, workers
        outer = pools.ordered_map(abs, range(-6, 0), 1, "pipeline.io", _set_state, ("outer",))
        assert next(outer) == 6                        # in use ...
        for k in range(3):                             # ... while three other settings come and go
            assert list(pools.ordered_map(abs, [-1], 1, "pipeline.io", _set_state, (f"inner{k}",))) == [1]
        assert list(outer) == [5, 4, 3, 2, 1]


def _live_worker(proc) -> bool:
    """A pool worker still running (an evicted pool's worker that has exited but is not yet reaped is not)."""
    import psutil

    try:
        return proc.status() != psutil.STATUS_ZOMBIE and "forkserver" not in " ".join(proc.cmdline())
    except (psutil.ZombieProcess, psutil.NoSuchProcess):
        return False


_STATE: list = []


def _set_state(value) -> None:
    _STATE[:] = [value]


def test_a_process_that_runs_task_after_task_keeps_a_steps_pools_for_its_next_task(monkeypatch):
    """dags test and the CLI run a step's 64 tasks one after another in one process: the second task reuses the
    first one's workers; a task of another step, and a failed task, leave none behind."""
    monkeypatch.setattr(pools, "_TASKS_RUN", [0])
    with pools.task_pools(step="ingest.ingest_shard"):        # the process's first task: keeps nothing
        first, _ = pools.task_executor(2, "pipeline.io")
        assert first.submit(abs, -1).result() == 1
    assert first._shutdown_thread and pools._KEPT["pools"] == {}
    with pools.task_pools(step="ingest.ingest_shard"):
        second, _ = pools.task_executor(2, "pipeline.io")
        workers = set(second.map(_pid_after, [0.05] * 4))
    assert not second._shutdown_thread and pools._KEPT["step"] == "ingest.ingest_shard"
    with pools.task_pools(step="ingest.ingest_shard"):        # the next task of the step: the same workers
        again, owned = pools.task_executor(2, "pipeline.io")
        assert again is second and not owned
        assert set(again.map(_pid_after, [0.05] * 4)) <= workers
    with pools.task_pools(step="clean.partitions"):           # another step: shut down before it runs
        assert second._shutdown_thread and pools._KEPT["pools"] == {}
        third, _ = pools.task_executor(2, "pipeline.io")
    with pytest.raises(RuntimeError):
        with pools.task_pools(step="clean.partitions"):
            assert pools.task_executor(2, "pipeline.io")[0] is third
            raise RuntimeError("the task failed")
    assert third._shutdown_thread and pools._KEPT == {"step": None, "pools": {}}


def _pid_after(seconds: float) -> int:
    import time

    time.sleep(seconds)
    return os.getpid()


def test_a_forked_task_process_neither_owns_nor_keeps_its_parents_pools(monkeypatch):
    """LocalExecutor and Celery fork a process per task that ends with os._exit: it must keep no pool."""
    monkeypatch.setattr(pools, "_TASKS_RUN", [0])
    with pools.task_pools(step="a"):
        pass
    with pools.task_pools(step="a"):
        kept, _ = pools.task_executor(1, "pipeline.io")
        assert kept.submit(abs, -1).result() == 1
    assert pools._KEPT["step"] == "a"
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                                  # the child: nothing kept, no task run
        os.write(w, b"%d %d" % (len(pools._KEPT["pools"]), pools._TASKS_RUN[0]))
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(r, 16) == b"0 0"
    pools.shutdown_kept()
    assert kept._shutdown_thread and pools._KEPT == {"step": None, "pools": {}}


def test_a_steps_cache_lasts_until_a_task_of_another_step_starts(monkeypatch):
    """The sink scatter keeps the held-out index for the step's next task (it runs no pool); the writer tasks
    after it do not carry it, nor does a failed task's successor."""
    from pipeline.sink import heldout_overlap

    monkeypatch.setattr(pools, "_TASKS_RUN", [0])
    cache = heldout_overlap._LOADED
    assert cache in pools._STEP_CACHES
    with pools.task_pools(step="sink.scatter"):               # the process's first task keeps nothing
        cache.append("index")
    with pools.task_pools(step="sink.scatter"):
        assert cache == []
        cache.append("index")
    assert pools._KEPT["step"] == "sink.scatter"
    with pools.task_pools(step="sink.scatter"):               # the step's next task still has it
        assert cache == ["index"]
    with pools.task_pools(step="sink.write_files"):           # another step: dropped before it runs
        assert cache == []
        cache.append("other")
    with pytest.raises(RuntimeError):
        with pools.task_pools(step="sink.write_files"):
            raise RuntimeError("the task failed")
    with pools.task_pools(step="sink.write_files"):
        assert cache == []
    pools.shutdown_kept()
