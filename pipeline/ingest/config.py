"""Settings of the ingest stage: the sources (reader, files, options per domain) and the shard planning."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.configkit import _f


@dataclass
class SourceConfig:
    """One input of one domain: a reader, the files it reads and the reader's options."""

    domain: str = _f(desc="Domain name the documents belong to (web, code, zh, ...).")
    paths: list[str] = _f(factory=list, desc="Files, folders, globs or URIs (s3://, gs://, hdfs://, fsspec schemes); "
                                             "relative paths are taken from the config file.")
    reader: str = _f("jsonl", desc="Reader for these files.",
                     choices=("jsonl", "parquet", "text", "html", "warc", "code", "mediawiki"))
    name: str = _f("", desc="Stable name of this source, hashed into every document id (default: the domain). "
                            "Give each source of one domain its own name.")
    text_field: str = _f("text", desc="JSONL field / Parquet column holding the document text.")
    id_field: str = _f("id", desc="JSONL field / Parquet column with the source's own id, kept in meta "
                                  "(empty: none).")
    options: dict = _f(factory=dict, desc="Reader options (pipeline/ingest/readers/<reader>.py: <Reader>Options), "
                                          "checked strictly.")
    fs_options: dict = _f(factory=dict, desc="Object-store filesystem options (e.g. endpoint_override, region for "
                                             "s3://); credentials come from the environment, never from here.")
    lang: str = _f("", desc="Language of every document instead of detecting it: 'code' for source code "
                            "(the code reader always sets it); empty: detect.")
    allow_empty: bool = _f(False, desc="Run on when the paths match no file (the source is listed as empty in the "
                                       "run summary); false: such a source fails the run at plan time.")

    def __post_init__(self) -> None:
        from pipeline.ingest.readers import reader_options

        reader_options(self.reader, self.options, f"source {self.name or self.domain!r} ({self.reader}) options")


@dataclass
class IngestConfig:
    """Shard planning and per-record limits of the ingest stage.

    ``shard_bytes`` defaults to 64 MiB (it was 256 MiB when only grouped files used it): it is now also the largest
    byte range of a plain JSONL file, so a 1 GB file with long documents still becomes 16 parallel tasks (parsing
    speed per task: ``ingest.jsonl_mb_per_cpu_s``), while a 1 TB corpus stays at ~16,000 shards, well within what the
    batched mapped tasks handle (``pipeline/tasks/batches.py``).  ``docs_per_shard`` usually cuts first: a range
    holds about that many lines, estimated from the file's first 64 KiB.
    """

    docs_per_shard: int = _f(2000, desc="Target documents per shard (JSONL lines, Parquet rows, files); shards "
                                        "map 1:1 onto Airflow mapped tasks. Plain JSONL is cut into line-aligned "
                                        "byte ranges of about this many lines (estimated from the file's head); "
                                        "compressed JSONL and WARC files are one task each (their output is "
                                        "cut by shard_bytes); MediaWiki multistream dumps are cut into ranges "
                                        "of about this many pages.", ge=1)
    shard_bytes: int = _f(64 << 20, desc="Most input bytes per shard: the largest JSONL byte range or range of bz2 "
                                         "streams of a MediaWiki multistream dump, the limit when many files are "
                                         "grouped into one task, and the input bytes (decompressed) after which a "
                                         "task starts its next output shard.", ge=1)
    strict: bool = _f(False, desc="Fail on the first bad record instead of quarantining it in the rejects table.")
    max_doc_chars: int = _f(20_000_000, desc="Records with longer text are rejected (reason too_long).", ge=1)
    max_record_bytes: int = _f(64 << 20, desc="Raw records (lines, files, HTTP bodies) above this many bytes are "
                                              "streamed past, never held, and rejected (record_too_large).", ge=1)
    workers: int = _f(0, desc="Processes parsing and normalizing inside one shard task (0: every core).", ge=0)
