"""Planning never reads whole files: plain JSONL is cut into byte ranges aligned to line starts by short probes.

Exact expectations on small real inputs: the ranges tile the file (their concatenation is the file, byte for
byte), every cut is right after a newline, and ingesting the ranges reads every line exactly once whatever the
plan.  Edge cases: a giant line (below and above ``ingest.max_record_bytes``), CRLF, no trailing newline, an
empty file.  A 20 MB file cut into 2 MB ranges is planned by reading a few hundred KB (counted at the file
objects and, locally, by the kernel's read counter), and an fsspec ``memory://`` store plans the same ranges.
"""

from __future__ import annotations

import hashlib
import json
import pathlib

import pyarrow.parquet as pq
import pytest
from conftest import prose_records

from pipeline.config import config_from_dict
from pipeline.ingest.readers import storage as storage_mod
from pipeline.ingest.readers.jsonl import SCAN_WINDOW
from pipeline.ingest.run import plan_ingest, run_ingest_shard


def lines_of(n: int, width: int = 37) -> bytes:
    """n JSONL lines of varied length (deterministic)."""
    return b"".join(json.dumps({"id": i, "text": "word " * (i % width + 1)}).encode() + b"\n" for i in range(n))


def config(tmp: pathlib.Path, path: str, **ingest):
    return config_from_dict({"data_root": str(tmp / "data"), "sources": [{"domain": "d", "paths": [path]}],
                             "ingest": {"workers": 1, "docs_per_shard": 10**9, **ingest}})


def plan_units(tmp: pathlib.Path, path: str, **ingest) -> list[dict]:
    return [u for s in plan_ingest(config(tmp, path, **ingest)) for u in s["units"]]


def assert_tiles(data: bytes, units: list[dict]) -> None:
    """Ranges in order, no gap, no overlap, each cut right after a newline, concatenation == the file."""
    ranges = [(u["start"], u["end"]) for u in units]
    assert ranges[0][0] == 0 and ranges[-1][1] == len(data)
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
    assert all(data[start - 1:start] == b"\n" for start, _ in ranges[1:])
    joined = hashlib.sha256(b"".join(data[a:b] for a, b in ranges)).hexdigest()
    assert joined == hashlib.sha256(data).hexdigest()


def ingest(tmp: pathlib.Path, path: str, **ingest) -> tuple[list[dict], list[dict], list[dict]]:
    cfg = config(tmp, path, **ingest)
    specs = plan_ingest(cfg)
    rdir = tmp / "data" / "run"
    stats = [run_ingest_shard(cfg, rdir, s) for s in specs]
    docs, rejects = [], []
    for st in stats:
        assert st["in_docs"] == st["kept_docs"] + sum(v["docs"] for v in st["removed"].values())
        assert st["in_bytes"] == st["kept_bytes"] + sum(v["bytes"] for v in st["removed"].values())
        for part in st["parts"]:
            docs += pq.read_table(rdir / "ingest" / f"{part}.parquet").to_pylist()
            rej = rdir / "rejects" / "ingest" / f"{part}.parquet"
            rejects += pq.read_table(rej).to_pylist() if rej.exists() else []
    return specs, docs, rejects


@pytest.mark.parametrize("shard_bytes", [1, 700, 4096, 50_000, 10**9])
def test_ranges_tile_the_file_and_every_line_is_read_once(tmp_path, shard_bytes):
    data = lines_of(2000)                                  # 173 KB, lines of 23 to 202 bytes
    path = tmp_path / "in.jsonl"
    path.write_bytes(data)
    units = plan_units(tmp_path / "p", str(path), shard_bytes=shard_bytes)
    assert_tiles(data, units)
    starts = [0] + [i + 1 for i in range(len(data) - 1) if data[i] == 10]
    if shard_bytes == 1:                                   # a range per line: every line start is a cut
        assert [u["start"] for u in units] == starts
    elif shard_bytes == 10**9:
        assert [(u["start"], u["end"]) for u in units] == [(0, len(data))]
    else:                                                  # each cut: the first line start ≥ start + shard_bytes
        for u in units[:-1]:
            assert u["end"] - u["start"] >= shard_bytes
            assert max(s for s in starts if s < u["end"]) - u["start"] < shard_bytes
    # the same plan twice, and the same documents (ids, order, locations) as one whole-file shard
    assert plan_units(tmp_path / "p", str(path), shard_bytes=shard_bytes) == units
    if shard_bytes in (700, 50_000):
        specs, docs, rejects = ingest(tmp_path / "ranges", str(path), shard_bytes=shard_bytes)
        _, whole, _ = ingest(tmp_path / "whole", str(path))
        assert len(specs) == len(units) > 1 and rejects == []
        assert [(d["doc_id"], d["origin"], d["text"]) for d in docs] == [
            (d["doc_id"], d["origin"], d["text"]) for d in whole]
        assert [d["origin"] for d in docs] == [f"in.jsonl:byte {s}" for s in starts]


