"""The benchmark headline block of docs/benchmarks.md, generated from ``benchmarks/results.json`` (never typed
by hand).

``run_all.py`` rewrites the text between ``<!-- bench:start -->`` and ``<!-- bench:end -->`` in docs/benchmarks.md
every time it saves results.json (a full run, ``--refresh`` or ``--report-only``), so the page cannot drift from
the measurements; ``tests/test_readme_figures.py`` checks that it did not and that every number in it is in
results.json.  Figures outside the block link to BENCHMARKS.md instead of repeating numbers.
"""

from __future__ import annotations

import re
from pathlib import Path

import report

START, END = "<!-- bench:start -->", "<!-- bench:end -->"
# the README's data-ablation table (make ablation), from the same results.json
ABL_START, ABL_END = "<!-- ablation:start -->", "<!-- ablation:end -->"


def _extractors(results: dict) -> list[str]:
    ex = (results.get("topics", {}).get("ingest", {}).get("results", {}).get("html_extractors.json") or {})
    tools = ex.get("extractors") or {}
    if not tools:
        return []
    cells = "; ".join(f"{name} F1 {v['f1']} at {v['ms_per_page']} ms per page" for name, v in tools.items())
    return ["", f"HTML main-content extraction, {ex.get('pages')} pages of `shared/corpora/web_html` scored against "
                f"each page's own main-content element: {cells}."]


def _memory_plan(results: dict) -> list[str]:
    """Plan vs measured per training layout, from the memory_plan topic's metrics."""
    by = {m["name"]: m for m in results.get("metrics", []) if m["topic"] == "memory_plan"}
    layouts = [n[len("memory_plan."):-len("_peak_error")] for n in by if n.endswith("_peak_error")]
    runs = results.get("topics", {}).get("memory_plan", {}).get("results", {}).get("memory_plan.json", {})
    order = [r["layout"] for r in runs.get("runs", [])]  # the script's order: floors, calibration, debug, 125m
    layouts.sort(key=lambda n: order.index(n) if n in order else len(order))
    if not layouts:
        return []
    rows = []
    for lay in layouts:
        def val(key, _lay=lay):
            m = by.get(f"memory_plan.{_lay}_{key}")
            return report.fmt(m["median"], m["unit"]) if m else "–"

        err = by[f"memory_plan.{lay}_peak_error"]
        rows.append([f"`{lay}`", val("exact_bytes"), val("predicted_mb"), val("peak_rss_mb"), val("peak_error"),
                     {True: "yes", False: "**no**", None: "–"}[err["met"]]])
    return ["", "Memory plan vs this CPU (peak RSS of the largest rank stands in for device memory; "
                "predicted = framework floor + plan):", "",
            *report.table(["Layout", "Plan bytes = allocated", "Predicted MB", "Peak RSS MB", "Error",
                           "Within 15 %"], rows)]


def _task_cost(results: dict) -> list[str]:
    """Issue 33's cost model: one mapped task per step, near-empty and 1 MB shard, warm and cold."""
    res = results.get("topics", {}).get("task_cost", {}).get("results", {}).get("task_cost.json") or {}
    tiny, big = res.get("cases", {}).get("tiny", {}), res.get("cases", {}).get("1mb", {})
    if not tiny.get("warm"):
        return []
    rows = [[f"`{step}`", *(f"{c.get(mode, {}).get(step, {}).get('cpu_s', '–')}" for mode in ("warm", "cold")
                            for c in (tiny, big))] for step in tiny["warm"]]
    return ["", f"Fixed cost of one mapped task (CPU-s of its process tree; `make bench` topic `task_cost`, "
                f"{big.get('domain', '')} text): *warm* in a process that ran tasks before (`airflow dags test`, "
                "`mindloom corpus`), *cold* in a fresh process per task (Celery, LocalExecutor; Airflow's own task "
                "start-up not included):", "",
            *report.table(["Mapped step", "warm, near-empty", f"warm, {res.get('mb', 1):g} MB",
                           "cold, near-empty", f"cold, {res.get('mb', 1):g} MB"], rows)]


def _sweep(results: dict) -> list[str]:
    """Issue 33's parallelism sweep from bench-scale: CPU of the whole dags test tree against task instances."""
    res = results.get("topics", {}).get("scale", {}).get("results", {}).get("scale.json") or {}
    points = res.get("sweep") or []
    if not points:
        return []
    same = points[0].get("outputs_sha256")
    rows = [[str(p["parallelism"]), str(p["task_instances"]), f"{p['cpu_s']}", f"{p['profile_cpu_s']}",
             f"{p['mb_per_cpu_s']}", f"{p['wall_s']}", f"{p.get('yardstick_cpu_s') or '–'}",
             "yes" if p.get("outputs_sha256") == same and p.get("outputs_sha256") else "**no**"] for p in points]
    return ["", f"`parallelism` sweep at {points[0]['size_gb']:g} GB ({points[0]['corpus_mb']} MB, "
                "`make bench-scale`, `airflow dags test corpus_build`, one run each): CPU-s of the whole process "
                "tree and of the task bodies (`profile/`); the rest is Airflow's own work per task instance. "
                "*Yardstick*: CPU-s of a fixed workload timed around the run (higher: the machine was slower):", "",
            *report.table(["parallelism", "task instances", "CPU-s", "in task bodies", "MB/CPU-s", "wall s",
                           "yardstick CPU-s", "same rows"], rows)]


def render_block(results: dict) -> str:
    """The block's markdown: the headline metrics table of BENCHMARKS.md plus the extractor comparison."""
    lines = [START, "<!-- Generated by benchmarks/run_all.py from benchmarks/results.json; do not edit. -->", "",
             f"Last `make bench` run started {results.get('started', '?')} (mode {results.get('mode', '?')}); "
             "ratios are mindloom ÷ peer (> 1: mindloom faster), *Met* compares the median with the issue's target "
             "(the worst run where every run must meet it: peak memory, dedup recall). "
             "Every figure, its runs and its notes: [BENCHMARKS.md](../BENCHMARKS.md).", "",
             report.headline(results), *_extractors(results), *_memory_plan(results), *_task_cost(results),
             *_sweep(results), "", END]
    return "\n".join(lines)


def render_ablation(results: dict) -> str:
    """The README's table: the ablation report's own table (each difference with its interval, verdict and both
    arms' token shares and epochs), from the one copy of its figures, ``results/ablation.json``."""
    import ablation

    res = results.get("topics", {}).get("ablation", {}).get("results", {}).get("ablation.json", {})
    lines = [ABL_START,
             "<!-- Generated by benchmarks/run_all.py from benchmarks/results/ablation.json; do not edit. -->", ""]
    return "\n".join([*lines, ablation.markdown(res).rstrip("\n"), "", ABL_END])


def update_readme(readme: Path, results: dict, start: str = START, end: str = END, render=render_block) -> bool:
    """Replace the block in ``readme`` (which must hold exactly one); True when the file changed."""
    text = readme.read_text(encoding="utf-8")
    if text.count(start) != 1 or text.count(end) != 1:
        raise ValueError(f"{readme}: expected one {start} … {end} block")
    new = re.sub(re.escape(start) + r".*?" + re.escape(end), lambda _: render(results), text, flags=re.S)
    if new != text:
        readme.write_text(new, encoding="utf-8")
    return new != text
