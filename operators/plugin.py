"""Airflow plugin: serve each run's HTML report and show it as a "Run report" tab on the DAG run page.

The api-server mounts a small FastAPI app at ``/mindloom``; the external view's ``href`` uses the UI's
``{DAG_ID}``/``{RUN_ID}`` placeholders, so every run of ``corpus_build``/``corpus_refresh``/``pretrain`` links to
its own report.

Airflow does not put plugin apps behind its auth manager, so every route here depends on Airflow's own check
(``requires_access_dag``: the UI's ``_token`` session cookie or an ``Authorization: Bearer`` token, and read access
to the DAG's runs): an anonymous browser request (``Accept: text/html``) is redirected to the login page and comes
back after it, other anonymous requests get 401, a bad token 403.  Only files named ``report.html`` inside the
deployment's ``data_root`` are ever served.  Every response carries ``Content-Security-Policy: sandbox`` without
``allow-same-origin``: whatever the Airflow UI's iframe allows, a report runs in an opaque origin and cannot read
the UI's cookies or call its API.  A corpus run folder is served only to the DAG whose run claimed it
(``owner.json``, :func:`pipeline.io.claim_run_dir`), so read access to ``corpus_build`` never serves a
``corpus_refresh`` report.  A run without a report gets a status page (which stage failed, its error, the last
lines of its log inline and the log's address as text) instead of a promise that will never be kept.
"""

from __future__ import annotations

from pathlib import Path

from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
from airflow.api_fastapi.core_api.security import requires_access_dag
from airflow.plugins_manager import AirflowPlugin
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from operators.param_errors import OneLineParamErrors

#: No scripts, no same-origin, no network: inline styles and data: images only; links may open the UI on click.
CSP = ("sandbox allow-popups allow-popups-to-escape-sandbox allow-top-navigation-by-user-activation; "
       "default-src 'none'; style-src 'unsafe-inline'; img-src data:; frame-ancestors 'self'")
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Cache-Control": "no-store"}
DAGS = ("corpus_build", "corpus_refresh", "pretrain")
LOG_TAIL_LINES = 25


def _data_root() -> Path:
    from operators.params import config_path
    from pipeline.config import load_config

    return Path(load_config(config_path()).data_root).resolve()


def report_path(dag_id: str, run_id: str) -> Path:
    from pipeline.io import safe_run_id

    if dag_id not in DAGS:
        raise HTTPException(status_code=404, detail="no reports for this DAG")
    data_root = _data_root()
    kind = "train" if dag_id == "pretrain" else "runs"
    try:
        path = (data_root / kind / safe_run_id(run_id) / "report.html").resolve()
    except ValueError:
        raise HTTPException(status_code=400, detail="bad run id") from None
    if data_root not in path.parents:
        raise HTTPException(status_code=400, detail="bad run id")
    return path


def _owned_by(dag_id: str, run_id: str, report: Path) -> bool:
    """A corpus run folder belongs to the DAG run that claimed it; ``train/`` holds only pretrain runs."""
    from pipeline.io import run_owner

    if dag_id == "pretrain":
        return True
    return run_owner(report.parent) == {"dag_id": dag_id, "run_id": run_id}


def _format_log(messages) -> list[str]:
    lines = []
    for m in messages:
        d = m.model_dump() if hasattr(m, "model_dump") else {"event": str(m)}
        event = str(d.get("event", ""))
        if event.startswith("::group::") or event.startswith("::endgroup::"):
            continue
        level = d.get("level")
        lines.append(f"{str(level).upper()} {event}" if level else event)
        for err in d.get("error_detail") or []:
            if isinstance(err, dict):
                lines.append(f"  {err.get('exc_type')}: {err.get('exc_value')}")
    return lines


def log_tail(ti, try_number: int, n: int = LOG_TAIL_LINES) -> list[str]:
    """The last ``n`` lines of a task instance's log, read by Airflow's own log reader (local file or log server)."""
    from airflow.utils.log.log_reader import TaskLogReader

    try:
        messages, _ = TaskLogReader().read_log_chunks(ti, try_number, {"download_logs": True})
        return _format_log(messages)[-n:]
    except Exception as exc:    # the page must still render when a log server is down; say why instead
        return [f"(the log could not be read here: {type(exc).__name__}: {exc})"]


def _run_rows(dag_id: str, run_id: str) -> tuple[str | None, str | None, list[dict]]:
    """(run state, run name from its conf, task instance rows) from the metadata DB."""
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        run = session.scalar(select(DagRun).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id))
        if run is None:
            return None, None, []
        tis = session.scalars(select(TaskInstance).where(TaskInstance.dag_id == dag_id,
                                                         TaskInstance.run_id == run_id)).all()
        rows = [{"task_id": t.task_id, "state": str(t.state.value if hasattr(t.state, "value") else t.state),
                 "try_number": t.try_number, "map_index": t.map_index} for t in tis]
        for t, row in zip(tis, rows, strict=True):
            if row["state"] == "failed":
                row["log_tail"] = log_tail(t, int(t.try_number or 1))
        name = (run.conf or {}).get("run_name")
        return str(run.state.value if hasattr(run.state, "value") else run.state), name, rows


app = FastAPI(title="mindloom reports")


@app.exception_handler(StarletteHTTPException)
async def _anonymous_to_login(request: Request, exc: StarletteHTTPException):
    """An anonymous page request goes to the login page (and back after it); API clients keep the 401."""
    if exc.status_code == 401 and "text/html" in request.headers.get("accept", ""):
        from airflow.api_fastapi.app import get_auth_manager

        back = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return RedirectResponse(get_auth_manager().get_url_login(next_url=back), status_code=303, headers=HEADERS)
    response = await http_exception_handler(request, exc)
    response.headers.update(HEADERS)
    return response


@app.get("/reports/{dag_id}/{run_id}", response_model=None,
         dependencies=[Depends(requires_access_dag("GET", DagAccessEntity.RUN))])
def get_report(dag_id: str, run_id: str) -> FileResponse | HTMLResponse:
    path = report_path(dag_id, run_id)
    owned = _owned_by(dag_id, run_id, path)
    if owned and path.is_file():
        return FileResponse(path, media_type="text/html", headers=HEADERS)
    from operators.run_status import status_page
    from pipeline.io import safe_run_id

    state, name, rows = _run_rows(dag_id, run_id)
    stage_root = _data_root() / "train" / safe_run_id(run_id)
    stage_dirs = {p.name: p for p in stage_root.iterdir() if p.is_dir()} \
        if dag_id == "pretrain" and stage_root.is_dir() else {}
    page = status_page(dag_id, run_id, state, name, rows, stage_dirs)
    return HTMLResponse(page, status_code=404 if state is None else 200, headers=HEADERS)


class MindloomPlugin(AirflowPlugin):
    name = "mindloom"
    fastapi_apps = [{"app": app, "url_prefix": "/mindloom", "name": "mindloom reports"}]
    fastapi_root_middlewares = [{"middleware": OneLineParamErrors, "args": [], "kwargs": {},
                                 "name": "mindloom: one-line answers to a bad trigger Param"}]
    external_views = [{"name": "Run report", "href": "/mindloom/reports/{DAG_ID}/{RUN_ID}",
                       "destination": "dag_run", "url_route": "mindloom_report"}]
