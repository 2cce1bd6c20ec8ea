"""Airflow as a user runs it: real api-server, scheduler, dag-processor and triggerer on loopback.

REST: trigger ``corpus_build`` with a conf, see the Asset trigger ``pretrain``, read the stage metrics from XCom,
make a training stage fail, clear it and see it resume from its checkpoint.  Browser: log in with headless
Chromium, fill the trigger form and see the run succeed.
"""

from __future__ import annotations

import shutil
import time

import pytest
from airflow_services import AirflowDeployment, q
from conftest import tiny_config

pytestmark = [pytest.mark.slow, pytest.mark.live]


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("live")
    dep = AirflowDeployment(tmp / "airflow_home", tiny_config(tmp), {"MINDLOOM_TRAIN_RETRIES": "0"})
    try:
        dep.start()
        for dag_id in ("corpus_build", "pretrain"):
            dep.wait_for_dag(dag_id)
        yield dep
    finally:
        dep.stop()


def _unpause(dep, dag_id):
    r = dep.api("PATCH", f"/dags/{dag_id}", json={"is_paused": False})
    assert r.status_code == 200, r.text


def test_bad_conf_is_refused_by_the_api(deployment):
    r = deployment.api("POST", "/dags/corpus_build/dagRuns",
                       json={"dag_run_id": "bad", "logical_date": None, "conf": {"seq_len": 2}})
    assert r.status_code == 400 and "seq_len" in r.text


def test_trigger_asset_metrics_fail_clear_resume(deployment):
    dep = deployment
    _unpause(dep, "pretrain")
    _unpause(dep, "corpus_build")
    r = dep.api("POST", "/dags/corpus_build/dagRuns",
                json={"dag_run_id": "api_e2e", "logical_date": None, "conf": {"run_name": "api"},
                      "note": "triggered by test_airflow_live"})
    assert r.status_code == 200, r.text
    assert dep.wait_run("corpus_build", "api_e2e")["state"] == "success", dep.logs_tail()
    corpus = dep.xcom("corpus_build", "api_e2e", "publish")
    assert corpus["samples"] > 0

    # The Asset event schedules pretrain.
    deadline, asset_run = time.time() + 180, None
    while time.time() < deadline and asset_run is None:
        runs = dep.api("GET", "/dags/pretrain/dagRuns").json()["dag_runs"]
        asset_run = next((x for x in runs if x["run_type"] == "asset_triggered"), None)
        time.sleep(3)
    assert asset_run, "pretrain was not triggered by the corpus Asset"
    assert dep.wait_run("pretrain", asset_run["dag_run_id"])["state"] == "success", dep.logs_tail()
    metrics = dep.xcom("pretrain", asset_run["dag_run_id"], "train_main")
    assert metrics["state"] == "SUCCEEDED" and metrics["final_loss"] < metrics["first_loss"]
    report = dep.xcom("pretrain", asset_run["dag_run_id"], "report")
    assert report["stages"]["main"]["steps"] == 12

    # A stage that fails (retries=0), cleared over REST, resumes from its checkpoint.
    r = dep.api("POST", "/dags/pretrain/dagRuns",
                json={"dag_run_id": "api_fail", "logical_date": None, "conf": {"fail_at_step": 8}})
    assert r.status_code == 200, r.text
    assert dep.wait_run("pretrain", "api_fail")["state"] == "failed"
    ti = dep.api("GET", "/dags/pretrain/dagRuns/api_fail/taskInstances/train_main").json()
    assert ti["state"] == "failed"
    r = dep.api("POST", "/dags/pretrain/clearTaskInstances",
                json={"dry_run": False, "dag_run_id": "api_fail", "task_ids": ["train_main"], "only_failed": True,
                      "include_downstream": True, "reset_dag_runs": True, "note": "cleared by test"})
    assert r.status_code == 200, r.text
    deadline = time.time() + 60
    while time.time() < deadline and dep.api("GET", "/dags/pretrain/dagRuns/api_fail").json()["state"] == "failed":
        time.sleep(1)
    assert dep.wait_run("pretrain", "api_fail")["state"] == "success", dep.logs_tail()
    resumed = dep.xcom("pretrain", "api_fail", "train_main")
    assert resumed["resumed_from"] == 8 and resumed["steps"] == 12
    tries = dep.api("GET", "/dags/pretrain/dagRuns/api_fail/taskInstances/train_main/tries").json()
    assert tries["total_entries"] >= 2

    # The run report is served by the mindloom plugin and linked from the run page.
    page = dep.api("GET", "/plugins").json()
    assert any(p["name"] == "mindloom" for p in page["plugins"])
    import httpx

    html = httpx.get(f"{dep.base}/mindloom/reports/pretrain/{q('api_fail')}", timeout=30)
    assert html.status_code == 200 and "Training loss" in html.text


@pytest.mark.skipif(shutil.which("chromium") is None, reason="Debian chromium not installed (apt-get install chromium)")
def test_browser_login_trigger_form_run_succeeds(deployment, tmp_path):
    from browser_flow import trigger_from_form

    dep = deployment
    _unpause(dep, "corpus_build")
    run_id = trigger_from_form(dep.base, "corpus_build", {"run_name": "from-browser"}, tmp_path)
    assert dep.wait_run("corpus_build", run_id)["state"] == "success", dep.logs_tail()
    conf = dep.api("GET", f"/dags/corpus_build/dagRuns/{q(run_id)}").json()["conf"]
    assert conf["run_name"] == "from-browser"


def test_backfill_of_corpus_refresh_over_past_dates(deployment):
    """`airflow backfill create` over REST: the dry run lists the cron dates, a one-date backfill runs to success."""
    dep = deployment
    body = {"dag_id": "corpus_refresh", "from_date": "2026-11-01T00:00:00Z", "to_date": "2026-11-16T00:00:00Z",
            "max_active_runs": 1, "run_backwards": False, "dag_run_conf": {"run_name": "backfill"},
            "reprocess_behavior": "none"}
    dry = dep.api("POST", "/backfills/dry_run", json=body)
    assert dry.status_code == 200, dry.text
    dates = [b["logical_date"][:10] for b in dry.json()["backfills"]]
    assert dates == ["2026-11-01", "2026-11-08", "2026-11-15"]          # Sundays 03:00 UTC (the default cron)
    # Quiet the scheduler first: Airflow refuses to create a backfill on SQLite while other writers hold the DB
    # ("Database is locked ... not supported on SQLite under concurrent access"; PostgreSQL has no such limit).
    dep.api("PATCH", "/dags/pretrain", json={"is_paused": True})
    _unpause(dep, "corpus_refresh")                                      # backfill runs wait while a DAG is paused
    for _ in range(20):
        r = dep.api("POST", "/backfills", json={**body, "to_date": "2026-11-02T00:00:00Z"})
        if r.status_code != 503:
            break
        time.sleep(3)
    assert r.status_code == 200, r.text
    run_id = "backfill__2026-11-01T03:00:00+00:00"
    assert dep.wait_run("corpus_refresh", run_id)["state"] == "success", dep.logs_tail()
    run = dep.api("GET", f"/dags/corpus_refresh/dagRuns/{q(run_id)}").json()
    assert run["run_type"] == "backfill" and run["conf"]["run_name"] == "backfill"
