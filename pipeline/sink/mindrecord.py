"""MindRecord token sets of the corpus and validation split, and their verification against the manifest.

:func:`write_mindrecord` orders every tokenized document (with the mixture's copies) and :func:`write_token_set`
packs them (:mod:`pipeline.sink.packing`) and writes the shards through the one writer
(:mod:`pipeline.sink.writer`), into a temporary folder that is renamed into place.

Row schema: ``input_ids`` int32 ``[seq_len + 1]``; optionally ``domain_id`` int32 (index into the manifest's
``domains``: the domain of the row's first token; an index field, so ``MindPage`` can list rows per domain) and
``segment_starts`` int32 ``[-1]`` (positions where a document begins inside the row, 0 always listed: tokens attend
only within ``[starts[i], starts[i+1])`` when a long-context stage resets attention at document boundaries).

MindRecord itself has no checksums (zeroed or bit-flipped row data reads back silently wrong), so :func:`verify`
checks file hashes first and then re-reads every row through ``MindDataset`` in a memory-limited child process,
because a damaged shard has made the reader allocate 23 GB.
"""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

from pipeline.io import read_json, read_parquet, sha256_file, write_json
from pipeline.sink import scatter
from pipeline.sink import shards as shards_mod
from pipeline.sink.packing import pack
from pipeline.sink.writer import (
    COLUMN,
    DOMAIN_COLUMN,
    MANIFEST,
    STARTS_COLUMN,
    row_digest,
    set_manifest,
    shard_names,
    write_shard,
)

FILE_PAD = -100          # pad value when the tokenizer has no pad piece (the trainer's default ignored label)


class ShardError(RuntimeError):
    """A MindRecord shard does not match its manifest or cannot be read; the message names the file."""


# ------------------------------------------------------------------------------------------------ writing


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
    jobs = [(str(out_dir / fname), seq_len, rows[s::shard_num],
             packed["row_domain"][s::shard_num] if domain_field else None,
             packed["row_starts"][s::shard_num] if boundaries else None)
            for s, fname in enumerate(shard_names(name, shard_num))]
    if workers > 1 and shard_num > 1:
        with ProcessPoolExecutor(min(workers, shard_num), mp_context=get_context("spawn")) as pool:
            files = list(pool.map(write_shard, *zip(*jobs, strict=True)))
    else:
        files = [write_shard(*args) for args in jobs]
    per_domain = {d: int(packed["tokens_per_domain"][i]) if i < len(packed["tokens_per_domain"]) else 0
                  for d, i in index.items()}
    manifest = set_manifest(files, seq_len=seq_len, domain_field=domain_field, boundaries=boundaries,
                            rows_sha256=hashlib.sha256(np.ascontiguousarray(rows).tobytes()).hexdigest(), extra={
        "domains": domains, "tokens_per_domain": per_domain,
        "token_share": {d: n / max(sum(per_domain.values()), 1) for d, n in per_domain.items()},
        "remainder": remainder, "dropped_tail_tokens": packed["dropped_tail_tokens"],
        "padded_tokens": packed["padded_tokens"], "documents": int(len(order)),
        "eos_id": eos_id, "bos_id": bos_id, "pad_id": pad, **(extra or {})})
    write_json(out_dir / MANIFEST, manifest)
    return manifest


