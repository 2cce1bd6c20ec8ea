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


def _lease(out_dir: Path, job_id: str, beat: int) -> None:
    write_json(out_dir / "lease.json", {"job_id": job_id, "generation": 1, "beat": beat, "host": "trainer-host",
                                        "pid": 4242, "released": False, "written_at": 0.0})


def test_metric_rows_are_matched_by_job_id_not_by_clocks(tmp_path):
    """The old job's rows carry later timestamps (its host's clock runs ahead) and are still not shown; the file is
    read from the byte offset where the previous poll stopped."""
    out = tmp_path / "main"
    out.mkdir()
    op, shown = _operator(out)
    with open(out / "metrics.jsonl", "w") as fh:
        fh.writelines(json.dumps({"step": s, "loss": 9.0, "time": 5e9, "job_id": "old"}) + "\n" for s in (1, 2))
        fh.write(json.dumps({"step": 3, "loss": 1.0, "time": 1.0, "job_id": "new"}) + "\n")
    op._stream_metrics(out, since=1e9, job_id="new")
    assert [(r["step"], r["job_id"]) for r in shown] == [(3, "new")]
    assert op._metrics_offset == (out / "metrics.jsonl").stat().st_size
    with open(out / "metrics.jsonl", "a") as fh:
        fh.write(json.dumps({"step": 4, "loss": 0.5, "time": 2.0, "job_id": "new"}) + "\n" + '{"step": 5')
    op._stream_metrics(out, since=1e9, job_id="new")
    assert [r["step"] for r in shown] == [3, 4]                   # the half-written row 5 waits for its newline


@pytest.mark.parametrize("beating", [True, False])
def test_the_trigger_keeps_the_heartbeat_counter_between_polls(tmp_path, monkeypatch, beating):
    """A job on another host: RUNNING while its counter moves (then SUCCEEDED), LOST when it stood still for the
    lease timeout of the triggerer's own clock."""
    import asyncio
    import threading

    import pipeline.train.jobs.lease as lease_mod
    from operators.triggers import TrainingJobTrigger

    monkeypatch.setattr(lease_mod, "LEASE_TIMEOUT_S", 1.5)        # 15 beats: a loaded machine still beats in time
    out = tmp_path / "main"
    out.mkdir()
    write_json(out / "launch.json", {"pid": 4242, "host": "trainer-host", "job_id": "J"})
    write_json(out / "status.json", {"state": "RUNNING", "step": 3, "job_id": "J"})
    _lease(out, "J", 0)
    stop = threading.Event()

    def job():
        beat = 0
        while not stop.wait(0.1):
            beat += 1
            _lease(out, "J", beat)
            if beat == 20:
                write_json(out / "status.json", {"state": "SUCCEEDED", "step": 9, "job_id": "J"})

    t = threading.Thread(target=job)
    if beating:
        t.start()

    async def first_event():
        trig = TrainingJobTrigger(str(out), pid=4242, poll_interval=0.05, job_id="J")
        assert trig.serialize()[1]["job_id"] == "J"
        async for ev in trig.run():
            return ev.payload

    try:
        t0 = time.monotonic()
        ev = asyncio.run(first_event())
        waited = time.monotonic() - t0
    finally:
        stop.set()
        if beating:
            t.join()
    if beating:
        assert (ev["state"], ev["step"], ev["job_id"]) == ("SUCCEEDED", 9, "J") and waited >= 1.9
    else:
        assert ev["state"] == "LOST" and "stood at 0 for" in ev["error"] and 1.5 <= waited < 8


def test_a_refused_second_trainer_does_not_fail_the_running_job(tmp_path):
    """Job A runs (its lease, its RUNNING row); a second trainer B is refused and writes nothing; the operator polling
    A still sees RUNNING, and a task that launched B is told why B never ran."""
    from pipeline.tasks.pretrain import job_state
    from pipeline.train.jobs.lease import Lease, StageBusy

    out = tmp_path / "main"
    out.mkdir()
    with Lease(out, job_id="A", heartbeat_s=0.1):
        write_json(out / "status.json", {"state": "RUNNING", "step": 5, "job_id": "A"})
        before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and p.name != "lease.json"}
        with pytest.raises(StageBusy):
            with Lease(out, job_id="B", heartbeat_s=0.1):
                pass
        assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and p.name != "lease.json"} == before
        op, _ = _operator(out)
        assert op.get_job_status({"out_dir": str(out), "job_id": "A"}, {}) == "RUNNING"
        write_json(out / "launch.json", {"pid": 999999999, "job_id": "B"})     # B's launcher is gone
        st = job_state(out, job_id="B")
        assert st["state"] == "LOST" and "held by job A" in st["error"] and st["step"] == 0
        assert job_state(out, job_id="A")["state"] == "RUNNING"


def test_the_form_caps_workers_at_the_deployment_limit_and_cannot_switch_the_memory_check_off(monkeypatch, tmp_path):
    from airflow.sdk import ParamsDict
    from airflow.sdk.exceptions import ParamValidationError

    from operators.params import pretrain_params
    from pipeline.configkit import ConfigError
    from pipeline.form import config_from_params

    deployment = tmp_path / "deployment.yaml"
    deployment.write_text("train:\n  max_workers: 4\n  device_memory_gb: 64.0\n", encoding="utf-8")
    monkeypatch.setenv("MINDLOOM_CONFIG", str(deployment))
    params = pretrain_params(["main"], retries=1)
    assert params["train_workers"].schema["maximum"] == 4 and "Allowed: 1 to 4." in params["train_workers"].description
    assert "train_device_memory_gb" not in params
    ParamsDict(params).update({"train_workers": 4})
    with pytest.raises(ParamValidationError):                 # what the UI and REST do with the schema
        ParamsDict(params).update({"train_workers": 5})
    with pytest.raises(ConfigError, match=r"^train\.workers: 5 is more than this deployment launches "
                                          r"\(train\.max_workers = 4\)$"):
        config_from_params({"train_workers": 5}, deployment)  # a conf that reached a task some other way
    cfg = config_from_params({"train_workers": 4, "train_device_memory_gb": 0}, deployment)
    assert (cfg.train.workers, cfg.train.device_memory_gb) == (4, 64.0)   # the conf cannot turn the check off


def test_every_form_param_is_checked_against_draft_7_and_still_refuses_a_bad_value(monkeypatch):
    """Airflow checks each Param's schema against its dialect's meta-schema every time it resolves the form (several
    times per task instance); draft 7's is the cheap one.  The bounds and types still refuse what they did."""
    from airflow.sdk.exceptions import ParamValidationError
    from jsonschema.validators import Draft7Validator, validator_for

    from operators.params import build_params, pretrain_params

    monkeypatch.setenv("MINDLOOM_TESTING_SWITCHES", "1")
    forms = {**build_params("corpus"), **pretrain_params(["main"], retries=1)}
    for name, p in forms.items():
        assert validator_for(p.schema) is Draft7Validator, name
        Draft7Validator.check_schema(p.schema)
        assert p.resolve() == p.value, name                                  # every default is valid
    with pytest.raises(ParamValidationError, match="less than the minimum of 1"):
        forms["docs_per_shard"].resolve(0)
    with pytest.raises(ParamValidationError, match="does not match"):
        forms["corpus_run"].resolve("my corpus/../x")
