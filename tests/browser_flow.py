"""Drive the Airflow UI in headless Debian Chromium with Playwright: log in, fill the trigger form, read the run.

Used by the live test and by ``scripts/screenshots.py`` (README screenshots).  Chromium runs with the flags that
keep it off the network (this machine reaches only package registries).
"""

from __future__ import annotations

import re
import urllib.parse
from pathlib import Path

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _login(page, base: str, user: str = "admin", password: str = "admin") -> None:
    page.goto(base + "/")
    page.wait_for_selector("input[name=username]", timeout=60_000)
    page.fill("input[name=username]", user)
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")
    page.wait_for_url(base + "/", timeout=60_000)


def open_browser(p):
    return p.chromium.launch(executable_path="/usr/bin/chromium", headless=True, args=CHROMIUM_ARGS)


def trigger_from_form(base: str, dag_id: str, fields: dict[str, str], shots: Path | None = None) -> str:
    """Log in, open the DAG's trigger form, fill ``fields`` (param name → text), trigger; return the run id."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = open_browser(p)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        _login(page, base)
        page.goto(f"{base}/dags/{dag_id}")
        page.get_by_role("button", name="Trigger").first.click()
        dialog = page.get_by_role("dialog")
        for name, value in fields.items():
            dialog.locator(f"#element_{name}, [name=element_{name}]").first.fill(value)
        if shots:
            dialog.screenshot(path=str(shots / f"{dag_id}_trigger_form.png"))
        dialog.get_by_role("button", name="Trigger").click()
        page.wait_for_url(f"**/dags/{dag_id}/runs/**", timeout=60_000)
        run_id = urllib.parse.unquote(page.url.split("/runs/", 1)[1].split("?")[0].split("/")[0])
        browser.close()
        return run_id


def capture_run(base: str, dag_id: str, run_id: str, shots: Path) -> dict[str, Path]:
    """Screenshots of a finished run: its graph and the mindloom "Run report" tab; returns the files."""
    from playwright.sync_api import sync_playwright

    out = {}
    run_url = f"{base}/dags/{dag_id}/runs/{urllib.parse.quote(run_id, safe='')}"
    with sync_playwright() as p:
        browser = open_browser(p)
        page = browser.new_page(viewport={"width": 1500, "height": 1000})
        _login(page, base)
        page.goto(run_url)
        page.get_by_role("button", name="Show Graph (Press g)").click()
        collapse = page.get_by_role("button", name="Collapse Details Panel")
        if collapse.count():
            collapse.first.click()                      # give the graph the whole width
        expand = page.get_by_role("button", name="Expand all task groups")
        if expand.count() and expand.is_enabled():      # DAGs without task groups have nothing to expand
            expand.click()
        page.wait_for_timeout(4000)
        out["graph"] = shots / f"{dag_id}_run_graph.png"
        page.screenshot(path=str(out["graph"]))
        page.get_by_role("button", name="Show Grid (Press g)").click()
        if not page.get_by_text("Run report", exact=True).count():        # the details panel was collapsed above
            page.get_by_role("button", name=re.compile("Details Panel")).first.click()
        page.get_by_text("Run report", exact=True).first.click()
        page.wait_for_timeout(4000)
        out["report"] = shots / f"{dag_id}_run_report.png"
        page.screenshot(path=str(out["report"]))
        out["report_text"] = "".join(f.content() for f in page.frames[1:])
        browser.close()
    return out
