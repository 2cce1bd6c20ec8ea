"""Atomic file output, completion markers and the run-folder layout shared by every stage.

Every output is written under a temporary name in the same folder and renamed into place, so a crash never
leaves a half-written file under a final name.  A stage that finishes a unit writes ``<output>.done`` holding the
size and sha256 of what it wrote (the digest computed once, by the writer) and the digest of the configuration and
inputs that produced it (:func:`config_digest`).  :func:`completed` trusts a marker whose size and config digest
still match: it never reads the output's data, so a fan-in task that checks thousands of inputs reads thousands of
small JSON files, not the corpus.  Data is verified where it is written; a full re-read is an explicit request
(``mindloom verify``).  Reruns, retries and clears skip complete units and redo those whose config changed.
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


def write_json(path: str | Path, obj: Any) -> str:
    """Write ``obj`` atomically; return the sha256 of the bytes written (a digest without a second read)."""
    data = (json.dumps(obj, indent=1, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8")
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def read_json(path: str | Path) -> Any:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def marker_path(output: str | Path) -> Path:
    output = Path(output)
    return output.with_name(output.name + ".done")


def config_digest(*parts: Any) -> str:
    """sha256 of the canonical JSON of ``parts``: the settings of a unit and the digests of its inputs.

    Marker digests chain: a unit's digest covers its own settings and the ``sha256`` its inputs' markers recorded,
    so a changed upstream output (or setting) makes every unit below it incomplete, without reading any data.
    """
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=_plain).encode()).hexdigest()


def settings(section: Any, *runtime: str) -> dict:
    """A config section's fields without the ``runtime`` ones (worker counts: they change no output)."""
    import dataclasses

    return {k: v for k, v in dataclasses.asdict(section).items() if k not in runtime}


def _plain(obj: Any) -> Any:
    """JSON form of a config dataclass (its fields) or anything else (its str)."""
    import dataclasses

    return dataclasses.asdict(obj) if dataclasses.is_dataclass(obj) else str(obj)


def write_marker(output: str | Path, extra: dict | None = None, *, config: str | None = None,
                 sha256: str | None = None) -> dict:
    """Record that ``output`` is complete: its size, its sha256 and the ``config`` digest that produced it.

    ``sha256`` is the digest the writer computed while writing; without one the file just written is hashed here
    (once, by the unit that wrote it: never again by a unit that only checks it).
    """
    output = Path(output)
    info = {"output": output.name, "bytes": output.stat().st_size, "sha256": sha256 or sha256_file(output),
            **({"config": config} if config is not None else {}), **(extra or {})}
    write_json(marker_path(output), info)
    return info


def read_marker(output: str | Path) -> dict | None:
    """The marker of ``output`` as written, or None (no data is read)."""
    try:
        return read_json(marker_path(output))
    except (OSError, ValueError):
        return None


def completed(output: str | Path, config: str | None = None) -> dict | None:
    """The marker of ``output`` when the output exists with the recorded size (and ``config`` digest); else None.

    Cheap by design (a stat and a small JSON read): the data was hashed once when written, and a rerun of a unit
    whose settings or inputs changed is caught by the config digest, not by re-reading the output.
    """
    output = Path(output)
    info = read_marker(output)
    if not info or not isinstance(info, dict):
        return None
    try:
        size = output.stat().st_size
    except OSError:
        return None
    if info.get("bytes") != size or (config is not None and info.get("config") != config):
        return None
    return info


class HashingFile:
    """A binary file that hashes what passes through it: the digest of an output without reading it back."""

    def __init__(self, fh):
        self._fh, self.hash, self.size = fh, hashlib.sha256(), 0
        self.closed = False

    def write(self, data) -> int:
        data = memoryview(data)
        self.hash.update(data)
        self.size += data.nbytes
        return self._fh.write(data)

    def tell(self) -> int:
        return self.size

    def flush(self) -> None:
        self._fh.flush()

    def close(self) -> None:
        self.closed = True

    def writable(self) -> bool:
        return True

    def readable(self) -> bool:
        return False

    def seekable(self) -> bool:
        return False


def recorded_sha256(path: str | Path) -> str:
    """The sha256 of an input as its marker recorded it (no data read); an input written without a marker (a
    hand-made test file, a foreign folder) is hashed instead."""
    done = completed(path)
    return done["sha256"] if done and done.get("sha256") else sha256_file(path)


def write_parquet(table: Any, path: str | Path) -> str:
    """Atomically write a pyarrow Table (zstd, deterministic for the same rows); return its sha256, hashed while
    writing (pass it to :func:`write_marker`)."""
    import pyarrow.parquet as pq

    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        sink = HashingFile(fh)
        pq.write_table(table, sink, compression="zstd", row_group_size=1024)
    return sink.hash.hexdigest()


def read_parquet(path: str | Path, columns: list[str] | None = None) -> Any:
    import pyarrow.parquet as pq

    return pq.read_table(path, columns=columns)


def stats_path(rdir: Path, stage: str, shard: str) -> Path:
    return rdir / "stats" / stage / f"{shard}.json"


def write_stats(rdir: Path, stage: str, shard: str, stats: dict) -> dict:
    """Persist one shard's accounting after checking in = kept + removed (documents and bytes)."""
    removed_docs = sum(v["docs"] for v in stats["removed"].values())
    removed_bytes = sum(v["bytes"] for v in stats["removed"].values())
    if (stats["in_docs"] != stats["kept_docs"] + removed_docs
            or stats["in_bytes"] != stats["kept_bytes"] + removed_bytes):
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
