"""Ingest: every configured source → normalized Parquet shards with stable ids, language and full accounting.

Two entry points, matching two Airflow tasks:

* :func:`plan_ingest` lists every source's paths (local or object storage) and splits the input into work units
  without reading it: byte ranges of plain JSONL aligned to line starts, Parquet row groups (footer only), and
  whole files otherwise (compressed JSONL, WARC, text, HTML, code, MediaWiki dumps: planned from their listed size,
  never opened).  A JSONL range is found from the file size and a short scan to the next newline at each cut
  (``readers/jsonl.py``: one small ranged read per unit, so a 1 TB corpus on S3 is planned by reading a few MB);
  its target size is ``min(ingest.shard_bytes, ingest.docs_per_shard × bytes per line)`` measured on the file's
  head, so small files still give shards of about ``docs_per_shard`` lines.  Units are then packed in order into
  shards of at most about ``docs_per_shard`` documents and ``shard_bytes`` bytes.  Document counts at plan time
  are estimates (``docs_estimate``); the real counts come from ingest.  The plan depends only on the listed files'
  bytes and the config, so rerunning it gives the same shards.  Each shard is one JSON-serialisable spec, one
  mapped task, one output file.  Paths that cannot be listed (missing, unreadable, symlink loops) become units of
  their own, so they are counted in a shard like any bad document.
* :func:`run_ingest_shard` streams the shard's records out of its reader (main process: I/O only), parses,
  normalizes, language-tags and hashes them in a pool of ``ingest.workers`` processes (results are consumed in
  submission order, so the output is byte-identical whatever the pool size), and writes
  ``ingest/<shard>.parquet`` (:data:`DOC_SCHEMA`), ``rejects/ingest/<shard>.parquet`` (:data:`REJECT_SCHEMA`) and
  ``stats/ingest/<shard>.json``.

Accounting: every record a reader frames is one document in (bytes: its raw, decompressed size); it is kept or
removed under one reason.  Bad input (malformed JSON, invalid UTF-8, truncated archives, binary files, broken HTTP
headers, missing or unreadable paths, symlink loops, oversized records, …) is logged with file, location
(``byte N`` in plain JSONL, ``line N`` in compressed JSONL, ``row N`` in Parquet, ``record N @ byte B`` in WARC)
and reason, written to the rejects table and counted; with ``ingest.strict`` the first one fails the task with
the same message.  Policy skips (vendored code, WARC request records, blank lines) are counted but never fail a
run.

Memory: a shard is streamed: records are framed in the task's process, handed to the ``ingest.workers`` pool in
batches of at most ``BATCH_RECORDS`` records or ``BATCH_BYTES`` bytes (a few batches in flight per worker), and the
kept rows are flushed to Parquet in row groups, so a task holds a few batches, one row group and one record of at
most ``ingest.max_record_bytes``: not the shard, not the corpus.
"""

from __future__ import annotations

import json
import logging
import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from pipeline.config import MindloomConfig
from pipeline.configkit import ConfigError
from pipeline.ingest.config import SourceConfig
from pipeline.ingest.empty_sources import check_source
from pipeline.ingest.langid import language_columns
from pipeline.ingest.normalize import doc_id, normalize_text, text_hash
from pipeline.ingest.readers import FileRef, RawRecord, Reader, ReadError, Rejection, make_reader
from pipeline.ingest.readers.base import snippet_of
from pipeline.ingest.readers.storage import Storage, _oserror_reason
from pipeline.io import (
    atomic_path,
    completed,
    config_digest,
    count_removed,
    new_stats,
    settings,
    write_marker,
    write_stats,
)

log = logging.getLogger(__name__)

DOC_COLUMNS = ("doc_id", "domain", "source", "text", "n_chars", "text_hash", "meta", "origin", "lang", "lang_score")
REJECT_COLUMNS = ("source", "path", "where", "reason", "detail", "snippet", "nbytes")
#: shards with less input than this are processed in the task's own process (a pool costs ~1 s to start)
PARALLEL_MIN_BYTES = 2 << 20
BATCH_RECORDS = 64
BATCH_BYTES = 4 << 20
ROW_GROUP = 1024


class IngestError(RuntimeError):
    """A bad input in strict mode, or a plan that selects nothing; the message names file, line and reason."""


def doc_schema():
    import pyarrow as pa

    return pa.schema([("doc_id", pa.string()), ("domain", pa.string()), ("source", pa.string()),
                      ("text", pa.large_string()), ("n_chars", pa.int64()), ("text_hash", pa.string()),
                      ("meta", pa.string()), ("origin", pa.string()), ("lang", pa.string()),
                      ("lang_score", pa.float32())])


