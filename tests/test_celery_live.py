"""Airflow on CeleryExecutor, Postgres and Redis on loopback: the corpus and the Asset-triggered training, end to end.

One deployment for the module (``celery_services.CeleryStack``): ``corpus_build`` triggered over REST, then the
``pretrain`` run its Asset event starts, both to success, with every task instance on the worker its queue names
(data stages on ``data@mindloom``, ``train_*`` on ``train@mindloom``).  Then the train worker is restarted on a
copy of the config with ``airflow.train_deferrable: true`` (workers parse the DAG file for each task, so the setting
takes effect there) and a hand-triggered ``pretrain`` must see its stages deferred to the triggerer and still succeed.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import psutil
import pytest
import yaml
from airflow_services import q
from celery_services import WORKERS, CeleryStack, missing_services
from conftest import LONG_FIXTURE, require, tiny_config

pytestmark = [pytest.mark.slow, pytest.mark.live, pytest.mark.celery, LONG_FIXTURE]

DATA_NODE, TRAIN_NODE = WORKERS["worker-data"][1], WORKERS["worker-train"][1]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    missing = missing_services()
    require(missing is None, f"Celery live test skipped: {missing}")
    tmp = tmp_path_factory.mktemp("celery")
    # A dead task supervisor is noticed after 20 s instead of 300 (the retry then reconnects to the job).
    st = CeleryStack(tmp / "airflow_home", tiny_config(tmp),
                     {"AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "20"})
    pids: set[int] = set()
    try:
        st.start()
        for dag_id in ("corpus_build", "pretrain"):
            st.airflow.wait_for_dag(dag_id)
        yield st
    finally:
        pids = st.pids()
        st.stop()
    assert not _alive(pids), f"processes left behind: {_alive(pids)}"
    assert not st.postgres.root.exists() and not st.redis.root.exists()


def _alive(pids: set[int]) -> list[str]:
    out = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            if proc.status() != psutil.STATUS_ZOMBIE:
                out.append(f"{pid} {' '.join(proc.cmdline())}")
        except psutil.NoSuchProcess:
            pass
    return out


def test_every_listening_socket_is_on_loopback(stack):
    """Postgres, Redis, the api-server and the scheduler's health check; the log servers are off (skip-serve-logs)."""
    sockets = stack.listening()
    ports = {port for _, port, _ in sockets}
    assert {stack.postgres.port, stack.redis.port, stack.airflow.port} <= ports, sockets
    assert all(ip == "127.0.0.1" for ip, _, _ in sockets), sockets


def task_instances(dep, dag_id: str, run_id: str) -> list[dict]:
    r = dep.api("GET", f"/dags/{dag_id}/dagRuns/{q(run_id)}/taskInstances", params={"limit": 1000})
    r.raise_for_status()
    return r.json()["task_instances"]


def assert_routed(tis: list[dict]) -> int:
    """Every task instance that ran did so on the worker of its queue; returns how many ran on the train worker."""
    wrong = []
    for ti in tis:
        if ti["state"] == "skipped":
            continue
        want = ("train", TRAIN_NODE) if ti["task_id"].startswith("train_") else ("data", DATA_NODE)
        if (ti["queue"], ti["hostname"]) != want:
            wrong.append(f"{ti['task_id']}[{ti['map_index']}] state={ti['state']} queue={ti['queue']} "
                         f"hostname={ti['hostname']} (want {want})")
    assert not wrong, "tasks not on their queue's worker:\n" + "\n".join(wrong)
    return sum(ti["hostname"] == TRAIN_NODE for ti in tis)


def wait_asset_run(dep, timeout: float = 240) -> str:
    deadline = time.time() + timeout
    while time.time() < deadline:
        runs = dep.api("GET", "/dags/pretrain/dagRuns").json()["dag_runs"]
        run = next((r["dag_run_id"] for r in runs if r["run_type"] == "asset_triggered"), None)
        if run:
            return run
        time.sleep(3)
    raise AssertionError(f"pretrain was not started by the corpus publish\n{dep.logs_tail()}")


