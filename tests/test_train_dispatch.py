"""CPU jobs dispatch MindSpore's launches on the calling thread (``MS_DEV_HOST_BLOCKING_RUN=1``); other devices keep
MindSpore's dispatch thread; a value the user exported wins. ``benchmarks/bench_parallel.py`` measures the
difference (rows ``parallel.inline_vs_threaded_dispatch``, ``parallel.tp2_inline_vs_threaded_dispatch``); the
two-rank msrun test in ``test_train_trainer.py`` checks that a launched job reports ``host_dispatch: inline``."""

from __future__ import annotations

import os

import pytest

from pipeline.train.job import TrainJob
from pipeline.train.jobs.cpu_dispatch import CPU_DISPATCH_ENV, cpu_dispatch_inline

KEY = "MS_DEV_HOST_BLOCKING_RUN"


def test_cpu_dispatch_is_inline_unless_the_user_chose(monkeypatch):
    assert CPU_DISPATCH_ENV == {KEY: "1"}
    monkeypatch.delenv(KEY, raising=False)
    cpu_dispatch_inline()
    assert os.environ[KEY] == "1"
    monkeypatch.setenv(KEY, "0")  # the user's choice (e.g. to compare): kept
    cpu_dispatch_inline()
    assert os.environ[KEY] == "0"


@pytest.mark.parametrize(("device", "want"), [("CPU", "1"), ("Ascend", None)])
def test_the_trainer_sets_it_for_cpu_jobs_only(monkeypatch, device, want):
    pytest.importorskip("mindspore")
    from pipeline.train import trainer

    calls = []
    monkeypatch.setattr(trainer.ms, "set_context", lambda **kw: calls.append(kw))
    monkeypatch.setattr(trainer.ms, "set_device", lambda d: calls.append(d))
    monkeypatch.setattr(trainer, "_THREADS_SET", True)  # threads_num may be set once per process: not here
    monkeypatch.delenv(KEY, raising=False)
    trainer._setup_context(TrainJob(stage="s", data_dir="d", out_dir="o", device=device))
    assert os.environ.get(KEY) == want and device in calls
