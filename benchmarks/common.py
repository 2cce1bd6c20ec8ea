"""Shared machinery of the benchmark suite: machine description, measured subprocesses, peer venvs, staging.

Why these live together: ``run_all.py`` (every topic), ``scaling.py`` (the data chain at 1×..8×) and
``ablation.py`` (training on raw vs curated data) all have to describe the machine the same way, measure peak
memory of whole process trees the same way (benchmarks spawn workers, so a parent's ``ru_maxrss`` says little), and
write into the one ``benchmarks/results.json`` from which ``BENCHMARKS.md`` is regenerated.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS_DIR = REPO / "benchmarks" / "results"
RESULTS_JSON = REPO / "benchmarks" / "results.json"
BENCHMARKS_MD = REPO / "BENCHMARKS.md"
VENVS = REPO / ".cache" / "bench-venvs"
SHARED_CORPORA = REPO.parent / "shared" / "corpora"
DEMO_CORPUS = REPO / "data" / "demo-corpus"

# Peer environments, one venv each, never the project's. ``probe`` must import for the venv to count as installed.
# datatrove and rensa: bench_minhash.py's peers, whose venvs minhash_peers.ensure_venv re-creates when their stamp
# differs from these pins (so ensure_peer writes that stamp); datatrove also gets lxml_html_clean, without which its
# Trafilatura step fails on every page (bench_ingest.py).
PEERS: dict[str, dict] = {
    "datatrove": {"pins": ["datatrove[processing]==0.10.1", "spacy==3.8.18", "pyarrow==25.0.1"],
                  # aiohttp/requests/orjson: datatrove's LanguageFilter and JsonlReader (the scale suite's peer run)
                  "extra": ["lxml_html_clean==0.4.6", "aiohttp", "requests", "orjson"],
                  "probe": "import datatrove, spacy, pyarrow, lxml_html_clean, aiohttp, requests, orjson"},
    "rensa": {"pins": ["rensa==0.5.0", "numpy==1.26.4", "pyarrow==25.0.1"], "extra": [], "probe": "import rensa"},
    "datasketch": {"pins": ["datasketch==2.0.0", "numpy==1.26.4"], "extra": [], "probe": "import datasketch"},
    # PyTorch CPU from the local wheel (pip finds torch==2.13.0 on this disk); a .pth adds the project venv's
    # packages so bench_train.py can build the MindSpore model beside the PyTorch one in one process.
    "torch": {"pins": ["torch==2.13.0", "numpy==1.26.4"], "extra": [], "probe": "import torch, mindspore",
              "pth": True},
}


# ------------------------------------------------------------------------------------------------------------
# Machine and statistics


def machine() -> dict:
    """CPU model, cores, RAM, load average now (the 'at start' figure when called first), Python, OS, UTC time."""
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                   if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    ram_gb = None
    try:
        kb = next(int(ln.split()[1]) for ln in Path("/proc/meminfo").read_text().splitlines()
                  if ln.startswith("MemTotal:"))
        ram_gb = round(kb / 2**20, 1)
    except (OSError, StopIteration):
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "ram_gb": ram_gb,
            "load_avg_start": [round(x, 2) for x in os.getloadavg()], "python": platform.python_version(),
            "os": platform.platform(), "date": now()}


def now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def spread(values: list[float], digits: int = 4) -> dict:
    """min / median / max / runs of finite values (empty when none)."""
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not vals:
        return {"min": None, "median": None, "max": None, "runs": []}
    return {"min": round(min(vals), digits), "median": round(statistics.median(vals), digits),
            "max": round(max(vals), digits), "runs": [round(v, digits) for v in vals]}


def loglog_slope(xs: list[float], ys: list[float]) -> float | None:
    """Least-squares slope of log(y) on log(x): the cost-growth exponent (1 = linear)."""
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys, strict=True) if x > 0 and y and y > 0]
    if len(pts) < 2:
        return None
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    den = sum((p[0] - mx) ** 2 for p in pts)
    return round(sum((p[0] - mx) * (p[1] - my) for p in pts) / den, 3) if den else None


# ------------------------------------------------------------------------------------------------------------
# Memory of process trees


def _tree(pid: int) -> list:
    import psutil

    try:
        proc = psutil.Process(pid)
        return [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return []


def sample_tree(pid: int, cpu: dict | None = None) -> float | None:
    """Resident MB of ``pid`` and all its descendants, None when ``pid`` is gone.  With ``cpu``, each process's
    user + system seconds also go into it, keyed by (pid, create time), so a process that exits keeps its last
    sample there.  (PeakSampler, tree_rss_mb and scale_timeline's TreeTimeline all sample through this.)"""
    import psutil

    from pipeline.profile import unexeced_children

    procs = _tree(pid)
    if not procs:
        return None
    total = 0
    skip = unexeced_children([p.pid for p in procs])     # a child before exec reports its parent's memory
    for p in procs:
        try:
            total += p.memory_info().rss if p.pid not in skip else 0
            if cpu is not None:
                t = p.cpu_times()
                cpu[(p.pid, p.create_time())] = t.user + t.system
        except psutil.Error:
            pass
    return total / 2**20


def tree_rss_mb(pid: int) -> float:
    return sample_tree(pid) or 0.0


class PeakSampler:
    """Peak resident memory and CPU seconds of a process and all its descendants, sampled every ``interval`` s.

    Sampling the sum over the tree is what a machine running the job has to provide; the process's own exact
    high-water mark (``VmHWM``, reset through ``/proc/self/clear_refs`` when ``reset_self``) is folded in so that
    a short spike in this process between two samples still counts.  CPU seconds (user + system, every process of
    the tree, from its last sample) are what a busy machine disturbs least: pool workers forked by a forkserver
    never show up in this process's ``RUSAGE_CHILDREN``, so they are read from the tree too.
    """

    def __init__(self, pid: int | None = None, interval: float = 0.05, reset_self: bool = False):
        self.pid, self.interval, self.reset_self = pid or os.getpid(), interval, reset_self
        self.peak_mb = 0.0
        self._cpu: dict[tuple, float] = {}
        self._cpu0: dict[tuple, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        self.peak_mb = max(self.peak_mb, sample_tree(self.pid, self._cpu) or 0.0)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.interval)

    @property
    def cpu_s(self) -> float:
        return round(sum(v - self._cpu0.get(k, 0.0) for k, v in self._cpu.items()), 2)

    def __enter__(self) -> PeakSampler:
        if self.reset_self and self.pid == os.getpid():
            try:
                Path("/proc/self/clear_refs").write_text("5")
            except OSError:
                pass
        self._sample()
        self._cpu0 = dict(self._cpu)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()
        if self.pid == os.getpid():
            self.peak_mb = max(self.peak_mb, self_hwm_mb())
        self.peak_mb = round(self.peak_mb, 1)


def self_hwm_mb() -> float:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_measured(argv: list[str], *, cwd: Path, log: Path, timeout: float, env: dict | None = None) -> dict:
    """Run a command with its output in ``log``; wall seconds, CPU seconds of the tree, peak tree RSS, rc."""
    import resource

    log.parent.mkdir(parents=True, exist_ok=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    with open(log, "ab") as out:
        out.write(f"\n$ {' '.join(argv)}   (cwd {cwd}, {now()})\n".encode())
        out.flush()
        proc = subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env={**os.environ, **(env or {})}, start_new_session=True)
        with PeakSampler(proc.pid, interval=0.1) as peak:
            try:
                rc = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                rc = proc.wait()
                out.write(f"\n[run_all] killed after {timeout} s\n".encode())
                rc = rc if rc else 124
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"rc": rc, "wall_s": round(time.perf_counter() - t0, 2), "cpu_s": round(cpu, 2),
            "peak_rss_mb": peak.peak_mb}


