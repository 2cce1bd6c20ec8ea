"""Ingest: every configured source → normalized Parquet shards with stable ids, language and full accounting.

Two entry points, matching two Airflow tasks:

* :func:`plan_ingest` lists every source's paths (local or object storage) and splits the input into work units
  without reading it: byte ranges of plain JSONL aligned to line starts, Parquet row groups (footer only), byte
  ranges of whole bz2 streams of MediaWiki multistream dumps (from the dump's index, or short probes for stream
  headers: ``readers/multistream.py``), and whole files otherwise (compressed JSONL, WARC, text, HTML, code,
  single-stream dumps: planned from their listed size, never opened; a compressed one says ``whole_file`` in its
  unit).  A JSONL range is found from the file size and a short scan to the next newline at each cut
  (``readers/jsonl.py``: one small ranged read per unit, so a 1 TB corpus on S3 is planned by reading a few MB);
  its target size is ``min(ingest.shard_bytes, ingest.docs_per_shard × bytes per line)`` measured on the file's
  head, so small files still give shards of about ``docs_per_shard`` lines.  Units are then packed in order into
  shards of at most about ``docs_per_shard`` documents and ``shard_bytes`` bytes.  Document counts at plan time
  are estimates (``docs_estimate``); the real counts come from ingest.  The plan depends only on the listed files'
  bytes and the config, so rerunning it gives the same shards.  Each plan shard is one JSON-serialisable spec.
  Paths that cannot be listed (missing, unreadable, symlink loops) become units of their own, so they are counted
  in a shard like any bad document.
* :func:`run_ingest_shard` streams the shard's records out of its reader (main process: I/O only), parses,
  normalizes, language-tags and hashes them in a pool of ``ingest.workers`` processes (results are consumed in
  submission order, so the output is byte-identical whatever the pool size), and writes output shards of at most
  ``ingest.shard_bytes`` input bytes (plus one record) each: ``ingest/<part>.parquet`` (:data:`DOC_SCHEMA`),
  ``rejects/ingest/<part>.parquet`` (:data:`REJECT_SCHEMA`) and ``stats/ingest/<part>.json``, as many parts as
  the input needs (a 5 GB ``.jsonl.zst`` gives ~80 of them from one task).  Part 0 carries the plan shard's name
  and, in its marker, the list of parts that later stages run over (:mod:`pipeline.ingest.output`).

Accounting: every record a reader frames is one document in (bytes: its raw, decompressed size); it is kept or
removed under one reason, in the output shard it falls in.  Bad input (malformed JSON, invalid UTF-8, truncated
archives, binary files, broken HTTP headers, missing or unreadable paths, symlink loops, oversized records, …) is
logged with file, location (``byte N`` in plain JSONL, ``line N`` in compressed JSONL, ``row N`` in Parquet,
``record N @ byte B`` in WARC, ``page id N`` in MediaWiki) and reason, written to the rejects table and counted;
with ``ingest.strict`` the first one fails the task with the same message.  Policy skips (vendored code, WARC
request records, blank lines) are counted but never fail a run.

Memory model of one ingest task (:func:`memory_model`; tests/test_ingest_output_shards.py measures it): the input
is streamed, never held.  Over the process's footprint after start-up (interpreter, pyarrow, the 1 MB fastText
model), the task's main process holds

* the reader: two 1 MiB buffers and the decompressor's window (gzip 32 KiB, bz2 < 4 MiB, zstd ≤ 8 MiB at the
  levels that do not use ``--long``), with the Parquet writer's state: :data:`FIXED_BYTES` in all;
* the batches in flight: 1 in process, ``2 × workers + 1`` with a pool, each of at most :data:`BATCH_BYTES` (or
  :data:`BATCH_RECORDS` records) and held twice (raw records and their finished rows): ``2 × BATCH_BYTES`` each;
* one row group per output table: ``ROW_GROUP_BYTES`` of text as Python strings, its Arrow copy and its encoded
  pages: ``4 × ROW_GROUP_BYTES``;
* the largest record, three times (raw, parsed, normalized); ``ingest.max_record_bytes`` caps it.

So not the shard, not the file, not the corpus: a 100 GB ``.jsonl.zst`` is read in the same memory as a 100 MB
one.  Each pool worker holds its own batch and rows (``2 × BATCH_BYTES``) over the same start-up footprint.  A
MediaWiki range also keeps one emptied XML element per page it read (mwxml never clears the root), a few MB for a
range of ``shard_bytes`` of bz2 streams; a single-stream dump read whole keeps one per page of the dump.
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
from pipeline.ingest.output import ROW_GROUP_BYTES, TableSink, doc_path, part_name, reject_path, remove_stale_parts
from pipeline.ingest.readers import FileRef, RawRecord, Reader, ReadError, Rejection, make_reader
from pipeline.ingest.readers.base import snippet_of
from pipeline.ingest.readers.storage import Storage, _oserror_reason, compression_of
from pipeline.io import completed, config_digest, count_removed, new_stats, settings, write_marker, write_stats

log = logging.getLogger(__name__)

DOC_COLUMNS = ("doc_id", "domain", "source", "text", "n_chars", "text_hash", "meta", "origin", "lang", "lang_score")
REJECT_COLUMNS = ("source", "path", "where", "reason", "detail", "snippet", "nbytes")
#: shards with less input than this are processed in the task's own process (starting a pool costs more)
PARALLEL_MIN_BYTES = 2 << 20
BATCH_RECORDS = 64
BATCH_BYTES = 4 << 20
#: reader buffers, decompressor window and Parquet writer state (see "Memory model" above)
FIXED_BYTES = 16 << 20


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
                ranged = piece.get("end", -1) >= 0
                nbytes = piece["end"] - piece["start"] if ranged else ref.size
                if not ranged and (kind := compression_of(ref.path)):
                    piece = {**piece, "whole_file": f"one {kind} stream, not splittable: one reader task, its "
                                                    "output cut into shards of ingest.shard_bytes"}
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


def shard_records(reader: Reader, storage: Storage, spec: dict) -> Iterator[RawRecord | Rejection]:
    """The records (and rejections) of one ingest shard's units, framed in this process."""
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
            res.snippet = res.snippet or snippet_of(
                item.payload if isinstance(item.payload, bytes | bytearray | str) else "")
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


