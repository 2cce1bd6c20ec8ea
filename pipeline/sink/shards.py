"""Sink step 2 (per output file) and 3 (the set): each MindRecord file packed and written on its own.

:func:`write_output_file` reads batch ``k`` of every scatter file (:mod:`pipeline.sink.scatter`), sorts the copies
by key, packs them chunk by chunk (:class:`pipeline.sink.packing.StreamPacker`) and streams the rows into
``sink/out/corpus-<k>-of-<n>.mindrecord`` with a completion marker holding its manifest entry.  Each file is its own
packed stream: its tail shorter than a row is dropped (``remainder: drop``) or padded, per file.

:func:`finalize_set` assembles ``manifest.json`` from the markers, renames ``sink/out`` to ``mindrecord`` and
removes the scatter files.  The manifest's ``layout`` is ``"contiguous"``: rows are consecutive in the packed stream
within a file (what long-context re-packing needs, :mod:`pipeline.train.repack`), and ``rows_sha256`` is the sha256
of the files' own ``rows_sha256`` values joined in file order.

Memory of a writer task: 4 bytes per token of its file (all its copies' tokens, read batch by batch into one
preallocated array), 24 bytes per copy (key, length, domain, order), and the packing chunk (about 30 bytes per token
of ``CHUNK_TOKENS``, ~120 MB).  With the default ``pack.shard_mb: 256`` that is about 0.5 GB plus the MindSpore
import, whatever the corpus size: the corpus grows the number of files, not the memory of one.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from pipeline.io import completed, read_json, write_json, write_marker
from pipeline.sink.packing import StreamPacker
from pipeline.sink.scatter import SCATTER_DIR, read_batch, scatter_path
from pipeline.sink.writer import MANIFEST, ShardWriter, set_manifest, shard_names

OUT_DIR = Path("sink") / "out"
CHUNK_TOKENS = 4 << 20      # tokens packed per StreamPacker.feed call


def output_path(rdir: Path, k: int, n_files: int) -> Path:
    return rdir / OUT_DIR / shard_names("corpus", n_files)[k]


def write_output_file(rdir: Path, k: int, n_files: int, shards: list[str], *, seq_len: int, eos_id: int,
                      bos_id: int | None, pad_id: int, remainder: str, domain_field: bool, boundaries: bool,
                      n_domains: int) -> dict:
    """Pack and write output file ``k`` of ``n_files`` from every shard's scatter batch ``k``; its manifest entry."""
    import numpy as np

    final = output_path(rdir, k, n_files)
    if done := completed(final):
        return done["entry"]
    markers = [completed(scatter_path(rdir, s)) for s in shards]
    missing = [s for s, m in zip(shards, markers, strict=True) if not m or m.get("n_files") != n_files]
    if missing:
        raise RuntimeError(f"{scatter_path(rdir, missing[0])}: not scattered into {n_files} files "
                           f"({len(missing)} shards missing); run the sink scatter step first")
    n_tok = sum(m["tokens"][k] for m in markers)
    n_copies = sum(m["copies"][k] for m in markers)
    flat = np.empty(n_tok, np.int32)
    keys, lens, dom = (np.empty(n_copies, np.uint64), np.empty(n_copies, np.int64), np.empty(n_copies, np.int32))
    t = c = 0
    for shard, m in zip(shards, markers, strict=True):
        if not m["copies"][k]:
            continue
        b = read_batch(scatter_path(rdir, shard), k)
        col = b.column(2)
        vals = col.values.to_numpy(zero_copy_only=False)
        n = len(b)
        flat[t:t + len(vals)] = vals
        keys[c:c + n] = b.column(0).to_numpy()
        dom[c:c + n] = b.column(1).to_numpy()
        lens[c:c + n] = np.diff(col.offsets.to_numpy())
        t, c = t + len(vals), c + n
        del b, col, vals
    order = np.argsort(keys, kind="stable")
    starts = np.cumsum(lens) - lens
    packer = StreamPacker(seq_len=seq_len, eos_id=eos_id, bos_id=bos_id, pad_id=pad_id, boundaries=boundaries,
                          n_domains=n_domains)
    tmp_dir = final.parent / f".tmp-{k:05d}-{os.getpid()}"     # MindRecord files must keep their own name
    shutil.rmtree(tmp_dir, ignore_errors=True)
    tmp_dir.mkdir(parents=True)
    tmp = tmp_dir / final.name
    writer = ShardWriter(tmp, seq_len, domain_field=domain_field, boundaries=boundaries)
    digest = hashlib.sha256()

    def put(parts):
        for rows, row_domain, row_starts in parts:
            digest.update(np.ascontiguousarray(rows).tobytes())
            for i in range(len(rows)):
                writer.add(rows[i], row_domain[i], row_starts[i] if boundaries else None)

    cum = np.cumsum(lens[order])
    cuts = np.searchsorted(cum, np.arange(CHUNK_TOKENS, int(cum[-1]) if len(cum) else 0, CHUNK_TOKENS))
    for chunk in np.split(order, cuts):
        put(packer.feed(flat, starts, lens, dom, chunk))
    put(packer.finish(remainder))
    if not writer.samples:
        writer.close()
        raise ValueError(f"pack.shard_num: output file {k + 1} of {n_files} packs into 0 rows of {seq_len + 1} "
                         f"tokens ({n_tok} tokens in {n_copies} copies); lower pack.shard_num or pack.shard_mb")
    entry = writer.close()
    os.replace(f"{tmp}.db", f"{final}.db")
    os.replace(tmp, final)
    tmp_dir.rmdir()
    entry.update(file=final.name, rows_sha256=digest.hexdigest(), copies=int(n_copies),
                 tokens_per_domain=[int(x) for x in packer.tokens_per_domain],
                 dropped_tail_tokens=packer.dropped_tail_tokens, padded_tokens=packer.padded_tokens)
    write_marker(final, {"entry": entry})
    return entry


def finalize_set(rdir: Path, n_files: int, shards: list[str], *, seq_len: int, domains: list[str],
                 domain_field: bool, boundaries: bool, extra: dict) -> dict:
    """Assemble the manifest from the written files, rename ``sink/out`` to ``mindrecord``; return the manifest."""
    final = rdir / "mindrecord"
    if (final / MANIFEST).exists():
        return read_json(final / MANIFEST)
    entries = []
    for k in range(n_files):
        done = completed(output_path(rdir, k, n_files))
        if not done:
            raise RuntimeError(f"{output_path(rdir, k, n_files)}: output file {k + 1} of {n_files} is not written; "
                               "run the sink write step first")
        entries.append(done["entry"])
    scatter = [read_json(scatter_path(rdir, s).with_name(scatter_path(rdir, s).name + ".done")) for s in shards]
    per_domain = {d: sum(e["tokens_per_domain"][i] for e in entries if i < len(e["tokens_per_domain"]))
                  for i, d in enumerate(domains)}
    total = sum(per_domain.values()) or 1
    files = [{k: e[k] for k in ("file", "samples", "sha256", "db_sha256", "bytes", "content_sha256", "rows_sha256",
                                 "copies", "dropped_tail_tokens")} for e in entries]
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
    out = rdir / OUT_DIR
    for f in out.iterdir():        # leftovers of killed writers
        if f.name.startswith("."):
            shutil.rmtree(f)
    write_json(out / MANIFEST, manifest)
    if final.exists():
        shutil.rmtree(final)
    os.replace(out, final)
    for f in final.glob("*.done"):
        f.unlink()
    shutil.rmtree(rdir / SCATTER_DIR, ignore_errors=True)
    return manifest
