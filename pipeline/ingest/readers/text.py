"""Plain-text files (books, papers, dumps): one document per file, or several split on a separator.

Files may be compressed (.gz, .bz2, .zst).  Bytes are decoded with :func:`pipeline.ingest.normalize.decode_bytes` (BOM,
UTF-8, then charset detection) unless ``encoding`` forces one; binary files found in a text folder are rejected as
``binary_file``.  Long documents are kept whole: the only cap is ``ingest.max_record_bytes`` per file.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from pipeline.configkit import _f
from pipeline.ingest.normalize import DecodeError, decode_bytes
from pipeline.ingest.readers.base import FileRef, ParsedDoc, RawRecord, Reader, ReadError, Rejection, snippet_of


@dataclass
class TextOptions:
    separator: str = _f("", desc="Split each file on this exact string (e.g. '\\f' or '\\n\\n\\n'); "
                                 "empty: one document per file.")
    encoding: str = _f("", desc="Decode with this charset instead of detecting it.")
    suffixes: list[str] = _f(factory=list, desc="File name endings taken from folders and globs (empty: all files).")


class TextReader(Reader):
    name = "text"
    Options = TextOptions

    def accepts(self, rel: str) -> bool:
        return not self.opts.suffixes or rel.lower().endswith(tuple(s.lower() for s in self.opts.suffixes))

    def read(self, ref: FileRef, unit: dict, storage) -> Iterator[RawRecord | Rejection]:
        data = storage.read_bytes(ref.path, self.max_record_bytes)
        if not data:
            yield Rejection("empty_file", "file is empty" + (" after decompression" if ref.size else " (0 bytes)"),
                            ref.rel, "")
            return
        if not self.opts.separator:
            yield RawRecord(ref.rel, "", 0, len(data), data, {"path": ref.rel})
            return
        try:
            text, enc = decode_bytes(data, self.opts.encoding or None)
        except DecodeError as exc:
            yield Rejection(exc.reason, exc.detail, ref.rel, "", len(data), snippet_of(data))
            return
        pos, part = 0, 0
        for piece in text.split(self.opts.separator):
            nbytes = len(piece.encode("utf-8"))
            yield RawRecord(ref.rel, f"part {part}", pos, nbytes, piece, {"path": ref.rel, "part": part,
                                                                         "encoding": enc})
            pos += len(piece) + len(self.opts.separator)
            part += 1

    def parse(self, raw: RawRecord) -> ParsedDoc | Rejection:
        if isinstance(raw.payload, str):
            return ParsedDoc(raw.payload, dict(raw.meta))
        try:
            text, enc = decode_bytes(raw.payload, self.opts.encoding or None)
        except DecodeError as exc:
            return Rejection(exc.reason, exc.detail)
        return ParsedDoc(text, {**raw.meta, "encoding": enc})


def read_whole(storage, ref: FileRef, limit: int) -> bytes:
    """The file's bytes, with ``empty_file`` for 0-byte files (shared by the HTML and code readers)."""
    data = storage.read_bytes(ref.path, limit)
    if not data:
        raise ReadError("empty_file", "file is empty (0 bytes)")
    return data
