"""Packing into ``seq_len + 1`` rows and the MindRecord sink, with a manifest that stands in for checksums.

Packing: documents in a seeded order (a hash of seed, doc id and copy number, so it mixes domains, spreads the
repeats of an upsampled document apart and never depends on a process RNG) are concatenated with EOS after each
one (BOS before each when configured) and cut into rows of exactly ``seq_len + 1`` tokens, the mindformers
pretraining convention (the model shifts inside).  Remainder policy: the tail that does not fill a row is dropped
and counted as ``dropped_tail_tokens`` (``remainder="drop"``, mindformers), or padded with ``pad_id`` to one last
row (``remainder="pad"``, used for validation so every held-out token is scored; the trainer must then ignore
``pad_id`` labels).  Documents are never split across the drop: only the stream's last partial row goes.

Row schema: ``input_ids`` int32 ``[seq_len + 1]``; optionally ``domain_id`` int32 (index into the manifest's
``domains``: the domain of the row's first token; an index field, so ``MindPage`` can list rows per domain) and
``segment_starts`` int32 ``[-1]`` (positions where a document begins inside the row, 0 always listed: tokens attend
only within ``[starts[i], starts[i+1])`` when a long-context stage resets attention at document boundaries).

MindRecord: ``FileWriter(shard_num=N)`` assigns rows to shard files nondeterministically (measured: the same 11
rows split 5/6 in one run and 6/5 in the next), so each shard file is written by its own single-shard
``FileWriter`` (optionally in parallel processes) with rows dealt round-robin.  That keeps reruns byte-identical
and the per-shard sample counts known.  Files are written into a temporary folder that is renamed into place, made
world-readable (the writer creates them 0600), and listed with sha256, row counts and a content hash of the decoded
rows in ``manifest.json``.  MindRecord itself has no checksums (zeroed or bit-flipped row data reads back silently
wrong), so :func:`verify` checks file hashes first and then re-reads every row through ``MindDataset`` in a
memory-limited child process, because a damaged shard has made the reader allocate 23 GB.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

from pipeline.io import read_json, read_parquet, sha256_file, write_json

COLUMN = "input_ids"
DOMAIN_COLUMN = "domain_id"
STARTS_COLUMN = "segment_starts"
MANIFEST = "manifest.json"
FILE_PAD = -100          # pad value when the tokenizer has no pad piece (the trainer's default ignored label)


class ShardError(RuntimeError):
    """A MindRecord shard does not match its manifest or cannot be read; the message names the file."""


# ------------------------------------------------------------------------------------------------ packing


def order_keys(seed: int, doc_ids: list[str], copies) -> tuple:
    """(document index, uint64 sort key) for every copy of every document: sorting by key gives the order."""
    import numpy as np

    idx, keys = [], []
    for i, (did, c) in enumerate(zip(doc_ids, copies, strict=True)):
        for k in range(int(c)):
            idx.append(i)
            keys.append(int.from_bytes(hashlib.blake2b(f"pack\x00{seed}\x00{did}\x00{k}".encode(),
                                                       digest_size=8).digest(), "big"))
    return np.asarray(idx, np.int64), np.asarray(keys, np.uint64)


def pack(flat, starts, lens, dom, order, *, seq_len: int, eos_id: int, bos_id: int | None, pad_id: int,
         remainder: str = "drop", boundaries: bool = False) -> dict:
    """Concatenate documents ``order`` (indices into ``starts``/``lens``/``dom``) and cut ``seq_len + 1`` rows.

    ``flat`` holds every document's tokens back to back.  Returns rows int32 ``[n, seq_len + 1]``, the domain index
    of each row's first token, per-row segment starts (when ``boundaries``), token counts per domain index in
    the rows, and the tail dropped or padded.
    """
    import numpy as np

    width = seq_len + 1
    pre = 0 if bos_id is None else 1
    n = lens[order].astype(np.int64)
    src = starts[order].astype(np.int64)
    seg = n + 1 + pre
    seg_start = np.cumsum(seg) - seg
    total = int(seg.sum())
    stream = np.empty(total, np.int32)
    if pre:
        stream[seg_start] = bos_id
    stream[seg_start + pre + n] = eos_id
    n_tok = int(n.sum())
    if n_tok:
        before = np.cumsum(n) - n
        ramp = np.arange(n_tok, dtype=np.int64)
        stream[np.repeat(seg_start + pre - before, n) + ramp] = flat[np.repeat(src - before, n) + ramp]
    owner = np.repeat(dom[order].astype(np.int32), seg)
    n_rows, tail = divmod(total, width)
    padded = dropped = 0
    if tail and remainder == "pad":
        padded = width - tail
        stream = np.concatenate([stream, np.full(padded, pad_id, np.int32)])
        owner = np.concatenate([owner, np.full(padded, -1, np.int32)])
        n_rows += 1
    else:
        dropped = tail
    used = n_rows * width
    rows = stream[:used].reshape(n_rows, width)
    real = owner[:used]
    counts = np.bincount(real[real >= 0], minlength=int(dom.max()) + 1 if len(dom) else 0)
    out = {"rows": rows, "row_domain": owner[:used:width].copy() if n_rows else np.zeros(0, np.int32),
           "tokens_per_domain": counts, "dropped_tail_tokens": int(dropped), "padded_tokens": int(padded),
           "row_starts": None}
    if boundaries:
        s = seg_start[seg_start < used]
        row_of = s // width
        cuts = np.searchsorted(row_of, np.arange(n_rows + 1))
        out["row_starts"] = [_with_zero((s[cuts[r]:cuts[r + 1]] - r * width).astype(np.int32))
                             for r in range(n_rows)]
    return out


def _with_zero(pos):
    import numpy as np

    return pos if len(pos) and pos[0] == 0 else np.concatenate([np.zeros(1, np.int32), pos])


# ------------------------------------------------------------------------------------------------ writing


def schema(seq_len: int, domain_field: bool, boundaries: bool) -> dict:
    out = {COLUMN: {"type": "int32", "shape": [seq_len + 1]}}
    if domain_field:
        out[DOMAIN_COLUMN] = {"type": "int32"}
    if boundaries:
        out[STARTS_COLUMN] = {"type": "int32", "shape": [-1]}
    return out


def row_digest(ids, dom, starts) -> bytes:
    """What the manifest's ``content_sha256`` hashes per row: exactly the fields as written (and read back)."""
    import numpy as np

    parts = [np.ascontiguousarray(ids, np.int32).tobytes()]
    if dom is not None:
        parts.append(np.int32(dom).tobytes())
    if starts is not None:
        parts.append(np.int32(len(starts)).tobytes() + np.ascontiguousarray(starts, np.int32).tobytes())
    return b"".join(parts)


