"""Atomic file output, completion markers and the run-folder layout shared by every stage.

Every output is written under a temporary name in the same folder and renamed into place, so a crash never
leaves a half-written file under a final name.  A stage that finishes a shard writes ``<output>.done`` holding the
sha256 of what it wrote; a rerun that finds a marker whose checksum still matches skips the shard, which makes
Airflow retries and clears idempotent.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

STAGES = ("ingest", "exact_dedup", "quality", "tokenize")


def safe_run_id(run_id: str) -> str:
    """A folder name from an Airflow run id (``manual__2026-11-29T10:00:00+00:00`` has ':' and '+')."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "_", run_id).strip("._")
    if not cleaned:
        raise ValueError(f"run id {run_id!r} gives an empty folder name")
    return cleaned


def run_dir(data_root: str | Path, run_id: str) -> Path:
    return Path(data_root) / "runs" / safe_run_id(run_id)


OWNER = "owner.json"


def claim_run_dir(rdir: str | Path, dag_id: str | None, run_id: str) -> None:
    """Record which DAG run owns ``runs/<run id>/``; refuse a folder another run already owns.

    Why: ``corpus_build`` and ``corpus_refresh`` share the ``runs/`` namespace, and :func:`safe_run_id` maps
    distinct run ids (``a:b``, ``a_b``) onto one folder.  Without an owner a second run would write into the
    first's folder, and read access to one DAG would serve the other's report.
    """
    rdir = Path(rdir)
    owner = {"dag_id": dag_id, "run_id": run_id}
    path = rdir / OWNER
    if path.exists():
        found = read_json(path)
        if found != owner:
            raise ValueError(f"run id {run_id!r}: folder {rdir} already belongs to {found.get('dag_id') or 'a CLI'} "
                             f"run {found.get('run_id')!r}; trigger with another run id")
        return
    rdir.mkdir(parents=True, exist_ok=True)
    write_json(path, owner)


def run_owner(rdir: str | Path) -> dict | None:
    """The ``{"dag_id", "run_id"}`` that claimed a run folder (None for a folder without a claim)."""
    path = Path(rdir) / OWNER
    return read_json(path) if path.is_file() else None


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


@contextlib.contextmanager
def atomic_path(final: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``final``; rename it onto ``final`` when the block succeeds."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.chmod(tmp_path, 0o644)
        os.replace(tmp_path, final)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def write_json(path: str | Path, obj: Any) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=1, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


def read_json(path: str | Path) -> Any:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def marker_path(output: str | Path) -> Path:
    output = Path(output)
    return output.with_name(output.name + ".done")


def write_marker(output: str | Path, extra: dict | None = None) -> None:
    """Record that ``output`` is complete, with its checksum (and e.g. the stage's stats)."""
    write_json(marker_path(output), {"output": Path(output).name, "sha256": sha256_file(output), **(extra or {})})


def completed(output: str | Path) -> dict | None:
    """The marker of ``output`` when it exists and still matches the file; otherwise None."""
    marker = marker_path(output)
    if not marker.exists() or not Path(output).exists():
        return None
    try:
        info = read_json(marker)
    except (OSError, ValueError):
        return None
    return info if info.get("sha256") == sha256_file(output) else None


def write_parquet(table: Any, path: str | Path) -> None:
    """Atomically write a pyarrow Table (zstd, deterministic for the same rows)."""
    import pyarrow.parquet as pq

    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, compression="zstd", row_group_size=1024)


def read_parquet(path: str | Path, columns: list[str] | None = None) -> Any:
    import pyarrow.parquet as pq

    return pq.read_table(path, columns=columns)


def stats_path(rdir: Path, stage: str, shard: str) -> Path:
    return rdir / "stats" / stage / f"{shard}.json"


def write_stats(rdir: Path, stage: str, shard: str, stats: dict) -> dict:
    """Persist one shard's accounting after checking in = kept + removed (documents and bytes)."""
    removed_docs = sum(v["docs"] for v in stats["removed"].values())
    removed_bytes = sum(v["bytes"] for v in stats["removed"].values())
    if stats["in_docs"] != stats["kept_docs"] + removed_docs or stats["in_bytes"] != stats["kept_bytes"] + removed_bytes:
        raise AssertionError(f"{stage}/{shard}: accounting mismatch {stats}")
    stats = {"stage": stage, "shard": shard, **stats}
    write_json(stats_path(rdir, stage, shard), stats)
    return stats


def new_stats(domain: str) -> dict:
    return {"domain": domain, "in_docs": 0, "in_bytes": 0, "kept_docs": 0, "kept_bytes": 0, "removed": {}}


def count_removed(stats: dict, reason: str, nbytes: int, n: int = 1) -> None:
    slot = stats["removed"].setdefault(reason, {"docs": 0, "bytes": 0})
    slot["docs"] += n
    slot["bytes"] += nbytes