def reject_schema():
    import pyarrow as pa

    return pa.schema([("source", pa.string()), ("path", pa.string()), ("where", pa.string()),
                      ("reason", pa.string()), ("detail", pa.string()), ("snippet", pa.string()),
                      ("nbytes", pa.int64())])


# --------------------------------------------------------------------------------------------------------------
# Plan


def source_name(src: SourceConfig) -> str:
    return src.name or src.domain


def _check_names(cfg: MindloomConfig) -> None:
    seen: dict[str, int] = {}
    for i, src in enumerate(cfg.sources):
        name = source_name(src)
        if name in seen:
            raise ConfigError(f"sources[{i}].name: {name!r} is already the name of sources[{seen[name]}]; document "
                              "ids hash the source name, so give each source its own 'name'")
        seen[name] = i


def _plan_source(src: SourceConfig, reader: Reader, cfg: MindloomConfig) -> list[dict]:
    storage = Storage(src.fs_options)
    units: list[dict] = []
    owner: dict[str, str] = {}
    for pattern in src.paths:
        files, problems = storage.list(pattern)
        units += [{"path": p.path, "rel": p.rel, "docs_estimate": 1, "bytes": 0, "problem": [p.reason, p.detail]}
                  for p in problems]
        explicit = len(files) == 1 and files[0].path.rstrip("/") == pattern.rstrip("/")
        chosen = files if explicit else [f for f in files if reader.accepts(f.rel)]
        if len(chosen) < len(files):
            log.info("source %s: %d of %d files under %s do not match the %s reader's suffixes and are not read",
                     source_name(src), len(files) - len(chosen), len(files), pattern, reader.name)
        if files and not chosen:
            units.append({"path": pattern, "rel": pattern.rsplit("/", 1)[-1], "docs_estimate": 1, "bytes": 0,
                          "problem": ["missing_path", f"none of {len(files)} files has a {reader.name} suffix"]})
        for ref in chosen:
            if owner.setdefault(ref.rel, ref.path) != ref.path:
                raise ConfigError(f"source {source_name(src)!r}: {ref.path} and {owner[ref.rel]} have the same "
                                  f"relative path {ref.rel!r}, so their document ids would collide; use one glob "
                                  "over their common folder or separate sources")
            try:
                pieces = reader.units(ref, storage, cfg.ingest.docs_per_shard, cfg.ingest.shard_bytes)
            except (ReadError, OSError) as exc:
                reason = exc.reason if isinstance(exc, ReadError) else _oserror_reason(exc)
                units.append({"path": ref.path, "rel": ref.rel, "docs_estimate": 1, "bytes": 0,
                              "problem": [reason, getattr(exc, "detail", str(exc))]})
                continue
            for piece in pieces:
                nbytes = piece["end"] - piece["start"] if piece.get("end", -1) >= 0 else ref.size
                units.append({"path": ref.path, "rel": ref.rel, "size": ref.size, "bytes": nbytes, **piece})
    return units


def plan_ingest(cfg: MindloomConfig, empty: list[dict] | None = None) -> list[dict]:
    """One spec per shard: {shard, domain, source_index, source, reader, units, docs_estimate, bytes}
    (JSON-serialisable).  ``docs_estimate`` sizes shards only; the documents a shard really holds are counted by
    :func:`run_ingest_shard` (``in_docs`` of its stats).

    A source matching no file raises a ConfigError, or with ``allow_empty`` is appended to ``empty`` instead.
    """
    _check_names(cfg)
    specs: list[dict] = []
    per_domain: Counter = Counter()
    limit_docs, limit_bytes = cfg.ingest.docs_per_shard, cfg.ingest.shard_bytes
    for si, src in enumerate(cfg.sources):
        if cfg.domains and src.domain not in cfg.domains:
            continue
        reader = make_reader(src, cfg.ingest.max_record_bytes)
        groups: list[list[dict]] = []
        docs = nbytes = 0
        units = _plan_source(src, reader, cfg)
        if (entry := check_source(si, source_name(src), src, units)) is not None:
            if empty is not None:
                empty.append(entry)
            continue
        for unit in units:
            full = docs + unit["docs_estimate"] > limit_docs or nbytes + unit["bytes"] > limit_bytes
            if not groups or full and docs:
                groups.append([])
                docs = nbytes = 0
            groups[-1].append(unit)
            docs += unit["docs_estimate"]
            nbytes += unit["bytes"]
        for group in groups:
            k = per_domain[src.domain]
            per_domain[src.domain] += 1
            specs.append({"shard": f"{src.domain}-{k:05d}", "domain": src.domain, "source_index": si,
                          "source": source_name(src), "reader": src.reader, "units": group,
                          "docs_estimate": sum(u["docs_estimate"] for u in group),
                          "bytes": sum(u["bytes"] for u in group)})
    if not specs:
        raise IngestError("no sources selected: check 'domains' and 'sources' in the config"
                          + (" (every selected source matched no file)" if empty else ""))
    return specs


