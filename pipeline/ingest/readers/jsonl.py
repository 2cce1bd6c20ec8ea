"""JSON Lines, plain or compressed (.gz, .bz2, .zst): one object per line, text in ``text_field``.

Planning never reads a whole file.  A plain file is cut into byte ranges aligned to line starts
(:func:`line_ranges`): the cut points come from the file size and a target range size, and each is moved forward
to just after the next newline by a short scan (:data:`SCAN_WINDOW` bytes, grown while a line is longer, at most
``ingest.max_record_bytes``), locally and on object storage alike (one seek and one small ranged read per cut).
The target is ``min(ingest.shard_bytes, ingest.docs_per_shard × bytes per line)``, bytes per line being measured
on the first window of the file, so a small file still gives several shards of about ``docs_per_shard`` lines and
a large one shards of at most ``shard_bytes``.  Each unit's ``docs_estimate`` is only an estimate (range bytes ÷
bytes per line): the real count comes from ingest.  Compressed files cannot be entered in the middle and are one
shard each, planned from their size alone; pre-split dumps (as every crawl and HF export is) keep shards small.

Record locations: a line of a plain file is located by its byte offset (``byte 123456``; ``tail -c +123457 FILE |
head -1`` shows it), since a range that starts mid-file cannot know its line numbers without counting every line
before it; the location is therefore the same whatever the plan.  A compressed file is read from its start, so its
lines keep exact numbers (``line 12``).  The document id hashes the byte offset in both cases.

Lines are read with a size cap: a line longer than ``ingest.max_record_bytes`` is streamed past in 1 MiB pieces
and rejected as ``record_too_large`` without ever being held whole.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass

from pipeline.configkit import _f
from pipeline.ingest.readers.base import FileRef, ParsedDoc, RawRecord, Reader, ReadError, Rejection, snippet_of
from pipeline.ingest.readers.storage import compression_of

log = logging.getLogger(__name__)

#: values of the ``markup`` option of JSONL and Parquet sources
MARKUPS = ("text", "wikitext")
_REDIRECT = re.compile(r"\s*#redirect\s*:?\s*\[\[([^\]|#]*)", re.I)


@dataclass
class JsonlOptions:
    source_field: str = _f("source", desc="Field whose string value overrides the source name in the output.")
    meta_field: str = _f("meta", desc="Field holding an object merged into the output meta (empty: none).")
    keep_fields: list[str] = _f(factory=list, desc="Other top-level fields copied into meta.")
    markup: str = _f("text", choices=MARKUPS, desc="What the text field holds: plain 'text', or MediaWiki "
                     "'wikitext' (a dump exported to JSONL), converted to prose as the mediawiki reader does; "
                     "redirects are skipped as wiki_redirect.")


class JsonlReader(Reader):
    name = "jsonl"
    suffixes = (".jsonl", ".json", ".ndjson", ".jsonl.gz", ".json.gz", ".ndjson.gz", ".jsonl.zst", ".json.zst",
                ".jsonl.zstd", ".jsonl.bz2", ".json.bz2")
    Options = JsonlOptions

    def units(self, ref: FileRef, storage, docs_per_shard: int, shard_bytes: int = 64 << 20) -> list[dict]:
        if compression_of(ref.path):
            return [{"docs_estimate": max(1, ref.size // 2000), "start": 0, "end": -1, "line": 1}]
        if ref.size == 0:  # nothing to scan; the shard reports empty_file
            return [{"docs_estimate": 1, "start": 0, "end": 0}]
        with storage.open_random_access(ref.path, buffered=False) as fh:
            probe = LineProbe(fh, ref.size, self.max_record_bytes)
            per_line = probe.bytes_per_line()
            target = max(1, min(shard_bytes, math.ceil(docs_per_shard * per_line)))
            bounds = line_ranges(probe, target)
        log.debug("%s: %d byte ranges of ~%d bytes from %d bytes read of %d", ref.rel, len(bounds) - 1, target,
                  probe.bytes_read, ref.size)
        return [{"docs_estimate": max(1, round((end - start) / per_line)), "start": start, "end": end}
                for start, end in itertools.pairwise(bounds)]

    def read(self, ref: FileRef, unit: dict, storage) -> Iterator[RawRecord | Rejection]:
        start, end = unit["start"], unit["end"]
        # whole (compressed) files are read from line 1 and keep line numbers; byte ranges locate lines by offset
        lineno = unit.get("line", 0)
        fh = storage.open(ref.path) if end < 0 else storage.open_random_access(ref.path)
        limit = self.max_record_bytes
        with fh:
            if start:
                fh.seek(start)
            pos, seen = start, False
            while end < 0 or pos < end:
                where = f"line {lineno}" if lineno else f"byte {pos}"
                try:
                    raw = _read_line(fh, limit)
                except ReadError as exc:
                    after = f"after {lineno - 1} lines, {pos} bytes" if lineno else f"at byte {pos}"
                    yield Rejection(exc.reason, f"{exc.detail} ({after})", ref.rel, where)
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
                        yield Rejection(exc.reason, exc.detail, ref.rel, where)
                        return
                    pos += total
                    yield Rejection("record_too_large", f"line of {total} bytes > ingest.max_record_bytes ({limit})",
                                    ref.rel, where, total, snippet_of(head))
                else:
                    pos += len(raw)
                    yield RawRecord(ref.rel, where, here, len(raw), raw)
                if lineno:
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


#: bytes read at each cut point while planning (and at the file head, to measure bytes per line)
SCAN_WINDOW = 64 << 10
#: a scan that finds no newline grows its reads up to this size (the total stays bounded by max_record_bytes)
SCAN_MAX_READ = 4 << 20


class LineProbe:
    """Finds line starts in a seekable file by short reads, never reading it through.

    ``fh`` must not read ahead (``storage.open_random_access(path, buffered=False)``): a buffered file would turn
    each 64 KiB probe into a 1 MiB read.  The last window read is kept, so cut points that fall inside it (tiny
    targets, or a line that spans several of them) cost no further I/O.
    """

    def __init__(self, fh, size: int, max_record_bytes: int, window: int = SCAN_WINDOW):
        self.fh, self.size, self.window = fh, size, window
        self.bound = max(window, max_record_bytes + 1)
        self.buf, self.buf_start = b"", 0
        self.bytes_read = 0  # what the probes read so far (logged per file)

    def _load(self, pos: int, n: int) -> None:
        self.fh.seek(pos)
        parts, got = [], 0
        while got < n:
            piece = self.fh.read(n - got)
            if not piece:
                break
            parts.append(piece)
            got += len(piece)
        self.buf, self.buf_start = b"".join(parts), pos
        self.bytes_read += got

    def bytes_per_line(self) -> float:
        """Mean line length over the complete lines of the file's first window (its length when none ends in it)."""
        self._load(0, min(self.window, self.size))
        lines = self.buf.count(b"\n")
        return (self.buf.rfind(b"\n") + 1) / lines if lines else max(1, len(self.buf))

    def line_start_from(self, t: int) -> int | None:
        """The first line start at or after ``t`` (0 < t ≤ size): the smallest b ≥ t with byte b-1 a newline, or
        the file size when no newline follows.  None when no newline lies within the ``bound`` bytes from t-1:
        that line is longer than ``ingest.max_record_bytes`` (its reader rejects it whole), so no cut is put in
        it and the caller tries further on."""
        pos, limit, chunk = t - 1, t - 1 + self.bound, self.window
        while pos < self.size:
            if pos >= limit:
                return None
            if not self.buf_start <= pos < self.buf_start + len(self.buf):
                self._load(pos, min(chunk, self.size - pos, limit - pos))
                if not self.buf:  # the file shrank since it was listed: cut at what is there
                    self.size = pos
                    break
                chunk = min(chunk * 2, SCAN_MAX_READ)
            at = self.buf.find(b"\n", pos - self.buf_start)
            if at >= 0:
                return self.buf_start + at + 1
            pos = self.buf_start + len(self.buf)
        return self.size


def line_ranges(probe: LineProbe, target: int) -> list[int]:
    """Boundaries ``[0, b1, …, size]`` of ranges of at least ``target`` bytes (the last may be shorter), each
    starting at a line start and ending right after a newline or at the end of the file.

    They tile the file, so every line is read exactly once, by the range its first byte is in.  The boundaries
    depend only on the file's bytes and ``target``: the same plan on every run.
    """
    bounds, t = [0], target
    while t < probe.size:
        b = probe.line_start_from(t)
        if b is None:  # a line without end within the bound: look for a cut past the part already scanned
            t += max(target, probe.bound)
            continue
        if b >= probe.size:
            break
        bounds.append(b)
        t = b + target
    bounds.append(probe.size)
    return bounds


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
        return Rejection("wrong_text_type",
                         f"field {text_field!r} is {'null' if text is None else type(text).__name__}, not a string")
    if opts.markup == "wikitext":
        if m := _REDIRECT.match(text):
            return Rejection("wiki_redirect", f"redirects to {m.group(1).strip()!r}", policy=True)
        from pipeline.ingest.readers.wikitext import wikitext_to_text

        text = wikitext_to_text(text)
        if not text:
            return Rejection("empty_text", "no prose left after removing the wikitext markup")
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