def test_docs_per_shard_sets_the_range_size_from_the_head(tmp_path):
    """Fixed 50-byte lines: the head gives exactly 50 bytes per line, so ranges of exactly docs_per_shard lines."""
    data = b"".join(json.dumps({"text": f"line {i:08d} " + "x" * 23}).encode() + b"\n" for i in range(1000))
    assert {len(x) for x in data.splitlines(keepends=True)} == {50}
    path = tmp_path / "fixed.jsonl"
    path.write_bytes(data)
    specs = plan_ingest(config(tmp_path, str(path), docs_per_shard=100))
    assert [(s["units"][0]["start"], s["units"][0]["end"], s["docs_estimate"]) for s in specs] == [
        (k * 5000, (k + 1) * 5000, 100) for k in range(10)]
    # shard_bytes caps the range when docs_per_shard × bytes per line is larger
    specs = plan_ingest(config(tmp_path, str(path), docs_per_shard=100, shard_bytes=1200))
    assert [s["units"][0]["end"] for s in specs][:3] == [1200, 2400, 3600]
    assert [s["docs_estimate"] for s in specs][:3] == [24, 24, 24]


@pytest.mark.parametrize("limit", [64 << 20, 100_000])
def test_a_giant_line_is_never_split(tmp_path, limit):
    """A 300 KB line (several probe windows) among short ones, with 10 KB ranges.  Below the record limit the
    probe keeps scanning to its end; above it the cut moves past it.  Either way it lies in one range."""
    recs = [{"id": i, "text": f"short line {i}"} for i in range(400)]
    recs[150] = {"id": 150, "text": "giant " * 50_000}
    data = b"".join(json.dumps(r).encode() + b"\n" for r in recs)
    path = tmp_path / "giant.jsonl"
    path.write_bytes(data)
    units = plan_units(tmp_path / "p", str(path), shard_bytes=10_000, max_record_bytes=limit)
    assert_tiles(data, units)
    giant_start = data.index(b'{"id": 150,')
    giant_end = data.index(b"\n", giant_start) + 1
    assert giant_end - giant_start > 4 * SCAN_WINDOW
    assert sum(u["start"] <= giant_start and giant_end <= u["end"] for u in units) == 1
    specs, docs, rejects = ingest(tmp_path / "run", str(path), shard_bytes=10_000, max_record_bytes=limit)
    if limit > giant_end - giant_start:
        assert [json.loads(d["meta"])["source_id"] for d in docs] == [str(i) for i in range(400)] and not rejects
    else:
        assert len(docs) == 399
        assert [(r["where"], r["reason"], r["nbytes"]) for r in rejects] == [
            (f"byte {giant_start}", "record_too_large", giant_end - giant_start)]


def test_crlf_no_trailing_newline_and_empty_file(tmp_path):
    recs = prose_records(12)
    crlf = b"".join(json.dumps(r).encode() + b"\r\n" for r in recs)
    (tmp_path / "crlf.jsonl").write_bytes(crlf)
    units = plan_units(tmp_path / "p1", str(tmp_path / "crlf.jsonl"), shard_bytes=3000)
    assert len(units) > 3
    assert_tiles(crlf, units)
    assert all(crlf[u["end"] - 2:u["end"]] == b"\r\n" for u in units)
    _, docs, rejects = ingest(tmp_path / "r1", str(tmp_path / "crlf.jsonl"), shard_bytes=3000)
    assert [json.loads(d["meta"])["source_id"] for d in docs] == [r["id"] for r in recs] and rejects == []

    bare = b"".join(json.dumps(r).encode() + b"\n" for r in recs).rstrip(b"\n")
    (tmp_path / "bare.jsonl").write_bytes(bare)
    units = plan_units(tmp_path / "p2", str(tmp_path / "bare.jsonl"), shard_bytes=3000)
    assert_tiles(bare, units)
    assert units[-1]["end"] == len(bare) and bare[units[-1]["start"]:].count(b"\n") == 0
    _, docs, rejects = ingest(tmp_path / "r2", str(tmp_path / "bare.jsonl"), shard_bytes=3000)
    assert len(docs) == 12 and rejects == []

    (tmp_path / "empty.jsonl").write_bytes(b"")
    assert plan_units(tmp_path / "p3", str(tmp_path / "empty.jsonl")) == [
        {"path": str(tmp_path / "empty.jsonl"), "rel": "empty.jsonl", "size": 0, "bytes": 0, "docs_estimate": 1,
         "start": 0, "end": 0}]
    _, docs, rejects = ingest(tmp_path / "r3", str(tmp_path / "empty.jsonl"))
    assert docs == []
    assert [(r["reason"], r["detail"]) for r in rejects] == [("empty_file", "file holds no data (0 bytes)")]


class _Counting:
    """A file object that counts the bytes its reads return."""

    def __init__(self, inner, counter: list[int]):
        self.inner, self.counter = inner, counter

    def read(self, n: int = -1) -> bytes:
        data = self.inner.read(n)
        self.counter[0] += len(data)
        return data

    def readinto(self, buf) -> int:
        n = self.inner.readinto(buf)
        self.counter[0] += n or 0
        return n

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.inner.close()


