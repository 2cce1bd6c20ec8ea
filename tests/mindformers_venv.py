"""The mindformers client venv the export tests run mindformers in: mindspore 2.9.0 + mindformers 1.9.0.

Why a venv of its own: mindformers 1.9.0 is the newest release that installs from PyPI and runs on CPU, and it needs
mindspore ~=2.9 while mindloom trains with 2.10 (``/work/shared/notes/mindformers.md``). Every package is installed
with ``--no-deps`` from ``tests/fixtures/mindformers-venv.txt`` (exact pins, frozen once from mindformers'
requirements), so the venv is the same on every machine. It lives under ``.cache/client-venvs/`` like the benchmark
peers' venvs and is rebuilt only when the pins change; the first build downloads mindspore (~0.4 GB).
"""

from __future__ import annotations

import fcntl
import hashlib
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PINS = REPO / "tests" / "fixtures" / "mindformers-venv.txt"
MINDFORMERS = "mindformers==1.9.0"
VENVS = REPO / ".cache" / "client-venvs"
VENV = VENVS / "mindformers"
PROBE = "import mindspore, mindformers; from mindformers import LlamaForCausalLM, LlamaConfig, MindFormerConfig"


def python() -> Path:
    return VENV / "bin" / "python"


def _stamp() -> str:
    return hashlib.sha256(PINS.read_bytes() + MINDFORMERS.encode()).hexdigest()[:16]


def _imports() -> bool:
    return python().exists() and subprocess.run([str(python()), "-c", PROBE], capture_output=True, cwd=VENVS,
                                                timeout=600).returncode == 0   # mindformers logs to ./output


def _ready() -> bool:
    stamp = VENV / ".mindloom-stamp"
    return stamp.exists() and stamp.read_text().strip() == _stamp() and _imports()


def ensure() -> tuple[Path | None, str]:
    """(python of the venv, how it was obtained or why it failed); builds it when missing or stale."""
    VENVS.mkdir(parents=True, exist_ok=True)
    with open(VENVS / "mindformers.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)              # one build at a time (parallel test processes)
        if _ready():
            return python(), "present"
        log = VENVS / "mindformers.log"
        start = time.time()
        with open(log, "ab") as fh:
            fh.write(f"\n== build {time.strftime('%Y-%m-%dT%H:%M:%S')} ({_stamp()})\n".encode())
            fh.flush()
            # --no-compile: the client imports a small part of what it installs, and Python compiles that part on
            # first import; byte-compiling every installed file (mindspore alone has thousands) is CPU the suite
            # spends inside a test
            pip = [str(python()), "-m", "pip", "install", "-q", "--no-deps", "--no-compile"]
            steps = [[sys.executable, "-m", "venv", "--clear", str(VENV)], [*pip, "-r", str(PINS)],
                     [*pip, MINDFORMERS]]
            for argv in steps:
                rc = subprocess.run(argv, stdout=fh, stderr=fh).returncode
                if rc:
                    return None, f"building the mindformers venv failed at `{' '.join(argv[-3:])}` (see {log})"
        if not _imports():
            return None, f"the mindformers venv was built but `{PROBE}` fails in it (see {log})"
        (VENV / ".mindloom-stamp").write_text(_stamp() + "\n")
        took = time.time() - start
        with open(log, "a") as fh:
            fh.write(f"built in {took:.0f} s\n")
        return python(), f"built in {took:.0f} s"
