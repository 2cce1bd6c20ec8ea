"""MediaWiki multistream dumps: byte ranges of whole bz2 streams, so N tasks read one dump in parallel.

A ``*-pages-articles-multistream.xml.bz2`` is a concatenation of bz2 streams: the first holds ``<mediawiki>`` and
``<siteinfo>``, then one stream per 100 pages, the last ``</mediawiki>``.  Its ``*-multistream-index.txt.bz2``
has one line per page, ``offset:page_id:title``, ``offset`` being where the page's stream starts.

Planning (:func:`plan_ranges`) puts cut points at stream starts, at least ``target`` bytes apart (and, with the
index, at most ``docs_per_shard`` pages apart):

* with the index: its offsets (the index is streamed once; only distinct offsets are kept, about 1 % of its
  lines); every chosen cut is checked to start with a bz2 stream header (a 10-byte ranged read), and the index
  gives each range's exact page count.  An index that does not match its dump is ignored (with a warning);
* without one: from each target offset a forward scan for a stream header ``BZh[1-9]1AY&SY``.  Those bytes can
  occur by chance inside compressed data, so a candidate counts only when a fresh decompressor run from it ends a
  stream cleanly (its CRCs check) within :data:`SCAN_BOUND` bytes and the stream's text starts with ``<page>``;
  that also refuses streams of a parallel compressor (pbzip2, lbzip2), which cut the text anywhere.

A dump whose first stream does not end within :data:`SCAN_BOUND` bytes, or is not followed by a stream of whole
pages, is a single-stream dump: one unit, read whole by one task (whose output is still cut into shards).

Reading (:func:`open_range`): a range is decompressed stream after stream; one that does not start at byte 0 is
preceded by the dump's first stream (the header, whose ``<siteinfo>`` names the namespaces), one that does not
reach the end is followed by ``</mediawiki>``, so every range is a well-formed dump for ``mwxml``.
"""

from __future__ import annotations

import bz2
import io
import logging
import re

from pipeline.ingest.readers.base import FileRef, ReadError

log = logging.getLogger(__name__)

STREAM_MAGIC = re.compile(rb"BZh[1-9]1AY&SY")
#: bytes read per step while scanning or checking a stream
SCAN_STEP = 256 << 10
#: the longest stretch scanned for a stream header, and the longest stream decompressed to check one (Wikimedia's
#: streams of 100 pages are well under 1 MiB; a single-stream dump is given up on after this many bytes)
SCAN_BOUND = 16 << 20
CLOSE = b"</mediawiki>\n"


def index_path(path: str) -> str | None:
    """Where Wikimedia puts the index of a multistream dump: ``…-multistream.xml.bz2`` →
    ``…-multistream-index.txt.bz2`` (and ``…-multistream1.xml-p1p41242.bz2`` →
    ``…-multistream-index1.txt-p1p41242.bz2``)."""
    folder, _, name = path.rpartition("/")
    if "multistream" not in name or ".xml" not in name:
        return None
    name = name.replace("multistream", "multistream-index", 1).replace(".xml", ".txt", 1)
    return f"{folder}/{name}" if folder else name


def plan_ranges(ref: FileRef, storage, docs_per_shard: int, shard_bytes: int) -> list[dict] | None:
    """Units ``{start, end, head, docs_estimate, streams}`` of whole streams, or None for a single-stream dump."""
    idx = index_path(ref.path)
    if idx and storage.size_of(idx) is not None:
        units = _from_index(ref, storage, idx, docs_per_shard, shard_bytes)
        if units is not None:
            return units
    if ref.size <= shard_bytes:
        return None
    with storage.open_random_access(ref.path, buffered=False) as fh:
        probe = _Probe(fh, ref.size)
        head = probe.stream_end(0)
        first = probe.check(head) if head is not None and head < ref.size else None
        if first is None:
            log.info("%s: not a multistream dump (no second stream of whole pages); read by one task", ref.rel)
            return None
        per_page = max(1, (first[0] - head) / max(1, first[1]))
        target = max(1, min(shard_bytes, int(docs_per_shard * per_page)))
        cuts, t = [0], target
        while t < ref.size:
            c = probe.next_stream(max(t, head))
            if c is None:                # no page stream within SCAN_BOUND: look further on
                t += SCAN_BOUND
                continue
            if c >= ref.size:
                break
            cuts.append(c)
            t = c + target
    cuts.append(ref.size)
    log.info("%s: %d ranges of whole bz2 streams found by scanning (%d bytes read of %d)", ref.rel,
             len(cuts) - 1, probe.bytes_read, ref.size)
    return [{"start": a, "end": b, "head": head, "streams": "scan",
             "docs_estimate": max(1, round((b - a) / per_page))} for a, b in zip(cuts, cuts[1:], strict=False)]


