"""Airflow plugin: serve each run's HTML report and show it as a "Run report" tab on the DAG run page.

The api-server mounts a small FastAPI app at ``/mindloom``; the external view's ``href`` uses the UI's
``{DAG_ID}``/``{RUN_ID}`` placeholders, so every run of ``corpus_build``/``corpus_refresh``/``pretrain`` links to
its own report.  Only files named ``report.html`` inside the configured ``data_root`` are ever served.
"""

from __future__ import annotations

from pathlib import Path

from airflow.plugins_manager import AirflowPlugin
from fastapi import FastAPI, HTTPException
from fastapi.responses import FileResponse, HTMLResponse


def report_path(dag_id: str, run_id: str) -> Path:
    from operators.params import config_path
    from pipeline.config import load_config
    from pipeline.io import safe_run_id

    data_root = Path(load_config(config_path()).data_root).resolve()
    kind = "train" if dag_id == "pretrain" else "runs"
    path = (data_root / kind / safe_run_id(run_id) / "report.html").resolve()
    if data_root not in path.parents:
        raise HTTPException(status_code=400, detail="bad run id")
    return path


app = FastAPI(title="mindloom reports")


@app.get("/reports/{dag_id}/{run_id}", response_model=None)
def get_report(dag_id: str, run_id: str) -> FileResponse | HTMLResponse:
    path = report_path(dag_id, run_id)
    if not path.exists():
        return HTMLResponse(f"<p>No report yet for {dag_id} / {run_id}: it is written by the run's last task.</p>",
                            status_code=404)
    return FileResponse(path, media_type="text/html")


class MindloomPlugin(AirflowPlugin):
    name = "mindloom"
    fastapi_apps = [{"app": app, "url_prefix": "/mindloom", "name": "mindloom reports"}]
    external_views = [{"name": "Run report", "href": "/mindloom/reports/{DAG_ID}/{RUN_ID}",
                       "destination": "dag_run", "url_route": "mindloom_report"}]
