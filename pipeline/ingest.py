"""Ingest: JSONL sources → normalized Parquet shards with stable ids and a ``domain`` column.

Two entry points, matching two Airflow tasks:

* :func:`plan_ingest` expands every source's paths and cuts each file into line ranges of
  ``ingest.docs_per_shard`` records.  Each range is one shard, one mapped task, one output file.
* :func:`run_ingest_shard` reads one range, normalizes each record and writes ``ingest/<shard>.parquet``.

Bad records never stop the run (unless ``ingest.strict``): they go to ``rejects/ingest/<shard>.parquet`` with the
file, line and reason, and are counted in the shard's stats.  A missing path becomes its own shard whose only
record is the rejection, so it shows up in the same accounting.
"""

from __future__ import annotations

import bz2
import glob
import gzip
import json
import logging
from pathlib import Path

from pipeline.config import MindloomConfig
from pipeline.io import completed, count_removed, new_stats, write_marker, write_parquet, write_stats
from pipeline.normalize import doc_id, normalize_text, text_hash

log = logging.getLogger(__name__)

DOC_COLUMNS = ("doc_id", "domain", "source", "text", "n_chars", "text_hash", "meta", "origin")


class IngestError(RuntimeError):
    """A bad input in strict mode; the message names file, line and reason."""


def _open(path: str):
    if path.endswith(".gz"):
        return gzip.open(path, "rb")
    if path.endswith(".bz2"):
        return bz2.open(path, "rb")
    return open(path, "rb")


def _count_lines(path: str) -> int:
    n, last = 0, b"\n"
    with _open(path) as fh:
        while block := fh.read(1 << 20):
            n += block.count(b"\n")
            last = block[-1:]
    return n + (0 if last == b"\n" else 1)


def _expand(pattern: str) -> list[str]:
    if any(ch in pattern for ch in "*?["):
        return sorted(glob.glob(pattern, recursive=True))
    return [pattern]


def plan_ingest(cfg: MindloomConfig) -> list[dict]:
    """One spec per shard: {shard, domain, source_index, path, line_start, line_end} (or ``missing``)."""
    specs: list[dict] = []
    per_domain: dict[str, int] = {}
    for si, src in enumerate(cfg.sources):
        if cfg.domains and src.domain not in cfg.domains:
            continue
        for pattern in src.paths:
            matches = _expand(pattern)
            if not matches or not Path(matches[0]).exists():
                k = per_domain.get(src.domain, 0)
                per_domain[src.domain] = k + 1
                specs.append({"shard": f"{src.domain}-{k:05d}", "domain": src.domain, "source_index": si,
                              "path": pattern, "missing": True, "line_start": 0, "line_end": 0})
                continue
            for path in matches:
                n = _count_lines(path)
                for start in range(0, max(n, 1), cfg.ingest.docs_per_shard):
                    k = per_domain.get(src.domain, 0)
                    per_domain[src.domain] = k + 1
                    specs.append({"shard": f"{src.domain}-{k:05d}", "domain": src.domain, "source_index": si,
                                  "path": path, "line_start": start,
                                  "line_end": min(n, start + cfg.ingest.docs_per_shard)})
    if not specs:
        raise IngestError("no sources selected: check 'domains' and 'sources' in the config")
    return specs


def _reject(rejects: list[dict], stats: dict, spec: dict, line: int, reason: str, detail: str, raw: bytes,
            strict: bool) -> None:
    where = f"{spec['path']}:{line}" if line else spec["path"]
    if strict:
        raise IngestError(f"{where}: {reason}: {detail}")
    log.warning("rejected %s: %s (%s)", where, reason, detail)
    rejects.append({"path": spec["path"], "line": line, "reason": reason, "detail": detail[:500],
                    "snippet": raw[:200].decode("utf-8", "replace")})
    count_removed(stats, reason, len(raw))