def launch_train_job(job, out: str, workers: int, timeout: float, env: dict | None = None) -> float:
    """Write ``job`` (a ``TrainJob``) to ``<out>.json`` and run it through the training launcher (logs in
    ``<out>_log``, a free master port, ``env`` over this process's environment); its wall seconds.  A failed run
    raises with the tail of its stderr."""
    import socket

    from pipeline.train.jobs.launch import env_with_venv, train_command

    path = out + ".json"
    job.to_json(path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = train_command(path, workers=workers, log_dir=out + "_log", master_port=port, cluster_timeout_s=300)
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True, env={**env_with_venv(), **(env or {})}, cwd=REPO,
                       timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"{job.stage}: rc {r.returncode}: {r.stderr[-1500:]}")
    return time.time() - t0


def tail(path: Path, n: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


# ------------------------------------------------------------------------------------------------------------
# Peer virtual environments


def peer_python(name: str) -> Path:
    return VENVS / name / "bin" / "python"


def peer_ready(name: str) -> bool:
    py = peer_python(name)
    return py.exists() and subprocess.run([str(py), "-c", PEERS[name]["probe"]], capture_output=True,
                                          timeout=300).returncode == 0


def ensure_peer(name: str, install: bool = True) -> tuple[Path | None, str]:
    """(python of the peer venv, status); installs it with its pins when missing and ``install``."""
    spec = PEERS[name]
    venv, py = VENVS / name, peer_python(name)
    if peer_ready(name):
        status = "present"
    elif not install:
        return None, f"{venv} absent or incomplete (run `make bench` to install it)"
    else:
        log = VENVS / f"{name}.log"
        VENVS.mkdir(parents=True, exist_ok=True)
        print(f"[run_all] installing peer {name}: {' '.join(spec['pins'] + spec['extra'])} -> {venv}", flush=True)
        with open(log, "ab") as fh:
            if not py.exists():
                subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, stdout=fh, stderr=fh)
            if spec.get("pth"):                      # numpy from the project first: same numpy as MindSpore
                site = next((venv / "lib").glob("python3*/site-packages"))
                project_site = next((REPO / ".venv" / "lib").glob("python3*/site-packages"))
                (site / "zz-mindloom-project.pth").write_text(f"{project_site}\n")
            rc = subprocess.run([str(py), "-m", "pip", "install", "-q", *spec["pins"], *spec["extra"]],
                                stdout=fh, stderr=fh).returncode
        if rc != 0 or not peer_ready(name):
            return None, f"installing {name} failed (see {log})"
        status = "installed"
    return py, status


