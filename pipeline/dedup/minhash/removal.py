"""Stage 4: drop the near duplicates of one shard, after proving the shard is the one stage 1 signed.

Stage 3 decided by global ids = manifest offset + row, so removing the right rows depends on the input shard being
exactly the file stage 1 read.  This stage checks it (sha256 and row count against the manifest, doc ids of the
decided rows against the input) and fails with the file and the difference instead of deleting the wrong rows.
The output has the input's columns, row order and schema; stats account for every document.

Memory (per shard task, not measured separately): the input shard's table (text included) and its decisions
file; bounded by the shard, not the corpus.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from pipeline.dedup.minhash.config import MinhashConfig, check_config
from pipeline.dedup.minhash.layout import (
    MinhashError,
    decisions_path,
    input_path,
    output_path,
    read_manifest,
    shard_entry,
    verify_input,
)
from pipeline.io import completed, count_removed, new_stats, read_parquet, write_marker, write_parquet, write_stats

log = logging.getLogger(__name__)

STAGE = "minhash"


def run_removal_shard(rdir: Path, shard: str, cfg: MinhashConfig, input_stage: str = "exact_dedup",
                      decided=None) -> dict:
    """``<input_stage>/<shard>.parquet`` minus its near duplicates → ``minhash/<shard>.parquet``; returns stats.

    ``decided`` is the shard's slice of stage 3's decisions (:func:`attach_decisions` reads a batch's at once);
    without it the shard's id range is read from the decision runs.  With ``enabled: false`` the shard passes
    through unchanged (``input_stage`` names it; otherwise the manifest does), so later stages always read
    ``minhash/``.
    """
    import pyarrow as pa

    from pipeline.dedup.minhash.clusters import read_decisions

    cfg = check_config(cfg)
    rdir = Path(rdir)
    out = output_path(rdir, shard)
    if (done := completed(out)) and done.get("config") == cfg.digest():
        return done["stats"]
    if not cfg.enabled:
        return _pass_through(rdir, shard, input_path(rdir, input_stage, shard), out, cfg)
    manifest = read_manifest(rdir, cfg.digest())
    entry = shard_entry(manifest, shard, rdir)
    if decided is None:
        decided = read_decisions(rdir, cfg, entry["offset"], entry["offset"] + entry["docs"])
    src = verify_input(rdir, manifest, shard)
    table = read_parquet(src)
    if table.num_rows != entry["docs"]:
        raise MinhashError(f"{src}: {table.num_rows} rows, the stage-1 manifest says {entry['docs']}")
    rows = (decided.column("gid").to_numpy().astype(np.int64) - entry["offset"])
    part = decided.drop_columns(["gid", "kept_gid"]).add_column(0, "row", pa.array(rows.astype(np.int32)))
    write_parquet(part, decisions_path(rdir, shard))         # the shard's removals, for audit
    if len(rows):
        have = table.column("doc_id").take(pa.array(rows)).to_pylist()
        want = decided.column("doc_id").to_pylist()
        if have != want:
            bad = next(i for i, (h, w) in enumerate(zip(have, want, strict=True)) if h != w)
            raise MinhashError(f"{src}: row {rows[bad]} holds {have[bad]!r}, stage 3 decided on {want[bad]!r}; "
                               "the shard changed after signatures were computed")
    drop = np.zeros(table.num_rows, bool)
    drop[rows] = True
    reasons = np.array(decided.column("reason").to_pylist(), dtype=object)
    return _write(rdir, shard, table, drop, rows, reasons, entry["domain"], out, cfg)


def attach_decisions(rdir: Path, cfg: MinhashConfig, specs: list[dict]) -> list[dict]:
    """Each shard spec of a batch with its slice of stage 3's decisions, read once for the batch's id range
    (a contiguous range: a batch's shards are consecutive in the manifest)."""
    from pipeline.dedup.minhash.clusters import read_decisions

    cfg = check_config(cfg)
    if not cfg.enabled or not specs:
        return specs
    manifest = read_manifest(Path(rdir), cfg.digest())
    entries = [shard_entry(manifest, s["shard"], Path(rdir)) for s in specs]
    if any(completed(output_path(Path(rdir), s["shard"])) is None for s in specs):
        lo = min(e["offset"] for e in entries)
        hi = max(e["offset"] + e["docs"] for e in entries)
        decided = read_decisions(Path(rdir), cfg, lo, hi)
        gids = decided.column("gid").to_numpy().astype(np.int64)
    else:
        decided, gids = None, None
    out = []
    for spec, e in zip(specs, entries, strict=True):
        if decided is None:
            out.append(spec)
            continue
        r0, r1 = np.searchsorted(gids, [e["offset"], e["offset"] + e["docs"]])
        out.append({**spec, "minhash_decisions": decided.slice(int(r0), int(r1 - r0)).combine_chunks()
                    if r1 > r0 else decided.schema.empty_table()})
    return out


def _pass_through(rdir: Path, shard: str, src: Path, out: Path, cfg: MinhashConfig) -> dict:
    if not src.exists():
        raise MinhashError(f"{src}: input shard is missing")
    table = read_parquet(src)
    return _write(rdir, shard, table, np.zeros(table.num_rows, bool), np.zeros(0, np.int64), np.zeros(0, object),
                  shard.rsplit("-", 1)[0], out, cfg)


def _write(rdir: Path, shard: str, table, drop: np.ndarray, rows: np.ndarray, reasons: np.ndarray, domain: str,
           out: Path, cfg: MinhashConfig) -> dict:
    import pyarrow as pa
    import pyarrow.compute as pc

    nbytes = pc.binary_length(pc.cast(table.column("text"), pa.large_binary())).to_numpy(zero_copy_only=False)
    if table.num_rows and "domain" in table.column_names:
        domain = table.column("domain")[0].as_py()
    stats = new_stats(domain)
    stats["in_docs"] = table.num_rows
    stats["in_bytes"] = int(nbytes.sum())
    kept = table.filter(pa.array(~drop))
    stats["kept_docs"] = kept.num_rows
    stats["kept_bytes"] = int(nbytes[~drop].sum())
    for reason in sorted(set(reasons.tolist())):
        sel = rows[reasons == reason]
        count_removed(stats, reason, int(nbytes[sel].sum()), len(sel))
    write_parquet(kept, out)
    stats = write_stats(rdir, STAGE, shard, stats)
    write_marker(out, {"stats": stats, "config": cfg.digest()})
    log.info("minhash %s: kept %d of %d", shard, stats["kept_docs"], stats["in_docs"])
    return stats
