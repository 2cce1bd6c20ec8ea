"""Rows of another context length from the same tokens: long-context stages without re-running the corpus DAG.

Choice (documented in the README): a stage whose ``seq_len`` differs from the corpus rows re-packs the corpus'
own rows instead of requiring a corpus packed at that length.

* Longer (``seq_len = k * stored``): ``k`` consecutive rows (``k * (stored + 1)`` tokens of the packed stream)
  are concatenated and cut to ``k * stored + 1`` tokens; ``k - 1`` tokens per new row are dropped (< 1 %).
* Shorter (``stored = k * seq_len``): each row is split into ``k`` rows ``row[j*s : (j+1)*s + 1]`` that overlap by
  the one token that is both the last label of a piece and the first input of the next, so no token is lost.
* Anything else is refused (``TrainJob.seq_len``): a non-integer ratio would straddle rows arbitrarily.

"Consecutive" must mean consecutive in the packed token stream, or a long row would glue unrelated text. The
corpus sink (``pipeline/sink/shards.py``) packs every file as its own stream (manifest ``layout: contiguous``):
:func:`stream_rows` reads the files in manifest order and checks the per-file ``rows_sha256`` digests (joined,
the set's ``rows_sha256``; reported as ``contiguous_verified``).  Sets written by
:func:`pipeline.sink.writer.write_rows` (and corpus sets from before the streaming sink) deal stream rows round-robin
over their files; :func:`stream_rows` undoes that interleave and checks the manifest's ``rows_sha256``. A folder
without such a manifest is read file by file in name order (``contiguous_verified: false``).

The re-packed set is written once per stage (``<out_dir>/data/seq<N>/``, temp folder + rename, idempotent by a
fingerprint of the source), by the ``repack_<stage>`` task of the ``pretrain`` DAG before the job starts, else by
rank 0 while the other ranks wait for its manifest. It is written by the corpus' own writer
(:func:`pipeline.sink.writer.write_rows`: same round-robin layout and manifest), so it can itself be re-packed,
verified or read in stream order.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Iterable, Iterator

import numpy as np

from pipeline.io import write_json
from pipeline.sink.writer import MANIFEST, write_rows

from .data import COLUMN, find_mindrecord_files

log = logging.getLogger("mindloom.train")


def _manifest(data_dir: str) -> dict | None:
    path = os.path.join(data_dir, MANIFEST)
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _file_rows(path: str) -> Iterator[np.ndarray]:
    import mindspore.dataset as ds

    d = ds.MindDataset(path, columns_list=[COLUMN], shuffle=False, num_parallel_workers=1)
    for (row,) in d.create_tuple_iterator(num_epochs=1, output_numpy=True):
        yield np.asarray(row, dtype=np.int32)


def stream_files(data_dir: str) -> tuple[list[str], bool]:
    """(data files in stream order, whether they are interleaved round-robin per the mindloom manifest)."""
    m = _manifest(data_dir)
    if m and isinstance(m.get("shards"), list) and m["shards"]:
        files = [os.path.join(data_dir, s["file"]) for s in m["shards"]]
        for f in files:
            if not os.path.exists(f) or not os.path.exists(f + ".db"):
                raise FileNotFoundError(f"{f}: listed in {data_dir}/{MANIFEST} but missing (or its .db is)")
        return files, True
    return find_mindrecord_files(data_dir), False


def stream_rows(data_dir: str, digest: dict | None = None) -> Iterator[np.ndarray]:
    """Rows in packed-stream order. ``digest`` (a dict) receives ``rows``, ``sha256`` and ``contiguous_verified``
    once the iterator is exhausted."""
    files, interleaved = stream_files(data_dir)
    manifest = _manifest(data_dir) or {}
    contiguous = interleaved and manifest.get("layout") == "contiguous"
    h = hashlib.sha256()
    n = 0
    if contiguous:          # the corpus sink: every file is its own stream; the set hashes the files' digests
        per_file = []
        for f in files:
            hf = hashlib.sha256()
            for row in _file_rows(f):
                hf.update(np.ascontiguousarray(row).tobytes())
                n += 1
                yield row
            per_file.append(hf.hexdigest())
        h = hashlib.sha256("".join(per_file).encode())
    elif interleaved:
        its = [_file_rows(f) for f in files]
        live = list(range(len(its)))
        while live:
            still = []
            for i in live:
                row = next(its[i], None)
                if row is None:
                    continue
                still.append(i)
                h.update(np.ascontiguousarray(row).tobytes())
                n += 1
                yield row
            live = still if len(still) == len(live) else _check_tail(still, live, files)
    else:
        for f in files:
            for row in _file_rows(f):
                h.update(np.ascontiguousarray(row).tobytes())
                n += 1
                yield row
    if digest is not None:
        want = manifest.get("rows_sha256") if interleaved else None
        digest.update(rows=n, sha256=h.hexdigest(), contiguous_verified=bool(want) and want == h.hexdigest())


def _check_tail(still: list[int], live: list[int], files: list[str]) -> list[int]:
    """Round-robin dealing leaves the *first* files one row longer; any other ending means another layout."""
    if still != live[: len(still)]:
        log.warning("shard files of %s end unevenly for round-robin dealing; rows may not be contiguous",
                    os.path.dirname(files[0]))
    return still


def regroup(rows: Iterable[np.ndarray], stored: int, seq_len: int) -> Iterator[np.ndarray]:
    """Rows of ``stored + 1`` tokens -> rows of ``seq_len + 1`` tokens (see the module docstring)."""
    factor_check(stored, seq_len)
    if seq_len == stored:
        yield from rows
    elif seq_len > stored:
        k = seq_len // stored
        buf: list[np.ndarray] = []
        for r in rows:
            buf.append(r)
            if len(buf) == k:
                yield np.concatenate(buf)[: seq_len + 1]
                buf = []
    else:
        k = stored // seq_len
        for r in rows:
            for j in range(k):
                yield r[j * seq_len: (j + 1) * seq_len + 1]


def factor_check(stored: int, seq_len: int) -> int:
    if seq_len >= stored and seq_len % stored == 0:
        return seq_len // stored
    if seq_len < stored and stored % seq_len == 0:
        return stored // seq_len
    raise ValueError(f"TrainJob.seq_len={seq_len}: must be a multiple or a divisor of the corpus rows' seq_len "
                     f"{stored} (rows are re-packed from consecutive corpus rows)")


def stored_seq_len(data_dir: str) -> int:
    """seq_len of the stored rows: the manifest's, else the first row's length - 1."""
    m = _manifest(data_dir)
    if m and m.get("seq_len"):
        return int(m["seq_len"])
    files, _ = stream_files(data_dir)
    for row in _file_rows(files[0]):
        return len(row) - 1
    raise ValueError(f"{files[0]}: no rows")


def _fingerprint(src: str, seq_len: int) -> str:
    files, _ = stream_files(src)
    parts = [f"seq_len={seq_len}"]
    m = os.path.join(src, MANIFEST)
    if os.path.exists(m):
        with open(m, "rb") as f:
            parts.append(hashlib.sha256(f.read()).hexdigest())
    for p in files:
        st = os.stat(p)
        parts.append(f"{os.path.basename(p)}:{st.st_size}:{int(st.st_mtime)}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def repack(src: str, dst: str, seq_len: int) -> dict:
    """Materialise ``src`` at ``seq_len`` in ``dst`` (atomically; reused when the source fingerprint matches)."""
    fp = _fingerprint(src, seq_len)
    old = _manifest(dst) if os.path.isdir(dst) else None
    if old and old.get("source_fingerprint") == fp:
        return old
    stored = stored_seq_len(src)
    factor_check(stored, seq_len)
    files, _ = stream_files(src)
    tmp = f"{dst}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    digest: dict = {}
    t0 = time.time()
    m = write_rows(regroup(stream_rows(src, digest), stored, seq_len), tmp, len(files),
                   {"source_dir": os.path.abspath(src), "source_seq_len": stored, "source_fingerprint": fp})
    m.update(source_rows=digest["rows"], contiguous_verified=digest["contiguous_verified"],
             repack_seconds=round(time.time() - t0, 3))
    write_json(os.path.join(tmp, MANIFEST), m)
    if os.path.isdir(dst):
        shutil.rmtree(dst)
    os.replace(tmp, dst)
    log.info("re-packed %s (%d rows of %d) -> %s (%d rows of %d, contiguous_verified=%s)", src, digest["rows"],
             stored + 1, dst, m["samples"], seq_len + 1, m["contiguous_verified"])
    return m


def repacked_dir(out_dir: str, seq_len: int) -> str:
    """Where a stage's re-packed rows live: ``<out_dir>/data/seq<N>`` (kept when a cleared stage is archived)."""
    return os.path.join(out_dir, "data", f"seq{seq_len}")


