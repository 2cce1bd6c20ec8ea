"""The Slurm backend against a real Slurm (two slurmd nodes on loopback, ``scripts/slurm_local.py``).

A two-stage job (warmup -> main with ``init: continue``) on 2 ranks, one per Slurm node, through the operator in its
own process (``tests/operator_try.py``, as an Airflow task process runs it): its losses equal the local backend's
(one-host msrun, same 2 ranks) at every step of both stages.  The job runs as an Ascend site's would: a
``slurm_setup`` line exports a variable, ``train.env`` passes another, ``train.python`` is a wrapper script that
records each rank's environment; the Airflow worker's own variables (``AIRFLOW__*``, a stray ``RANK_TABLE_FILE``)
reach no rank. The main stage's task process is SIGKILLed mid-stage;
the next try reconnects to the same Slurm job id and finishes. A task stopped with SIGTERM (Airflow's stop) runs
``on_kill``, which scancels the job. The same for ``mindloom train`` (#50): the CLI SIGKILLed mid-stage (its whole
process group) and run again follows the same Slurm job, which Slurm shows as the stage folder's only job.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import REPO, require

pytestmark = [pytest.mark.slow, pytest.mark.slurm]
SEQ = 32
TRAIN = """
seed: 7
data_root: {root}
train:
  preset: debug
  model_overrides: {{dim: 64, n_layers: 2, n_heads: 4, n_kv_heads: 2}}
  batch_size: 8
  lr: 3.0e-3
  min_lr: 3.0e-4
  steps: 6
  warmup_steps: 2
  workers: 2
  backend: {backend}
  nodes: {nodes}
  checkpoint_every: 2
  metrics_every: 1
  eval_tokens: 0
{slurm_extra}
  stages:
    - {{name: warmup, overrides: {{steps: 4, warmup_steps: 2}}}}
    - {{name: main, init: continue, overrides: {{steps: 10, warmup_steps: 1}}}}
"""


@pytest.fixture(scope="module")
def slurm_conf():
    sys.path.insert(0, str(REPO / "scripts"))
    import slurm_local

    have = all(shutil.which(t) or os.path.exists(f"/usr/sbin/{t}") for t in ("sbatch", "slurmctld", "slurmd"))
    require(have and os.geteuid() == 0, "Slurm (slurm-wlm, munge) is not installed or we are not root")
    root = Path(os.environ.get("MINDLOOM_SLURM_ROOT", "/tmp/mindloom-slurm"))
    was_up = slurm_local.running(root)
    conf = slurm_local.start(root)     # also scancels jobs whose folders are gone (a killed earlier test's)
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(conf)
    yield conf
    if not was_up:  # leave no daemons behind that this test started (a cluster found running stays)
        slurm_local.stop(root)
    if old is None:
        os.environ.pop("SLURM_CONF", None)
    else:
        os.environ["SLURM_CONF"] = old


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    pytest.importorskip("mindspore")
    sys.path.insert(0, str(REPO / "tests"))
    from bytes_data import BYTE_VOCAB, pack_bytes, stdlib_text, write_mindrecord

    d = tmp_path_factory.mktemp("slurm_corpus") / "mindrecord"
    write_mindrecord(pack_bytes(stdlib_text("argparse"), SEQ), str(d), shards=2)
    path = d.parent / "corpus.json"
    corpus = {"seq_len": SEQ, "vocab_size": BYTE_VOCAB, "mindrecord_dir": str(d)}
    path.write_text(json.dumps(corpus))
    return path


WRAPPER = """#!/bin/sh
env > "rank-env.$SLURM_PROCID.txt"
exec {python} "$@"
"""


def _config(root: Path, backend: str, nodes: int) -> Path:
    path = root / f"{backend}.yaml"
    extra = ""
    if backend == "slurm":              # what an Ascend site sets: a setup line, rank variables, its interpreter
        wrapper = root / "pywrap.sh"
        wrapper.write_text(WRAPPER.format(python=sys.executable))
        wrapper.chmod(0o755)
        extra = (f"  slurm_setup: ['export MINDLOOM_SETUP_MARK=setup-ran']\n"
                 f"  env: ['MINDLOOM_ENV_MARK=env-ran', 'HCCL_CONNECT_TIMEOUT=1800']\n"
                 f"  python: {wrapper}")
    path.write_text(TRAIN.format(root=root / "data", backend=backend, nodes=nodes, slurm_extra=extra))
    return path


def _losses(stage_dir: Path) -> dict[int, float]:
    rows = [json.loads(x) for x in (stage_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return {r["step"]: r["loss"] for r in rows}


def _env(cfg: Path) -> dict:
    """The task process's environment, with what an Airflow worker holds that no rank should see."""
    return {**os.environ, "MINDLOOM_CONFIG": str(cfg), "PYTHONPATH": str(REPO),
            "AIRFLOW_CONN_WAREHOUSE": "postgresql://airflow:secret@db/warehouse",
            "AIRFLOW__MINDLOOM_TEST__TOKEN": "secret", "RANK_TABLE_FILE": "/nonexistent/rank_table.json"}


