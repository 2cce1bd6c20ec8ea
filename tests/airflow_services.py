"""Run a real Airflow deployment on loopback for end-to-end tests: api-server, scheduler, dag-processor, triggerer.

SQLite and LocalExecutor in a throw-away ``AIRFLOW_HOME`` by default, free ports, login admin/admin.  ``executor``,
``db_url`` and ``extra_components`` (e.g. Celery workers, see ``celery_services.py``) turn the same class into a
production-like deployment.  Every process runs in its own session so its whole group can be stopped (or killed
and started again by a test), and its log is kept for the failure message.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class AirflowRest:
    """A REST client of one Airflow deployment (``base`` URL, admin token); subclasses say how it runs."""

    base = ""
    token = ""

    def check_alive(self) -> None:
        """Raise when the deployment has died (subclasses that own processes check them)."""

    def logs_tail(self, n: int = 2500) -> str:
        return ""

    def login(self, user: str = "admin", password: str = "admin") -> None:
        r = httpx.post(f"{self.base}/auth/token", json={"username": user, "password": password}, timeout=30)
        r.raise_for_status()
        self.token = r.json()["access_token"]

    def api(self, method: str, path: str, headers_extra: Mapping[str, str] | None = None, **kw) -> httpx.Response:
        return httpx.request(method, f"{self.base}/api/v2{path}",
                             headers={"Authorization": f"Bearer {self.token}", **(headers_extra or {})}, timeout=60,
                             **kw)

    def wait_for_dag(self, dag_id: str, timeout: float = 180) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.api("GET", f"/dags/{dag_id}").status_code == 200:
                return
            time.sleep(2)
        errors = self.api("GET", "/importErrors").text
        raise TimeoutError(f"DAG {dag_id} not parsed after {timeout} s; import errors: {errors}")

    def wait_run(self, dag_id: str, run_id: str, states=("success", "failed"), timeout: float = 600,
                 expect_failure: bool = False) -> dict:
        """The run once it is in one of ``states``.  Unless ``expect_failure``, a task that fails for good (state
        ``failed``: no retry left) fails the wait at once, with that task's log tail (:meth:`failed_tasks_report`),
        instead of letting the caller find a failed run, or wait for something that will never come."""
        deadline = time.time() + timeout
        run: dict = {}
        while time.time() < deadline:
            self.check_alive()
            run = self.api("GET", f"/dags/{dag_id}/dagRuns/{q(run_id)}").json()
            if not expect_failure:
                self.assert_no_failed_task(dag_id, run_id)
            if run.get("state") in states:
                return run
            time.sleep(3)
        raise TimeoutError(f"{dag_id}/{run_id} still {run.get('state')} after {timeout} s\n{self.logs_tail()}")

    def failed_tasks_report(self, dag_id: str, run_id: str, lines: int = 30) -> str | None:
        """Each task instance of the run that failed for good, with the last ``lines`` of its log; None if none."""
        r = self.api("GET", f"/dags/{dag_id}/dagRuns/{q(run_id)}/taskInstances",
                     params={"limit": 1000, "state": "failed"})
        if r.status_code != 200:
            return None
        out = []
        for ti in r.json()["task_instances"]:
            name = ti["task_id"] + (f"[{ti['map_index']}]" if ti.get("map_index", -1) >= 0 else "")
            out.append(f"task {name} failed (try {ti['try_number']}); its log ends:\n"
                       + self.task_log(dag_id, run_id, ti["task_id"], ti["try_number"], ti.get("map_index", -1),
                                       lines))
        return "\n\n".join(out) or None

    def assert_no_failed_task(self, dag_id: str, run_id: str) -> None:
        report = self.failed_tasks_report(dag_id, run_id)
        if report:
            raise AssertionError(f"{dag_id}/{run_id}: {report}")

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int, map_index: int = -1,
                 lines: int = 30) -> str:
        """The last ``lines`` of a task's log, read over REST (events, levels and exceptions, one per line)."""
        r = self.api("GET", f"/dags/{dag_id}/dagRuns/{q(run_id)}/taskInstances/{task_id}/logs/{try_number}",
                     params={"full_content": "true", "map_index": map_index},
                     headers_extra={"Accept": "application/json"})
        if r.status_code != 200:
            return f"(log unavailable: HTTP {r.status_code} {r.text[:200]})"
        text = []
        for m in r.json().get("content") or []:
            if not isinstance(m, dict):
                text.append(str(m))
                continue
            event = str(m.get("event", ""))
            if event.startswith(("::group::", "::endgroup::")):
                continue
            text.append(f"{str(m.get('level') or '').upper()} {event}".strip())
            for err in m.get("error_detail") or []:
                if isinstance(err, dict):
                    text.append(f"  {err.get('exc_type')}: {err.get('exc_value')}")
        return "\n".join(text[-lines:])

    def xcom(self, dag_id: str, run_id: str, task_id: str) -> object:
        r = self.api("GET", f"/dags/{dag_id}/dagRuns/{q(run_id)}/taskInstances/{task_id}/xcomEntries/return_value")
        r.raise_for_status()
        return r.json()["value"]


