"""The parallelism sweep of ``bench_scale.py`` (issue 33): the smallest corpus at other ``parallelism`` values.

Why a module of its own: it is the one part of bench-scale that runs the chain again with changed settings
(``--sweep``) or takes single runs of earlier invocations (``--add-sweep``, ``--sweep-only``), apart from the main
runs that ``bench_scale.py`` times; it keeps that file under the project's ~400 lines.  Each point is
``scale_targets.sweep_point`` of a run; ``scale_targets.sweep_targets`` judges them.  ``sweep`` takes
``bench_scale.run_size`` as an argument, so this module never imports ``bench_scale``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

import scale_stats
import scale_targets


def sweep(first: dict, a: argparse.Namespace, run_size: Callable[[float, argparse.Namespace], dict]) -> list[dict]:
    """The smallest size at each parallelism of ``--sweep`` (one run each, no CLI) next to the main runs' own
    parallelism, plus earlier single runs or sweep points (``--add-sweep``) of the same size at other parallelisms,
    each naming its file: CPU against task instances."""
    points = {a.parallelism: scale_targets.sweep_point({**first, "parallelism": a.parallelism})}
    for path in a.add_sweep:
        doc = json.loads(path.read_text())
        for run in doc["runs"]:
            if run["size_gb"] == first["size_gb"] and run.get("parallelism") and run["parallelism"] != a.parallelism:
                points[run["parallelism"]] = scale_targets.sweep_point(run)
        for point in doc.get("sweep") or []:            # an earlier invocation's sweep points (same size)
            if point["size_gb"] == first["size_gb"] and point["parallelism"] != a.parallelism:
                points.setdefault(point["parallelism"], {**point, "from": str(path)})
    main_p, main_cli = a.parallelism, a.cli
    for p in [int(x) for x in a.sweep.split(",") if x.strip()]:
        if p not in points:
            a.parallelism, a.cli = p, False
            try:
                before = scale_stats.yardstick()        # as the main runs: the machine's speed around the run
                run = run_size(first["size_gb"], a)
                points[p] = scale_targets.sweep_point({**run, "yardstick": [before, scale_stats.yardstick()]})
            finally:
                a.parallelism, a.cli = main_p, main_cli
    return [points[p] for p in sorted(points)]


def merge_sweep(out: Path, files: list[Path], shipped: int) -> int:
    """``--sweep-only``: the sweep points of earlier single runs (one size, one parallelism each, same code) into an
    existing results file, which keeps its own runs; its targets are re-judged with the sweep's."""
    res = json.loads(out.read_text())
    points = {}
    for path in files:
        doc = json.loads(path.read_text())
        for run in doc["runs"]:
            points[run["parallelism"]] = {**scale_targets.sweep_point(run), "machine": doc["machine"]}
    res["sweep"] = [points[p] for p in sorted(points)]
    res["sweep_targets"] = scale_targets.sweep_targets(res["sweep"], shipped)
    names = {t["name"] for t in res["sweep_targets"]}
    res["targets"] = [t for t in res.get("targets", []) if t["name"] not in names
                      and not t["name"].startswith("parallelism_")] + res["sweep_targets"]
    res["sweep_files"] = [str(p) for p in files]
    out.write_text(json.dumps(res, indent=1, default=str) + "\n", encoding="utf-8")
    print("\n".join(f"{t['name']}: {t['value']} (target {t['op']} {t['target']}, met {t['met']}) {t['note']}"
                    for t in res["sweep_targets"]))
    return 0