def _write_shard(path: str, seq_len: int, rows, row_domain, row_starts) -> str:
    """Write one single-shard MindRecord file (+ .db); return the sha256 of its decoded content."""
    from mindspore.mindrecord import FileWriter

    sch = schema(seq_len, row_domain is not None, row_starts is not None)
    writer = FileWriter(file_name=path, shard_num=1, overwrite=True)
    writer.set_page_size(1 << 22)   # default 32 MiB pages make tiny shards look 32 MB large (sparse files)
    writer.set_header_size(1 << 20)
    writer.add_schema(sch, "mindloom pretraining tokens")
    if row_domain is not None:
        writer.add_index([DOMAIN_COLUMN])
    content = hashlib.sha256()
    for start in range(0, len(rows), 1000):
        batch = []
        for i in range(start, min(start + 1000, len(rows))):
            rec = {COLUMN: rows[i]}
            dom = starts = None
            if row_domain is not None:
                rec[DOMAIN_COLUMN] = dom = int(row_domain[i])
            if row_starts is not None:
                rec[STARTS_COLUMN] = starts = row_starts[i]
            content.update(row_digest(rows[i], dom, starts))
            batch.append(rec)
        writer.write_raw_data(batch)
    writer.commit()
    for f in (path, path + ".db"):
        os.chmod(f, 0o644)
    return content.hexdigest()


