"""Sink step 2 (per output file) and 3 (the set): the corpus stream's rows dealt to files, each file written alone.

The corpus is one packed stream: every training copy in key order (:mod:`pipeline.sink.scatter`), cut into rows of
``seq_len + 1`` tokens.  Rows, not documents, are dealt to files: of ``R`` rows, file ``k`` of ``n`` holds the
consecutive rows ``[k*R // n, (k+1)*R // n)``, so every file gets ``R // n`` or ``R // n + 1`` rows whatever the
documents look like (two documents of 110 rows fill two files with 55 each), and only the stream's last partial
row is dropped (``remainder: drop``) or padded into the last file.  :func:`row_plan` finds, from the scatter
parts' markers alone, where every key-range bucket starts in the stream and how many rows there are; a corpus with
fewer rows than files fails with one line saying so.

:func:`write_output_file` reads only the buckets its rows fall in (memory-mapped, every scatter part's batch of
them: one part per scatter task, :func:`pipeline.sink.scatter.run_scatter_part`; each file closed once mapped, so
the task holds no descriptor per part),
orders their copies by key, and feeds the copies that overlap its rows to a windowed
:class:`pipeline.sink.packing.StreamPacker`, chunk by chunk, into ``sink/out/corpus-<k>-of-<n>.mindrecord``.  The
writer then verifies its own file (every row read back through ``MindDataset`` in a memory-limited child, count and
content hash) before renaming it into place and writing the marker with its manifest entry: data is verified once,
where it is written.

:func:`finalize_set` assembles ``manifest.json`` from the markers (no data read), checks the row deal and the rank
split, renames ``sink/out`` to ``mindrecord`` and removes the scatter parts.  The manifest's ``layout`` is
``"contiguous"``: the files in manifest order are the packed stream (what long-context re-packing needs,
:mod:`pipeline.train.repack`), and ``rows_sha256`` is the sha256 of the files' own ``rows_sha256`` values joined in
file order.

Memory of a writer task: per bucket it touches, 32 bytes per copy (key, length, domain, source); the tokens of
one packing chunk (``CHUNK_TOKENS``, about 30 bytes per token, ~120 MB) gathered from the mapped scatter parts.
It does not grow with the corpus: the corpus grows the number of files and buckets, not the size of one, and a
writer reads the markers of ``parallelism`` parts and maps that many files per bucket, not one per shard.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from pipeline.io import completed, config_digest, read_json, read_marker, write_json, write_marker
from pipeline.sink.packing import StreamPacker
from pipeline.sink.scatter import SCATTER_DIR, open_batch, part_path
from pipeline.sink.writer import MANIFEST, ShardWriter, set_manifest, shard_names

OUT_DIR = Path("sink") / "out"
CHUNK_TOKENS = 4 << 20      # tokens packed per StreamPacker.feed call


class RowDealError(ValueError):
    """The corpus packs into fewer rows than output files (one line, names ``pack.shard_num``)."""


def output_path(rdir: Path, k: int, n_files: int) -> Path:
    return rdir / OUT_DIR / shard_names("corpus", n_files)[k]


def total_rows(stream_tokens: int, seq_len: int, remainder: str) -> int:
    """Rows of ``seq_len + 1`` tokens the stream packs into (the tail dropped, or padded into one more row)."""
    width = seq_len + 1
    return stream_tokens // width if remainder == "drop" else -(-stream_tokens // width)


def check_rows(rows: int, n_files: int, seq_len: int, shard_num: int | None = None) -> None:
    if rows < n_files:
        raise RowDealError(f"pack.shard_num: the corpus packs into {rows} rows of {seq_len + 1} tokens, fewer than "
                           f"its {n_files} output files (pack.shard_num {shard_num or n_files}); lower "
                           "pack.shard_num or add data")


def file_rows(rows: int, n_files: int, k: int) -> tuple[int, int]:
    """Global row range ``[first, stop)`` of output file ``k``: consecutive rows, counts differing by at most 1."""
    return k * rows // n_files, (k + 1) * rows // n_files


def row_plan(markers: list[dict], n_files: int, *, seq_len: int, bos: bool, remainder: str) -> dict:
    """From the scatter markers: stream tokens per bucket, where each bucket starts, and the row count."""
    import numpy as np

    per = 2 if bos else 1                    # EOS (and BOS) per copy
    bucket = np.zeros(n_files, np.int64)
    for m in markers:
        bucket += np.asarray(m["tokens"], np.int64) + per * np.asarray(m["copies"], np.int64)
    start = np.concatenate([[0], np.cumsum(bucket)])
    rows = total_rows(int(start[-1]), seq_len, remainder)
    check_rows(rows, n_files, seq_len)
    return {"bucket_start": start.tolist(), "stream_tokens": int(start[-1]), "rows": rows}


def _scatter_markers(rdir: Path, parts: list[str], n_files: int) -> list[dict]:
    markers = [completed(part_path(rdir, p)) for p in parts]
    missing = [p for p, m in zip(parts, markers, strict=True) if not m or m.get("n_files") != n_files]
    if missing:
        raise RuntimeError(f"{part_path(rdir, missing[0])}: not scattered into {n_files} buckets "
                           f"({len(missing)} of {len(parts)} scatter parts missing); run the sink scatter step first")
    return markers


def _bucket_copies(rdir: Path, parts: list[str], markers: list[dict], b: int) -> dict:
    """Bucket ``b`` of every scatter part, memory-mapped: per copy its key, length, domain and source (part, row)."""
    import numpy as np

    keys, lens, dom, part, sources = [], [], [], [], []
    for name, m in zip(parts, markers, strict=True):
        if not m["copies"][b]:
            continue
        batch = open_batch(part_path(rdir, name), b)
        col = batch.column(2)
        offsets = col.offsets.to_numpy()
        keys.append(batch.column(0).to_numpy())
        dom.append(batch.column(1).to_numpy())
        lens.append(np.diff(offsets).astype(np.int64))
        part.append(np.full(len(batch), len(sources), np.int32))
        sources.append((col.values.to_numpy(zero_copy_only=False), offsets[:-1].astype(np.int64)))
    if not sources:
        return {"n": 0}
    rows = np.concatenate([np.arange(len(k), dtype=np.int64) for k in keys])
    return {"n": len(rows), "keys": np.concatenate(keys), "lens": np.concatenate(lens), "dom": np.concatenate(dom),
            "part": np.concatenate(part), "row": rows, "sources": sources}


def _gather(bucket: dict, chunk):
    """The tokens of copies ``chunk`` (indices into the bucket), back to back: (flat, starts, lens)."""
    import numpy as np

    n = bucket["lens"][chunk]
    dst = np.cumsum(n) - n
    flat = np.empty(int(n.sum()), np.int32)
    part = bucket["part"][chunk]
    if not len(part):
        return flat, dst, n
    by_part = np.argsort(part, kind="stable")       # one pass per part present in the chunk, not per scatter file
    sorted_part = part[by_part]
    first = np.flatnonzero(np.concatenate([[True], sorted_part[1:] != sorted_part[:-1]]))   # sorted: no np.unique
    for p, sel in zip(sorted_part[first].tolist(), np.split(by_part, first[1:]), strict=True):
        values, starts = bucket["sources"][p]
        ln = n[sel]
        ramp = np.arange(int(ln.sum()), dtype=np.int64) - np.repeat(np.cumsum(ln) - ln, ln)
        flat[np.repeat(dst[sel], ln) + ramp] = values[np.repeat(starts[bucket["row"][chunk[sel]]], ln) + ramp]
    return flat, dst, n


def write_output_file(rdir: Path, k: int, n_files: int, parts: list[str], *, seq_len: int, eos_id: int,
                      bos_id: int | None, pad_id: int, remainder: str, domain_field: bool, boundaries: bool,
                      n_domains: int, megatron_dtype: str | None = None, verify_mem_mb: int | None = None) -> dict:
    """Pack and write output file ``k`` of ``n_files`` (its rows of the corpus stream, from the scatter ``parts``);
    its manifest entry. With ``megatron_dtype`` the same pass also writes the file's documents as Megatron's
    ``.bin/.idx`` (:mod:`pipeline.sink.megatron`: the documents whose first token falls in this file)."""
    import numpy as np

    from .megatron import IndexedWriter, prefix_of

    final = output_path(rdir, k, n_files)
    markers = _scatter_markers(rdir, parts, n_files)
    digest = config_digest("sink_write", k, n_files, seq_len, eos_id, bos_id, pad_id, remainder, domain_field,
                           boundaries, n_domains, [m["sha256"] for m in markers], megatron_dtype)
    if done := completed(final, digest):
        return done["entry"]
    plan = row_plan(markers, n_files, seq_len=seq_len, bos=bos_id is not None, remainder=remainder)
    first, stop = file_rows(plan["rows"], n_files, k)
    width, last = seq_len + 1, k == n_files - 1
    lo = first * width
    hi = plan["stream_tokens"] if last else stop * width       # the last file also takes the stream's tail
    per = 2 if bos_id is not None else 1
    packer = StreamPacker(seq_len=seq_len, eos_id=eos_id, bos_id=bos_id, pad_id=pad_id, boundaries=boundaries,
                          n_domains=n_domains, rows=(first, stop))
    tmp_dir = final.parent / f".tmp-{k:05d}-{os.getpid()}"     # MindRecord files must keep their own name
    shutil.rmtree(tmp_dir, ignore_errors=True)
    tmp_dir.mkdir(parents=True)
    tmp = tmp_dir / final.name
    writer = ShardWriter(tmp, seq_len, domain_field=domain_field, boundaries=boundaries)
    mega = IndexedWriter(tmp_dir / prefix_of(final.name), megatron_dtype, eos_id=eos_id, bos_id=bos_id) \
        if megatron_dtype else None
    digest_rows = hashlib.sha256()

    def put(parts):
        for rows, row_domain, row_starts in parts:
            digest_rows.update(np.ascontiguousarray(rows).tobytes())
            for i in range(len(rows)):
                writer.add(rows[i], row_domain[i], row_starts[i] if boundaries else None)

    copies = _feed_buckets(rdir, parts, markers, plan["bucket_start"], (lo, hi), per, packer, put, mega)
    if last:
        put(packer.finish(remainder))
    if writer.samples != stop - first:
        writer.close()
        raise RuntimeError(f"{final}: packed {writer.samples} rows, the row plan gives it {stop - first} "
                           f"(rows {first}..{stop - 1} of {plan['rows']}); the scatter markers disagree with the data")
    entry = writer.close()
    if mega is not None:
        entry["megatron"] = mega.close()
    entry.update(file=final.name, rows_sha256=digest_rows.hexdigest(), copies=copies, rows=[first, stop],
                 tokens_per_domain=[int(x) for x in packer.tokens_per_domain],
                 dropped_tail_tokens=packer.dropped_tail_tokens, padded_tokens=packer.padded_tokens)
    _verify_written(tmp_dir, entry, seq_len=seq_len, domain_field=domain_field, boundaries=boundaries,
                    mem_limit_mb=verify_mem_mb)
    os.replace(f"{tmp}.db", f"{final}.db")
    if mega is not None:
        for suffix in (".bin", ".idx"):
            os.replace(f"{mega.prefix}{suffix}", final.parent / f"{prefix_of(final.name)}{suffix}")
    os.replace(tmp, final)
    shutil.rmtree(tmp_dir)
    write_marker(final, {"entry": entry}, config=digest, sha256=entry["sha256"])
    return entry


def _feed_buckets(rdir: Path, parts: list[str], markers: list[dict], start, span: tuple[int, int], per: int,
                  packer: StreamPacker, put, mega) -> int:
    """The copies of the output file's stream ``span`` (token positions ``lo..hi``), bucket by bucket in key order,
    chunk by chunk into ``packer`` (its rows to ``put``) and the documents that begin in the file to the Megatron
    writer ``mega``; returns how many copies begin in the file. ``start``: the stream position of every bucket
    (``row_plan``'s ``bucket_start``); ``per``: the tokens a copy adds besides its own (EOS, and BOS)."""
    import numpy as np

    lo, hi = span
    copies, aligned = 0, False
    for b in range(len(start) - 1):
        if start[b] >= hi or start[b + 1] <= lo or start[b] == start[b + 1]:
            continue
        bucket = _bucket_copies(rdir, parts, markers, b)
        order = np.argsort(bucket["keys"], kind="stable")      # part (then shard) order breaks ties: deterministic
        seg = bucket["lens"][order] + per
        at = start[b] + np.cumsum(seg) - seg                    # stream position of every copy
        keep = (at + seg > lo) & (at < hi)
        sel = order[keep]
        if not len(sel):
            continue
        if not aligned:
            packer.align(int(at[keep][0]))
            aligned = True
        copies += int((at[keep] >= lo).sum())                  # copies that begin in this file
        cum = np.cumsum(bucket["lens"][sel])
        cuts = np.searchsorted(cum, np.arange(CHUNK_TOKENS, int(cum[-1]), CHUNK_TOKENS))
        for chunk, begins in zip(np.split(sel, cuts), np.split(at[keep] >= lo, cuts), strict=True):
            flat, starts, lens = _gather(bucket, chunk)
            put(packer.feed(flat, starts, lens, bucket["dom"][chunk], np.arange(len(chunk))))
            if mega is not None:  # the documents that begin in this file, in stream order
                mega.add(flat, starts[begins], lens[begins])
        del bucket, order, seg, at, keep, sel
    return copies


def _verify_written(tmp_dir: Path, entry: dict, *, seq_len: int, domain_field: bool, boundaries: bool,
                    mem_limit_mb: int | None = None) -> None:
    """The writer's own full check of the file it wrote: every row read back (count, length, content hash), in a
    child that starts MindSpore (its framework's memory too) limited to ``mem_limit_mb`` (``pack.verify_mem_mb``).
    The heap the writing freed goes back to the OS first, so the task's peak is the larger of the two, not their
    sum."""
    from pipeline.profile import release_memory
    from pipeline.sink.verify import verify

    release_memory()

    write_json(tmp_dir / MANIFEST, set_manifest([entry], seq_len=seq_len, rows_sha256=entry["rows_sha256"],
                                                domain_field=domain_field, boundaries=boundaries))
    verify(tmp_dir, full_read=True, hashes=False, mem_limit_mb=mem_limit_mb)


def finalize_set(rdir: Path, n_files: int, parts: list[str], *, seq_len: int, domains: list[str],
                 domain_field: bool, boundaries: bool, extra: dict, num_shards: int | None = None) -> dict:
    """Assemble the manifest from the writers' markers, check the row deal (and the split over ``num_shards``
    ranks), rename ``sink/out`` to ``mindrecord``; return the manifest.  Reads no MindRecord data."""
    from pipeline.sink.verify import rank_split, verify

    final = rdir / "mindrecord"
    if (final / MANIFEST).exists() and (old := read_json(final / MANIFEST)).get("config_sha256") == \
            extra.get("config_sha256"):
        return old
    entries = []
    for k in range(n_files):
        done = completed(output_path(rdir, k, n_files))
        if not done:
            raise RuntimeError(f"{output_path(rdir, k, n_files)}: output file {k + 1} of {n_files} is not written; "
                               "run the sink write step first")
        entries.append(done["entry"])
    rows = sum(e["samples"] for e in entries)
    for k, e in enumerate(entries):
        if e.get("rows") != list(file_rows(rows, n_files, k)):
            raise RuntimeError(f"{output_path(rdir, k, n_files)}: holds rows {e.get('rows')}, the deal of {rows} rows "
                               f"over {n_files} files gives {list(file_rows(rows, n_files, k))}; rewrite the sink")
    scatter = [read_marker(part_path(rdir, p)) for p in parts]
    if not all(scatter):
        raise RuntimeError(f"{part_path(rdir, parts[scatter.index(None)])}: scatter marker missing; rerun the sink")
    scatter = sorted((s for m in scatter for s in m["shards"]), key=lambda s: s["shard"])
    per_domain = {d: sum(e["tokens_per_domain"][i] for e in entries if i < len(e["tokens_per_domain"]))
                  for i, d in enumerate(domains)}
    total = sum(per_domain.values()) or 1
    files = [{k: e[k] for k in ("file", "samples", "sha256", "db_sha256", "bytes", "content_sha256", "rows_sha256",
                                 "copies", "dropped_tail_tokens", "megatron") if k in e} for e in entries]
    if any("megatron" in f for f in files):  # BlendedMegatronDatasetDataLoader's data_path, relative to the folder
        from .megatron import data_path

        extra = {**extra, "megatron": {"dtype": files[0]["megatron"]["dtype"], "data_path": data_path(files, ""),
                                       "documents": sum(f["megatron"]["documents"] for f in files)}}
    joined = hashlib.sha256("".join(e["rows_sha256"] for e in entries).encode()).hexdigest()
    manifest = set_manifest(files, seq_len=seq_len, domain_field=domain_field, boundaries=boundaries,
                            rows_sha256=joined, extra={
        "layout": "contiguous", "domains": domains, "tokens_per_domain": per_domain,
        "token_share": {d: n / total for d, n in per_domain.items()}, **extra,
        "dropped_tail_tokens": sum(e["dropped_tail_tokens"] for e in entries),
        "padded_tokens": sum(e["padded_tokens"] for e in entries), "documents": sum(e["copies"] for e in entries),
        "unique_documents": sum(m["unique_docs"] for m in scatter),
        "inputs": [{"shard": m["shard"], "sha256": m["input_sha256"], "docs": m["docs"],
                    "mixture_sha256": m["mixture_sha256"]} for m in scatter]})
    if num_shards:
        rank_split(manifest, num_shards, rdir / OUT_DIR)
    out = rdir / OUT_DIR
    for f in out.iterdir():        # leftovers of killed writers
        if f.name.startswith("."):
            shutil.rmtree(f)
    write_json(out / MANIFEST, manifest)
    verify(out, full_read=False, hashes=False)          # every file there with its size: no data read
    if final.exists():
        shutil.rmtree(final)
    os.replace(out, final)
    for f in final.glob("*.done"):
        f.unlink()
    shutil.rmtree(rdir / SCATTER_DIR, ignore_errors=True)
    return manifest
