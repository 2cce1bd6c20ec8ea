"""Checks of a MindRecord set against its manifest: cheap (sizes, rank split) by default, every byte on request.

MindRecord itself has no checksums (zeroed or bit-flipped row data reads back silently wrong), so the full check
(``mindloom verify``, and each corpus writer on the file it just wrote) hashes the files and re-reads every row
through ``MindDataset`` in a memory-limited child process, because a damaged shard has made the reader allocate
23 GB.  The corpus' final step and training start only check that every file exists with the manifest's size and
that the rows split over the data-parallel ranks: their data was verified when it was written.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from pipeline.io import read_json, sha256_file
from pipeline.sink.config import PackConfig
from pipeline.sink.writer import COLUMN, DOMAIN_COLUMN, MANIFEST, STARTS_COLUMN, row_digest


class ShardError(RuntimeError):
    """A MindRecord shard does not match its manifest or cannot be read; the message names the file."""


#: Address-space limit of the reader child when the caller passes none: ``pack.verify_mem_mb``'s default (callers
#: with a config pass its value); a damaged shard has made MindDataset allocate 23 GB (mindspore.md §3.4).
VERIFY_MEM_MB: int = PackConfig.verify_mem_mb


def _check_files(mr_dir: Path, manifest: dict, hashes: bool = True) -> None:
    """Existence, then size, then (with ``hashes``) sha256 of every data and index file: the cheapest telling
    error first."""
    for s in manifest["shards"]:
        data, index = mr_dir / s["file"], mr_dir / (s["file"] + ".db")
        for path in (data, index):
            if not path.exists():
                raise ShardError(f"{path}: missing (listed in the manifest)")
        if "bytes" in s and data.stat().st_size != s["bytes"]:
            raise ShardError(f"{data}: {data.stat().st_size} bytes, manifest says {s['bytes']} (truncated or "
                             "overwritten shard)")
        for path, key in ((data, "sha256"), (index, "db_sha256")) if hashes else ():
            if sha256_file(path) != s[key]:
                raise ShardError(f"{path}: sha256 differs from the manifest (corrupt shard)")


def rank_split(manifest: dict, num_shards: int, where: Path | str = "") -> dict:
    """How ``num_shards`` data-parallel ranks split the set's rows (from the manifest, no data read).

    Each rank reads ``ceil(rows / ranks)`` rows; MindDataset evens out the ranks by repeating the first rows
    (``padding_rows``).  A set with fewer rows than ranks would give a rank nothing but repeats: refused.
    """
    samples = int(manifest["samples"])
    if samples < num_shards:
        raise ShardError(f"{where}: {samples} rows cannot be split over {num_shards} data-parallel ranks "
                         "(train.workers); write more rows or train on fewer ranks")
    per_rank = -(-samples // num_shards)
    return {"num_shards": num_shards, "rows_per_rank": per_rank, "padding_rows": per_rank * num_shards - samples}


def verify(mr_dir: str | Path, full_read: bool = True, num_shards: int | None = None,
           mem_limit_mb: int | None = None, timeout_s: float | None = None, hashes: bool = True) -> dict:
    """Check a MindRecord set (or a collection of sets, e.g. ``mindrecord_val``) against its manifest.

    Always: every data and ``.db`` file exists with the manifest's size, and (``hashes``, the default) sha256;
    ``hashes=False`` with ``full_read=False`` reads no data (the corpus' final step and training start), and with
    ``num_shards`` checks the rank split from the manifest (:func:`rank_split`).  With ``full_read``: one child
    process limited to ``mem_limit_mb`` of address space reads every shard (of every set of a collection: one
    MindSpore start, not one per set) through ``MindDataset`` and the row counts, row lengths and content hash of
    the decoded rows must match; with ``num_shards`` it also reads each set as that many data-parallel ranks
    (``num_shards``/``shard_id``) and checks that each rank gets ``ceil(rows / ranks)`` rows and that together they
    cover every row (MindDataset evens out the ranks by repeating the first rows; their number is reported as
    ``padding_rows``).  Raises :class:`ShardError` naming the file.
    """
    mr_dir = Path(mr_dir)
    manifest = _manifest(mr_dir)
    collection = manifest.get("format") == "mindrecord-collection"
    sets = ({name: mr_dir / s["dir"] for name, s in sorted(manifest["sets"].items())} if collection
            else {None: mr_dir})
    manifests = {name: (_manifest(d) if collection else manifest) for name, d in sets.items()}
    results = {}
    for name, d in sets.items():
        _check_files(d, manifests[name], hashes)
        results[name] = {"dir": str(d), "shards": len(manifests[name]["shards"]),
                         "samples": manifests[name]["samples"], "read": 0}
        if not full_read and num_shards:
            results[name]["ranks"] = rank_split(manifests[name], num_shards, d)
    if full_read and sets:          # an empty collection (no held-out documents) has nothing to read
        reports = _read_in_child(list(sets.values()), num_shards or 0, mem_limit_mb or VERIFY_MEM_MB, timeout_s)
        for (name, d), report in zip(sets.items(), reports, strict=True):
            results[name].update(_compare(d, manifests[name], report, num_shards))
    return {"dir": str(mr_dir), "sets": results} if collection else results[None]


def _manifest(mr_dir: Path) -> dict:
    if not (mr_dir / MANIFEST).exists():
        raise ShardError(f"{mr_dir / MANIFEST}: manifest missing; the MindRecord set is incomplete")
    return read_json(mr_dir / MANIFEST)


def _compare(mr_dir: Path, manifest: dict, report: dict, num_shards: int | None) -> dict:
    """What the reader child decoded against the manifest: row counts, lengths, content hashes, rank split."""
    total_fp, read = 0, 0
    for s, got in zip(manifest["shards"], report["shards"], strict=True):
        path = mr_dir / s["file"]
        if got["rows"] != s["samples"]:
            raise ShardError(f"{path}: {got['rows']} rows read, manifest says {s['samples']}")
        if got["bad_length"]:
            raise ShardError(f"{path}: {got['bad_length']} rows are not {manifest['row_length']} tokens long")
        if s.get("content_sha256") and got["content_sha256"] != s["content_sha256"]:
            raise ShardError(f"{path}: decoded rows differ from what was written (content sha256 mismatch)")
        total_fp = (total_fp + got["fingerprint"]) % 2**64
        read += got["rows"]
    out = {"read": read, "reader_max_rss_mb": report["max_rss_mb"]}
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
        out["ranks"] = {"num_shards": num_shards, "rows_per_rank": per_rank, "padding_rows": padding}
    return out


def _read_in_child(mr_dirs: list[Path], ranks: int, mem_limit_mb: int, timeout_s: float | None) -> list[dict]:
    """Run :func:`_reader_main` over the sets in one subprocess under RLIMIT_AS; one report per set, in order.
    Any failure becomes a ShardError naming the file.

    The child sets its own limit before it imports MindSpore: a ``preexec_fn`` would make Python fork the caller
    (Airflow and its libraries) instead of vfork-and-exec, and until the exec the forked child counts the caller's
    whole resident memory again (the profile sampler saw such a task as about twice its size)."""
    import json
    import signal
    import subprocess
    import sys

    repo = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "MALLOC_ARENA_MAX": "2", "GLOG_v": "3",
           "PYTHONPATH": os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")]))}
    cmd = [sys.executable, "-m", "pipeline.sink.verify", "read", str(mem_limit_mb), str(ranks), *map(str, mr_dirs)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout_s)
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
    done = [e for e in events if e["event"] == "done"]
    if rc == 0 and len(done) == len(mr_dirs):
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
        raise ShardError(f"{Path(started[-1]['dir']) / started[-1]['file']}: unreadable through MindDataset "
                         f"({reason})")
    raise ShardError(f"{mr_dirs[0] if len(mr_dirs) == 1 else mr_dirs[0].parent}: MindDataset reader failed "
                     f"before reading any shard ({reason})")


def _reader_main(mr_dirs: list[str], ranks: int, mem_limit_mb: int) -> int:
    """Child side of :func:`verify`: limit this process's address space, then read every shard (then every rank)
    of each set; one JSON line per step."""
    import json
    import resource

    from pipeline.profile import own_peak_rss_mb

    lim = mem_limit_mb << 20
    resource.setrlimit(resource.RLIMIT_AS, (lim, lim))

    def emit(obj):
        print(json.dumps(obj), flush=True)

    def read(d, fields, row_length, first):
        has_dom, has_starts = DOMAIN_COLUMN in fields, STARTS_COLUMN in fields
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

        for mr_dir in map(Path, mr_dirs):
            manifest = read_json(mr_dir / MANIFEST)
            fields, row_length = manifest.get("fields", [COLUMN]), manifest["row_length"]
            files = [str(mr_dir / s["file"]) for s in manifest["shards"]]
            first: list[int] = []
            shards, rank_results = [], []
            for f in files:
                emit({"event": "start", "dir": str(mr_dir), "file": Path(f).name})
                shards.append(read(ds.MindDataset(f, columns_list=fields, shuffle=False, num_parallel_workers=1),
                                   fields, row_length, first))
            collect = first.copy()
            for r in range(ranks):
                emit({"event": "start", "dir": str(mr_dir), "file": f"(rank {r} of {ranks} over all shards)"})
                res = read(ds.MindDataset(files, columns_list=fields, shuffle=False, num_parallel_workers=1,
                                          num_shards=ranks, shard_id=r), fields, row_length, first)
                rank_results.append({"rank": r, "rows": res["rows"], "fingerprint": res["fingerprint"]})
            emit({"event": "done", "dir": str(mr_dir), "shards": shards, "ranks": rank_results,
                  "first_digests": collect,
                  "max_rss_mb": own_peak_rss_mb()})
    except (RuntimeError, MemoryError, OSError, ValueError) as exc:
        msg = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)
        emit({"event": "error", "error": msg[:300]})
        return 3
    return 0


if __name__ == "__main__":
    import sys

    if len(sys.argv) < 5 or sys.argv[1] != "read":
        sys.exit("usage: python -m pipeline.sink.verify read MEM_LIMIT_MB RANKS DIR [DIR ...]")
    sys.exit(_reader_main(sys.argv[4:], int(sys.argv[3]), int(sys.argv[2])))