def write_token_set(out_dir: Path, doc_domains: list[str], doc_tokens: list, *, seq_len: int, shard_num: int,
                    name: str, eos_id: int, bos_id: int | None, pad_id: int | None, remainder: str = "drop",
                    domain_field: bool = True, boundaries: bool = False, domains: list[str] | None = None,
                    extra: dict | None = None, workers: int = 1) -> dict:
    """Pack documents already in their final order and write ``out_dir`` (shards + manifest); return the manifest.

    ``doc_tokens`` is a list of int32 arrays, or ``(flat, starts, lens, order)`` from :func:`write_mindrecord`.
    Writes in place: callers write into a temporary folder and rename it.
    """
    import numpy as np

    domains = sorted(set(doc_domains)) if domains is None else domains
    index = {d: i for i, d in enumerate(domains)}
    dom = np.asarray([index[d] for d in doc_domains], np.int32)
    if isinstance(doc_tokens, tuple):
        flat, starts, lens, order = doc_tokens
    else:
        lens = np.asarray([len(t) for t in doc_tokens], np.int64)
        starts = np.cumsum(lens) - lens
        flat = np.concatenate(doc_tokens).astype(np.int32) if doc_tokens else np.zeros(0, np.int32)
        order = np.arange(len(doc_tokens))
    pad = FILE_PAD if pad_id is None or pad_id < 0 else pad_id
    packed = pack(flat, starts, lens, dom, order, seq_len=seq_len, eos_id=eos_id, bos_id=bos_id, pad_id=pad,
                  remainder=remainder, boundaries=boundaries)
    rows = packed["rows"]
    if len(rows) < shard_num:
        raise ValueError(f"pack.shard_num: {shard_num} shards need at least as many rows of {seq_len + 1} tokens, "
                         f"but {name} packs into {len(rows)}")
    out_dir.mkdir(parents=True, exist_ok=True)
    jobs = []
    for s in range(shard_num):
        fname = f"{name}-{s:05d}-of-{shard_num:05d}.mindrecord"
        jobs.append((fname, (str(out_dir / fname), seq_len, rows[s::shard_num],
                             packed["row_domain"][s::shard_num] if domain_field else None,
                             packed["row_starts"][s::shard_num] if boundaries else None)))
    if workers > 1 and shard_num > 1:
        with ProcessPoolExecutor(min(workers, shard_num), mp_context=get_context("spawn")) as pool:
            contents = list(pool.map(_write_shard, *zip(*(args for _, args in jobs), strict=True)))
    else:
        contents = [_write_shard(*args) for _, args in jobs]
    files = []
    for (fname, args), content in zip(jobs, contents, strict=True):
        path = out_dir / fname
        files.append({"file": fname, "samples": int(len(args[2])), "sha256": sha256_file(path),
                      "db_sha256": sha256_file(str(path) + ".db"), "bytes": path.stat().st_size,
                      "content_sha256": content})
    per_domain = {d: int(packed["tokens_per_domain"][i]) if i < len(packed["tokens_per_domain"]) else 0
                  for d, i in index.items()}
    fields = [COLUMN] + ([DOMAIN_COLUMN] if domain_field else []) + ([STARTS_COLUMN] if boundaries else [])
    manifest = {
        "format": "mindrecord", "column": COLUMN, "dtype": "int32", "seq_len": seq_len, "row_length": seq_len + 1,
        "fields": fields, "index_fields": [DOMAIN_COLUMN] if domain_field else [], "domains": domains,
        "samples": int(len(rows)), "tokens": int(rows.size), "tokens_per_domain": per_domain,
        "token_share": {d: n / max(sum(per_domain.values()), 1) for d, n in per_domain.items()},
        "remainder": remainder, "dropped_tail_tokens": packed["dropped_tail_tokens"],
        "padded_tokens": packed["padded_tokens"], "documents": int(len(order)), "shards": files,
        "eos_id": eos_id, "bos_id": bos_id, "pad_id": pad,
        "rows_sha256": hashlib.sha256(np.ascontiguousarray(rows).tobytes()).hexdigest(), **(extra or {}),
    }
    write_json(out_dir / MANIFEST, manifest)
    return manifest


