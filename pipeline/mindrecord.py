"""Packing into ``seq_len + 1`` rows and the MindRecord sink, with a manifest that stands in for checksums.

Packing: documents in a seeded order (a hash of seed and doc id, so it mixes domains and never depends on a
process RNG) are concatenated with EOS after each one (BOS before each when configured) and cut into rows of
exactly ``seq_len + 1`` tokens, the mindformers pretraining convention (the model shifts inside).  The tail that
does not fill a row is dropped and reported as ``dropped_tail_tokens``.

MindRecord: ``FileWriter(shard_num=N)`` assigns rows to shard files nondeterministically (measured: the same 11
rows split 5/6 in one run and 6/5 in the next), so each shard file is written by its own single-shard
``FileWriter`` with rows dealt round-robin.  That keeps reruns byte-identical and the per-shard sample counts
known.  Files are written into a temporary folder that is renamed into place, made world-readable (the writer
creates them 0600), and listed with sha256 and row counts in ``manifest.json`` — MindRecord itself has no data
checksums, so :func:`verify` checks the manifest before training reads a shard.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from pipeline.io import read_json, read_parquet, sha256_file, write_json

COLUMN = "input_ids"
SCHEMA = {COLUMN: {"type": "int32", "shape": [-1]}}
MANIFEST = "manifest.json"


class ShardError(RuntimeError):
    """A MindRecord shard does not match its manifest; the message names the file."""


def _order_key(seed: int, doc_id: str) -> str:
    return hashlib.sha1(f"pack\x00{seed}\x00{doc_id}".encode()).hexdigest()


def pack_rows(docs: list[tuple[str, list[int]]], seq_len: int, eos_id: int, bos_id: int | None):
    """Concatenate (domain, tokens) documents and cut ``seq_len + 1`` rows.

    Returns (rows int32 [n, seq_len + 1], tokens per domain in the rows, dropped tail tokens).
    """
    import numpy as np

    width = seq_len + 1
    parts, owners = [], []
    domains = sorted({d for d, _ in docs})
    dom_index = {d: i for i, d in enumerate(domains)}
    for dom, toks in docs:
        seq = ([bos_id] if bos_id is not None else []) + list(toks) + [eos_id]
        parts.append(np.asarray(seq, dtype=np.int32))
        owners.append(np.full(len(seq), dom_index[dom], dtype=np.int16))
    stream = np.concatenate(parts) if parts else np.zeros(0, np.int32)
    owner = np.concatenate(owners) if owners else np.zeros(0, np.int16)
    n_rows = len(stream) // width
    used = n_rows * width
    counts = np.bincount(owner[:used], minlength=len(domains)) if used else np.zeros(len(domains), np.int64)
    per_domain = {d: int(counts[i]) for d, i in dom_index.items()}
    return stream[:used].reshape(n_rows, width), per_domain, int(len(stream) - used)


def _write_shard(path: Path, rows) -> None:
    from mindspore.mindrecord import FileWriter

    writer = FileWriter(file_name=str(path), shard_num=1, overwrite=True)
    writer.set_page_size(1 << 22)   # default 32 MiB pages make tiny shards look 32 MB large (sparse files)
    writer.set_header_size(1 << 20)
    writer.add_schema(SCHEMA, "mindloom pretraining tokens")
    for start in range(0, len(rows), 1000):
        writer.write_raw_data([{COLUMN: r} for r in rows[start:start + 1000]])
    writer.commit()


def write_mindrecord(rdir: Path, shards: list[str], *, seq_len: int, shard_num: int, add_bos: bool, seed: int,
                     tokenizer_sha256: str, config_sha256: str, eos_id: int, bos_id: int,
                     vocab_size: int) -> dict:
    """Pack every tokenized shard and write ``mindrecord/`` with its manifest; return the manifest."""
    import numpy as np

    final = rdir / "mindrecord"
    if (final / MANIFEST).exists():
        manifest = read_json(final / MANIFEST)
        verify(final, full_read=False)
        return manifest
    keyed, lineage = [], []
    for shard in sorted(shards):
        path = rdir / "tokenize" / f"{shard}.parquet"
        t = read_parquet(path, columns=["doc_id", "domain", "tokens"])
        for did, dom, toks in zip(*(t.column(c).to_pylist() for c in ("doc_id", "domain", "tokens")), strict=True):
            keyed.append((_order_key(seed, did), dom, toks))
        lineage.append({"shard": shard, "sha256": sha256_file(path), "docs": t.num_rows})
    keyed.sort(key=lambda x: x[0])
    rows, per_domain, dropped = pack_rows([(d, t) for _, d, t in keyed], seq_len, eos_id,
                                          bos_id if add_bos else None)
    if len(rows) < shard_num:
        raise ValueError(f"pack.shard_num: {shard_num} shards need at least as many rows of {seq_len + 1} tokens, "
                         f"but the corpus packs into {len(rows)}")
    tmp = rdir / f".mindrecord.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    files = []
    for s in range(shard_num):
        name = f"corpus-{s:05d}-of-{shard_num:05d}.mindrecord"
        shard_rows = rows[s::shard_num]
        _write_shard(tmp / name, shard_rows)
        for f in (name, name + ".db"):
            os.chmod(tmp / f, 0o644)
        files.append({"file": name, "samples": int(len(shard_rows)), "sha256": sha256_file(tmp / name),
                      "db_sha256": sha256_file(tmp / (name + ".db")), "bytes": (tmp / name).stat().st_size})
    manifest = {
        "format": "mindrecord", "column": COLUMN, "dtype": "int32", "seq_len": seq_len, "row_length": seq_len + 1,
        "samples": int(len(rows)), "tokens": int(rows.size), "tokens_per_domain": per_domain,
        "dropped_tail_tokens": dropped, "documents": len(keyed), "shards": files,
        "vocab_size": vocab_size, "tokenizer_sha256": tokenizer_sha256, "config_sha256": config_sha256, "eos_id": eos_id,
        "bos_id": bos_id if add_bos else None, "inputs": lineage,
        "rows_sha256": hashlib.sha256(np.ascontiguousarray(rows).tobytes()).hexdigest(),
    }
    write_json(tmp / MANIFEST, manifest)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    return manifest


def dataset_files(mr_dir: str | Path) -> list[str]:
    """The shard files listed in the manifest, in order (what ``MindDataset(dataset_files=...)`` takes)."""
    mr_dir = Path(mr_dir)
    return [str(mr_dir / s["file"]) for s in read_json(mr_dir / MANIFEST)["shards"]]


def verify(mr_dir: str | Path, full_read: bool = True, num_shards: int | None = None) -> dict:
    """Check every shard against the manifest (sha256 of data and index files, sample counts).

    With ``full_read`` each shard is also read through ``MindDataset`` (for every rank when ``num_shards`` is
    given) and the rows are counted and checked for length.  Raises :class:`ShardError` naming the file.
    """
    mr_dir = Path(mr_dir)
    if not (mr_dir / MANIFEST).exists():
        raise ShardError(f"{mr_dir / MANIFEST}: manifest missing; the MindRecord set is incomplete")
    manifest = read_json(mr_dir / MANIFEST)
    for s in manifest["shards"]:
        for name, key in ((s["file"], "sha256"), (s["file"] + ".db", "db_sha256")):
            path = mr_dir / name
            if not path.exists():
                raise ShardError(f"{path}: missing (listed in the manifest)")
            if sha256_file(path) != s[key]:
                raise ShardError(f"{path}: sha256 differs from the manifest (corrupt or truncated shard)")
    result = {"shards": len(manifest["shards"]), "samples": manifest["samples"], "read": 0}
    if not full_read:
        return result
    import mindspore.dataset as ds

    for s in manifest["shards"]:
        path = mr_dir / s["file"]
        n = 0
        try:
            for (row,) in ds.MindDataset(str(path), columns_list=[COLUMN], shuffle=False).create_tuple_iterator(
                    output_numpy=True, num_epochs=1):
                if len(row) != manifest["row_length"]:
                    raise ShardError(f"{path}: row {n} has {len(row)} tokens, expected {manifest['row_length']}")
                n += 1
        except RuntimeError as exc:
            raise ShardError(f"{path}: unreadable ({str(exc).splitlines()[0]})") from None
        if n != s["samples"]:
            raise ShardError(f"{path}: {n} rows read, manifest says {s['samples']}")
        result["read"] += n
    if num_shards:
        seen = 0
        for rank in range(num_shards):
            d = ds.MindDataset(dataset_files(mr_dir), columns_list=[COLUMN], shuffle=False,
                               num_shards=num_shards, shard_id=rank)
            seen += sum(1 for _ in d.create_tuple_iterator(output_numpy=True, num_epochs=1))
        if seen != manifest["samples"]:
            raise ShardError(f"{mr_dir}: {num_shards} ranks read {seen} rows, manifest says {manifest['samples']}")
        result["ranks_checked"] = num_shards
    return result