def count_reads(monkeypatch) -> list[int]:
    counter = [0]
    for name in ("open_random_access", "open_raw", "open"):
        real = getattr(storage_mod.Storage, name)
        monkeypatch.setattr(storage_mod.Storage, name,
                            lambda self, *a, _real=real, **k: _Counting(_real(self, *a, **k), counter))
    return counter


def _rchar() -> int:
    with open("/proc/self/io") as fh:
        return int(next(line for line in fh if line.startswith("rchar:")).split()[1])


BIG_RANGE = 2 << 20


def big_file(path: pathlib.Path) -> bytes:
    data = lines_of(75_000, width=97)                      # 20 MB in lines of 23 to 502 bytes
    path.write_bytes(data)
    return data


def test_planning_a_20mb_file_reads_a_few_windows(tmp_path, monkeypatch, capsys):
    path = tmp_path / "big.jsonl"
    data = big_file(path)
    assert len(data) > 20_000_000
    plan_units(tmp_path / "warm", str(path), shard_bytes=BIG_RANGE)   # imports and caches warm
    counter = count_reads(monkeypatch)
    before = _rchar() if pathlib.Path("/proc/self/io").exists() else None
    units = plan_units(tmp_path / "p", str(path), shard_bytes=BIG_RANGE)
    kernel = _rchar() - before if before is not None else None
    assert_tiles(data, units)
    assert len(units) in (len(data) // BIG_RANGE, len(data) // BIG_RANGE + 1)
    assert all(BIG_RANGE <= u["end"] - u["start"] < BIG_RANGE + 600 for u in units[:-1])
    # the head window, and one window per cut (each line ends within its probe)
    assert counter[0] <= SCAN_WINDOW * len(units), counter[0]
    assert counter[0] < len(data) // 20
    if kernel is not None:  # no hidden read-ahead: what the OS delivered is what the probes asked for (+ slack)
        assert kernel < counter[0] + (256 << 10), (kernel, counter[0])
    with capsys.disabled():
        print(f"\nplan of {len(data):,} B in {len(units)} ranges of {BIG_RANGE:,} B: {counter[0]:,} B read by the "
              f"planner, {kernel if kernel is not None else 'n/a':,} B by the process (kernel rchar)")


def test_object_store_plans_the_same_ranges_with_ranged_reads(tmp_path, monkeypatch):
    """fsspec's memory:// filesystem (through the same Storage as s3://): same cuts as on local disk, same bytes
    read at plan, and the shards read the same documents."""
    fsspec = pytest.importorskip("fsspec")
    data = lines_of(40_000, width=60)                      # 7.1 MB
    (tmp_path / "local").mkdir()
    (tmp_path / "local" / "part.jsonl").write_bytes(data)
    mem = fsspec.filesystem("memory")
    mem.pipe("/lake/corpus/part.jsonl", data)
    try:
        local = plan_units(tmp_path / "l", str(tmp_path / "local" / "part.jsonl"), shard_bytes=1 << 20)
        counter = count_reads(monkeypatch)
        remote = plan_units(tmp_path / "r", "memory://lake/corpus/part.jsonl", shard_bytes=1 << 20)
        read_at_plan = counter[0]
        monkeypatch.undo()
        assert len(remote) == 7                            # 7.1 MB in ranges of 1 MiB
        assert [(u["start"], u["end"], u["docs_estimate"]) for u in remote] == [
            (u["start"], u["end"], u["docs_estimate"]) for u in local]
        assert read_at_plan <= SCAN_WINDOW * len(remote)
        _, docs, rejects = ingest(tmp_path / "run-r", "memory://lake/corpus/part.jsonl", shard_bytes=1 << 20)
        _, here, _ = ingest(tmp_path / "run-l", str(tmp_path / "local" / "part.jsonl"), shard_bytes=1 << 20)
        assert len(docs) == 40_000 and rejects == []
        assert [(d["doc_id"], d["text"]) for d in docs] == [(d["doc_id"], d["text"]) for d in here]
    finally:
        mem.rm("/lake", recursive=True)


def test_units_of_compressed_warc_and_other_whole_files_are_planned_without_opening_them(tmp_path, monkeypatch):
    import gzip

    (tmp_path / "a.jsonl.gz").write_bytes(gzip.compress(lines_of(100)))
    (tmp_path / "crawl.warc.gz").write_bytes(b"not even read")
    (tmp_path / "t.txt").write_text("some text")
    counter = count_reads(monkeypatch)
    opened: list[str] = []
    real = storage_mod.Storage.open_raw
    monkeypatch.setattr(storage_mod.Storage, "open_raw", lambda self, p: opened.append(p) or real(self, p))
    for reader, name in (("jsonl", "a.jsonl.gz"), ("warc", "crawl.warc.gz"), ("text", "t.txt")):
        cfg = config_from_dict({"data_root": str(tmp_path / "d"), "ingest": {"docs_per_shard": 1},
                                "sources": [{"domain": "d", "reader": reader, "paths": [str(tmp_path / name)]}]})
        (spec,) = plan_ingest(cfg)
        assert spec["bytes"] == (tmp_path / name).stat().st_size
    assert counter[0] == 0 and opened == []
