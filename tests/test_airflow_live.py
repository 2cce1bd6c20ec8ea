"""Airflow over REST: real api-server, scheduler, dag-processor and triggerer on loopback (SQLite, LocalExecutor).

A bad conf is refused with a 400 that names the param (in one line), a run whose task fails is reported at once with
that task's error, and ``corpus_refresh`` is backfilled over past cron dates.
The UI path (forms, Asset hand-off, a failed stage cleared and resumed, the report tab) is walked in a browser by
``test_ui_walkthrough.py`` against ``make airflow`` itself.
"""

from __future__ import annotations

import time

import pytest
from airflow_services import AirflowDeployment, q
from conftest import tiny_config

pytestmark = [pytest.mark.slow, pytest.mark.live, pytest.mark.airflow]


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("live")
    dep = AirflowDeployment(tmp / "airflow_home", tiny_config(tmp, airflow={"train_retries": 0}))
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
    r = deployment.api("POST", "/dags/corpus_build/dagRuns",
                       json={"dag_run_id": "bad2", "logical_date": None, "conf": {"near_dedup_threshold": 1.5}})
    assert r.status_code == 400 and "near_dedup_threshold" in r.text
    r = deployment.api("POST", "/dags/pretrain/dagRuns",
                       json={"dag_run_id": "bad3", "logical_date": None, "conf": {"corpus_run": "../../etc"}})
    assert r.status_code == 400 and "corpus_run" in r.text
    # one line that says what is allowed (operators/param_errors.py), not jsonschema's dump of the schema
    assert r.json()["detail"] == ("Invalid input for param corpus_run: '../../etc' is not allowed; a run id is 1 to "
                                  "250 characters: letters, digits and _ . : + - (no spaces or slashes), starting "
                                  "with a letter or digit, e.g. manual__2026-11-29T10:00:00+00:00")


def test_a_wait_fails_at_once_with_the_failed_tasks_own_error(deployment):
    """A run whose task fails for good (no corpus run of that id) fails ``wait_run`` as soon as the task fails,
    with the task's error from its log, instead of the caller finding out at its timeout."""
    dep = deployment
    r = dep.api("POST", "/dags/pretrain/dagRuns",
                json={"dag_run_id": "no_corpus", "logical_date": None, "conf": {"corpus_run": "no_such_run"}})
    assert r.status_code == 200, r.text
    t0 = time.time()
    with pytest.raises(AssertionError) as failed:
        dep.wait_run("pretrain", "no_corpus", timeout=900)
    text = str(failed.value)
    assert text.startswith("pretrain/no_corpus: task resolve_corpus failed (try 1); its log ends:"), text  # retries 0
    assert "corpus_run: no published corpus for run 'no_such_run'" in text, text
    assert time.time() - t0 < 600


BACKFILL = {"dag_id": "corpus_refresh", "from_date": "2026-11-01T00:00:00Z", "to_date": "2026-11-16T00:00:00Z",
            "max_active_runs": 1, "run_backwards": False, "dag_run_conf": {"run_name": "backfill"},
            "reprocess_behavior": "none"}


@pytest.fixture(scope="module")
def backfilled(deployment) -> dict:
    """One past week of ``corpus_refresh`` backfilled over REST and approved by a person (a refresh waits, #53):
    the run id, the question it asked and the Asset events before the answer. Both the backfill test and the
    approval test read this run, so the module builds two refresh corpora (this one and the rejected one)."""
    dep = deployment
    dry = dep.api("POST", "/backfills/dry_run", json=BACKFILL)
    assert dry.status_code == 200, dry.text
    # Quiet the scheduler first: Airflow refuses to create a backfill on SQLite while other writers hold the DB
    # ("Database is locked ... not supported on SQLite under concurrent access"; PostgreSQL has no such limit).
    dep.api("PATCH", "/dags/pretrain", json={"is_paused": True})
    _unpause(dep, "corpus_refresh")                                      # backfill runs wait while a DAG is paused
    for _ in range(20):
        r = dep.api("POST", "/backfills", json={**BACKFILL, "to_date": "2026-11-02T00:00:00Z"})
        if r.status_code != 503:
            break
        time.sleep(3)
    assert r.status_code == 200, r.text
    run_id = "backfill__2026-11-01T03:00:00+00:00"
    events = _events(dep)
    question = _respond(dep, "corpus_refresh", run_id, "Approve", "backfilled week looks right")
    assert dep.wait_run("corpus_refresh", run_id)["state"] == "success", dep.logs_tail()
    return {"run_id": run_id, "question": question, "events_before": events,
            "dry_run": [b["logical_date"][:10] for b in dry.json()["backfills"]]}


