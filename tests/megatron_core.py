"""megatron-core's own reader for the Megatron sink test: the ``megatron-core`` wheel, unpacked without its
dependencies into ``.cache/client-venvs/megatron-core/`` and imported by the main venv's Python (which has the lock's
PyTorch CPU). ``IndexedDataset`` needs only torch and numpy of what megatron-core depends on."""

from __future__ import annotations

import fcntl
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PIN = "megatron-core==0.16.1"
ROOT = REPO / ".cache" / "client-venvs" / "megatron-core"
PROBE = "from megatron.core.datasets.indexed_dataset import IndexedDataset"


def ensure() -> tuple[Path | None, str]:
    """(folder to put on sys.path, how it was obtained or why not)."""
    ROOT.parent.mkdir(parents=True, exist_ok=True)
    with open(ROOT.parent / "megatron-core.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        stamp = ROOT / ".mindloom-stamp"
        if not (stamp.exists() and stamp.read_text().strip() == PIN):
            wheels = ROOT.parent / "megatron-core-wheel"
            r = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(wheels), PIN],
                               capture_output=True, text=True, timeout=600)
            found = sorted(wheels.glob("megatron_core-*.whl"))
            if r.returncode or not found:
                return None, f"pip download {PIN} failed: {(r.stderr or r.stdout).strip()[-300:]}"
            ROOT.mkdir(parents=True, exist_ok=True)
            with zipfile.ZipFile(found[-1]) as z:
                z.extractall(ROOT)
            stamp.write_text(PIN)
    r = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(ROOT)!r}); {PROBE}"],
                       capture_output=True, text=True, timeout=300)
    if r.returncode:
        return None, f"{PIN} does not import: {r.stderr.strip()[-300:]}"
    return ROOT, f"{PIN} unpacked in {ROOT}"
