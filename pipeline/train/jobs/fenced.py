"""Fenced publication of a job's files: write under a temporary name, fence, rename, fence again.

Why: a check of the lease followed by a separate write leaves a window. A process that stalls between the two (an
NFS hang of a minute) would write after another job took the stage folder over. Here the bytes go to a temporary
name first, so the only step after the fence is one ``rename``. The fence is then checked once more: a job that
lost the lease inside that window takes its file back (unlinks it, if the name still points at the inode it
renamed) and raises ``LeaseLost``. So nothing it wrote after the takeover stays visible. What it cannot undo is a
rename over a file of the same name that the new holder had already written. That needs a stall longer than the
new job takes to reach the same file, and readers also check the job id and lease generation that every status row,
marker and ``eval.json`` carries (``commit.valid_markers``, ``pipeline.tasks.pretrain.job_state``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def no_fence() -> None:
    return None


def publish(tmp: str | Path, dest: str | Path, fence: Callable[[], None] = no_fence) -> None:
    """Rename the written ``tmp`` onto ``dest`` between two fences (see the module docstring). On a lost lease
    before the rename ``tmp`` is removed; after it, ``dest`` is withdrawn if it is still this rename's inode."""
    tmp, dest = Path(tmp), Path(dest)
    try:
        fence()
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    ino = os.stat(tmp).st_ino
    os.replace(tmp, dest)
    try:
        fence()
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            if os.stat(dest).st_ino == ino:
                os.unlink(dest)
        raise


def write_json(path: str | Path, obj: Any, fence: Callable[[], None] = no_fence) -> str:
    """``pipeline.io.write_json`` published through :func:`publish`; returns the sha256 of the bytes."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = (json.dumps(obj, indent=1, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    publish(tmp, path, fence)
    return hashlib.sha256(data).hexdigest()