def memory_model(workers: int, largest_record: int) -> int:
    """Bytes an ingest task's main process may grow by over its start-up footprint (module docstring)."""
    in_flight = 1 if workers <= 1 else 2 * workers + 1
    return FIXED_BYTES + in_flight * 2 * BATCH_BYTES + 4 * ROW_GROUP_BYTES + 3 * largest_record


class _Part:
    """One output shard being written: its documents, rejects and accounting."""

    def __init__(self, rdir: Path, spec: dict, k: int):
        self.rdir, self.name = rdir, part_name(spec["shard"], k)
        self.stats = new_stats(spec["domain"])
        self.langs: Counter = Counter()
        self.docs = TableSink(doc_path(rdir, self.name), doc_schema(), always=True)
        self.rejects = TableSink(reject_path(rdir, self.name), reject_schema(), always=False)

    def close(self) -> dict:
        """Commit both tables and the stats (in = kept + removed is checked); the marker is the caller's."""
        self.docs.commit()
        self.rejects.commit()
        self.stats["lang_docs"] = dict(sorted(self.langs.items()))
        return write_stats(self.rdir, "ingest", self.name, self.stats)

    def abort(self) -> None:
        self.docs.abort()
        self.rejects.abort()


def run_ingest_shard(cfg: MindloomConfig, rdir: Path, spec: dict) -> dict:
    """Read one plan shard; write as many output shards as its input needs (:mod:`pipeline.ingest.output`), each
    with its documents, rejects, stats and marker (with the digest of the settings that produced it).  Returns the
    plan shard's stats: the sum over its output shards, with ``parts`` listing them."""
    out = doc_path(rdir, spec["shard"])
    digest = config_digest("ingest", cfg.sources[spec["source_index"]], settings(cfg.ingest, "workers"),
                           {k: v for k, v in spec.items() if k != "run_dir"})
    if done := completed(out, digest):
        log.info("ingest %s already complete, skipping", spec["shard"])
        return done.get("spec_stats", done["stats"])
    src = cfg.sources[spec["source_index"]]
    reader = make_reader(src, cfg.ingest.max_record_bytes)
    storage = Storage(src.fs_options)
    full_path = {u["rel"]: u["path"] for u in spec["units"]}
    workers = worker_count(cfg.ingest.workers) if spec.get("bytes", 0) >= PARALLEL_MIN_BYTES else 1
    init_args = (_source_dict(src), cfg.ingest.max_record_bytes, cfg.ingest.max_doc_chars, spec["domain"])
    limit = cfg.ingest.shard_bytes
    part = _Part(rdir, spec, 0)
    closed: list[dict] = []
    try:
        for res, nbytes in _results(shard_records(reader, storage, spec), workers, init_args):
            if isinstance(res, Rejection):
                nbytes = res.nbytes
            if part.stats["in_bytes"] >= limit:     # this output shard is full: the record starts the next one
                closed.append(part.close())
                if len(closed) > 1:
                    write_marker(doc_path(rdir, part.name), {"stats": closed[-1]}, config=digest)
                part = _Part(rdir, spec, len(closed))
            stats = part.stats
            stats["in_docs"] += 1
            stats["in_bytes"] += nbytes
            if isinstance(res, dict):
                part.docs.add(res)
                part.langs[res["lang"]] += 1
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
                part.rejects.add({"source": spec.get("source", ""), "path": path, "where": res.where,
                                  "reason": res.reason, "detail": res.detail[:500], "snippet": res.snippet[:200],
                                  "nbytes": nbytes})
            count_removed(stats, res.reason, nbytes)
        closed.append(part.close())
    except BaseException:
        part.abort()
        raise
    if len(closed) > 1:
        write_marker(doc_path(rdir, part.name), {"stats": closed[-1]}, config=digest)
    remove_stale_parts(rdir, spec["shard"], len(closed))
    parts = [s["shard"] for s in closed]
    total = _sum_stats(spec, closed)
    if len(closed) > 1:
        log.info("ingest %s: %d output shards of at most %d input bytes (+ one record)", spec["shard"], len(closed),
                 limit)
    write_marker(out, {"stats": closed[0], "parts": parts, "spec_stats": total}, config=digest)
    return total


def _sum_stats(spec: dict, parts: list[dict]) -> dict:
    """The plan shard's accounting: every output shard's, added up."""
    if len(parts) == 1:
        return {**parts[0], "parts": [parts[0]["shard"]]}
    total = {"stage": "ingest", "shard": spec["shard"], **new_stats(spec["domain"])}
    langs: Counter = Counter()
    for p in parts:
        for k in ("in_docs", "in_bytes", "kept_docs", "kept_bytes"):
            total[k] += p[k]
        for reason, v in p["removed"].items():
            count_removed(total, reason, v["bytes"], v["docs"])
        langs.update(p["lang_docs"])
    total["removed"] = dict(sorted(total["removed"].items()))
    total["lang_docs"] = dict(sorted(langs.items()))
    total["parts"] = [p["shard"] for p in parts]
    return total


def _source_dict(src: SourceConfig) -> dict:
    import dataclasses

    return dataclasses.asdict(src)
