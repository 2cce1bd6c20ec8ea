"""Ingest as a whole: accounting over a real multi-reader run, determinism across pool sizes, idempotent reruns,
JSON-serialisable specs, and object storage through a real S3-compatible server (moto) on loopback."""

from __future__ import annotations

import gzip
import hashlib
import itertools
import json
import math
import pathlib
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from conftest import SHARED_CORPORA, prose_records, stdlib_records, write_jsonl

from pipeline.config import config_from_dict
from pipeline.dedup import exact as exact_dedup
from pipeline.ingest.run import plan_ingest, run_ingest_shard
from pipeline.io import read_json


def sha(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build_inputs(root: pathlib.Path) -> list[dict]:
    """Every reader, real text, and a sprinkling of bad input."""
    from test_readers import warc_record

    prose, code = prose_records(30), stdlib_records(8)
    write_jsonl(root / "prose" / "a.jsonl", prose[:20])
    with open(root / "prose" / "a.jsonl", "ab") as fh:
        fh.write(b'{"text": 42}\n{broken\n\xff\xfe\n')
    (root / "prose" / "b.jsonl.gz").write_bytes(gzip.compress(json.dumps(prose[20]).encode() + b"\n" * 2)[:-6])
    (root / "prose" / "c.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(
        "".join(json.dumps(r) + "\n" for r in prose[21:])[:].encode()))
    pq.write_table(pa.table({"text": [r["text"] for r in code] + [None], "id": [r["id"] for r in code] + ["n"]}),
                   root / "code.parquet", row_group_size=3)
    (root / "books").mkdir()
    for i, r in enumerate(prose[:5]):
        (root / "books" / f"{i}.txt").write_text(r["text"] * 3)
    (root / "books" / "img.bin").write_bytes(bytes(range(256)))
    page = "<html><head><title>T{i}</title></head><body><main><p>{t}</p></main></body></html>"
    (root / "html").mkdir()
    for i, r in enumerate(prose[5:9]):
        (root / "html" / f"p{i}.html").write_text(page.format(i=i, t=r["text"]))
    recs = [warc_record(f"http://x/{i}", b"HTTP/1.1 200 OK\r\nContent-Type: text/html", page.format(i=i, t=r["text"])
                        .encode()) for i, r in enumerate(prose[9:14])]
    recs.insert(2, warc_record("http://x/bad", b"HTTP/1.1 OK", b"<p>x</p>"))
    (root / "crawl.warc.gz").write_bytes(b"".join(recs))
    (root / "repo" / "pkg").mkdir(parents=True)
    for r in code[:4]:
        (root / "repo" / "pkg" / r["id"].split("/")[-1]).write_text(r["text"])
    (root / "repo" / "node_modules").mkdir()
    (root / "repo" / "node_modules" / "x.js").write_text("module.exports = 1;\n")
    return [{"domain": "prose", "paths": [str(root / "prose"), str(root / "missing.jsonl")]},
            {"domain": "code", "name": "code-table", "reader": "parquet", "paths": [str(root / "code.parquet")]},
            {"domain": "books", "reader": "text", "paths": [str(root / "books")]},
            {"domain": "web", "name": "web-html", "reader": "html", "paths": [str(root / "html")]},
            {"domain": "web", "name": "web-warc", "reader": "warc", "paths": [str(root / "*.warc.gz")]},
            {"domain": "code", "name": "code-tree", "reader": "code", "paths": [str(root / "repo")]}]


def run_all(tmp: pathlib.Path, sources: list[dict], **ingest) -> tuple[pathlib.Path, list[dict], list[dict]]:
    cfg = config_from_dict({"data_root": str(tmp), "sources": sources,
                            "ingest": {"docs_per_shard": 6, "workers": 1, **ingest}})
    rdir = tmp / "run"
    specs = plan_ingest(cfg)
    assert json.loads(json.dumps(specs)) == specs
    return rdir, specs, [run_ingest_shard(cfg, rdir, s) for s in specs]