def write_mindrecord(rdir: Path, shards: list[str], *, seq_len: int, shard_num: int, add_bos: bool, seed: int,
                     tokenizer_sha256: str, config_sha256: str, eos_id: int, bos_id: int, vocab_size: int,
                     pad_id: int | None = None, mixture: bool = False, remainder: str = "drop",
                     domain_field: bool = True, boundaries: bool = False, workers: int = 1,
                     shard_mb: int = 256) -> dict:
    """The whole sink in one process (CLI, tests): scatter every shard, write every file, assemble the set.

    With ``mixture`` the per-document decisions of :func:`pipeline.sink.mixture.plan_mixture` apply (``copies``
    per document: 0 for held-out and downsampled documents, more than 1 for upsampled ones); without it every
    document goes in once (a mixture of one copy each is written first).  The DAG runs the same three steps as
    mapped tasks (:mod:`pipeline.tasks.corpus`).
    """
    final = rdir / "mindrecord"
    if (final / MANIFEST).exists():
        manifest = read_json(final / MANIFEST)
        verify(final, full_read=False)
        return manifest
    if not mixture:
        write_single_copies(rdir, shards)
    layout = sink_layout(rdir, seq_len=seq_len, shard_mb=shard_mb, shard_num=shard_num, add_bos=add_bos)
    for shard in sorted(shards):
        scatter.run_scatter_shard(rdir, shard, seed=seed, n_files=layout["n_files"], domains=layout["domains"])
    args = dict(seq_len=seq_len, eos_id=eos_id, bos_id=bos_id if add_bos else None,
                pad_id=FILE_PAD if pad_id is None or pad_id < 0 else pad_id, remainder=remainder,
                domain_field=domain_field, boundaries=boundaries, n_domains=len(layout["domains"]))
    ks = range(layout["n_files"])
    if workers > 1 and layout["n_files"] > 1:
        with ProcessPoolExecutor(min(workers, layout["n_files"]), mp_context=get_context("spawn")) as pool:
            list(pool.map(write_file_job, [(rdir, k, layout["n_files"], sorted(shards), args) for k in ks]))
    else:
        for k in ks:
            write_file_job((rdir, k, layout["n_files"], sorted(shards), args))
    return shards_mod.finalize_set(rdir, layout["n_files"], sorted(shards), seq_len=seq_len,
                                   domains=layout["domains"], domain_field=domain_field, boundaries=boundaries,
                                   extra=set_extra(rdir, layout, seed=seed, vocab_size=vocab_size,
                                                   tokenizer_sha256=tokenizer_sha256, config_sha256=config_sha256,
                                                   mixture=mixture, **args))


def write_file_job(job: tuple) -> dict:
    """One output file from a picklable ``(rdir, k, n_files, shards, args)`` (what writer pools map over)."""
    rdir, k, n, shards, args = job
    return shards_mod.write_output_file(rdir, k, n, shards, **args)


def sink_layout(rdir: Path, *, seq_len: int, shard_mb: int, shard_num: int,
                add_bos: bool) -> dict:
    """Output files and the domain list, from the mixture report: written once to ``sink/layout.json``, so every
    task of the run uses the same (the report is final once the mixture task has finished)."""
    path = rdir / "sink" / "layout.json"
    if path.exists():
        return read_json(path)
    report = read_json(rdir / "mixture" / "report.json")
    tokens = scatter.stream_tokens(report, add_bos)
    n_files = scatter.n_output_files(tokens, shard_mb, shard_num)
    if tokens // (seq_len + 1) < n_files:
        raise ValueError(f"pack.shard_num: {n_files} files need at least as many rows of {seq_len + 1} tokens, but "
                         f"the mixture selects {tokens} tokens")
    layout = {"n_files": n_files, "domains": sorted(report["domains"]), "stream_tokens": tokens,
              "shard_mb": shard_mb, "shard_num": shard_num}
    write_json(path, layout)
    return layout


def set_extra(rdir: Path, layout: dict, *, seed: int, vocab_size: int, tokenizer_sha256: str, config_sha256: str,
              remainder: str, mixture: bool, eos_id: int, bos_id: int | None, pad_id: int, **_) -> dict:
    """The corpus manifest's keys beyond the files: tokenizer, config, mixture report, packing settings."""
    return {"remainder": remainder, "eos_id": eos_id, "bos_id": bos_id, "pad_id": pad_id, "vocab_size": vocab_size,
            "tokenizer_sha256": tokenizer_sha256, "config_sha256": config_sha256, "seed": seed,
            "shard_mb": layout["shard_mb"],
            "mixture": read_json(rdir / "mixture" / "report.json") if mixture else None}


def write_single_copies(rdir: Path, shards: list[str]) -> None:
    """Without a mixture plan every document trains once: write those decisions and a minimal report."""
    import pyarrow as pa

    from pipeline.io import write_parquet

    totals = {"total_selected_tokens": 0, "total_selected_docs": 0, "domains": {}}
    for shard in shards:
        t = read_parquet(rdir / "tokenize" / f"{shard}.parquet", columns=["doc_id", "domain", "n_tokens"])
        write_parquet(pa.table({"doc_id": t.column("doc_id"), "copies": pa.array([1] * t.num_rows, pa.int32())}),
                      rdir / "mixture" / f"{shard}.parquet")
        totals["total_selected_tokens"] += sum(t.column("n_tokens").to_pylist())
        totals["total_selected_docs"] += t.num_rows
        for d in set(t.column("domain").to_pylist()):
            totals["domains"][d] = {}
    write_json(rdir / "mixture" / "report.json", totals)


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