def peer(name: str) -> Path:
    """The peer venv's python, installed when missing: for a script that cannot run without it."""
    py, status = ensure_peer(name)
    if py is None:
        raise RuntimeError(f"peer venv {name}: {status}")
    return py


# ------------------------------------------------------------------------------------------------------------
# Inputs: a staged copy of the repository (so quick runs never overwrite benchmarks/results) and a tiny corpus


STAGE_LINKS = ("pipeline", "configs", ".venv", "data")


def stage_tree(work: Path, corpus: Path) -> Path:
    """A repository look-alike under ``work``: copies of the topic scripts (they locate the repository from their
    own resolved path), links to the code, venvs and ``data``, and ``<work>/shared/corpora`` -> ``corpus``.

    The topic scripts then read ``corpus`` as "the shared corpora" and write their results into
    ``<work>/repo/benchmarks/results`` instead of the repository's.
    """
    repo = work / "repo"
    (repo / "benchmarks" / "results").mkdir(parents=True, exist_ok=True)
    for script in (REPO / "benchmarks").glob("*.py"):
        shutil.copy2(script, repo / "benchmarks" / script.name)
    for name in STAGE_LINKS:
        link = repo / name
        if not link.exists() and (REPO / name).exists():
            link.symlink_to(REPO / name)
    (repo / ".cache").mkdir(exist_ok=True)
    if not (repo / ".cache" / "bench-venvs").exists():
        VENVS.mkdir(parents=True, exist_ok=True)
        (repo / ".cache" / "bench-venvs").symlink_to(VENVS)
    (work / "shared").mkdir(exist_ok=True)
    link = work / "shared" / "corpora"
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(corpus.resolve())
    return repo


def source_corpus() -> Path | None:
    """The shared sample corpus when present, else the demo corpus (``make corpus``), else None."""
    if SHARED_CORPORA.is_dir() and any(SHARED_CORPORA.glob("*.jsonl")):
        return SHARED_CORPORA
    if (DEMO_CORPUS / ".built").exists():     # not a demo corpus still being written (make corpus touches it last)
        return DEMO_CORPUS
    return None


def tiny_corpus(out: Path, src: Path, per_domain_bytes: int = 150_000, warc_records: int = 24) -> Path:
    """The first documents of each ``<domain>.jsonl`` of ``src`` up to ``per_domain_bytes`` of text (at least 4),
    and the first ``warc_records`` records of its ``web.warc.gz`` when it has one: the same kinds of input as the
    full benchmark, small enough for a smoke run."""
    out.mkdir(parents=True, exist_ok=True)
    for f in sorted(src.glob("*.jsonl")):
        lines, size = [], 0
        with open(f, encoding="utf-8") as fh:
            for line in fh:
                if size >= per_domain_bytes and len(lines) >= 4:
                    break
                lines.append(line)
                size += len(json.loads(line).get("text", "").encode("utf-8"))
        (out / f.name).write_text("".join(lines), encoding="utf-8")
    if (src / "web.warc.gz").exists():
        from warcio.archiveiterator import ArchiveIterator
        from warcio.warcwriter import WARCWriter

        with open(src / "web.warc.gz", "rb") as fin, open(out / "web.warc.gz", "wb") as fout:
            writer, n = WARCWriter(fout, gzip=True), 0
            for record in ArchiveIterator(fin):
                writer.write_record(record)
                n += record.rec_type == "response"
                if n >= warc_records:
                    break
    return out


# ------------------------------------------------------------------------------------------------------------
# results.json on disk: each topic names its results files; their content lives once, in results/<file>

