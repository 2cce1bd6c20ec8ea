"""TrainingStageOperator's decisions from the stage folder alone: what a try announces, which metric rows it shows,
and what a Clear of a succeeded stage does.  No training: the folder is written by hand, as the trainer would."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from pipeline.io import write_json


class Store:
    def __init__(self, **kv):
        self.kv = dict(kv)

    def get(self, key, default=None):
        return self.kv.get(key, default)

    def set(self, key, value, **_):
        self.kv[key] = value

    def delete(self, key):
        self.kv.pop(key, None)


class TI:
    try_number = 3


def _operator(out_dir: Path):
    from operators.training import TrainingStageOperator

    op = TrainingStageOperator(task_id="train_main", corpus={}, stage="main")
    op._out_dir = lambda context: out_dir
    shown: list[dict] = []
    op._log_metric = shown.append
    return op, shown


def _stage(out_dir: Path, ckpt_steps: list[int], stopped_at: int, launched_by: int, rows_until: int,
           launch_time: float) -> None:
    (out_dir / "checkpoints").mkdir(parents=True)
    for s in ckpt_steps:
        p = out_dir / "checkpoints" / f"step_{s:08d}.ckpt"
        p.write_bytes(b"x")
        (out_dir / "checkpoints" / f"{p.name}.sha256").write_text(f"00  {p.name}\n")
        write_json(out_dir / "checkpoints" / f"step_{s:08d}.commit.json", {"step": s, "ranks": 1})  # committed
    write_json(out_dir / "status.json", {"state": "FAILED", "step": stopped_at, "pid": 999999999})
    write_json(out_dir / "launch.json", {"pid": 999999999, "try_number": launched_by, "time": launch_time})
    with open(out_dir / "metrics.jsonl", "w") as fh:
        for s in range(1, rows_until + 1):
            fh.write(json.dumps({"step": s, "loss": 9.0, "time": launch_time + s}) + "\n")


def test_a_resumed_try_says_so_first(tmp_path, capsys):
    out = tmp_path / "main"
    _stage(out, [4, 8], stopped_at=9, launched_by=2, rows_until=9, launch_time=100.0)
    op, _ = _operator(out)
    op._prepare_try({"task_state_store": Store(training_job={"out_dir": str(out), "pid": 999999999}), "ti": TI()})
    assert "resumed from checkpoint step 8 (try 2 stopped at step 9)" in capsys.readouterr().out
    assert op._resume_step == 8


def test_the_log_shows_only_rows_the_current_job_wrote_past_its_resume(tmp_path):
    out = tmp_path / "main"
    _stage(out, [8], stopped_at=9, launched_by=1, rows_until=9, launch_time=100.0)
    op, shown = _operator(out)
    op._resume_step = 8
    new_launch = time.time()
    op._stream_metrics(out, new_launch)       # the old try's rows 1..9 are not this job's
    assert shown == []
    # The trainer resumes: it drops the rows past step 8 (a rewrite, new inode) and appends its own.
    rows = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()][:8]
    rows += [{"step": s, "loss": 1.0, "time": new_launch + s} for s in (9, 10)]
    tmp = out / "metrics.jsonl.tmp"
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tmp.replace(out / "metrics.jsonl")
    op._stream_metrics(out, new_launch)
    assert [(r["step"], r["loss"]) for r in shown] == [(9, 1.0), (10, 1.0)]
    with open(out / "metrics.jsonl", "a") as fh:
        fh.write(json.dumps({"step": 11, "loss": 0.5, "time": new_launch + 11}) + "\n")
    op._stream_metrics(out, new_launch)
    assert [r["step"] for r in shown] == [9, 10, 11]


def test_clearing_a_succeeded_stage_trains_it_again_and_keeps_the_old_folder(tmp_path, capsys):
    out = tmp_path / "main"
    _stage(out, [12], stopped_at=12, launched_by=1, rows_until=12, launch_time=100.0)
    write_json(out / "completed.json", {"try_number": 1})
    store = Store(training_job={"out_dir": str(out), "pid": 1})
    op, _ = _operator(out)
    op._prepare_try({"task_state_store": store, "ti": TI()})
    assert not out.exists() and (tmp_path / "main.cleared-1" / "completed.json").exists()
    assert store.get("training_job") is None and op._resume_step == 0
    assert "had succeeded and was cleared" in capsys.readouterr().out


def test_a_worker_crash_after_the_job_succeeded_returns_its_result(tmp_path):
    """No completed.json (the task never finished): the stage folder stays, so the mixin returns the summary."""
    out = tmp_path / "main"
    _stage(out, [12], stopped_at=12, launched_by=1, rows_until=12, launch_time=100.0)
    write_json(out / "status.json", {"state": "SUCCEEDED", "step": 12})
    op, _ = _operator(out)
    op._prepare_try({"task_state_store": Store(training_job={"out_dir": str(out)}), "ti": TI()})
    assert out.exists() and not (tmp_path / "main.cleared-1").exists()


@pytest.mark.parametrize("enabled", [False, True])
def test_testing_switches_only_when_the_deployment_enables_them(monkeypatch, enabled):
    from operators.params import fail_step_template, pretrain_params

    monkeypatch.setenv("MINDLOOM_TESTING_SWITCHES", "1" if enabled else "")
    params = pretrain_params(["warmup", "main"], retries=1)
    assert ("fail_at_step" in params) == enabled and ("fail_for_good" in params) == enabled
    assert (fail_step_template("main") != "") == enabled
    assert "config_path" not in params and "corpus_manifest" not in params
    assert params["corpus_run"].schema["type"] == ["null", "string"]      # optional: not marked required
