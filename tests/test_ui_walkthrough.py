"""The README's path through the Airflow UI, as a new user walks it, against `make airflow` itself.

`make airflow` is started in a clean environment (system PATH without the venv, no AIRFLOW_* settings beyond
throw-away ports): it must start every component, unpause ``pretrain`` and print the URL and login.  Then, in
headless Chromium: trigger ``corpus_build`` from its form, see ``pretrain`` start from the Asset, trigger
``pretrain`` from its form with its defaults plus the testing switch that fails a stage for good, read the failed
run's report tab (the log's last lines inline, its address as text) and open that address as a user would, Clear
the stage in the UI, read the resumed try's first log line, and see the report.  Training checkpoints at the
default ``train.checkpoint_every`` (10), and the crash step is one the form's description says resumes.  Also the
report plugin's security (login required, values escaped, CSP sandbox) on the real api-server, and a Clear of a
succeeded stage, which trains it again from the stage start.

Screenshots go to ``$MINDLOOM_SCREENSHOTS`` when set (``make screenshots`` points it at docs/screenshots).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from airflow_services import REPO, AirflowRest, free_port, q
from conftest import LONG_FIXTURE, require, tiny_config

pytestmark = [pytest.mark.slow, pytest.mark.live, pytest.mark.browser, LONG_FIXTURE]

BANNER = re.compile(r"mindloom: Airflow is ready at (http://127\.0\.0\.1:\d+)\s+\(login admin / admin\)")


def default_checkpointing(config: Path) -> Path:
    """The tiny config with ``train.checkpoint_every`` left at its default (the tiny config sets 4)."""
    import yaml

    cfg = yaml.safe_load(config.read_text(encoding="utf-8"))
    cfg["train"].pop("checkpoint_every", None)
    config.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    return config


class MadeAirflow(AirflowRest):
    """`make airflow` in a throw-away home on free ports, plus a REST client with the admin token."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.log = tmp / "make_airflow.log"
        self.port = free_port()
        venv = str(REPO / ".venv")
        path = os.pathsep.join(p for p in os.environ.get("PATH", "/usr/bin:/bin").split(os.pathsep)
                               if p and not p.startswith(venv))
        self.env = {"HOME": os.environ.get("HOME", "/root"), "PATH": path, "LANG": "C.UTF-8",
                    "MINDLOOM_CONFIG": str(default_checkpointing(tiny_config(tmp, airflow={"train_retries": 1}))),
                    "MINDLOOM_AIRFLOW_HOME": str(tmp / "home"),
                    "MINDLOOM_AIRFLOW_PORT": str(self.port), "MINDLOOM_TESTING_SWITCHES": "1",
                    "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_SERVER_PORT": str(free_port()),
                    "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
                    "AIRFLOW__TRIGGERER__TRIGGERER_LOG_SERVER_PORT": str(free_port()),
                    "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
                    # a worktree's own code before the venv's editable install (unset in CI: a clean clone)
                    **({"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else {})}
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 480) -> None:
        with open(self.log, "wb") as fh:
            self.proc = subprocess.Popen(["make", "--no-print-directory", "-C", str(REPO), "airflow"], env=self.env,
                                         stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        deadline = time.time() + timeout
        while time.time() < deadline:
            m = BANNER.search(self.log.read_text(errors="replace"))
            if m:
                self.base = m.group(1)
                self.login()
                return
            if self.proc.poll() is not None:
                break
            time.sleep(2)
        raise RuntimeError(f"`make airflow` printed no ready banner:\n{self.logs_tail()}")

    def stop(self) -> None:
        """SIGTERM the whole process group (make, standalone and its components), then SIGKILL what is left."""
        if self.proc is None:
            return
        for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 0)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            deadline = time.time() + wait
            while time.time() < deadline:
                try:
                    os.killpg(self.proc.pid, 0)
                except ProcessLookupError:
                    return
                time.sleep(1)

    def logs_tail(self, n: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-n:] if self.log.exists() else ""

    def data(self) -> Path:
        return self.tmp / "data"


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    require(shutil.which("chromium"), "Debian chromium not installed (apt-get install chromium; make system-deps)")
    dep = MadeAirflow(tmp_path_factory.mktemp("walkthrough"))
    try:
        dep.start()
        yield dep
    finally:
        dep.stop()


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    out = Path(os.environ.get("MINDLOOM_SCREENSHOTS") or tmp_path_factory.mktemp("shots"))
    out.mkdir(parents=True, exist_ok=True)
    return out


def test_make_airflow_starts_unpauses_pretrain_and_prints_url(made):
    assert made.base == f"http://127.0.0.1:{made.port}"
    paused = {d["dag_id"]: d["is_paused"] for d in made.api("GET", "/dags").json()["dags"]}
    assert paused["pretrain"] is False            # the first corpus publish must start it
    assert paused["corpus_build"] is True         # the form's "Unpause on trigger" does that


def test_report_plugin_requires_login_escapes_and_sandboxes(made):
    evil = "<img src=x onerror=alert(document.domain)>"
    anon = httpx.get(f"{made.base}/mindloom/reports/pretrain/{q(evil)}", timeout=30)
    assert anon.status_code == 401
    page = httpx.get(f"{made.base}/mindloom/reports/pretrain/x", timeout=30, headers={"Accept": "text/html"})
    assert page.status_code == 303 and page.headers["location"].startswith("/auth/login?next=%2Fmindloom%2Freports")
    login = httpx.get(made.base + page.headers["location"], timeout=30)
    assert login.status_code == 200 and "<html" in login.text.lower()     # Airflow's own login page
    assert httpx.get(f"{made.base}/mindloom/reports/pretrain/x", cookies={"_token": "forged"},
                     timeout=30).status_code == 403
    r = httpx.get(f"{made.base}/mindloom/reports/pretrain/{q(evil)}", timeout=30,
                  headers={"Authorization": f"Bearer {made.token}"})
    assert r.status_code == 404 and evil not in r.text and "&lt;img src=x" in r.text
    csp = r.headers["content-security-policy"]
    assert csp.startswith("sandbox") and "allow-same-origin" not in csp and "allow-scripts" not in csp
    assert httpx.get(f"{made.base}/mindloom/reports/other_dag/x", timeout=30,
                     headers={"Authorization": f"Bearer {made.token}"}).status_code in (403, 404)


def _report_frame_text(page) -> str:
    page.get_by_text("Run report", exact=True).first.click()
    page.wait_for_timeout(3000)
    return "".join(f.content() for f in page.frames[1:])


def _report_frame(page):
    return next(f for f in page.frames[1:] if "/mindloom/reports/" in f.url)


def test_walkthrough_trigger_asset_fail_for_good_clear_resume_report(made, shots):
    from browser_flow import _login, fill_form, open_browser, open_trigger_form, park, submit_trigger_form
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = open_browser(p)
        page = browser.new_page(viewport={"width": 1500, "height": 1100})
        _login(page, made.base)

        # 1. corpus_build from its form: only corpus fields, no server path, bounds enforced by the form.
        dialog = open_trigger_form(page, made.base, "corpus_build")
        sections = [b.inner_text() for b in dialog.locator("button[aria-controls]").all()]
        assert "Tokenizer and MindRecord" in sections and "Execution" not in sections, sections
        assert not dialog.get_by_text("Config file").count() and not dialog.get_by_text("Train precision").count()
        fill_form(dialog, page, "corpus_build", {"seq_len": -3})
        assert dialog.locator("input[role=spinbutton][aria-valuemin='8']").input_value() == "8"   # clamped
        fill_form(dialog, page, "corpus_build", {"run_name": "walkthrough", "seq_len": 32})
        dialog.screenshot(path=str(shots / "corpus_build_trigger_form.png"))
        corpus_run = submit_trigger_form(page, dialog, "corpus_build")
        park(page)
        assert made.wait_run("corpus_build", corpus_run)["state"] == "success", made.logs_tail()

        # 2. The Asset starts pretrain on its first publish (pretrain was never unpaused by hand).
        deadline, asset_run = time.time() + 180, None
        while time.time() < deadline and asset_run is None:
            runs = made.api("GET", "/dags/pretrain/dagRuns").json()["dag_runs"]
            asset_run = next((r["dag_run_id"] for r in runs if r["run_type"] == "asset_triggered"), None)
            time.sleep(3)
        assert asset_run, "pretrain was not started by the first corpus publish"
        assert made.wait_run("pretrain", asset_run)["state"] == "success", made.logs_tail()
        metrics = made.xcom("pretrain", asset_run, "train_main")
        assert metrics["state"] == "SUCCEEDED" and metrics["final_loss"] < metrics["first_loss"]

        # 3. pretrain's form triggers with its defaults; the testing switch fails the stage for good, at a step
        #    that writes a checkpoint at the default checkpoint_every (10), as the switch's description says.
        dialog = open_trigger_form(page, made.base, "pretrain")
        assert dialog.get_by_role("button", name="Trigger").is_enabled()        # defaults are valid
        dialog.get_by_role("button", name="Testing", exact=True).click()
        dialog.get_by_text("Checkpoints are written every 10 steps").wait_for(timeout=30_000)
        dialog.get_by_role("button", name="Testing", exact=True).click()
        fill_form(dialog, page, "pretrain", {"run_name": "fail-demo", "fail_at_step": 10, "fail_for_good": True})
        dialog.screenshot(path=str(shots / "pretrain_trigger_form.png"))
        run = submit_trigger_form(page, dialog, "pretrain")
        park(page)
        assert made.wait_run("pretrain", run, expect_failure=True)["state"] == "failed", made.logs_tail()
        tries = made.api("GET", f"/dags/pretrain/dagRuns/{q(run)}/taskInstances/train_main/tries").json()
        assert [t["state"] for t in tries["task_instances"]] == ["failed", "failed"]   # retries=1: both tries

        # 4. The failed run's report tab names the stage and its error, shows the log's last lines inline and the
        #    log's address as text (a target=_top link is dead in the UI's sandboxed iframe); open that address.
        page.goto(f"{made.base}/dags/pretrain/runs/{q(run)}")
        text = _report_frame_text(page)
        assert "fail-demo" in text and "train_main" in text and "SimulatedCrash" in text
        frame = _report_frame(page)
        tail = frame.locator("pre.logtail").first.inner_text()
        assert "stage main step 11 loss" in tail and "FAILED at step 11" in tail, tail
        address = frame.locator(".logaddr code").first.inner_text()
        assert address == f"/dags/pretrain/runs/{q(run)}/tasks/train_main?try_number=2"
        assert frame.locator("a[target=_top]").count() == 0
        page.screenshot(path=str(shots / "pretrain_failed_run_report.png"))
        page.goto(made.base + address)                  # "open log": the address pasted into the address bar
        page.get_by_text("FAILED at step 11").first.wait_for(timeout=60_000)

        # 5. Clear the failed stage in the UI; the new try resumes from the step-10 checkpoint.
        page.goto(f"{made.base}/dags/pretrain/runs/{q(run)}/tasks/train_main")
        page.get_by_role("button", name="Press shift+c to clear").click()
        page.get_by_role("dialog").get_by_role("button", name="Confirm").click()
        deadline = time.time() + 60
        while (time.time() < deadline
               and made.api("GET", f"/dags/pretrain/dagRuns/{q(run)}").json()["state"] == "failed"):
            time.sleep(1)
        park(page)
        assert made.wait_run("pretrain", run)["state"] == "success", made.logs_tail()
        resumed = made.xcom("pretrain", run, "train_main")
        assert resumed["resumed_from"] == 10 and resumed["steps"] == 12

        page.goto(f"{made.base}/dags/pretrain/runs/{q(run)}/tasks/train_main?try_number=3")
        page.get_by_text("resumed from checkpoint step 10 (try 2 stopped at step 11)").wait_for(timeout=60_000)
        log_text = page.locator("body").inner_text()
        assert "stage main step 11 loss" in log_text and "stage main step 12 loss" in log_text
        assert "stage main step 10 loss" not in log_text         # nothing before the resume point is replayed
        page.screenshot(path=str(shots / "pretrain_resumed_log.png"))

        # 6. The report: the run name the user typed, and the loss curves.
        page.goto(f"{made.base}/dags/pretrain/runs/{q(run)}")
        text = _report_frame_text(page)
        assert "fail-demo" in text and "Training loss" in text
        page.screenshot(path=str(shots / "pretrain_run_report.png"))
        browser.close()

    # 7. A log row per step of the resumed try, exactly the rows metrics.jsonl now holds past step 10.
    from pipeline.io import safe_run_id

    stage_root = made.data() / "train" / safe_run_id(run)
    rows = [ln for ln in (stage_root / "main" / "metrics.jsonl").read_text().splitlines() if ln]
    assert len(rows) == 12

    # 8. Clearing the succeeded stage trains it again from the stage start and keeps the old folder.
    r = made.api("POST", "/dags/pretrain/clearTaskInstances",
                 json={"dry_run": False, "dag_run_id": run, "task_ids": ["train_main"], "only_failed": False,
                       "include_downstream": True, "reset_dag_runs": True})
    assert r.status_code == 200, r.text
    deadline = time.time() + 60
    while time.time() < deadline and made.api("GET", f"/dags/pretrain/dagRuns/{q(run)}").json()["state"] == "success":
        time.sleep(1)
    assert made.wait_run("pretrain", run)["state"] == "success", made.logs_tail()
    again = made.xcom("pretrain", run, "train_main")
    assert again["resumed_from"] is None and again["steps"] == 12 and again["start_step"] == 0
    assert (stage_root / "main.cleared-1" / "summary.json").exists()