def write_mindrecord(rdir: Path, shards: list[str], *, seq_len: int, shard_num: int, add_bos: bool, seed: int,
                     tokenizer_sha256: str, config_sha256: str, eos_id: int, bos_id: int, vocab_size: int,
                     pad_id: int | None = None, mixture: bool = False, remainder: str = "drop",
                     domain_field: bool = True, boundaries: bool = False, workers: int = 1) -> dict:
    """Pack every tokenized shard and write ``mindrecord/`` with its manifest; return the manifest.

    With ``mixture`` the per-document decisions of :func:`pipeline.sink.mixture.plan_mixture` apply (``copies``
    per document: 0 for held-out and downsampled documents, more than 1 for upsampled ones); without it every
    document goes in once.
    """
    import numpy as np
    import pyarrow.compute as pc

    final = rdir / "mindrecord"
    if (final / MANIFEST).exists():
        manifest = read_json(final / MANIFEST)
        verify(final, full_read=False)
        return manifest
    doc_ids, doc_domains, flats, lens_parts, copies, lineage = [], [], [], [], [], []
    for shard in sorted(shards):
        path = rdir / "tokenize" / f"{shard}.parquet"
        t = read_parquet(path, columns=["doc_id", "domain", "tokens"])
        ids = t.column("doc_id").to_pylist()
        tokens = t.column("tokens").combine_chunks()
        lens_parts.append(pc.list_value_length(tokens).to_numpy(zero_copy_only=False).astype(np.int64))
        flats.append(tokens.flatten().to_numpy(zero_copy_only=False).astype(np.int32))
        if mixture:
            dec = read_parquet(rdir / "mixture" / f"{shard}.parquet", columns=["doc_id", "copies"])
            if dec.column("doc_id").to_pylist() != ids:
                raise ValueError(f"{rdir / 'mixture' / shard}.parquet: documents differ from {path}; "
                                 "rerun the mixture plan after tokenization")
            copies.append(dec.column("copies").to_numpy().astype(np.int64))
        else:
            copies.append(np.ones(len(ids), np.int64))
        doc_ids += ids
        doc_domains += t.column("domain").to_pylist()
        lineage.append({"shard": shard, "sha256": sha256_file(path), "docs": t.num_rows,
                        **({"mixture_sha256": sha256_file(rdir / "mixture" / f"{shard}.parquet")} if mixture else {})})
    lens = np.concatenate(lens_parts) if lens_parts else np.zeros(0, np.int64)
    flat = np.concatenate(flats) if flats else np.zeros(0, np.int32)
    idx, keys = order_keys(seed, doc_ids, np.concatenate(copies) if copies else [])
    order = idx[np.argsort(keys, kind="stable")]
    tmp = rdir / f".mindrecord.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    extra = {"vocab_size": vocab_size, "tokenizer_sha256": tokenizer_sha256, "config_sha256": config_sha256,
             "inputs": lineage, "unique_documents": int(len(set(order.tolist()))), "seed": seed,
             "mixture": read_json(rdir / "mixture" / "report.json") if mixture else None}
    manifest = write_token_set(
        tmp, doc_domains, (flat, np.cumsum(lens) - lens, lens, order), seq_len=seq_len, shard_num=shard_num,
        name="corpus", eos_id=eos_id, bos_id=bos_id if add_bos else None, pad_id=pad_id, remainder=remainder,
        domain_field=domain_field, boundaries=boundaries, extra=extra, workers=workers)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    return manifest


def dataset_files(mr_dir: str | Path) -> list[str]:
    """The shard files listed in the manifest, in order (what ``MindDataset(dataset_files=...)`` takes)."""
    mr_dir = Path(mr_dir)
    return [str(mr_dir / s["file"]) for s in read_json(mr_dir / MANIFEST)["shards"]]




# ------------------------------------------------------------------------------------------------ verifying

#: Address-space limit of the reader child; a damaged shard has made MindDataset allocate 23 GB (mindspore.md §3.4).
VERIFY_MEM_MB = int(os.environ.get("MINDLOOM_VERIFY_MEM_MB", "6144"))


def _check_files(mr_dir: Path, manifest: dict) -> None:
    """Existence, then size, then sha256 of every data and index file: the cheapest telling error first."""
    for s in manifest["shards"]:
        data, index = mr_dir / s["file"], mr_dir / (s["file"] + ".db")
        for path in (data, index):
            if not path.exists():
                raise ShardError(f"{path}: missing (listed in the manifest)")
        if "bytes" in s and data.stat().st_size != s["bytes"]:
            raise ShardError(f"{data}: {data.stat().st_size} bytes, manifest says {s['bytes']} (truncated or "
                             "overwritten shard)")
        for path, key in ((data, "sha256"), (index, "db_sha256")):
            if sha256_file(path) != s[key]:
                raise ShardError(f"{path}: sha256 differs from the manifest (corrupt shard)")


