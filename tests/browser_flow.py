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


#: Form titles and sections of the Params that do not come from the config (operators/params.py).
EXTRA_FIELDS = {"corpus_run": ("Corpus", "Corpus run"), "fail_at_step": ("Testing", "Fail at step"),
                "fail_stage": ("Testing", "Stage that fails"),
                "fail_for_good": ("Testing", "Fail every automatic try")}


def form_field(dialog, page, dag_id: str, name: str, opened: list[str]):
    """The input of Param ``name`` in the trigger dialog, after opening its section (one section is open at a
    time; ``opened`` remembers which)."""
    from pipeline.form import FORMS

    kind = "train" if dag_id == "pretrain" else "corpus"
    section = next((sec for sec, names in FORMS[kind].items() if name in names), None)
    title = name.replace("_", " ").capitalize()
    if section is None:
        section, title = EXTRA_FIELDS[name]
    if opened[-1:] != [section]:
        dialog.get_by_role("button", name=section, exact=True).click()
        page.wait_for_timeout(400)
        opened.append(section)
    return dialog.locator("[data-scope=field][data-part=root]",
                          has=page.get_by_text(re.compile(r"^" + re.escape(title) + r"\s*\*?$"))).first


def fill_form(dialog, page, dag_id: str, fields: dict) -> None:
    """Fill Params (name → text, or bool for switches) in the open trigger dialog."""
    opened: list[str] = []
    for name, value in fields.items():
        root = form_field(dialog, page, dag_id, name, opened)
        field = root.locator("input").first
        if isinstance(value, bool):
            if field.is_checked() != value:
                root.locator("label").last.click()
        else:
            field.fill(str(value))
            field.press("Tab")


def open_trigger_form(page, base: str, dag_id: str):
    page.goto(f"{base}/dags/{dag_id}")
    page.get_by_role("button", name="Trigger").first.click()
    dialog = page.get_by_role("dialog")
    dialog.get_by_role("button", name="Trigger").wait_for(timeout=60_000)
    return dialog


def submit_trigger_form(page, dialog, dag_id: str) -> str:
    dialog.get_by_role("button", name="Trigger").click()
    page.wait_for_url(f"**/dags/{dag_id}/runs/**", timeout=60_000)
    return urllib.parse.unquote(page.url.split("/runs/", 1)[1].split("?")[0].split("/")[0])


def park(page) -> None:
    """Leave the tab on a blank page while the test waits on REST: a live run page re-renders its grid every few
    seconds, CPU spent on nothing the test reads (docs/testing.md, Duration)."""
    page.goto("about:blank")


def trigger_from_form(base: str, dag_id: str, fields: dict, shots: Path | None = None) -> str:
    """Log in, open the DAG's trigger form, fill ``fields`` (param name → value), trigger; return the run id."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = open_browser(p)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        _login(page, base)
        dialog = open_trigger_form(page, base, dag_id)
        fill_form(dialog, page, dag_id, fields)
        if shots:
            dialog.screenshot(path=str(shots / f"{dag_id}_trigger_form.png"))
        run_id = submit_trigger_form(page, dialog, dag_id)
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
