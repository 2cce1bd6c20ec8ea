"""What every reader shares: the records it yields, the rejections it reports and its small interface.

A reader is split in two on purpose.  :meth:`Reader.read` runs in the shard task's main process and only does
I/O and framing (split a stream into lines, rows, WARC records or files); it yields :class:`RawRecord` and, for
input it cannot even frame, :class:`Rejection`.  :meth:`Reader.parse` is a pure function of one raw record that
returns a :class:`ParsedDoc` or a :class:`Rejection`; it holds the CPU-heavy part (JSON decoding, charset
detection, HTML extraction) and runs in a worker process, so a shard task uses every core while the reading order,
and therefore the output, stays deterministic.

Every record that leaves :meth:`Reader.read` is counted by the caller (documents and bytes in); every
:class:`Rejection` is counted as removed under its ``reason``: nothing is dropped silently.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar


class ReadError(Exception):
    """Raised inside a reader for input that cannot be framed; carries the rejection reason."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(slots=True)
class FileRef:
    """One input file: ``path`` as the filesystem sees it, ``rel`` relative to the pattern's root (ids use it)."""

    path: str
    rel: str
    size: int = 0


@dataclass(slots=True)
class RawRecord:
    """One unparsed document: ``payload`` is bytes (or a str/dict for Parquet rows)."""

    rel: str            # file path relative to its source root: part of the doc id and of ``origin``
    where: str          # human locator: "line 12", "row 40", "record 3 @ byte 1234", "" for whole files
    offset: int         # byte offset / row index inside the file: the third part of the doc id
    nbytes: int         # input bytes this record accounts for
    payload: Any
    meta: dict = field(default_factory=dict)


@dataclass(slots=True)
class ParsedDoc:
    """A decoded document before normalization; ``source`` overrides the source name when the record has one."""

    text: str
    meta: dict = field(default_factory=dict)
    source: str = ""


@dataclass(slots=True)
class Rejection:
    """A record or file that does not become a document, with a reason (snake_case) and a human detail."""

    reason: str
    detail: str
    rel: str = ""
    where: str = ""
    nbytes: int = 0
    snippet: str = ""
    #: a deliberate skip (vendored file, blank line, WARC request record): counted, but ``strict`` ignores it
    policy: bool = False
    #: False for skips too frequent and too dull to list row by row (WARC request/metadata records)
    listed: bool = True


def snippet_of(raw: Any, n: int = 200) -> str:
    if isinstance(raw, bytes | bytearray | memoryview):
        return bytes(raw[:n]).decode("utf-8", "replace")
    return str(raw)[:n]


class Reader:
    """Interface of every reader: ``read`` frames in the main process, ``parse`` decodes in a worker."""

    name: ClassVar[str] = ""
    #: file name suffixes this reader takes when a path is a folder or a glob (lower case; empty: every file)
    suffixes: ClassVar[tuple[str, ...]] = ()
    #: dataclass of this reader's ``options`` (validated strictly when the config is loaded)
    Options: ClassVar[type] = type(None)

    def __init__(self, options: Any, text_field: str = "text", id_field: str = "id",
                 max_record_bytes: int = 1 << 26):
        self.opts = options
        self.text_field = text_field
        self.id_field = id_field
        self.max_record_bytes = max_record_bytes

    # -- planning -------------------------------------------------------------------------------------------
    def accepts(self, rel: str) -> bool:
        """Whether a file found under a folder or glob belongs to this reader (by suffix)."""
        low = rel.lower()
        return not self.suffixes or low.endswith(self.suffixes)

    def units(self, ref: FileRef, storage: Any, docs_per_shard: int, shard_bytes: int = 64 << 20) -> list[dict]:
        """How to cut one file into work units (plan time): [{"docs_estimate": n, ...range keys}].  Default: the
        whole file, planned from its listed size without opening it.

        Planning must not read file contents beyond metadata (a Parquet footer) or a few short probes (JSONL line
        starts): it runs once, serially, over the whole corpus.  ``docs_estimate`` only sizes shards; the real
        count comes from ingest.  The range keys travel in the shard spec (JSON) and come back to :meth:`read` as
        ``unit``."""
        return [{"docs_estimate": 1}]

    # -- reading --------------------------------------------------------------------------------------------
    def read(self, ref: FileRef, unit: dict, storage: Any) -> Iterator[RawRecord | Rejection]:
        """Frame one unit of one file (main process); a :class:`ReadError` or OSError ends the unit and is
        turned into a rejection by the caller."""
        raise NotImplementedError

    def parse(self, raw: RawRecord) -> ParsedDoc | Rejection:
        """Decode one framed record (worker process); pure, so its result does not depend on the process."""
        raise NotImplementedError

    def fixed_lang(self) -> str:
        """A language every document of this reader has (``code``), or "" to detect it."""
        return ""

    def template(self, raw: RawRecord) -> tuple[list[str], list[str]] | None:
        """The template lines a page's extraction drops, before and after its main content (HTML readers,
        ``html.page_template``); None where a reader's records are no pages."""
        return None


def options_from_dict(cls: type, data: dict, where: str) -> Any:
    """Strictly build a reader's Options dataclass (unknown keys and wrong types raise ConfigError)."""
    from pipeline.configkit import _build

    if not dataclasses.is_dataclass(cls):
        from pipeline.configkit import ConfigError

        if data:
            raise ConfigError(f"{where}: this reader takes no options, got {sorted(data)}")
        return None
    return _build(cls, data or {}, where)