def verify(mr_dir: str | Path, full_read: bool = True, num_shards: int | None = None,
           mem_limit_mb: int | None = None, timeout_s: float | None = None) -> dict:
    """Check a MindRecord set (or a collection of sets, e.g. ``mindrecord_val``) against its manifest.

    Always: every data and ``.db`` file exists with the manifest's size and sha256.  With ``full_read``: a child
    process limited to ``mem_limit_mb`` of address space reads every shard through ``MindDataset`` and the row
    counts, row lengths and content hash of the decoded rows must match; with ``num_shards`` it also reads the set
    as that many data-parallel ranks (``num_shards``/``shard_id``) and checks that each rank gets
    ``ceil(rows / ranks)`` rows and that together they cover every row (MindDataset evens out the ranks by
    repeating the first rows; their number is reported as ``padding_rows``).  Raises :class:`ShardError` naming
    the file.
    """
    mr_dir = Path(mr_dir)
    if not (mr_dir / MANIFEST).exists():
        raise ShardError(f"{mr_dir / MANIFEST}: manifest missing; the MindRecord set is incomplete")
    manifest = read_json(mr_dir / MANIFEST)
    if manifest.get("format") == "mindrecord-collection":
        return {"dir": str(mr_dir), "sets": {name: verify(mr_dir / s["dir"], full_read, num_shards, mem_limit_mb,
                                                          timeout_s)
                                             for name, s in sorted(manifest["sets"].items())}}
    _check_files(mr_dir, manifest)
    result = {"dir": str(mr_dir), "shards": len(manifest["shards"]), "samples": manifest["samples"], "read": 0}
    if not full_read:
        return result
    report = _read_in_child(mr_dir, num_shards or 0, mem_limit_mb or VERIFY_MEM_MB, timeout_s)
    total_fp = 0
    for s, got in zip(manifest["shards"], report["shards"], strict=True):
        path = mr_dir / s["file"]
        if got["rows"] != s["samples"]:
            raise ShardError(f"{path}: {got['rows']} rows read, manifest says {s['samples']}")
        if got["bad_length"]:
            raise ShardError(f"{path}: {got['bad_length']} rows are not {manifest['row_length']} tokens long")
        if s.get("content_sha256") and got["content_sha256"] != s["content_sha256"]:
            raise ShardError(f"{path}: decoded rows differ from what was written (content sha256 mismatch)")
        total_fp = (total_fp + got["fingerprint"]) % 2**64
        result["read"] += got["rows"]
    result["reader_max_rss_mb"] = report["max_rss_mb"]
    if num_shards:
        per_rank = -(-manifest["samples"] // num_shards)
        padding = per_rank * num_shards - manifest["samples"]
        union_fp = 0
        for r in report["ranks"]:
            if r["rows"] != per_rank:
                raise ShardError(f"{mr_dir}: rank {r['rank']} of {num_shards} reads {r['rows']} rows, "
                                 f"expected {per_rank}")
            union_fp = (union_fp + r["fingerprint"]) % 2**64
        if union_fp != (total_fp + sum(report["first_digests"][:padding])) % 2**64:
            raise ShardError(f"{mr_dir}: the {num_shards} ranks together do not read every row exactly once "
                             f"(plus {padding} padding rows)")
        result["ranks"] = {"num_shards": num_shards, "rows_per_rank": per_rank, "padding_rows": padding}
    return result


def _read_in_child(mr_dir: Path, ranks: int, mem_limit_mb: int, timeout_s: float | None) -> dict:
    """Run :func:`_reader_main` in a subprocess under RLIMIT_AS; turn any failure into a ShardError naming the file."""
    import json
    import resource
    import signal
    import subprocess
    import sys

    def limit():
        lim = mem_limit_mb << 20
        resource.setrlimit(resource.RLIMIT_AS, (lim, lim))

    repo = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "MALLOC_ARENA_MAX": "2", "GLOG_v": "3",
           "PYTHONPATH": os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")]))}
    cmd = [sys.executable, "-m", "pipeline.sink.mindrecord", "read", str(mr_dir), str(ranks)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=limit, env=env, timeout=timeout_s)
        out, err, rc = proc.stdout, proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as exc:
        out, err, rc = (exc.stdout or b"").decode(errors="replace"), "", f"timeout after {timeout_s} s"
    events = []
    for line in out.splitlines():
        if line.startswith("{"):
            try:
                events.append(json.loads(line))
            except ValueError:
                pass
    done = next((e for e in events if e["event"] == "done"), None)
    if rc == 0 and done:
        return done
    started = [e for e in events if e["event"] == "start"]
    err_event = next((e for e in events if e["event"] == "error"), None)
    if err_event:
        reason = err_event["error"]
    elif isinstance(rc, int) and rc < 0:
        reason = f"reader killed by {signal.Signals(-rc).name}; address-space limit {mem_limit_mb} MB"
    else:
        tail = [ln for ln in err.splitlines() if ln.strip() and "WARNING" not in ln][-1:]
        reason = (f"reader exit {rc}: {tail[0][:300] if tail else 'no message'} "
                  f"(address-space limit {mem_limit_mb} MB)")
    if started:
        raise ShardError(f"{mr_dir / started[-1]['file']}: unreadable through MindDataset ({reason})")
    raise ShardError(f"{mr_dir}: MindDataset reader failed before reading any shard ({reason})")


def _reader_main(mr_dir: str, ranks: int) -> int:
    """Child side of :func:`verify`: read every shard (then every rank) and print one JSON line per step."""
    import json
    import resource

    def emit(obj):
        print(json.dumps(obj), flush=True)

    mr_dir = Path(mr_dir)
    manifest = read_json(mr_dir / MANIFEST)
    fields = manifest.get("fields", [COLUMN])
    has_dom, has_starts = DOMAIN_COLUMN in fields, STARTS_COLUMN in fields
    row_length = manifest["row_length"]
    files = [str(mr_dir / s["file"]) for s in manifest["shards"]]
    first: list[int] = []

    def read(d):
        content, n, bad, fp = hashlib.sha256(), 0, 0, 0
        for row in d.create_tuple_iterator(output_numpy=True, num_epochs=1):
            ids = row[0]
            dom = int(row[fields.index(DOMAIN_COLUMN)]) if has_dom else None
            starts = row[fields.index(STARTS_COLUMN)] if has_starts else None
            b = row_digest(ids, dom, starts)
            content.update(b)
            digest = int.from_bytes(hashlib.blake2b(b, digest_size=8).digest(), "big")
            fp = (fp + digest) % 2**64
            if len(first) < ranks:
                first.append(digest)
            bad += len(ids) != row_length
            n += 1
        return {"rows": n, "content_sha256": content.hexdigest(), "bad_length": bad, "fingerprint": fp}

    try:
        import mindspore.dataset as ds

        shards, rank_results = [], []
        for f in files:
            emit({"event": "start", "file": Path(f).name})
            shards.append(read(ds.MindDataset(f, columns_list=fields, shuffle=False, num_parallel_workers=1)))
        collect = first.copy()
        for r in range(ranks):
            emit({"event": "start", "file": f"(rank {r} of {ranks} over all shards)"})
            res = read(ds.MindDataset(files, columns_list=fields, shuffle=False, num_parallel_workers=1,
                                      num_shards=ranks, shard_id=r))
            rank_results.append({"rank": r, "rows": res["rows"], "fingerprint": res["fingerprint"]})
    except (RuntimeError, MemoryError, OSError, ValueError) as exc:
        msg = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)
        emit({"event": "error", "error": msg[:300]})
        return 3
    emit({"event": "done", "shards": shards, "ranks": rank_results, "first_digests": collect,
          "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024})
    return 0


if __name__ == "__main__":
    import sys

    if len(sys.argv) != 4 or sys.argv[1] != "read":
        sys.exit("usage: python -m pipeline.sink.mindrecord read DIR RANKS")
    sys.exit(_reader_main(sys.argv[2], int(sys.argv[3])))
