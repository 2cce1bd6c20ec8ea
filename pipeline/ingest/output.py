"""The output shards of one ingest task: as many as its input needs, each of about ``ingest.shard_bytes``.

Why: the plan sizes a unit by the bytes it can see without reading: a byte range of plain JSONL, a range of bz2
streams of a MediaWiki dump, or the stored size of a compressed file.  What a compressed file holds is only known
once it is read (a 1 GB ``.jsonl.zst`` may be 5 GB of text), so the task cuts its own output: a new output shard
starts once the current one holds ``ingest.shard_bytes`` of input (the decompressed record bytes that the stats
count as ``in_bytes``), so one shard holds at most ``shard_bytes`` plus one record.

Names: part 0 keeps the plan shard's name (``web-00003``), part k > 0 is ``web-00003_00001`` …, so sorted names are
plan order, and ``name.rsplit("-", 1)[0]`` is still the domain (stages that meet an empty shard name its domain
that way).  Each part has its own ``ingest/<part>.parquet``, rejects table, ``stats/ingest/<part>.json`` and marker,
so in = kept + removed holds per part.  The marker of part 0 is written last and lists every part (``parts``): it
is the plan shard's completion marker, and what later stages read (:func:`output_shards`) to learn the shards they
work on, without opening any data.
"""

from __future__ import annotations

import re
from pathlib import Path

from pipeline.io import atomic_path, marker_path, read_json, stats_path

#: rows per Parquet row group; a row group is also flushed once its text reaches ROW_GROUP_BYTES
ROW_GROUP = 1024
ROW_GROUP_BYTES = 2 << 20


def part_name(shard: str, k: int) -> str:
    return shard if k == 0 else f"{shard}_{k:05d}"


def doc_path(rdir: Path, shard: str) -> Path:
    return rdir / "ingest" / f"{shard}.parquet"


def reject_path(rdir: Path, shard: str) -> Path:
    return rdir / "rejects" / "ingest" / f"{shard}.parquet"


def output_shards(rdir: str | Path, shard: str) -> list[str]:
    """The output shards of plan shard ``shard``, in order, from its ingest marker (one small JSON read)."""
    marker = marker_path(doc_path(Path(rdir), shard))
    if not marker.exists():
        raise FileNotFoundError(f"{marker}: ingest of shard {shard} has not completed, so its output shards are "
                                "unknown; run the ingest stage first")
    return read_json(marker).get("parts", [shard])


def output_specs(specs: list[dict]) -> list[dict]:
    """Plan specs → one spec per output shard (``shard`` replaced; the rest kept): what every stage after ingest
    runs over.  The batches stay the plan's, so the task count does not grow with the corpus."""
    return [{**spec, "shard": part} for spec in specs for part in output_shards(spec["run_dir"], spec["shard"])]


def remove_stale_parts(rdir: Path, shard: str, keep: int) -> None:
    """Delete parts ``keep``, ``keep + 1``, … of ``shard`` left by an earlier run that cut its input differently
    (another ``shard_bytes``), so ``stats/ingest`` and ``ingest/`` hold exactly the parts of this run."""
    rx = re.compile(re.escape(shard) + r"_(\d{5})(?:\.parquet(?:\.done)?|\.json)\Z")
    for folder in (rdir / "ingest", rdir / "rejects" / "ingest", stats_path(rdir, "ingest", shard).parent):
        if not folder.is_dir():
            continue
        for f in folder.iterdir():
            m = rx.match(f.name)
            if m and int(m.group(1)) >= keep:
                f.unlink()


class TableSink:
    """Streams rows into a Parquet file under a temporary name; the file exists only once ``commit`` ran.

    Rows are flushed in row groups of ROW_GROUP rows or ROW_GROUP_BYTES of ``text`` (whichever comes first), so the
    sink holds one row group, however long the documents."""

    def __init__(self, path: Path, schema, always: bool):
        self.path, self.schema, self.always = path, schema, always
        self.rows: dict[str, list] = {c: [] for c in schema.names}
        self.writer = self.ctx = None
        self.count = 0
        self.held = 0

    def add(self, row: dict) -> None:
        for k in self.rows:
            self.rows[k].append(row[k])
        self.count += 1
        self.held += len(row.get("text") or "")
        if len(self.rows[self.schema.names[0]]) >= ROW_GROUP or self.held >= ROW_GROUP_BYTES:
            self._flush()

    def _flush(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        if self.writer is None:
            self.ctx = atomic_path(self.path)
            tmp = self.ctx.__enter__()
            self.writer = pq.ParquetWriter(tmp, self.schema, compression="zstd")
        if self.rows[self.schema.names[0]] or not self.count:
            self.writer.write_table(pa.table(self.rows, schema=self.schema), row_group_size=ROW_GROUP)
        self.rows = {c: [] for c in self.schema.names}
        self.held = 0

    def commit(self) -> bool:
        if not self.count and not self.always:
            return False
        self._flush()
        self.writer.close()
        self.ctx.__exit__(None, None, None)
        return True

    def abort(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.ctx.__exit__(RuntimeError, RuntimeError("aborted"), None)