def test_every_shard_accounts_for_every_document(tmp_path):
    rdir, specs, stats = run_all(tmp_path / "out", build_inputs(tmp_path / "in"))
    assert len(specs) == 11
    files = sorted((rdir / "stats" / "ingest").glob("*.json"))
    assert [f.stem for f in files] == sorted(s["shard"] for s in specs)
    total: dict = {"in": 0, "kept": 0, "removed": {}}
    for f in files:
        s = read_json(f)
        removed_docs = sum(v["docs"] for v in s["removed"].values())
        removed_bytes = sum(v["bytes"] for v in s["removed"].values())
        assert s["in_docs"] == s["kept_docs"] + removed_docs, f.name
        assert s["in_bytes"] == s["kept_bytes"] + removed_bytes, f.name
        assert pq.read_metadata(rdir / "ingest" / f"{f.stem}.parquet").num_rows == s["kept_docs"]
        rej = rdir / "rejects" / "ingest" / f"{f.stem}.parquet"
        listed = pq.read_table(rej).num_rows if rej.exists() else 0
        assert listed == removed_docs - s["removed"].get("warc_non_response", {"docs": 0})["docs"]
        total["in"] += s["in_docs"]
        total["kept"] += s["kept_docs"]
        for reason, v in s["removed"].items():
            total["removed"][reason] = total["removed"].get(reason, 0) + v["docs"]
    assert total["removed"] == {"wrong_text_type": 2, "malformed_json": 1, "invalid_utf8": 1, "truncated_file": 1,
                                "blank_line": 1, "missing_path": 1, "binary_file": 1, "bad_http_header": 1,
                                "vendored_file": 1}
    assert total["kept"] == 20 + 10 + 8 + 5 + 4 + 5 + 4 and total["in"] == total["kept"] + 10
    # and the next stage keeps the books balanced too
    shards = [s["shard"] for s in specs]
    exact_dedup.build_exact_index(rdir, shards, n_partitions=4)
    for st in exact_dedup.drop_exact_duplicates(rdir, shards, n_partitions=4):
        assert st["in_docs"] == st["kept_docs"] + sum(v["docs"] for v in st["removed"].values())