# --------------------------------------------------------------------------------------------------------------
# Records out of a shard's units (main process)


def _records(reader: Reader, storage: Storage, spec: dict) -> Iterator[RawRecord | Rejection]:
    for unit in spec["units"]:
        ref = FileRef(unit["path"], unit["rel"], unit.get("size", 0))
        if "problem" in unit:
            yield Rejection(unit["problem"][0], unit["problem"][1], ref.rel, "")
            continue
        started = False
        try:
            for item in reader.read(ref, unit, storage):
                started = True
                if isinstance(item, Rejection) and not item.rel:
                    item.rel = ref.rel
                yield item
        except ReadError as exc:
            yield Rejection(exc.reason, exc.detail, ref.rel, "", 0 if started else unit["bytes"])
        except OSError as exc:
            yield Rejection(_oserror_reason(exc), f"read failed ({exc.strerror or repr(exc)})", ref.rel, "",
                            0 if started else unit["bytes"])
        except Exception as exc:  # a library choking on hostile bytes: quarantine the rest of the file, go on
            yield Rejection("read_error", f"{type(exc).__name__}: {exc}", ref.rel, "", 0 if started else unit["bytes"])


# --------------------------------------------------------------------------------------------------------------
# Per-record work (worker processes, or the task's own process)

_WORKER: dict = {}


def _init_worker(src: dict, max_record_bytes: int, max_doc_chars: int, domain: str) -> None:
    from pipeline.configkit import _build

    source = _build(SourceConfig, src, "source")
    reader = make_reader(source, max_record_bytes)
    _WORKER.update(reader=reader, name=source_name(source), domain=domain, max_doc_chars=max_doc_chars,
                   lang=source.lang or reader.fixed_lang())


def _finish(raw: RawRecord) -> dict | Rejection:
    w = _WORKER
    parsed = w["reader"].parse(raw)
    if isinstance(parsed, Rejection):
        return parsed
    if len(parsed.text) > w["max_doc_chars"]:
        return Rejection("too_long", f"{len(parsed.text)} characters > ingest.max_doc_chars ({w['max_doc_chars']})")
    text = normalize_text(parsed.text)
    if not text:
        return Rejection("empty_text", "no text after extraction and normalization")
    lang, score = language_columns(text, w["lang"])
    meta = {**raw.meta, **parsed.meta}
    return {"doc_id": doc_id(w["domain"], f"{w['name']}/{raw.rel}", raw.offset), "domain": w["domain"],
            "source": parsed.source or w["name"], "text": text, "n_chars": len(text), "text_hash": text_hash(text),
            "meta": json.dumps(meta, sort_keys=True, ensure_ascii=False, default=str),
            "origin": f"{raw.rel}:{raw.where}" if raw.where else raw.rel, "lang": lang, "lang_score": score}


def _process_batch(batch: list) -> list:
    out = []
    for item in batch:
        if isinstance(item, Rejection):
            out.append((item, 0))
            continue
        try:
            res = _finish(item)
        except Exception as exc:  # one hostile record must not take the shard down: quarantine it
            res = Rejection("parse_error", f"{type(exc).__name__}: {exc}")
        if isinstance(res, Rejection):
            res.rel, res.where, res.nbytes = item.rel, item.where, item.nbytes
            res.snippet = res.snippet or snippet_of(item.payload if isinstance(item.payload, bytes | bytearray | str) else "")
        out.append((res, item.nbytes))
    return out


def _batches(items: Iterator) -> Iterator[list]:
    batch, size = [], 0
    for item in items:
        batch.append(item)
        size += item.nbytes
        if len(batch) >= BATCH_RECORDS or size >= BATCH_BYTES:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def _results(items: Iterator, workers: int, init_args: tuple) -> Iterator[tuple]:
    """(document row or Rejection, raw bytes) in input order, computed by ``workers`` processes."""
    if workers <= 1:
        _init_worker(*init_args)
        for batch in _batches(items):
            yield from _process_batch(batch)
        return
    from concurrent.futures.process import BrokenProcessPool

    from pipeline.pools import ordered_map

    try:
        for done in ordered_map(_process_batch, _batches(items), workers, "pipeline.ingest.run", _init_worker,
                                init_args):
            yield from done
    except BrokenProcessPool as exc:
        raise IngestError(f"a worker process died ({exc}); rerun with ingest.workers: 1 to see which record "
                          "kills it") from None