@pytest.fixture(scope="module")
def published(stack) -> dict:
    """``corpus_build`` run over REST and the ``pretrain`` run its Asset event starts, both finished: what every
    test after the first needs (a published corpus, a quiet train worker), whichever of them runs first or alone.
    A task that fails on the way fails the fixture at once with that task's log (``wait_run``)."""
    dep = stack.airflow
    assert dep.api("PATCH", "/dags/corpus_build", json={"is_paused": False}).status_code == 200
    r = dep.api("POST", "/dags/corpus_build/dagRuns",
                json={"dag_run_id": "celery_build", "logical_date": None, "conf": {"run_name": "celery"}})
    assert r.status_code == 200, r.text
    assert dep.wait_run("corpus_build", "celery_build", timeout=900)["state"] == "success", dep.logs_tail()
    run = wait_asset_run(dep)
    assert dep.wait_run("pretrain", run, timeout=900)["state"] == "success", dep.logs_tail()
    return {"corpus_run": "celery_build", "asset_run": run}


def test_corpus_then_asset_triggered_pretrain_on_celery_workers(stack, published):
    dep = stack.airflow
    corpus_tis = task_instances(dep, "corpus_build", published["corpus_run"])
    assert assert_routed(corpus_tis) == 0 and len(corpus_tis) > 5

    run = published["asset_run"]
    tis = task_instances(dep, "pretrain", run)
    stages = [ti for ti in tis if ti["task_id"].startswith("train_")]
    assert stages and assert_routed(tis) == len(stages)
    assert all(ti["state"] == "success" for ti in tis), [(t["task_id"], t["state"]) for t in tis]


def _stage_dir(stack, run_id: str):
    from pipeline.config import load_config
    from pipeline.io import safe_run_id

    cfg = load_config(stack.airflow.env["MINDLOOM_CONFIG"])
    return __import__("pathlib").Path(cfg.data_root) / "train" / safe_run_id(run_id) / "main"


def _wait_training(dep, run_id: str, stage, min_step: int, timeout: float = 300) -> dict:
    """The stage's job state once it runs past ``min_step``; a task of the run that fails first (e.g. the corpus
    cannot be resolved) fails the wait at once with that task's log."""
    from pipeline.tasks.pretrain import job_state

    deadline = time.time() + timeout
    while time.time() < deadline:
        dep.assert_no_failed_task("pretrain", run_id)
        st = job_state(stage) if stage.exists() else {"state": "PENDING", "step": 0}
        if st["state"] == "RUNNING" and (st.get("step") or 0) >= min_step:
            return st
        assert st["state"] not in ("FAILED", "LOST", "SUCCEEDED"), st
        time.sleep(1)
    raise TimeoutError(f"stage {stage} never reached step {min_step}")


def _kill_task_processes(dep, run_id: str, task_id: str) -> list[int]:
    """SIGKILL the processes running the task (the worker's view of it); the training job, in its own session,
    is left alone, as it would survive the loss of a worker host's Celery process."""
    import psutil

    ti = dep.api("GET", f"/dags/pretrain/dagRuns/{q(run_id)}/taskInstances/{task_id}").json()
    killed = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = " ".join(proc.info["cmdline"] or [])
        if proc.pid == ti.get("pid") or (task_id in cmd and run_id in cmd and "pipeline.train" not in cmd):
            try:
                proc.kill()
                killed.append(proc.pid)
            except psutil.NoSuchProcess:
                pass
    return killed


def _ti(dep, run_id: str) -> dict:
    return dep.api("GET", f"/dags/pretrain/dagRuns/{q(run_id)}/taskInstances/train_main").json()