#: Keys of a topic record whose value is ``{file: content}`` of files under ``results/``; on disk only the names.
FILE_KEYS = ("results", "reference")


def read_results(path: Path) -> dict:
    """``results.json`` with every topic's results files read back in (``rec["results"] = {file: content}``)."""
    results = json.loads(path.read_text(encoding="utf-8"))
    folder = path.parent / "results"
    for name, rec in results.get("topics", {}).items():
        for key in FILE_KEYS:
            files = rec.pop(f"{key}_files", None)
            if files is None:
                continue
            missing = [f for f in files if not (folder / f).is_file()]
            if missing:
                raise FileNotFoundError(f"{path}: topic {name!r} names {key} file {folder / missing[0]}, which is "
                                        f"missing (re-run the topic, or restore the file)")
            rec[key] = {f: json.loads((folder / f).read_text(encoding="utf-8")) for f in files}
    return results


def results_on_disk(results: dict, path: Path) -> dict:
    """What ``results.json`` at ``path`` holds: each topic's results files by name only. A file not yet under
    ``<path's folder>/results`` (a quick run's own folder), or different there, is written there first, so the
    names always resolve to the content the record was made from."""
    folder = path.parent / "results"
    out = {k: v for k, v in results.items() if k != "topics"}
    out["topics"] = {}
    for name, rec in results.get("topics", {}).items():
        rec = dict(rec)
        for key in FILE_KEYS:
            if key not in rec:
                continue
            files = rec.pop(key) or {}
            for f, content in files.items():
                if not (folder / f).is_file() or json.loads((folder / f).read_text(encoding="utf-8")) != content:
                    folder.mkdir(parents=True, exist_ok=True)
                    (folder / f).write_text(json.dumps(content, indent=1, ensure_ascii=False) + "\n",
                                            encoding="utf-8")
            rec[f"{key}_files"] = sorted(files)
        out["topics"][name] = rec
    return out


# ------------------------------------------------------------------------------------------------------------
# results.json entries and Markdown tables (used by topics, scaling, ablation and report alike)

ISSUE = {"ingest": 3, "filters": 4, "minhash": 5, "datasketch": 5, "tokenize": 6, "mindrecord": 6, "train": 7,
         "scaling": 10, "ablation": 10, "parallel": 15, "scale": 13, "memory_plan": 22, "task_cost": 33,
         "quality_kernels": 34, "cluster_graph": 49}


def last_result(runs: list[dict], file: str) -> dict:
    """The results file ``file`` of a topic's last run (empty before its first run or when that run wrote none)."""
    return runs[-1].get(file, {}) if runs else {}


def of_last_run(file: str):
    """Decorator: ``fn(res)``, the metrics of one results file, becomes a topic's ``metrics(runs)``: it reads
    ``file`` of the last run, and a topic with no such file yet has no metrics."""
    def wrap(fn):
        @functools.wraps(fn)
        def metrics(runs: list[dict]) -> list[dict]:
            res = last_result(runs, file)
            return fn(res) if res else []
        return metrics
    return wrap


def metric(topic: str, name: str, unit: str, values: list, *, compared: str | None = None, target: float | None = None,
           op: str = ">=", issue: int | None = None, note: str = "", headline: bool = False,
           worst: bool = False) -> dict:
    """One results.json entry; ``met`` compares the median with the target (None when there is no target), or with
    ``worst``, the worst run (unrounded), for a target every run must meet (a memory ceiling, a recall of 1)."""
    s = spread([v for v in values if v is not None])
    met = None
    if target is not None and s["median"] is not None:
        raw = [float(v) for v in values if v is not None and math.isfinite(float(v))]
        judged = (max(raw) if op in ("<", "<=") else min(raw)) if worst else s["median"]
        met = {">=": judged >= target, "<": judged < target, "<=": judged <= target}[op]
    sym = {">=": "≥", "<": "<", "<=": "≤"}[op]
    return {"name": f"{topic}.{name}", "topic": topic, "unit": unit, "median": s["median"], "min": s["min"],
            "max": s["max"], "runs": s["runs"], "compared": compared,
            "target": None if target is None else (f"{sym} {100 * target:g} %" if unit == "share" else
                                                   f"{sym} {target:g}{'×' if unit == '×' else ''}"),
            "target_value": target, "target_op": op if target is not None else None,
            "issue": issue if issue is not None else ISSUE[topic], "met": met, "note": note,
            "headline": headline or target is not None, **({"judged": "worst run"} if worst else {})}


def table(headers: list[str], rows: list[list]) -> list[str]:
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join("–" if c is None else str(c) for c in r) + " |" for r in rows]
    return out