# --------------------------------------------------------------------------------------------------------------
# Shard


def worker_count(configured: int) -> int:
    if configured:
        return configured
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


class _TableSink:
    """Streams rows into a Parquet file under a temporary name; the file exists only once ``commit`` ran."""

    def __init__(self, path: Path, schema, always: bool):
        self.path, self.schema, self.always = path, schema, always
        self.rows: dict[str, list] = {c: [] for c in schema.names}
        self.writer = self.ctx = None
        self.count = 0

    def add(self, row: dict) -> None:
        for k in self.rows:
            self.rows[k].append(row[k])
        self.count += 1
        if len(self.rows[self.schema.names[0]]) >= ROW_GROUP:
            self._flush()

    def _flush(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        if self.writer is None:
            self.ctx = atomic_path(self.path)
            tmp = self.ctx.__enter__()
            self.writer = pq.ParquetWriter(tmp, self.schema, compression="zstd")
        if self.rows[self.schema.names[0]] or not self.count:
            self.writer.write_table(pa.table(self.rows, schema=self.schema), row_group_size=ROW_GROUP)
        self.rows = {c: [] for c in self.schema.names}

    def commit(self) -> bool:
        if not self.count and not self.always:
            return False
        self._flush()
        self.writer.close()
        self.ctx.__exit__(None, None, None)
        return True

    def abort(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.ctx.__exit__(RuntimeError, RuntimeError("aborted"), None)


def run_ingest_shard(cfg: MindloomConfig, rdir: Path, spec: dict) -> dict:
    """Read one shard, normalize, write the shard, its rejects and its stats; return the stats."""
    out = rdir / "ingest" / f"{spec['shard']}.parquet"
    digest = config_digest("ingest", cfg.sources[spec["source_index"]], settings(cfg.ingest, "workers"),
                           {k: v for k, v in spec.items() if k != "run_dir"})
    if done := completed(out, digest):
        log.info("ingest %s already complete, skipping", spec["shard"])
        return done["stats"]
    src = cfg.sources[spec["source_index"]]
    reader = make_reader(src, cfg.ingest.max_record_bytes)
    storage = Storage(src.fs_options)
    full_path = {u["rel"]: u["path"] for u in spec["units"]}
    stats = new_stats(spec["domain"])
    langs: Counter = Counter()
    workers = worker_count(cfg.ingest.workers) if spec.get("bytes", 0) >= PARALLEL_MIN_BYTES else 1
    init_args = (_source_dict(src), cfg.ingest.max_record_bytes, cfg.ingest.max_doc_chars, spec["domain"])
    docs = _TableSink(out, doc_schema(), always=True)
    rejects = _TableSink(rdir / "rejects" / "ingest" / f"{spec['shard']}.parquet", reject_schema(), always=False)
    try:
        for res, nbytes in _results(_records(reader, storage, spec), workers, init_args):
            if isinstance(res, Rejection):
                nbytes = res.nbytes
            stats["in_docs"] += 1
            stats["in_bytes"] += nbytes
            if isinstance(res, dict):
                docs.add(res)
                langs[res["lang"]] += 1
                stats["kept_docs"] += 1
                stats["kept_bytes"] += nbytes
                continue
            path = full_path.get(res.rel, res.rel)
            message = f"{path}{':' + res.where if res.where else ''}: {res.reason}: {res.detail}"
            if cfg.ingest.strict and not res.policy:
                raise IngestError(f"ingest {spec['shard']}: {message}")
            if not res.policy:
                log.warning("rejected %s", message)
            if res.listed:
                rejects.add({"source": spec.get("source", ""), "path": path, "where": res.where,
                             "reason": res.reason, "detail": res.detail[:500], "snippet": res.snippet[:200],
                             "nbytes": nbytes})
            count_removed(stats, res.reason, nbytes)
        docs.commit()
        rejects.commit()
    except BaseException:
        docs.abort()
        rejects.abort()
        raise
    stats["lang_docs"] = dict(sorted(langs.items()))
    stats = write_stats(rdir, "ingest", spec["shard"], stats)
    write_marker(out, {"stats": stats}, config=digest)
    return stats


def _source_dict(src: SourceConfig) -> dict:
    import dataclasses

    return dataclasses.asdict(src)