def _parse(raw: bytes, text_field: str) -> tuple[dict | None, str, str]:
    """(record, reason, detail); record is None when the line is rejected."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, "invalid_utf8", f"byte {exc.start}: {exc.reason}"
    if not line.strip():
        return None, "blank_line", "empty line"
    try:
        rec = json.loads(line)
    except json.JSONDecodeError as exc:
        return None, "malformed_json", f"{exc.msg} at column {exc.colno}"
    if not isinstance(rec, dict):
        return None, "malformed_json", f"expected a JSON object, got {type(rec).__name__}"
    if text_field not in rec:
        return None, "missing_text_field", f"no field {text_field!r}"
    if not isinstance(rec[text_field], str):
        return None, "wrong_text_type", f"field {text_field!r} is {type(rec[text_field]).__name__}, not a string"
    return rec, "", ""


def run_ingest_shard(cfg: MindloomConfig, rdir: Path, spec: dict) -> dict:
    """Read one line range, normalize, write the shard and its rejects; return the shard's stats."""
    import pyarrow as pa

    out = rdir / "ingest" / f"{spec['shard']}.parquet"
    if done := completed(out):
        log.info("ingest %s already complete, skipping", spec["shard"])
        return done["stats"]
    src = cfg.sources[spec["source_index"]]
    stats = new_stats(spec["domain"])
    rows: dict[str, list] = {c: [] for c in DOC_COLUMNS}
    rejects: list[dict] = []
    strict = cfg.ingest.strict
    if spec.get("missing"):
        stats["in_docs"] += 1
        _reject(rejects, stats, spec, 0, "missing_path", "no file matches this path", b"", strict)
    else:
        key = f"{spec['source_index']}:{Path(spec['path']).name}"
        offset = 0
        with _open(spec["path"]) as fh:
            for lineno, raw in enumerate(fh, start=1):
                here, offset = offset, offset + len(raw)
                if lineno <= spec["line_start"]:
                    continue
                if lineno > spec["line_end"]:
                    break
                stats["in_docs"] += 1
                stats["in_bytes"] += len(raw)
                rec, reason, detail = _parse(raw, src.text_field)
                if rec is None:
                    _reject(rejects, stats, spec, lineno, reason, detail, raw, strict)
                    continue
                if len(rec[src.text_field]) > cfg.ingest.max_doc_chars:
                    _reject(rejects, stats, spec, lineno, "too_long",
                            f"{len(rec[src.text_field])} characters > {cfg.ingest.max_doc_chars}", raw, strict)
                    continue
                text = normalize_text(rec[src.text_field])
                if not text:
                    _reject(rejects, stats, spec, lineno, "empty_text", "no text after normalization", raw, strict)
                    continue
                meta = dict(rec.get("meta") or {}) if isinstance(rec.get("meta"), dict) else {}
                if src.id_field and src.id_field in rec:
                    meta["source_id"] = str(rec[src.id_field])
                rows["doc_id"].append(doc_id(spec["domain"], key, here))
                rows["domain"].append(spec["domain"])
                rows["source"].append(str(rec.get("source") or Path(spec["path"]).name))
                rows["text"].append(text)
                rows["n_chars"].append(len(text))
                rows["text_hash"].append(text_hash(text))
                rows["meta"].append(json.dumps(meta, sort_keys=True, ensure_ascii=False))
                rows["origin"].append(f"{Path(spec['path']).name}:{lineno}")
                stats["kept_docs"] += 1
                stats["kept_bytes"] += len(raw)
    schema = pa.schema([("doc_id", pa.string()), ("domain", pa.string()), ("source", pa.string()),
                        ("text", pa.large_string()), ("n_chars", pa.int64()), ("text_hash", pa.string()),
                        ("meta", pa.string()), ("origin", pa.string())])
    write_parquet(pa.table(rows, schema=schema), out)
    if rejects:
        write_parquet(pa.Table.from_pylist(rejects), rdir / "rejects" / "ingest" / f"{spec['shard']}.parquet")
    stats = write_stats(rdir, "ingest", spec["shard"], stats)
    write_marker(out, {"stats": stats})
    return stats