def test_backfill_of_corpus_refresh_over_past_dates(deployment, backfilled):
    """`airflow backfill create` over REST: the dry run lists the cron dates, a one-date backfill runs to success,
    and a dry run after it leaves out the week already backfilled (``reprocess_behavior: none``)."""
    dep = deployment
    assert backfilled["dry_run"] == ["2026-11-01", "2026-11-08", "2026-11-15"]  # Sundays 03:00 UTC (default cron)
    dry = dep.api("POST", "/backfills/dry_run", json=BACKFILL)
    assert dry.status_code == 200, dry.text
    assert [b["logical_date"][:10] for b in dry.json()["backfills"]] == ["2026-11-08", "2026-11-15"]
    run = dep.api("GET", f"/dags/corpus_refresh/dagRuns/{q(backfilled['run_id'])}").json()
    assert run["state"] == "success"
    assert run["run_type"] == "backfill" and run["conf"]["run_name"] == "backfill"


def _wait_awaiting_input(dep, dag_id: str, run_id: str, timeout: float = 600) -> dict:
    """The ``approve`` task instance once it waits for a person (``awaiting_input``)."""
    deadline = time.time() + timeout
    ti: dict = {}
    while time.time() < deadline:
        dep.assert_no_failed_task(dag_id, run_id)
        ti = dep.api("GET", f"/dags/{dag_id}/dagRuns/{q(run_id)}/taskInstances/approve").json()
        if ti.get("state") == "awaiting_input":
            return ti
        time.sleep(3)
    raise TimeoutError(f"{dag_id}/{run_id}: approve still {ti.get('state')} after {timeout} s\n{dep.logs_tail()}")


def _respond(dep, dag_id: str, run_id: str, option: str, reason: str) -> dict:
    """Answer the run's ``approve`` question over REST; returns the question as it was asked."""
    _wait_awaiting_input(dep, dag_id, run_id)
    # Airflow 3.3.2 races an answer given within seconds of the pause: the scheduler then handles the paused
    # attempt's exit after the resume and retries the task, which asks again. A person never answers that fast.
    time.sleep(20)
    detail = dep.api("GET", f"/dags/{dag_id}/dagRuns/{q(run_id)}/taskInstances/approve/-1/hitlDetails").json()
    r = dep.api("PATCH", f"/dags/{dag_id}/dagRuns/{q(run_id)}/taskInstances/approve/-1/hitlDetails",
                json={"chosen_options": [option], "params_input": {"reason": reason}})
    assert r.status_code == 200, r.text
    return detail


def _states(dep, dag_id: str, run_id: str) -> dict:
    r = dep.api("GET", f"/dags/{dag_id}/dagRuns/{q(run_id)}/taskInstances", params={"limit": 1000})
    return {ti["task_id"]: ti["state"] for ti in r.json()["task_instances"] if ti.get("map_index", -1) < 1}


def _events(dep) -> int:
    return dep.api("GET", "/assets/events", params={"limit": 1}).json()["total_entries"]


def test_a_refresh_waits_for_approval_and_a_rejection_publishes_nothing(deployment, backfilled):
    """#53: a corpus_refresh run stops before ``publish`` until a person answers over REST. The question shows
    the run's headline and report link. *Reject* skips publish (no Asset event, so no pretrain run) with the
    reason in the task log; *Approve* publishes. The run the scheduler made when the DAG was unpaused is the one
    rejected; the backfilled run (module fixture) is the one approved."""
    dep = deployment
    dep.api("PATCH", "/dags/pretrain", json={"is_paused": True})
    _unpause(dep, "corpus_refresh")
    deadline = time.time() + 120
    scheduled = []
    while not scheduled and time.time() < deadline:
        runs = dep.api("GET", "/dags/corpus_refresh/dagRuns", params={"run_type": "scheduled"}).json()["dag_runs"]
        scheduled = [r["dag_run_id"] for r in runs]
        time.sleep(2)
    assert scheduled, "unpausing corpus_refresh made no scheduled run"
    events = _events(dep)
    rejected, reason = scheduled[0], "too few new encyclopedia pages"
    detail = _respond(dep, "corpus_refresh", rejected, "Reject", reason)
    assert dep.wait_run("corpus_refresh", rejected)["state"] == "success", dep.logs_tail()
    approved = backfilled["run_id"]
    for run_id, question in ((rejected, detail), (approved, backfilled["question"])):
        assert question["subject"] == f"Publish corpus run {run_id} for training?", question
        assert "| domain | documents in | kept |" in question["body"], question["body"]
        assert "/mindloom/reports/corpus_refresh/" in question["body"], question["body"]
    log = dep.task_log("corpus_refresh", rejected, "approve", 1, lines=300)
    assert _states(dep, "corpus_refresh", rejected)["publish"] == "skipped"
    assert f"rejected by admin: {reason}; publish and pretrain are skipped" in log, log
    assert _events(dep) == events  # nothing published: pretrain has nothing to start on
    log = dep.task_log("corpus_refresh", approved, "approve", 1, lines=300)
    assert _states(dep, "corpus_refresh", approved)["publish"] == "success"
    assert "approved by admin: backfilled week looks right" in log, log
    assert events == backfilled["events_before"] + 1      # the approved run published, once