def _try(tmp: Path, cfg: Path, run: str, stage: str, try_number: int, corpus: Path) -> subprocess.Popen:
    log = open(tmp / f"{run}.{stage}.try{try_number}.log", "wb")  # noqa: SIM115 - the child holds it
    return subprocess.Popen([sys.executable, str(REPO / "tests" / "operator_try.py"),
                             str(tmp / f"{run}.{stage}.state"), run, stage, str(try_number), str(corpus)],
                            stdout=log, stderr=subprocess.STDOUT,
                            env=_env(cfg), cwd=str(REPO))


def _finish(p: subprocess.Popen, tmp: Path, run: str, stage: str, try_number: int, timeout: float = 600) -> str:
    try:
        rc = p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        text = (tmp / f"{run}.{stage}.try{try_number}.log").read_text(errors="replace")
        raise AssertionError(f"{run}/{stage} try {try_number} still running after {timeout:.0f} s; Slurm's queue:\n"
                             f"{_queue()}\nits log ends:\n{text[-3000:]}") from None
    text = (tmp / f"{run}.{stage}.try{try_number}.log").read_text(errors="replace")
    assert rc == 0, text[-4000:]
    return text


def _wait_for(pred, timeout: float, what: str):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if got := pred():
            return got
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}; Slurm's queue:\n{_queue()}")


def _queue() -> str:
    import slurm_local

    return slurm_local.queue(Path(os.environ["SLURM_CONF"]).parent) if os.environ.get("SLURM_CONF") else "(no Slurm)"


def _running_slurm_job(stage_dir: Path) -> str | None:
    """The Slurm job id once the stage's trainer reports RUNNING under the launch's job id."""
    try:
        launch = json.loads((stage_dir / "launch.json").read_text())
        status = json.loads((stage_dir / "status.json").read_text())
    except (OSError, ValueError):
        return None
    if launch.get("slurm_job_id") and status.get("state") == "RUNNING" and status.get("job_id") == launch["job_id"]:
        return launch["slurm_job_id"]
    return None


@pytest.fixture(scope="module")
def local_run(corpus, tmp_path_factory):
    """The same two stages on the local backend (one-host msrun, 2 ranks), through the same operator."""
    tmp = tmp_path_factory.mktemp("local_backend")
    cfg = _config(tmp, "local", 1)
    for stage in ("warmup", "main"):
        _finish(_try(tmp, cfg, "ref", stage, 1, corpus), tmp, "ref", stage, 1)
    return tmp / "data" / "train" / "ref"


