"""WARC / WARC.gz crawls: HTML ``response`` records → main-content text, URL and title in meta.

``warcio`` frames the records (``no_record_parse``: we read the HTTP block ourselves).  warcio's own HTTP parser is
lenient on purpose — it accepts any first line as a status line and drops header lines without a colon — which
would hide broken records; here a status line that is not ``HTTP/x.y NNN``, a header line that is neither
``name: value`` nor a continuation, or a header block without its blank line rejects the record as
``bad_http_header`` (with record number and byte offset) and reading goes on with the next record.  A record whose
block is shorter than its ``Content-Length`` (a cut file) is ``truncated_file``.

Only HTML responses become documents.  Request, metadata and warcinfo records are counted as
``warc_non_response`` (not listed), non-HTML responses as ``unsupported_content_type`` and non-2xx responses as
``http_status`` (policy skips: ``strict`` does not fail on them).  Dechunking, Content-Encoding and extraction
run in the worker processes.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

from pipeline.configkit import _f
from pipeline.ingest.normalize import DecodeError
from pipeline.ingest.readers.base import FileRef, ParsedDoc, RawRecord, Reader, ReadError, Rejection, snippet_of
from pipeline.ingest.readers.html import EXTRACTORS, extract, page_template

_STATUS = re.compile(r"HTTP/\d(?:\.\d)? +([1-5]\d\d)(?: .*)?")
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_CHARSET = re.compile(r"charset\s*=\s*[\"']?([A-Za-z0-9_.:-]+)", re.IGNORECASE)
HTML_TYPES = ("text/html", "application/xhtml+xml")
MAX_HEADER_BYTES = 1 << 16


@dataclass
class WarcOptions:
    extractor: str = _f("resiliparse", desc="Main-content extractor.", choices=EXTRACTORS)


def parse_http_head(stream) -> tuple[int, dict[str, str], int]:
    """(status, lower-cased headers, header bytes) from a stream at the start of an HTTP response.

    Raises ReadError("bad_http_header") when the block is not a well-formed HTTP/1.x response head.
    """
    raw_status = stream.readline(8192)
    consumed = len(raw_status)
    status_line = raw_status.decode("latin-1").rstrip("\r\n")
    m = _STATUS.fullmatch(status_line)
    if not m:
        raise ReadError("bad_http_header", f"status line is not 'HTTP/x.y NNN ...': {status_line[:80]!r}")
    headers: dict[str, str] = {}
    last = None
    while True:
        line = stream.readline(8192)
        consumed += len(line)
        if consumed > MAX_HEADER_BYTES:
            raise ReadError("bad_http_header", f"header block longer than {MAX_HEADER_BYTES} bytes")
        if not line:
            raise ReadError("bad_http_header", "header block ends without the blank line")
        text = line.decode("latin-1").rstrip("\r\n")
        if not text:
            return int(m.group(1)), headers, consumed
        if text[0] in " \t" and last:
            headers[last] += " " + text.strip()
            continue
        name, sep, value = text.partition(":")
        if not sep or not _TOKEN.fullmatch(name):
            raise ReadError("bad_http_header", f"header line is not 'name: value': {text[:80]!r}")
        last = name.lower()
        headers[last] = value.strip() if last not in headers else headers[last] + ", " + value.strip()


def _dechunk(body: bytes) -> bytes:
    out, pos = bytearray(), 0
    while True:
        eol = body.find(b"\r\n", pos)
        if eol < 0:
            raise ValueError("chunk size line missing")
        size = int(body[pos:eol].split(b";")[0].strip() or b"0", 16)
        if size == 0:
            return bytes(out)
        out += body[eol + 2: eol + 2 + size]
        pos = eol + 2 + size + 2


def _decode_body(body: bytes, headers: dict[str, str]) -> bytes:
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body = _dechunk(body)
    enc = headers.get("content-encoding", "").lower().strip()
    if enc in ("gzip", "x-gzip"):
        body = zlib.decompress(body, 47)
    elif enc == "deflate":
        try:
            body = zlib.decompress(body)
        except zlib.error:
            body = zlib.decompress(body, -15)
    elif enc == "br":
        import brotli

        body = brotli.decompress(body)
    return body


def _drain(stream) -> int:
    """Skip the rest of a record block in 1 MiB steps (never held whole); returns the bytes skipped."""
    n = 0
    while block := stream.read(1 << 20):
        n += len(block)
    return n


class WarcReader(Reader):
    name = "warc"
    suffixes = (".warc", ".warc.gz", ".arc", ".arc.gz")
    Options = WarcOptions

    def read(self, ref: FileRef, unit: dict, storage) -> Iterator[RawRecord | Rejection]:
        from warcio.archiveiterator import ArchiveIterator
        from warcio.exceptions import ArchiveLoadFailed

        if ref.size == 0:
            yield Rejection("empty_file", "file is empty (0 bytes)", ref.rel, "")
            return
        with storage.open_raw(ref.path) as fh:
            it = ArchiveIterator(fh, no_record_parse=True)
            n = 0
            try:
                for rec in it:
                    n += 1
                    yield from self._record(it, rec, ref, n)
            except ArchiveLoadFailed as exc:
                yield Rejection("corrupt_file", f"not a readable WARC after {n} records ({exc})", ref.rel,
                                f"record {n + 1}")
            except (EOFError, zlib.error, OSError) as exc:
                yield Rejection("truncated_file" if isinstance(exc, EOFError) else "corrupt_file",
                                f"WARC stream broken after {n} records ({exc})", ref.rel, f"record {n + 1}")
            if n == 0:
                yield Rejection("empty_file", "no WARC record in the file", ref.rel, "")

    def _record(self, it, rec, ref: FileRef, n: int) -> Iterator[RawRecord | Rejection]:
        where = f"record {n}"
        uri = rec.rec_headers.get_header("WARC-Target-URI") or ""
        if rec.rec_type != "response":
            _drain(rec.raw_stream)
            yield Rejection("warc_non_response", f"{rec.rec_type} record", ref.rel, where, policy=True, listed=False)
            return
        stream = rec.raw_stream
        try:
            status, headers, head_len = parse_http_head(stream)
        except ReadError as exc:
            head = stream.read(200)
            size = len(head) + _drain(stream)
            offset = it.get_record_offset()
            yield Rejection(exc.reason, f"{exc.detail} (url {uri})", ref.rel, f"{where} @ byte {offset}",
                            size, snippet_of(head))
            return
        body = stream.read(self.max_record_bytes + 1)
        too_large = len(body) > self.max_record_bytes
        _drain(stream)
        missing = getattr(stream, "limit", 0)
        offset = it.get_record_offset()
        where = f"{where} @ byte {offset}"
        if missing:
            yield Rejection("truncated_file", f"record block is {missing} bytes shorter than its Content-Length",
                            ref.rel, where, len(body))
        elif too_large:
            yield Rejection("record_too_large", f"HTTP body > ingest.max_record_bytes ({self.max_record_bytes})",
                            ref.rel, where, len(body))
        elif not 200 <= status < 300:
            yield Rejection("http_status", f"HTTP status {status} (url {uri})", ref.rel, where, len(body),
                            policy=True)
        elif headers.get("content-type", "text/html").split(";")[0].strip().lower() not in HTML_TYPES:
            yield Rejection("unsupported_content_type", f"{headers['content-type'][:80]} (url {uri})", ref.rel,
                            where, len(body), policy=True)
        else:
            meta = {"url": uri, "warc_record_id": rec.rec_headers.get_header("WARC-Record-ID") or "",
                    "warc_date": rec.rec_headers.get_header("WARC-Date") or ""}
            yield RawRecord(ref.rel, where, offset, len(body), (headers, body), meta)

    def template(self, raw: RawRecord) -> tuple[list[str], list[str]]:
        headers, body = raw.payload
        m = _CHARSET.search(headers.get("content-type", ""))
        return page_template(_decode_body(body, headers), m.group(1) if m else None)

    def parse(self, raw: RawRecord) -> ParsedDoc | Rejection:
        headers, body = raw.payload
        try:
            body = _decode_body(body, headers)
        except Exception as exc:  # zlib, brotli and chunk-size errors on untrusted bytes
            return Rejection("corrupt_file", f"HTTP body cannot be decoded "
                                             f"({headers.get('content-encoding') or 'chunked'}: {exc})")
        m = _CHARSET.search(headers.get("content-type", ""))
        try:
            text, meta = extract(body, self.opts.extractor, m.group(1) if m else None)
        except DecodeError as exc:
            return Rejection(exc.reason, exc.detail)
        return ParsedDoc(text, {**raw.meta, **meta})