def test_a_lost_train_worker_reconnects_to_the_job_and_marking_failed_cancels_it(stack, published):
    """One long stage: its worker dies, the job runs on under its lease, Airflow's retry reconnects to it (no second
    launch); then marking the running stage failed over REST cancels the job through its stage folder."""
    from pipeline.io import read_json
    from pipeline.tasks.pretrain import job_state

    dep = stack.airflow
    run = "celery_kill"
    r = dep.api("POST", "/dags/pretrain/dagRuns",
                json={"dag_run_id": run, "logical_date": None, "conf": {"train_steps": 200_000}})
    assert r.status_code == 200, r.text
    stage = _stage_dir(stack, run)
    _wait_training(dep, run, stage, min_step=3)
    job_id = read_json(stage / "lease.json")["job_id"]
    dep.kill_component("worker-train")                     # the worker dies with its task processes
    _kill_task_processes(dep, run, "train_main")
    time.sleep(6)
    assert job_state(stage)["state"] == "RUNNING"           # the job keeps its lease
    stack.restart_worker("worker-train")
    deadline = time.time() + 300                           # heartbeat timeout (20 s) + retry delay + restart
    while time.time() < deadline and not (_ti(dep, run).get("try_number") == 2
                                          and _ti(dep, run)["state"] == "running"):
        time.sleep(2)
    ti = _ti(dep, run)
    assert (ti["try_number"], ti["state"]) == (2, "running"), ti
    time.sleep(10)
    st = job_state(stage)
    assert st["state"] == "RUNNING" and read_json(stage / "lease.json")["job_id"] == job_id   # the same job
    assert read_json(stage / "launch.json")["try_number"] == 1                               # launched once
    assert not list(stage.glob("launcher.try2.log"))

    # Marking the running stage failed over REST stops its job (on_kill writes cancel.json, from any host).
    r = dep.api("PATCH", f"/dags/pretrain/dagRuns/{run}/taskInstances/train_main", json={"new_state": "failed"})
    assert r.status_code == 200, r.text
    deadline = time.time() + 120
    while time.time() < deadline and job_state(stage)["state"] == "RUNNING":
        time.sleep(1)
    st = job_state(stage)
    assert st["state"] == "FAILED" and "cancelled" in (st.get("error") or ""), st
    assert (st.get("step") or 0) < 200_000
    assert dep.wait_run("pretrain", run, timeout=300, expect_failure=True)["state"] == "failed"


def test_deferrable_stages_complete_through_the_triggerer(stack, published):
    dep = stack.airflow
    dep.kill_component("worker-train", sig=signal.SIGTERM)   # warm shutdown: no task is running
    config = Path(dep.env["MINDLOOM_CONFIG"])                 # the same config (same folder), stages deferrable
    data = yaml.safe_load(config.read_text(encoding="utf-8"))
    data.setdefault("airflow", {})["train_deferrable"] = True
    deferrable = config.with_name("mindloom-deferrable.yaml")
    deferrable.write_text(yaml.safe_dump(data), encoding="utf-8")
    dep.commands["worker-train"][1]["MINDLOOM_CONFIG"] = str(deferrable)
    stack.restart_worker("worker-train")
    r = dep.api("POST", "/dags/pretrain/dagRuns",
                json={"dag_run_id": "celery_deferred", "logical_date": None, "conf": {}})
    assert r.status_code == 200, r.text
    deferred: set[str] = set()
    deadline = time.time() + 900
    while time.time() < deadline:
        dep.check_alive()
        dep.assert_no_failed_task("pretrain", "celery_deferred")
        tis = task_instances(dep, "pretrain", "celery_deferred")
        deferred |= {ti["task_id"] for ti in tis if ti["state"] == "deferred"}
        state = dep.api("GET", "/dags/pretrain/dagRuns/celery_deferred").json()["state"]
        if state in ("success", "failed"):
            break
        time.sleep(1)
    assert state == "success", dep.logs_tail()
    stages = {ti["task_id"] for ti in tis if ti["task_id"].startswith("train_")}
    assert stages and deferred == stages, f"deferred {sorted(deferred)}, stages {sorted(stages)}"
    assert assert_routed(tis) == len(stages)      # execute_complete ran on the train worker too
