"""The one MindRecord writer and manifest format: corpus and validation sets, long-context re-packs, test data.

``FileWriter(shard_num=N)`` assigns rows to shard files nondeterministically (the same rows split differently
from one run to the next), so every shard file is written by its own single-shard :class:`ShardWriter`,
with rows dealt round-robin by the caller.  That keeps reruns byte-identical and the per-shard sample counts known.
Files are made world-readable (the writer creates them 0600) and described in ``manifest.json`` by
:func:`set_manifest`: sha256 of every data and index file, row counts and the sha256 of the decoded rows
(``content_sha256``, what :func:`pipeline.sink.mindrecord.verify` re-reads), plus ``rows_sha256`` of the rows in
stream order (what :mod:`pipeline.train.repack` checks when it undoes the round-robin deal).

Row schema: ``input_ids`` int32 ``[seq_len + 1]``; optionally ``domain_id`` int32 (an index field) and
``segment_starts`` int32 ``[-1]``.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from pathlib import Path

from pipeline.io import sha256_file, write_json

COLUMN = "input_ids"
DOMAIN_COLUMN = "domain_id"
STARTS_COLUMN = "segment_starts"
MANIFEST = "manifest.json"
DESCRIPTION = "mindloom pretraining tokens"
BATCH_ROWS = 1000        # rows per FileWriter.write_raw_data call


def schema(seq_len: int, domain_field: bool, boundaries: bool) -> dict:
    out = {COLUMN: {"type": "int32", "shape": [seq_len + 1]}}
    if domain_field:
        out[DOMAIN_COLUMN] = {"type": "int32"}
    if boundaries:
        out[STARTS_COLUMN] = {"type": "int32", "shape": [-1]}
    return out


def fields_of(domain_field: bool, boundaries: bool) -> list[str]:
    return [COLUMN] + ([DOMAIN_COLUMN] if domain_field else []) + ([STARTS_COLUMN] if boundaries else [])


def row_digest(ids, dom, starts) -> bytes:
    """What the manifest's ``content_sha256`` hashes per row: exactly the fields as written (and read back)."""
    import numpy as np

    parts = [np.ascontiguousarray(ids, np.int32).tobytes()]
    if dom is not None:
        parts.append(np.int32(dom).tobytes())
    if starts is not None:
        parts.append(np.int32(len(starts)).tobytes() + np.ascontiguousarray(starts, np.int32).tobytes())
    return b"".join(parts)


class ShardWriter:
    """One single-shard MindRecord file (+ ``.db``); :meth:`close` returns its entry of the manifest's ``shards``."""

    def __init__(self, path: str | Path, seq_len: int, *, domain_field: bool = False, boundaries: bool = False):
        from mindspore.mindrecord import FileWriter

        self.path = str(path)
        self.domain_field, self.boundaries = domain_field, boundaries
        self._writer = FileWriter(file_name=self.path, shard_num=1, overwrite=True)
        self._writer.set_page_size(1 << 22)   # default 32 MiB pages make tiny shards look 32 MB large (sparse files)
        self._writer.set_header_size(1 << 20)
        self._writer.add_schema(schema(seq_len, domain_field, boundaries), DESCRIPTION)
        if domain_field:
            self._writer.add_index([DOMAIN_COLUMN])
        self._batch: list[dict] = []
        self._content = hashlib.sha256()
        self.samples = 0

    def add(self, ids, dom: int | None = None, starts=None) -> None:
        rec = {COLUMN: ids}
        if self.domain_field:
            rec[DOMAIN_COLUMN] = dom = int(dom)
        else:
            dom = None
        if self.boundaries:
            rec[STARTS_COLUMN] = starts
        else:
            starts = None
        self._content.update(row_digest(ids, dom, starts))
        self._batch.append(rec)
        self.samples += 1
        if len(self._batch) >= BATCH_ROWS:
            self._writer.write_raw_data(self._batch)
            self._batch = []

    def close(self) -> dict:
        if self._batch:
            self._writer.write_raw_data(self._batch)
            self._batch = []
        self._writer.commit()
        for f in (self.path, self.path + ".db"):
            os.chmod(f, 0o644)
        return {"file": os.path.basename(self.path), "samples": self.samples, "sha256": sha256_file(self.path),
                "db_sha256": sha256_file(self.path + ".db"), "bytes": os.path.getsize(self.path),
                "content_sha256": self._content.hexdigest()}


def write_shard(path: str, seq_len: int, rows, row_domain=None, row_starts=None) -> dict:
    """Write one shard file from rows (with their domain index / segment starts when given); its manifest entry."""
    w = ShardWriter(path, seq_len, domain_field=row_domain is not None, boundaries=row_starts is not None)
    for i in range(len(rows)):
        w.add(rows[i], None if row_domain is None else row_domain[i], None if row_starts is None else row_starts[i])
    return w.close()


def shard_names(name: str, shards: int) -> list[str]:
    return [f"{name}-{s:05d}-of-{shards:05d}.mindrecord" for s in range(shards)]


def set_manifest(files: list[dict], *, seq_len: int, rows_sha256: str, domain_field: bool = False,
                 boundaries: bool = False, extra: dict | None = None) -> dict:
    """The manifest of one MindRecord set: the fields every set has, then the writer's ``extra`` keys."""
    samples = sum(f["samples"] for f in files)
    return {"format": "mindrecord", "column": COLUMN, "dtype": "int32", "seq_len": seq_len, "row_length": seq_len + 1,
            "fields": fields_of(domain_field, boundaries), "index_fields": [DOMAIN_COLUMN] if domain_field else [],
            "samples": samples, "tokens": samples * (seq_len + 1), "rows_sha256": rows_sha256, "shards": files,
            **(extra or {})}


def write_rows(rows: Iterable, out_dir: str | Path, shards: int, extra: dict | None = None,
               name: str = "rows") -> dict:
    """Stream rows of one length, dealt round-robin over ``shards`` files, into ``out_dir`` with its manifest."""
    import numpy as np

    os.makedirs(out_dir, exist_ok=True)
    writers: list[ShardWriter] = []
    h = hashlib.sha256()
    n = 0
    for row in rows:
        row = np.ascontiguousarray(row, dtype=np.int32)
        if not writers:
            writers = [ShardWriter(os.path.join(out_dir, f), len(row) - 1) for f in shard_names(name, shards)]
        h.update(row.tobytes())
        writers[n % shards].add(row)
        n += 1
    if n < shards:
        raise ValueError(f"{n} rows are fewer than {shards} shard files")
    files = [w.close() for w in writers]
    manifest = set_manifest(files, seq_len=len(row) - 1, rows_sha256=h.hexdigest(), extra=extra)
    write_json(Path(out_dir) / MANIFEST, manifest)
    return manifest