def test_two_stages_on_two_slurm_nodes_equal_local_and_a_killed_task_reattaches(slurm_conf, corpus, local_run,
                                                                                   tmp_path):
    from pipeline.train.jobs import slurm

    cfg = _config(tmp_path, "slurm", 2)
    stages = tmp_path / "data" / "train" / "run1"
    log = _finish(_try(tmp_path, cfg, "run1", "warmup", 1, corpus), tmp_path, "run1", "warmup", 1)
    assert "backend slurm" in log
    warm_sid = json.loads((stages / "warmup" / "launch.json").read_text())["slurm_job_id"]
    nodes = subprocess.run(["scontrol", "-o", "show", "job", warm_sid], capture_output=True, text=True).stdout
    assert " NodeList=node[1-2] " in nodes and " NumNodes=2 " in nodes, nodes
    for rank in (0, 1):                 # every rank went through the wrapper, with the setup's and train.env's
        env = dict(line.split("=", 1) for line in (stages / "warmup" / f"rank-env.{rank}.txt").read_text()
                   .splitlines() if "=" in line)
        assert env["MINDLOOM_SETUP_MARK"] == "setup-ran" and env["MINDLOOM_ENV_MARK"] == "env-ran", sorted(env)
        assert env["HCCL_CONNECT_TIMEOUT"] == "1800" and env["SLURM_PROCID"] == str(rank)
        assert not [k for k in env if k.startswith("AIRFLOW") or k == "RANK_TABLE_FILE"], sorted(env)

    first = _try(tmp_path, cfg, "run1", "main", 1, corpus)
    sid = _wait_for(lambda: _running_slurm_job(stages / "main"), 300, "the main stage to run on Slurm")
    first.kill()  # the Airflow task process dies (worker lost); the Slurm job does not
    first.wait()
    assert slurm.is_active(slurm.state(sid)), slurm.state(sid)
    assert json.loads((stages / "main" / "status.json").read_text())["state"] == "RUNNING"
    log = _finish(_try(tmp_path, cfg, "run1", "main", 2, corpus), tmp_path, "run1", "main", 2)
    assert "reconnecting to the running job of stage main" in log, log[-3000:]
    assert json.loads((stages / "main" / "launch.json").read_text())["slurm_job_id"] == sid
    assert sorted(p.name for p in (stages / "main").glob("slurm-*.log")) == [f"slurm-{sid}.log"]  # one submission
    assert json.loads((stages / "main" / "status.json").read_text())["state"] == "SUCCEEDED"

    for stage, n in (("warmup", 4), ("main", 10)):
        want, got = _losses(local_run / stage), _losses(stages / stage)
        assert sorted(got) == sorted(want) == list(range(1, n + 1)), (stage, got, want)
        diff = np.abs(np.array([got[s] - want[s] for s in want])).max()
        assert diff < 1e-5, (stage, diff, got, want)


def test_stopping_the_task_scancels_its_slurm_job(slurm_conf, corpus, tmp_path):
    from pipeline.train.jobs import slurm

    cfg = _config(tmp_path, "slurm", 2)
    stage = tmp_path / "data" / "train" / "run2" / "warmup"
    p = _try(tmp_path, cfg, "run2", "warmup", 1, corpus)
    sid = _wait_for(lambda: _running_slurm_job(stage), 300, "the stage to run on Slurm")
    p.send_signal(signal.SIGTERM)  # Airflow stops a task this way; its runner calls on_kill
    assert p.wait(timeout=60) != 0
    text = (tmp_path / "run2.warmup.try1.log").read_text(errors="replace")
    assert f"scancel {sid}" in text, text[-3000:]
    _wait_for(lambda: not slurm.is_active(slurm.state(sid)), 60, f"Slurm job {sid} to end")
    assert slurm.state(sid).startswith("CANCELLED"), slurm.state(sid)
    assert not (stage / "summary.json").exists()


def _cli_train(root: Path, steps: int) -> str:
    """TRAIN on both nodes as one stage of ``steps`` steps, checkpointed every 50 (``mindloom train``'s test)."""
    import yaml

    cfg = yaml.safe_load(TRAIN.format(root=root, backend="slurm", nodes=2, slurm_extra=""))
    cfg["train"].update(steps=steps, checkpoint_every=50)
    del cfg["train"]["stages"]
    return yaml.safe_dump(cfg)


