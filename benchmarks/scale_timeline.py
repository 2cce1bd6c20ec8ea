"""The process-tree timeline of ``bench_scale.py``: what a measured command and each Airflow task instance cost.

What it measures: :func:`measured` runs one command (``airflow dags test``, ``mindloom corpus``, datatrove) and
samples its whole process tree every ``SAMPLE_S`` seconds (:class:`TreeTimeline`: tree RSS and cumulative CPU);
:func:`task_instances` reads the run's start/end per task instance from Airflow's SQLite database;
:func:`stage_rows` attributes the timeline to those intervals (:func:`attribute`: peak RSS inside the interval,
CPU growth interpolated at its ends), and :func:`profile_rows` sums the ``<run>/profile/`` files the tasks wrote
themselves.  Why apart: it is the measuring instrument, independent of how the corpus is built and which chain runs,
and also serves ``dag_vs_cli.py`` and ``bench_task_cost.py``; it keeps ``bench_scale.py`` under the project's ~400
lines.  It imports only ``common`` among the benchmark modules.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import sample_tree  # noqa: E402

SAMPLE_S = 0.2


class TreeTimeline(threading.Thread):
    """(time, tree RSS MB, tree CPU s) every ``SAMPLE_S`` seconds for ``pid`` and its descendants."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.pid, self.samples, self._cpu = pid, [], {}
        self.stop = threading.Event()

    def sample(self) -> None:
        rss = sample_tree(self.pid, self._cpu)
        if rss is not None:                  # None: the process is gone
            self.samples.append((time.time(), rss, sum(self._cpu.values())))

    def run(self) -> None:
        while not self.stop.wait(SAMPLE_S):
            self.sample()


def attribute(samples: list[tuple], start: float, end: float) -> dict:
    """Peak tree RSS, RSS at start and CPU growth over [start, end].

    The peak is taken over the samples inside the interval (the neighbouring tasks' samples stay out); a task shorter
    than one sampling period gets the larger of the two samples around it.  CPU: the growth of the cumulative tree
    CPU interpolated linearly at the start and at the end, so back-to-back tasks never count a CPU-second twice.
    """
    inside = [s for s in samples if start <= s[0] <= end]
    before = [s for s in samples if s[0] <= start][-1:] or samples[:1]
    after = [s for s in samples if s[0] >= end][:1] or samples[-1:]
    return {"peak_rss_mb": round(max(s[1] for s in inside or before + after), 1),
            "rss_start_mb": round(before[0][1], 1),
            "cpu_s": round(max(_cpu_at(samples, end) - _cpu_at(samples, start), 0.0), 2), "samples": len(inside)}


def _cpu_at(samples: list[tuple], t: float) -> float:
    """Cumulative tree CPU at time ``t``, linear between the samples around it (clamped at the ends)."""
    import bisect

    i = bisect.bisect_left(samples, (t,))
    if i <= 0:
        return samples[0][2]
    if i >= len(samples):
        return samples[-1][2]
    (t0, _, c0), (t1, _, c1) = samples[i - 1], samples[i]
    return c0 + (c1 - c0) * (t - t0) / (t1 - t0) if t1 > t0 else c1


def _ts(v) -> float | None:
    if v is None:
        return None
    d = dt.datetime.fromisoformat(str(v).replace("Z", "+00:00"))
    return (d if d.tzinfo else d.replace(tzinfo=dt.UTC)).timestamp()


def task_instances(db: Path, dag_id: str = "corpus_build") -> tuple[str, list[dict]]:
    con = sqlite3.connect(db)
    try:
        run_id = con.execute("SELECT run_id FROM dag_run WHERE dag_id=? ORDER BY id DESC LIMIT 1",
                             (dag_id,)).fetchone()[0]
        rows = con.execute("SELECT task_id, map_index, state, start_date, end_date, try_number FROM task_instance "
                           "WHERE dag_id=? AND run_id=? ORDER BY start_date", (dag_id, run_id)).fetchall()
    finally:
        con.close()
    return run_id, [{"task_id": r[0], "map_index": r[1], "state": r[2], "start": _ts(r[3]), "end": _ts(r[4]),
                     "try_number": r[5]} for r in rows]


def stage_rows(tis: list[dict], samples: list[tuple], corpus_mb: float) -> list[dict]:
    """One row per task_id (the DAG's stages, mapped instances summed), in order of first start."""
    by: dict[str, dict] = {}
    for ti in tis:
        if ti["start"] is None or ti["end"] is None:
            continue
        a = attribute(samples, ti["start"], ti["end"])
        st = by.setdefault(ti["task_id"], {"stage": ti["task_id"], "tasks": 0, "wall_s": 0.0, "cpu_s": 0.0,
                                           "peak_rss_mb": 0.0, "rss_start_mb": a["rss_start_mb"],
                                           "source": "external sampling"})
        st["tasks"] += 1
        st["wall_s"] = round(st["wall_s"] + ti["end"] - ti["start"], 2)
        st["cpu_s"] = round(st["cpu_s"] + a["cpu_s"], 2)
        st["peak_rss_mb"] = max(st["peak_rss_mb"], a["peak_rss_mb"])
        st["growth_mb"] = round(max(st.get("growth_mb", 0.0), a["peak_rss_mb"] - a["rss_start_mb"]), 1)
    for st in by.values():
        st["mb_per_cpu_s"] = round(corpus_mb / st["cpu_s"], 2) if st["cpu_s"] > 0 else None
    return list(by.values())


def profile_rows(rdir: Path, corpus_mb: float) -> list[dict]:
    """Per stage from ``<run>/profile/`` when the tasks wrote them (``pipeline.profile.measured``)."""
    base = rdir / "profile"
    out = []
    for d in sorted(base.glob("*")) if base.is_dir() else []:
        units = [json.loads(f.read_text()) for f in sorted(d.glob("*.json"))]
        if units:
            cpu = round(sum(u.get("cpu_s", 0) for u in units), 2)
            out.append({"stage": d.name, "tasks": len(units),
                        "wall_s": round(sum(u.get("wall_s", 0) for u in units), 2),
                        "cpu_s": cpu, "peak_rss_mb": max(u.get("peak_rss_mb", 0) for u in units),
                        "input_mb": round(sum(u.get("input_bytes", 0) for u in units) / 1e6, 2) or None,
                        "mb_per_cpu_s": round(corpus_mb / cpu, 2) if cpu > 0 else None, "source": "profile/"})
    return out


def measured(argv: list[str], *, log: Path, env: dict, timeout: float, cwd: Path) -> dict:
    """Run ``argv``; wall, CPU seconds and the 0.2 s timeline of its process tree.

    CPU is the larger of two lower bounds: ``RUSAGE_CHILDREN`` (exact for every process that was waited for, blind
    to the children of a forkserver or of any process that exits without reaping) and the sampled tree (sees every
    process, loses the last < 0.2 s of each).
    """
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, cwd=cwd)
        tl = TreeTimeline(proc.pid)
        tl.sample()
        tl.start()
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            rc = proc.wait() or 124
        tl.stop.set()
        tl.join()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    rusage = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    sampled = tl.samples[-1][2] if tl.samples else 0.0
    return {"rc": rc, "wall_s": round(time.perf_counter() - t0, 1), "cpu_s": round(max(rusage, sampled), 1),
            "cpu_s_rusage": round(rusage, 1), "cpu_s_sampled": round(sampled, 1),
            "peak_rss_mb": round(max((x[1] for x in tl.samples), default=0.0), 1), "samples": tl.samples}