def stage_data(src: str, seq_len: int, out_dir: str, rank: int, wait_s: float = 3600.0) -> tuple[str, dict]:
    """The data folder a stage trains on: ``src`` itself, or its re-packed copy under ``out_dir/data``.

    The ``pretrain`` DAG (and ``mindloom train``) re-pack before the job starts (``pipeline.tasks.pretrain.
    prepare_stage_data``, on a data worker, while earlier stages train); then rank 0 finds the copy by its
    fingerprint and nothing is rewritten. A job started some other way re-packs here, on rank 0."""
    stored = stored_seq_len(src)
    if not seq_len or seq_len == stored:
        return src, {"dir": src, "seq_len": stored, "repacked": False}
    dst = repacked_dir(out_dir, seq_len)
    if rank == 0:
        m = repack(src, dst, seq_len)
    else:  # rank 0 writes; the manifest appears last (atomic folder rename)
        deadline = time.time() + wait_s
        fp = _fingerprint(src, seq_len)
        while (m := _manifest(dst) if os.path.isdir(dst) else None) is None or m.get("source_fingerprint") != fp:
            if time.time() > deadline:
                raise TimeoutError(f"rank {rank}: re-packed data {dst} did not appear within {wait_s:.0f} s")
            time.sleep(1.0)
    return dst, {"dir": dst, "seq_len": seq_len, "repacked": True, "source_dir": src, "source_seq_len": stored,
                 "rows": m["samples"], "contiguous_verified": m["contiguous_verified"]}