def _metric_steps(stage_dir: Path) -> list[int]:
    try:
        return sorted(_losses(stage_dir))
    except (OSError, ValueError):
        return []


def _slurm_jobs_in(folder: Path) -> list[str]:
    """The ids of every job Slurm knows (queued, running, or ended within ``MinJobAge``) that runs in ``folder``."""
    out = subprocess.run(["scontrol", "-o", "show", "job"], capture_output=True, text=True).stdout
    return sorted(line.split()[0].removeprefix("JobId=") for line in out.splitlines()
                  if f" WorkDir={folder} " in f" {line} ")


def test_a_killed_mindloom_train_reruns_onto_the_same_slurm_job(slurm_conf, corpus, tmp_path):
    """#50: ``mindloom train`` SIGKILLed (its process group, not the Slurm job) once the job runs and has logged a
    step, then run again: it reconnects to the same Slurm job (no second sbatch: Slurm knows one job in the stage
    folder, which holds one ``slurm-<id>.log``), follows it to the end and prints the stage's summary."""
    from pipeline.train.jobs import slurm

    # ~0.2 s a step here; the rerun reattached 7 steps after the kill on an idle machine, 39 at load 6 on 2 cores
    steps = 200
    cfg = tmp_path / "cli.yaml"
    cfg.write_text(_cli_train(tmp_path / "data", steps))
    stage = tmp_path / "data" / "train" / "cli1" / "main"
    argv = [sys.executable, "-m", "pipeline.cli", "train", "--config", str(cfg), "--corpus", str(corpus),
            "--run-id", "cli1", "--stage", "main"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with open(tmp_path / "first.log", "wb") as log:
        first = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(REPO),
                                 start_new_session=True)          # its own process group, as a shell job's
    try:
        sid = _wait_for(lambda: _metric_steps(stage) and _running_slurm_job(stage), 300,
                        "the stage to run on Slurm and log a step")
    finally:
        os.killpg(first.pid, signal.SIGKILL)                      # the CLI dies; the Slurm job does not
        first.wait()
    killed_at = _metric_steps(stage)[-1]
    assert slurm.is_active(slurm.state(sid)) and killed_at < steps, ("the job ended before the rerun could start",
                                                                      slurm.state(sid), killed_at)
    assert f"Slurm job {sid}" in (tmp_path / "first.log").read_text(errors="replace")

    with open(tmp_path / "second.out", "wb") as out, open(tmp_path / "second.err", "wb") as err:
        second = subprocess.Popen(argv, stdout=out, stderr=err, env=env, cwd=str(REPO), start_new_session=True)
    try:
        _wait_for(lambda: "reconnecting to" in (tmp_path / "second.err").read_text(errors="replace")
                  or second.poll() is not None, 120, "the rerun to reattach")
        attached_at = (_metric_steps(stage) or [0])[-1]
        rc = second.wait(timeout=600)
    finally:
        if second.poll() is None:
            os.killpg(second.pid, signal.SIGKILL)
    stderr = (tmp_path / "second.err").read_text(errors="replace")
    assert rc == 0, stderr[-4000:]
    assert f"reconnecting to Slurm job {sid} of stage main" in stderr, stderr[-3000:]
    result = json.loads((tmp_path / "second.out").read_text())
    assert result["state"] == "SUCCEEDED" and result["steps"] == steps, result
    assert json.loads((stage / "launch.json").read_text())["slurm_job_id"] == sid
    assert _slurm_jobs_in(stage) == [sid]                              # Slurm's own record: one submission
    assert sorted(p.name for p in stage.glob("slurm-*.log")) == [f"slurm-{sid}.log"]
    assert json.loads((stage / "status.json").read_text())["state"] == "SUCCEEDED"
    assert _metric_steps(stage) == list(range(1, steps + 1))          # one job's steps, none run twice
    print(f"Slurm job {sid}: CLI killed after step {killed_at} of {steps}; the rerun reattached at step "
          f"{attached_at} and followed it to the end")