class AirflowDeployment(AirflowRest):
    """``extra_components`` maps a name to ``(airflow CLI args, extra env)``; they start after the core four are
    healthy and stop first.  ``procs`` holds the running ``Popen`` of every component by name."""

    def __init__(self, home: Path, config_path: Path, extra_env: dict[str, str] | None = None, *,
                 executor: str = "LocalExecutor", db_url: str | None = None,
                 extra_components: Mapping[str, tuple[Sequence[str], Mapping[str, str]]] | None = None):
        self.home = home
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
        self.env.update({
            "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "AIRFLOW__CORE__EXECUTOR": executor,
            "AIRFLOW__CORE__PARALLELISM": "4",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": db_url or f"sqlite:///{home}/airflow.db",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "passwords.json"),
            "AIRFLOW__API__HOST": "127.0.0.1", "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.base}/execution/",
            "AIRFLOW__API_AUTH__JWT_SECRET": "mindloom-e2e-" + "x" * 64,
            "AIRFLOW__API__SECRET_KEY": "mindloom-e2e-secret-key",
            "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_SERVER_PORT": str(free_port()),
            "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "True",
            "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_SERVER_HOST": "127.0.0.1",
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
            "AIRFLOW__TRIGGERER__TRIGGERER_LOG_SERVER_PORT": str(free_port()),
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
            "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "120",   # parsed at start; the config is fixed
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
            "MINDLOOM_CONFIG": str(config_path), "MINDLOOM_TRAIN_EXECUTOR": "",
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        })
        self.env.update(extra_env or {})
        self.commands: dict[str, tuple[list[str], dict[str, str]]] = {c: ([c], {}) for c in COMPONENTS}
        self.extra = list(extra_components or {})
        for name, (args, env) in (extra_components or {}).items():
            self.commands[name] = (list(args), dict(env))
        self.procs: dict[str, subprocess.Popen] = {}
        self.token = ""

    # -- lifecycle -------------------------------------------------------------------------------------------

    def airflow(self, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
        return subprocess.run([str(Path(sys.executable).parent / "airflow"), *args], env=self.env, timeout=timeout,
                              capture_output=True, text=True, stdin=subprocess.DEVNULL)

    def start(self, timeout: float = 240) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / "passwords.json").write_text(json.dumps({"admin": "admin"}))
        res = self.airflow("db", "migrate")
        if res.returncode:
            raise RuntimeError(f"airflow db migrate failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
        for c in COMPONENTS:
            self.start_component(c)
        deadline = time.time() + timeout
        while time.time() < deadline:
            self.check_alive()
            try:
                health = httpx.get(f"{self.base}/api/v2/monitor/health", timeout=5).json()
                if all(health.get(k, {}).get("status") == "healthy"
                       for k in ("metadatabase", "scheduler", "triggerer", "dag_processor")):
                    self.login()
                    for c in self.extra:
                        self.start_component(c)
                    return
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(2)
        raise TimeoutError(f"Airflow not healthy after {timeout} s\n{self.logs_tail()}")

    def start_component(self, name: str) -> subprocess.Popen:
        """Start (or start again, appending to its log) one component in its own session."""
        args, env = self.commands[name]
        with open(self.home / f"{name}.log", "ab") as log:
            self.procs[name] = subprocess.Popen([str(Path(sys.executable).parent / "airflow"), *args],
                                                env={**self.env, **env}, stdout=log, stderr=subprocess.STDOUT,
                                                stdin=subprocess.DEVNULL, start_new_session=True)
        return self.procs[name]

    def kill_component(self, name: str, sig: int = signal.SIGKILL, timeout: float = 40) -> int | None:
        """Signal a component's whole process group and wait for its main process; returns its exit code.

        Task processes and training jobs run in sessions of their own, so they outlive a killed worker (as on a
        real host): a test that kills a worker waits for or stops those itself."""
        proc = self.procs.pop(name)
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            return proc.wait(timeout=10)

    def check_alive(self) -> None:
        """Raise with the logs when a component has exited (a killed one is no longer in ``procs``)."""
        for c, p in self.procs.items():
            if p.poll() is not None:
                raise RuntimeError(f"airflow {c} exited with {p.returncode}\n{self.logs_tail()}")

    def stop(self) -> None:
        """SIGTERM every group (extra components such as workers first), SIGKILL what is left after 40 s."""
        extra = [self.procs[c] for c in self.extra if c in self.procs]
        core = [p for c, p in self.procs.items() if c not in self.extra]
        for group in (extra, core):
            for p in group:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
            deadline = time.time() + 40
            for p in group:
                try:
                    p.wait(timeout=max(deadline - time.time(), 1))
                except subprocess.TimeoutExpired:
                    pass
                try:
                    os.killpg(p.pid, signal.SIGKILL)    # leftovers of the group (the main process may be gone)
                except ProcessLookupError:
                    pass
                p.wait(timeout=10)

    def logs_tail(self, n: int = 2500) -> str:
        out = []
        for c in self.commands:
            f = self.home / f"{c}.log"
            if f.exists():
                out.append(f"--- {c} ---\n{f.read_text(errors='replace')[-n:]}")
        return "\n".join(out)

    # -- REST ------------------------------------------------------------------------------------------------



def q(run_id: str) -> str:
    return urllib.parse.quote(run_id, safe="")
