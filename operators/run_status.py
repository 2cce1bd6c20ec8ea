"""The "Run report" tab of a run whose report does not exist (yet): what state the run is in, and for a failed run
which stage failed, with its error, the last lines of its log inline and the log's address as text.

The address is text, not a link: the Airflow UI shows this page in a sandboxed iframe, and the sandbox blocks a
link that navigates the top window ("The frame attempting navigation of the top-level window is sandboxed").

Kept apart from the plugin so it can be rendered and tested without an api-server: :func:`status_page` takes plain rows
(``task_id``, ``state``, ``try_number``, ``map_index``, optional ``log_tail`` lines) and the run's stage folders.
Every value is escaped.
"""

from __future__ import annotations

import html
import urllib.parse
from pathlib import Path

from pipeline.report.html import CSS

EXTRA_CSS = ".bad{color:#a00}.warn{color:#a60}td{text-align:left}.logaddr code{user-select:all}"


def _error_of_stage(stage_dir: Path) -> str | None:
    """The training job's own error (``status.json``), if the task is a training stage with a folder."""
    from pipeline.io import read_json

    status = stage_dir / "status.json"
    if not status.exists():
        return None
    st = read_json(status)
    if st.get("state") not in ("FAILED", "LOST"):
        return None
    return f"{st.get('state')} at step {st.get('step')}: {st.get('error') or 'the process ended without a status'}"


def log_url(dag_id: str, run_id: str, task_id: str, try_number: int, map_index: int = -1) -> str:
    q = urllib.parse.quote
    url = f"/dags/{q(dag_id, safe='')}/runs/{q(run_id, safe='')}/tasks/{q(task_id, safe='')}"
    if map_index >= 0:
        url += f"/mapped/{map_index}"
    return f"{url}?try_number={try_number}"


def status_page(dag_id: str, run_id: str, run_state: str | None, run_name: str | None, tis: list[dict],
                stage_dirs: dict[str, Path]) -> str:
    """HTML for a run without a report: its state; for failures, each failed task with error and log link."""
    e = html.escape
    title = f"{dag_id}: {run_name or run_id}" + (f" ({run_id})" if run_name else "")
    body = [f"<h1>{e(title)}</h1>"]
    if run_state is None:
        body.append(f"<p class='warn'>There is no run {e(run_id)} of {e(dag_id)}.</p>")
    failed = [t for t in tis if t.get("state") == "failed"]
    if failed:
        body.append(f"<p class='bad'>The run is <b>{e(str(run_state))}</b>: {len(failed)} task(s) failed, so its "
                    f"report was not written. Clear the failed task to retry it; the report is written when the "
                    f"run's last task succeeds.</p><table><tr><th>task</th><th>try</th><th>error</th></tr>")
        for t in failed:
            stage = t["task_id"].removeprefix("train_")
            err = _error_of_stage(stage_dirs[stage]) if t["task_id"].startswith("train_") and stage in stage_dirs \
                else None
            body.append(f"<tr><td>{e(t['task_id'])}</td><td>{e(str(t.get('try_number')))}</td>"
                        f"<td>{e(err or 'see the task log below')}</td></tr>")
        body.append("</table>")
        for t in failed:
            url = log_url(dag_id, run_id, t["task_id"], int(t.get("try_number") or 1), int(t.get("map_index", -1)))
            tail = t.get("log_tail") or []
            body.append(f"<h3>Log of {e(t['task_id'])}, try {e(str(t.get('try_number')))}"
                        f"{f' (last {len(tail)} lines)' if tail else ''}</h3>"
                        f"<p class='logaddr'>Full log in the Airflow UI: <code>{e(url)}</code></p>"
                        + (f"<pre class='logtail'>{e(chr(10).join(tail))}</pre>" if tail else ""))
    elif run_state is not None:
        running = [t["task_id"] for t in tis if t.get("state") in ("running", "queued", "scheduled", "deferred",
                                                                    "up_for_retry")]
        body.append(f"<p>The run is <b>{e(str(run_state))}</b>. The report is written by its last task "
                    f"({e('report' if dag_id == 'pretrain' else 'publish')}) when the run succeeds.</p>")
        if running:
            body.append(f"<p>In progress: {e(', '.join(sorted(running)))}</p>")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{e(title)}</title>"
            f"<style>{CSS}{EXTRA_CSS}</style></head><body>{''.join(body)}</body></html>")
