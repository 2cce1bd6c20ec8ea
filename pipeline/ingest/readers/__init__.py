"""Readers: one small class per input format, all with the interface of :class:`pipeline.ingest.readers.base.Reader`.

``READERS`` maps the ``reader`` name of a source in the config to its class; :func:`make_reader` builds one from
a :class:`pipeline.ingest.config.SourceConfig`.
"""

from __future__ import annotations

from pipeline.ingest.readers.base import FileRef, ParsedDoc, RawRecord, Reader, ReadError, Rejection, options_from_dict
from pipeline.ingest.readers.code import CodeReader
from pipeline.ingest.readers.html import HtmlReader
from pipeline.ingest.readers.jsonl import JsonlReader
from pipeline.ingest.readers.mediawiki import MediawikiReader
from pipeline.ingest.readers.parquet import ParquetReader
from pipeline.ingest.readers.text import TextReader
from pipeline.ingest.readers.warc import WarcReader

READERS: dict[str, type[Reader]] = {cls.name: cls for cls in (JsonlReader, ParquetReader, TextReader, HtmlReader,
                                                             WarcReader, CodeReader, MediawikiReader)}

__all__ = ["READERS", "FileRef", "ParsedDoc", "RawRecord", "ReadError", "Reader", "Rejection", "make_reader",
           "options_from_dict"]


def reader_options(reader: str, options: dict, where: str):
    """The reader's typed options, validated strictly (ConfigError names ``where`` and the key)."""
    return options_from_dict(READERS[reader].Options, options, where)


def make_reader(src, max_record_bytes: int = 1 << 26) -> Reader:
    cls = READERS[src.reader]
    opts = reader_options(src.reader, src.options, f"source {src.name or src.domain!r} options")
    return cls(opts, text_field=src.text_field, id_field=src.id_field, max_record_bytes=max_record_bytes)