def test_output_is_identical_with_a_process_pool_and_on_rerun(tmp_path, monkeypatch):
    import pipeline.ingest.run as ingest_mod

    sources = build_inputs(tmp_path / "in")
    rdir1, specs, _ = run_all(tmp_path / "serial", sources)
    monkeypatch.setattr(ingest_mod, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(ingest_mod, "BATCH_RECORDS", 2)
    rdir2, specs2, _ = run_all(tmp_path / "pool", sources, workers=2)
    assert specs == specs2
    for s in specs:
        for sub in ("ingest", "rejects/ingest"):
            a, b = rdir1 / sub / f"{s['shard']}.parquet", rdir2 / sub / f"{s['shard']}.parquet"
            assert a.exists() == b.exists()
            if a.exists():
                assert sha(a) == sha(b), (sub, s["shard"])
    # rerun: completed shards are skipped and nothing changes
    before = {p: sha(p) for p in rdir2.rglob("*.parquet")}
    mtimes = {p: p.stat().st_mtime_ns for p in before}
    run_all(tmp_path / "pool", sources, workers=2)
    assert {p: sha(p) for p in rdir2.rglob("*.parquet")} == before
    assert {p: p.stat().st_mtime_ns for p in before} == mtimes


@pytest.mark.skipif(not SHARED_CORPORA.exists(), reason="../shared/corpora is absent")
def test_parallel_html_shard_uses_the_pool(tmp_path):
    """A 14 MB HTML shard goes through two worker processes; same rows as in-process."""
    src = [{"domain": "web", "reader": "html", "paths": [str(SHARED_CORPORA / "web_html")]}]
    rdir_a, specs, stats_a = run_all(tmp_path / "a", src, docs_per_shard=1000, workers=2)
    rdir_b, _, stats_b = run_all(tmp_path / "b", src, docs_per_shard=1000, workers=1)
    assert specs[0]["bytes"] > 2 << 20 and stats_a[0]["kept_docs"] == 413
    assert sha(rdir_a / "ingest" / "web-00000.parquet") == sha(rdir_b / "ingest" / "web-00000.parquet")


# ----------------------------------------------------------------------------------------- object storage (S3)

@pytest.fixture()
def s3_server(monkeypatch):
    """A real moto S3 server in its own process on 127.0.0.1 and a free port; stopped after the test."""
    pytest.importorskip("moto")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1).read()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("moto server did not start") from None
                time.sleep(0.2)
        for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                     "AWS_EC2_METADATA_DISABLED": "true"}.items():
            monkeypatch.setenv(k, v)
        yield {"endpoint_override": f"127.0.0.1:{port}", "scheme": "http", "region": "us-east-1"}
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_object_storage_on_a_real_s3_server(tmp_path, s3_server):
    import pyarrow.fs as pafs

    local = tmp_path / "local" / "corpus"
    recs = prose_records(12)
    write_jsonl(local / "part-0.jsonl", recs[:7])
    (local / "sub").mkdir()
    (local / "sub" / "part-1.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(
        "".join(json.dumps(r) + "\n" for r in recs[7:]).encode()))
    pq.write_table(pa.table({"text": [r["text"] for r in recs[:4]]}), local / "t.parquet", row_group_size=2)
    fs = pafs.S3FileSystem(**s3_server, allow_bucket_creation=True)
    fs.create_dir("lake")
    for f in sorted(local.rglob("*")):
        if f.is_file():
            with fs.open_output_stream(f"lake/corpus/{f.relative_to(local)}", compression=None) as out:
                out.write(f.read_bytes())

    def sources(root: str, fs_options: dict) -> list[dict]:
        return [{"domain": "prose", "paths": [f"{root}/**/*.jsonl*", f"{root}/absent/*.jsonl"],
                 "fs_options": fs_options},
                {"domain": "table", "reader": "parquet", "paths": [f"{root}/t.parquet"], "fs_options": fs_options}]

    remote_dir, remote_specs, remote_stats = run_all(tmp_path / "remote", sources("s3://lake/corpus", s3_server))
    local_dir, local_specs, _ = run_all(tmp_path / "local-run", sources(str(local), {}))
    assert list(dict.fromkeys((u["path"], u["rel"]) for s in remote_specs if s["domain"] == "prose"
                              for u in s["units"])) == [
        ("s3://lake/corpus/part-0.jsonl", "part-0.jsonl"),
        ("s3://lake/corpus/sub/part-1.jsonl.zst", "sub/part-1.jsonl.zst"),
        ("s3://lake/corpus/absent/*.jsonl", "absent")]
    remote = [r for s in remote_specs
              for r in pq.read_table(remote_dir / "ingest" / f"{s['shard']}.parquet").to_pylist()]
    here = [r for s in local_specs for r in pq.read_table(local_dir / "ingest" / f"{s['shard']}.parquet").to_pylist()]
    assert len(remote) == 16 and [r["doc_id"] for r in remote] == [r["doc_id"] for r in here]
    assert [r["text"] for r in remote] == [r["text"] for r in here]
    removed = [s["removed"] for s in remote_stats if s["removed"]]
    assert removed == [{"missing_path": {"docs": 1, "bytes": 0}}]
    shutil.rmtree(local_dir)


def test_plan_respects_docs_per_shard_and_domains(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", prose_records(25))
    write_jsonl(tmp_path / "b.jsonl", stdlib_records(3))
    cfg = config_from_dict({"data_root": str(tmp_path), "domains": ["a"], "ingest": {"docs_per_shard": 10},
                            "sources": [{"domain": "a", "paths": [str(tmp_path / "a.jsonl")]},
                                        {"domain": "b", "paths": [str(tmp_path / "b.jsonl")]}]})
    specs = plan_ingest(cfg)
    # byte ranges of about 10 lines: 10 × the mean line length of the file's head (here the whole 49 KB file)
    data = (tmp_path / "a.jsonl").read_bytes()
    target = math.ceil(10 * len(data) / 25)
    assert [s["shard"] for s in specs] == ["a-00000", "a-00001", "a-00002"]
    ranges = [(s["units"][0]["start"], s["units"][0]["end"]) for s in specs]
    assert ranges[0][0] == 0 and ranges[-1][1] == len(data)
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
    for start, end in ranges[:-1]:  # each cut: the first line start at or after start + target
        assert data[end - 1:end] == b"\n" and data.rfind(b"\n", start, end - 1) + 1 - start < target <= end - start
    assert sum(s["docs_estimate"] for s in specs) == 25