def _from_index(ref: FileRef, storage, idx: str, docs_per_shard: int, shard_bytes: int) -> list[dict] | None:
    streams: list[list[int]] = []           # [offset, pages]
    try:
        with storage.open(idx) as fh:
            for lineno, line in enumerate(fh, 1):
                head, sep, _ = line.partition(b":")
                if not sep or not head.isdigit():
                    raise ValueError(f"line {lineno} is not offset:page_id:title")
                off = int(head)
                if streams and off == streams[-1][0]:
                    streams[-1][1] += 1
                elif streams and off < streams[-1][0] or off >= ref.size:
                    raise ValueError(f"line {lineno}: offset {off} out of order or past the dump's end")
                else:
                    streams.append([off, 1])
    except (ReadError, OSError, ValueError) as exc:
        log.warning("%s: index %s unusable (%s); scanning the dump for streams instead", ref.rel, idx, exc)
        return None
    if not streams:
        return None
    cuts, pages = [0], [0]
    for i, (off, n) in enumerate(streams):   # the first page stream always stays with the header
        if i and (off - cuts[-1] >= shard_bytes or pages[-1] >= docs_per_shard):
            cuts.append(off)
            pages.append(0)
        pages[-1] += n
    with storage.open_random_access(ref.path, buffered=False) as fh:
        for c in cuts[1:]:
            fh.seek(c)
            if not STREAM_MAGIC.match(fh.read(10)):
                log.warning("%s: index %s says a stream starts at byte %d, but none does; scanning instead",
                            ref.rel, idx, c)
                return None
    cuts.append(ref.size)
    log.info("%s: %d ranges of whole bz2 streams from its index (%d streams, %d pages)", ref.rel, len(cuts) - 1,
             len(streams), sum(n for _, n in streams))
    return [{"start": a, "end": b, "head": streams[0][0], "streams": "index", "docs_estimate": max(1, n)}
            for a, b, n in zip(cuts, cuts[1:], pages, strict=False)]


class _Probe:
    """Short reads of a seekable dump: where a stream ends, whether a stream of whole pages starts at an offset."""

    def __init__(self, fh, size: int):
        self.fh, self.size = fh, size
        self.bytes_read = 0

    def _read(self, pos: int, n: int) -> bytes:
        self.fh.seek(pos)
        data = self.fh.read(min(n, self.size - pos))
        self.bytes_read += len(data)
        return data

    def _decompress(self, pos: int) -> tuple[int, bytes, int] | None:
        """(end of the stream starting at ``pos``, its first bytes of text, its ``<page>`` count), or None when no
        valid stream ends within SCAN_BOUND bytes."""
        dec, fed, text, pages = bz2.BZ2Decompressor(), 0, b"", 0
        while fed < SCAN_BOUND and pos + fed < self.size:
            chunk = self._read(pos + fed, SCAN_STEP)
            try:
                out = dec.decompress(chunk)
            except (OSError, EOFError, ValueError):
                return None
            if len(text) < 256:
                text += out[:256]
            pages += out.count(b"<page>")
            if dec.eof:
                return pos + fed + len(chunk) - len(dec.unused_data), text, pages
            fed += len(chunk)
        return None

    def stream_end(self, pos: int) -> int | None:
        res = self._decompress(pos)
        return res[0] if res else None

    def check(self, pos: int) -> tuple[int, int] | None:
        """(end, pages) when a stream of whole pages starts at ``pos``, else None."""
        res = self._decompress(pos)
        if res is None or not res[1].lstrip().startswith(b"<page>"):
            return None
        return res[0], max(1, res[2])

    def next_stream(self, t: int) -> int | None:
        """The first verified page stream starting at or after ``t`` (the file size when none follows), or None
        when none starts within SCAN_BOUND bytes of ``t``."""
        pos = t
        while pos < min(self.size, t + SCAN_BOUND):
            window = self._read(pos, SCAN_STEP + 9)
            for m in STREAM_MAGIC.finditer(window):
                if m.start() < SCAN_STEP and self.check(pos + m.start()) is not None:
                    return pos + m.start()
            if len(window) < SCAN_STEP + 9:      # the end of the file: no page stream after t
                return self.size
            pos += SCAN_STEP
        return None


def open_range(storage, ref: FileRef, unit: dict):
    """The text of one range as a well-formed dump (header + pages + closing tag), streamed."""
    start, end, head = unit["start"], unit["end"], unit["head"]
    parts: list = []
    if start > 0:
        parts.append(storage.open_range(ref.path, 0, head))
    parts.append(storage.open_range(ref.path, start, end))
    if end < ref.size:
        parts.append(io.BytesIO(CLOSE))
    return io.BufferedReader(_Chain(parts), 1 << 20)


class _Chain(io.RawIOBase):
    def __init__(self, parts: list):
        self.parts = parts

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        while self.parts:
            n = self.parts[0].readinto(buf)
            if n:
                return n
            self.parts.pop(0).close()
        return 0

    def close(self) -> None:
        for p in self.parts:
            p.close()
        self.parts = []
        super().close()

