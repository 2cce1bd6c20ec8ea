"""JSON Lines, plain or compressed (.gz, .bz2, .zst): one object per line, text in ``text_field``.

Plain files are cut into byte ranges of ``ingest.docs_per_shard`` lines at plan time (one newline-counting pass,
no parsing, about 1 GB/s on local disk), so each shard seeks straight to its range.  Compressed files cannot be
entered in the middle and are one shard each; pre-split dumps (as every crawl and HF export is) keep the shards
small.  On object storage prefer compressed or pre-split files: the plan-time pass downloads plain ones once.

Lines are read with a size cap: a line longer than ``ingest.max_record_bytes`` is streamed past in 1 MiB pieces
and rejected as ``record_too_large`` without ever being held whole.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

from pipeline.configkit import _f
from pipeline.ingest.readers.base import FileRef, ParsedDoc, RawRecord, Reader, ReadError, Rejection, snippet_of
from pipeline.ingest.readers.storage import compression_of


@dataclass
class JsonlOptions:
    source_field: str = _f("source", desc="Field whose string value overrides the source name in the output.")
    meta_field: str = _f("meta", desc="Field holding an object merged into the output meta (empty: none).")
    keep_fields: list[str] = _f(factory=list, desc="Other top-level fields copied into meta.")


class JsonlReader(Reader):
    name = "jsonl"
    suffixes = (".jsonl", ".json", ".ndjson", ".jsonl.gz", ".json.gz", ".ndjson.gz", ".jsonl.zst", ".json.zst",
                ".jsonl.zstd", ".jsonl.bz2", ".json.bz2")
    Options = JsonlOptions

    def units(self, ref: FileRef, storage, docs_per_shard: int) -> list[dict]:
        if compression_of(ref.path):
            return [{"docs": max(1, ref.size // 2000), "start": 0, "end": -1, "line": 1}]
        units, start, line, n, pos = [], 0, 1, 0, 0
        with storage.open_raw(ref.path) as fh:
            while block := fh.read(1 << 22):
                at = -1
                while (at := block.find(b"\n", at + 1)) >= 0:
                    n += 1
                    if n == docs_per_shard:
                        end = pos + at + 1
                        units.append({"docs": n, "start": start, "end": end, "line": line})
                        start, line, n = end, line + n, 0
                pos += len(block)
        if pos > start or not units:
            units.append({"docs": n + 1, "start": start, "end": pos, "line": line})
        return units

    def read(self, ref: FileRef, unit: dict, storage) -> Iterator[RawRecord | Rejection]:
        start, end, lineno = unit["start"], unit["end"], unit["line"]
        fh = storage.open(ref.path) if end < 0 else storage.open_random_access(ref.path)
        limit = self.max_record_bytes
        with fh:
            if start:
                fh.seek(start)
            pos, seen = start, False
            while end < 0 or pos < end:
                try:
                    raw = _read_line(fh, limit)
                except ReadError as exc:
                    yield Rejection(exc.reason, f"{exc.detail} (after {lineno - 1} lines, {pos} bytes)", ref.rel,
                                    f"line {lineno}")
                    return
                if not raw:
                    break
                seen = True
                here = pos
                if len(raw) > limit and not raw.endswith(b"\n"):
                    head, total = raw[:200], len(raw)
                    try:
                        while True:
                            more = fh.readline(1 << 20)
                            total += len(more)
                            if not more or more.endswith(b"\n"):
                                break
                    except ReadError as exc:
                        yield Rejection(exc.reason, exc.detail, ref.rel, f"line {lineno}")
                        return
                    pos += total
                    yield Rejection("record_too_large", f"line of {total} bytes > ingest.max_record_bytes ({limit})",
                                    ref.rel, f"line {lineno}", total, snippet_of(head))
                else:
                    pos += len(raw)
                    yield RawRecord(ref.rel, f"line {lineno}", here, len(raw), raw)
                lineno += 1
            if not seen and start == 0:
                yield Rejection("empty_file", "file holds no data" + (" after decompression" if end < 0 and ref.size
                                                                      else " (0 bytes)"), ref.rel, "")

    def parse(self, raw: RawRecord) -> ParsedDoc | Rejection:
        data = raw.payload
        try:
            line = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            return Rejection("invalid_utf8", f"byte {exc.start}: {exc.reason}")
        if not line.strip():
            return Rejection("blank_line", "empty line", policy=True)
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            return Rejection("malformed_json", f"{exc.msg} (column {exc.colno})")
        if not isinstance(rec, dict):
            return Rejection("malformed_json", f"expected a JSON object, got {type(rec).__name__}")
        return doc_from_record(rec, self.text_field, self.id_field, self.opts)


def _read_line(fh, limit: int) -> bytes | bytearray:
    """One line, or its first ``limit + 1`` bytes.  Long lines grow one bytearray in 1 MiB steps, so a line near
    the limit is held once (``readline(limit)`` would hold its pieces and their join: twice)."""
    piece = fh.readline(min(limit + 1, 1 << 20))
    if not piece or piece.endswith(b"\n") or len(piece) > limit:
        return piece
    buf = bytearray(piece)
    while len(buf) <= limit:
        piece = fh.readline(min(limit + 1 - len(buf), 1 << 20))
        if not piece:
            break
        buf += piece
        if piece.endswith(b"\n"):
            break
    return buf


def doc_from_record(rec: dict, text_field: str, id_field: str, opts) -> ParsedDoc | Rejection:
    """Shared by JSONL and Parquet: pick text, source id, source name and meta from one record."""
    if text_field not in rec:
        return Rejection("missing_text_field", f"no field {text_field!r}")
    text = rec[text_field]
    if not isinstance(text, str):
        return Rejection("wrong_text_type", f"field {text_field!r} is {'null' if text is None else type(text).__name__}, not a string")
    meta: dict = {}
    if opts.meta_field and isinstance(rec.get(opts.meta_field), dict):
        meta.update(rec[opts.meta_field])
    elif opts.meta_field and isinstance(rec.get(opts.meta_field), str):
        try:
            parsed = json.loads(rec[opts.meta_field])
            meta.update(parsed if isinstance(parsed, dict) else {})
        except ValueError:
            pass
    for key in opts.keep_fields:
        if key in rec:
            meta[key] = rec[key]
    if id_field and rec.get(id_field) is not None:
        meta["source_id"] = str(rec[id_field])
    source = rec.get(opts.source_field) if opts.source_field else None
    return ParsedDoc(text, meta, source if isinstance(source, str) else "")

