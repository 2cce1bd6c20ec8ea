"""Parquet tables: the text column plus chosen columns, streamed row group by row group.

Only the footer is read at plan time: row groups are packed into shards of about ``ingest.docs_per_shard`` rows,
so a large file is spread over several tasks without being opened twice.  Reading asks pyarrow for the needed
columns of the shard's row groups in batches of ``batch_rows``, so memory stays at one batch whatever the file
size.  The document offset is the row index in the file.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from pipeline.configkit import _f
from pipeline.ingest.readers.base import FileRef, ParsedDoc, RawRecord, Reader, ReadError, Rejection
from pipeline.ingest.readers.jsonl import MARKUPS, doc_from_record


@dataclass
class ParquetOptions:
    columns: list[str] = _f(factory=list, desc="Extra columns copied into meta (the text and id columns are read).")
    source_field: str = _f("", desc="Column whose string value overrides the source name (empty: none).")
    meta_field: str = _f("", desc="Column holding a struct or JSON string merged into meta (empty: none).")
    batch_rows: int = _f(1024, desc="Rows decoded at a time.", ge=1)
    markup: str = _f("text", choices=MARKUPS, desc="What the text column holds: plain 'text', or MediaWiki "
                     "'wikitext', converted to prose as the mediawiki reader does; redirects are skipped as "
                     "wiki_redirect.")


class ParquetReader(Reader):
    name = "parquet"
    suffixes = (".parquet", ".pq")
    Options = ParquetOptions

    def _file(self, ref: FileRef, storage):
        import pyarrow.parquet as pq

        if ref.size == 0:
            raise ReadError("empty_file", "file is empty (0 bytes)")
        fh = storage.open_random_access(ref.path, buffered=False)
        try:
            return pq.ParquetFile(fh), fh
        except Exception as exc:  # pyarrow raises ArrowInvalid/OSError with the footer problem
            fh.close()
            raise ReadError("corrupt_file", f"not a readable Parquet file ({exc})") from None

    def units(self, ref: FileRef, storage, docs_per_shard: int, shard_bytes: int = 64 << 20) -> list[dict]:
        try:
            pf, fh = self._file(ref, storage)
        except ReadError:
            return [{"docs_estimate": 1, "rg": [0, 0], "row": 0}]  # the shard reports the problem
        with fh:
            sizes = [pf.metadata.row_group(i).num_rows for i in range(pf.metadata.num_row_groups)]
        units, first, rows, row0 = [], 0, 0, 0
        for i, n in enumerate(sizes):
            if rows and rows + n > docs_per_shard:
                units.append({"docs_estimate": rows, "rg": [first, i], "row": row0})
                first, row0, rows = i, row0 + rows, 0
            rows += n
        units.append({"docs_estimate": max(rows, 1), "rg": [first, len(sizes)], "row": row0})
        return units

    def read(self, ref: FileRef, unit: dict, storage) -> Iterator[RawRecord | Rejection]:
        pf, fh = self._file(ref, storage)
        with fh:
            names = set(pf.schema_arrow.names)
            if self.text_field not in names:
                yield Rejection("missing_text_field", f"no column {self.text_field!r} (columns: {sorted(names)})",
                                ref.rel, "", ref.size)
                return
            if pf.metadata.num_rows == 0:
                yield Rejection("empty_file", "table has no rows", ref.rel, "", ref.size)
                return
            wanted = [self.text_field, self.id_field, self.opts.source_field, self.opts.meta_field, *self.opts.columns]
            cols = [c for c in dict.fromkeys(wanted) if c and c in names]
            first, last = unit["rg"]
            row = unit["row"]
            try:
                for batch in pf.iter_batches(batch_size=self.opts.batch_rows, row_groups=list(range(first, last)),
                                             columns=cols, use_threads=False):
                    for rec in batch.to_pylist():
                        text = rec.get(self.text_field)
                        nbytes = len(text.encode("utf-8")) if isinstance(text, str) else 0
                        yield RawRecord(ref.rel, f"row {row}", row, nbytes, rec)
                        row += 1
            except (OSError, ValueError) as exc:
                yield Rejection("corrupt_file", f"row group data cannot be decoded ({exc})", ref.rel, f"row {row}")

    def parse(self, raw: RawRecord) -> ParsedDoc | Rejection:
        return doc_from_record(raw.payload, self.text_field, self.id_field, _AsJsonl(self.opts))


@dataclass
class _AsJsonl:
    """Adapts Parquet options to the record helper shared with JSONL."""

    opts: ParquetOptions

    @property
    def source_field(self) -> str:
        return self.opts.source_field

    @property
    def meta_field(self) -> str:
        return self.opts.meta_field

    @property
    def keep_fields(self) -> list[str]:
        return self.opts.columns

    @property
    def markup(self) -> str:
        return self.opts.markup
