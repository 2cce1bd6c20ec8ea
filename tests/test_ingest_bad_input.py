"""Bad input, one test per case: a clear message naming file and line/record, a row in the rejects table, a count
in the stats, the run goes on; with ``strict: true`` the first one fails with the same message."""

from __future__ import annotations

import gzip
import json
import os
import pathlib
import subprocess
import sys
import tracemalloc

import pyarrow.parquet as pq
import pytest
import zstandard
from conftest import REPO, prose_records, stdlib_records, write_jsonl

from pipeline.config import config_from_dict
from pipeline.ingest.run import IngestError, plan_ingest, run_ingest_shard


def run(tmp: pathlib.Path, sources: list[dict], **opts) -> dict:
    cfg = config_from_dict({"data_root": str(tmp / "data"), "sources": sources, "ingest": {"workers": 1, **opts}})
    rdir = tmp / "data" / "run"
    specs = plan_ingest(cfg)
    stats = [run_ingest_shard(cfg, rdir, s) for s in specs]
    rejects, docs = [], []
    for part in (p for st in stats for p in st["parts"]):        # every output shard, in plan order
        docs += pq.read_table(rdir / "ingest" / f"{part}.parquet").to_pylist()
        path = rdir / "rejects" / "ingest" / f"{part}.parquet"
        rejects += pq.read_table(path).to_pylist() if path.exists() else []
    removed: dict = {}
    for st in stats:
        assert st["in_docs"] == st["kept_docs"] + sum(v["docs"] for v in st["removed"].values())
        for reason, v in st["removed"].items():
            removed[reason] = removed.get(reason, 0) + v["docs"]
    return {"docs": docs, "rejects": rejects, "removed": removed, "stats": stats}


def reasons(out: dict) -> list[tuple[str, str, str]]:
    return [(pathlib.Path(r["path"]).name, r["where"], r["reason"]) for r in out["rejects"]]


def strict_message(tmp: pathlib.Path, sources: list[dict], **opts) -> str:
    with pytest.raises(IngestError) as err:
        run(tmp / "strict", sources, strict=True, **opts)
    return str(err.value)


def jsonl_bytes(recs: list[dict]) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs).encode()


def test_malformed_json_line(tmp_path, caplog):
    recs = prose_records(3)
    path = tmp_path / "p.jsonl"
    path.write_bytes(jsonl_bytes(recs[:1]) + b'{"text": "unterminated\n' + jsonl_bytes(recs[1:]))
    out = run(tmp_path, [{"domain": "p", "paths": [str(path)]}])
    at = f"byte {len(jsonl_bytes(recs[:1]))}"            # plain JSONL lines are located by byte offset
    assert len(out["docs"]) == 3 and reasons(out) == [("p.jsonl", at, "malformed_json")]
    assert out["rejects"][0]["detail"] == "Invalid control character at (column 23)"
    assert out["rejects"][0]["nbytes"] == 23
    assert f"{path}:{at}: malformed_json" in caplog.text
    assert f"{path}:{at}: malformed_json: Invalid control character" in strict_message(
        tmp_path, [{"domain": "p", "paths": [str(path)]}])


def test_wrong_type_in_text_field(tmp_path):
    recs = prose_records(2)
    path = tmp_path / "p.jsonl"
    lines = [recs[0], {"id": "x", "text": ["a", "list"]}, {"id": "y", "text": None}, recs[1]]
    path.write_bytes(jsonl_bytes(lines))
    out = run(tmp_path, [{"domain": "p", "paths": [str(path)]}])
    assert len(out["docs"]) == 2
    second, third = len(jsonl_bytes(lines[:1])), len(jsonl_bytes(lines[:2]))
    assert reasons(out) == [("p.jsonl", f"byte {second}", "wrong_text_type"),
                            ("p.jsonl", f"byte {third}", "wrong_text_type")]
    assert [r["detail"] for r in out["rejects"]] == ["field 'text' is list, not a string",
                                                     "field 'text' is null, not a string"]
    assert f"byte {second}: wrong_text_type: field 'text' is list" in strict_message(
        tmp_path, [{"domain": "p", "paths": [str(path)]}])


def test_invalid_utf8(tmp_path):
    recs = prose_records(2)
    path = tmp_path / "p.jsonl"
    path.write_bytes(jsonl_bytes(recs[:1]) + b'{"text": "caf\xe9 au lait"}\n' + jsonl_bytes(recs[1:]))
    out = run(tmp_path, [{"domain": "p", "paths": [str(path)]}])
    at = f"byte {len(jsonl_bytes(recs[:1]))}"
    assert len(out["docs"]) == 2 and reasons(out) == [("p.jsonl", at, "invalid_utf8")]
    assert out["rejects"][0]["detail"] == "byte 13: invalid continuation byte"


@pytest.mark.parametrize("suffix", [".gz", ".zst"])
def test_truncated_compressed_file(tmp_path, suffix):
    data = jsonl_bytes(stdlib_records(20))
    packed = gzip.compress(data) if suffix == ".gz" else zstandard.ZstdCompressor().compress(data)
    path = tmp_path / f"c.jsonl{suffix}"
    path.write_bytes(packed[: len(packed) * 2 // 3])
    out = run(tmp_path, [{"domain": "c", "paths": [str(path)]}])
    assert out["removed"] == {"truncated_file": 1}
    (name, where, reason), = reasons(out)
    kept = len(out["docs"])
    assert 0 < kept < 20 and (name, where, reason) == (path.name, f"line {kept + 1}", "truncated_file")
    assert "ends" in out["rejects"][0]["detail"]
    assert f"{path}:line {kept + 1}: truncated_file" in strict_message(tmp_path,
                                                                       [{"domain": "c", "paths": [str(path)]}])


def test_empty_and_zero_byte_files(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "zero.jsonl").write_bytes(b"")
    (folder / "empty.jsonl.gz").write_bytes(gzip.compress(b""))
    (folder / "blank.jsonl").write_bytes(b"\n  \n")
    (folder / "zero.txt").write_bytes(b"")
    (folder / "spaces.txt").write_bytes(b"   \n\t\n")
    write_jsonl(folder / "ok.jsonl", prose_records(1))
    out = run(tmp_path, [{"domain": "j", "paths": [str(folder / "*.jsonl*")]},
                         {"domain": "t", "reader": "text", "paths": [str(folder / "*.txt")]}])
    assert len(out["docs"]) == 1
    assert sorted(reasons(out)) == [("blank.jsonl", "byte 0", "blank_line"), ("blank.jsonl", "byte 1", "blank_line"),
                                    ("empty.jsonl.gz", "", "empty_file"), ("spaces.txt", "", "empty_text"),
                                    ("zero.jsonl", "", "empty_file"), ("zero.txt", "", "empty_file")]
    assert {r["detail"] for r in out["rejects"] if r["reason"] == "empty_file"} == {
        "file holds no data (0 bytes)", "file holds no data after decompression", "file is empty (0 bytes)"}
    # blank lines are a policy skip, an empty file is not
    assert "empty.jsonl.gz: empty_file: file holds no data after decompression" in strict_message(
        tmp_path, [{"domain": "j", "paths": [str(folder / "*.jsonl*")]}])


def test_single_100mb_line_is_streamed_not_held(tmp_path):
    recs = prose_records(2)
    path = tmp_path / "big.jsonl"
    with open(path, "wb") as fh:
        fh.write(jsonl_bytes(recs[:1]))
        fh.write(b'{"text": "')
        block = b"x" * (1 << 20)
        for _ in range(100):
            fh.write(block)
        fh.write(b'"}\n')
        fh.write(jsonl_bytes(recs[1:]))
    line_bytes = 100 * (1 << 20) + 13
    tracemalloc.start()
    try:
        out = run(tmp_path, [{"domain": "p", "paths": [str(path)]}], max_record_bytes=1 << 20)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    at = f"byte {len(jsonl_bytes(recs[:1]))}"
    assert len(out["docs"]) == 2 and reasons(out) == [("big.jsonl", at, "record_too_large")]
    assert out["rejects"][0]["nbytes"] == line_bytes and out["rejects"][0]["snippet"].startswith('{"text": "xxx')
    assert peak < 12 << 20, f"peak {peak / 2**20:.1f} MiB: the line was held in memory"
    # with the default limit (64 MiB) one bounded read is held, never the whole 100 MB line or copies of it
    tracemalloc.start()
    try:
        out = run(tmp_path / "default", [{"domain": "p", "paths": [str(path)]}])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert reasons(out) == [("big.jsonl", at, "record_too_large")]
    assert peak < 72 << 20, f"peak {peak / 2**20:.1f} MiB"


def test_binary_file_in_text_folder(tmp_path):
    folder = tmp_path / "books"
    folder.mkdir()
    for i, r in enumerate(prose_records(2)):
        (folder / f"{i}.txt").write_text(r["text"])
    (folder / "cover.jpg").write_bytes(b"\xff\xd8\xff\xe0\x00\x10JFIF\x00\x01" + bytes(range(256)) * 8)
    (folder / "chapter.txt").write_bytes(bytes(range(256)) * 4)      # binary with a text name
    out = run(tmp_path, [{"domain": "b", "reader": "text", "paths": [str(folder)]}])
    assert len(out["docs"]) == 2
    assert reasons(out) == [("chapter.txt", "", "binary_file"), ("cover.jpg", "", "binary_file")]
    assert out["rejects"][1]["detail"] == "NUL byte at offset 4" and out["rejects"][1]["nbytes"] == 2060
    assert "chapter.txt: binary_file: NUL byte at offset 0" in strict_message(
        tmp_path, [{"domain": "b", "reader": "text", "paths": [str(folder)]}])


def test_warc_record_with_broken_http_header(tmp_path):
    from test_readers import warc_record

    page = b"<html><body><main><p>" + prose_records(1)[0]["text"].encode() + b"</p></main></body></html>"
    ok = warc_record("http://x/ok", b"HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8", page)
    bad_status = warc_record("http://x/bad", b"GARBAGE STATUS LINE\r\nContent-Type: text/html", page)
    bad_line = warc_record("http://x/bad2", b"HTTP/1.1 200 OK\r\nContent-Type text/html", page)
    path = tmp_path / "crawl.warc.gz"
    path.write_bytes(ok + bad_status + ok + bad_line)
    out = run(tmp_path, [{"domain": "w", "reader": "warc", "paths": [str(path)]}])
    assert len(out["docs"]) == 2
    assert reasons(out) == [("crawl.warc.gz", f"record 2 @ byte {len(ok)}", "bad_http_header"),
                            ("crawl.warc.gz", f"record 4 @ byte {2 * len(ok) + len(bad_status)}", "bad_http_header")]
    assert out["rejects"][0]["detail"] == "status line is not 'HTTP/x.y NNN ...': 'GARBAGE STATUS LINE' (url http://x/bad)"
    assert out["rejects"][1]["detail"].startswith("header line is not 'name: value': 'Content-Type text/html'")
    assert f"{path}:record 2 @ byte {len(ok)}: bad_http_header" in strict_message(
        tmp_path, [{"domain": "w", "reader": "warc", "paths": [str(path)]}])


def test_truncated_warc(tmp_path):
    from test_readers import warc_record

    page = b"<html><body><p>" + prose_records(1)[0]["text"].encode() + b"</p></body></html>"
    rec = warc_record("http://x/a", b"HTTP/1.1 200 OK\r\nContent-Type: text/html", page)
    raw = gzip.decompress(rec)
    path = tmp_path / "cut.warc"
    path.write_bytes(raw + raw[: len(raw) - 300])
    out = run(tmp_path, [{"domain": "w", "reader": "warc", "paths": [str(path)]}])
    assert len(out["docs"]) == 1 and [r[2] for r in reasons(out)] == ["truncated_file"]


def test_missing_path(tmp_path):
    write_jsonl(tmp_path / "ok.jsonl", prose_records(1))
    sources = [{"domain": "p", "paths": [str(tmp_path / "ok.jsonl"), str(tmp_path / "nope.jsonl"),
                                         str(tmp_path / "nodir" / "*.jsonl"), str(tmp_path / "*.parquet")]}]
    out = run(tmp_path, sources)
    assert len(out["docs"]) == 1
    assert [(r["path"], r["reason"], r["detail"]) for r in out["rejects"]] == [
        (str(tmp_path / "nope.jsonl"), "missing_path", "no such file or folder"),
        (str(tmp_path / "nodir" / "*.jsonl"), "missing_path", "no such file or folder"),
        (str(tmp_path / "*.parquet"), "missing_path", "no file matches this pattern")]
    assert f"{tmp_path / 'nope.jsonl'}: missing_path: no such file or folder" in strict_message(tmp_path, sources)


UNREADABLE_CHILD = """
import json, pathlib, sys
sys.path.insert(0, {repo!r})
from pipeline.config import config_from_dict
from pipeline.ingest.run import plan_ingest, run_ingest_shard
cfg = config_from_dict({cfg!r})
print(json.dumps([run_ingest_shard(cfg, pathlib.Path({rdir!r}), s) for s in plan_ingest(cfg)]))
"""


def _drop_dac_capabilities() -> None:  # runs in the child between fork and exec
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (1, 2):                                  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
        if libc.prctl(24, cap, 0, 0, 0) != 0:           # PR_CAPBSET_DROP: root keeps only the bounding set on exec
            raise OSError(ctypes.get_errno(), "PR_CAPBSET_DROP failed")


def test_unreadable_file(tmp_path):
    """Permissions: a chmod-000 file.  Tests run as root, and root bypasses file permissions (``os.access`` says
    readable, ``open`` succeeds), so as root the ingest runs in a child process that keeps uid 0 but has
    CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH dropped from its capability bounding set: the kernel then applies the
    000 mode to it, exactly as to any unprivileged worker."""
    folder = tmp_path / "in"
    write_jsonl(folder / "ok.jsonl", prose_records(1))
    locked = write_jsonl(folder / "locked.jsonl", prose_records(2))
    os.chmod(locked, 0)
    sources = [{"domain": "p", "paths": [str(folder)]}]
    try:
        if os.geteuid() != 0:
            assert not os.access(locked, os.R_OK)
            stats = run(tmp_path, sources)["stats"]
            log = ""
        else:
            assert os.access(locked, os.R_OK)            # root: DAC does not apply, hence the child below
            cfg = {"data_root": str(tmp_path / "data"), "sources": sources, "ingest": {"workers": 1}}
            code = UNREADABLE_CHILD.format(repo=str(REPO), cfg=cfg, rdir=str(tmp_path / "data" / "run"))
            try:
                proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                                      preexec_fn=_drop_dac_capabilities)
            except subprocess.SubprocessError as exc:
                pytest.skip(f"cannot drop capabilities here ({exc})")
            assert proc.returncode == 0, proc.stderr
            stats = json.loads(proc.stdout.strip().splitlines()[-1])
            log = proc.stderr
    finally:
        os.chmod(locked, 0o644)
    assert [s["removed"] for s in stats] == [{"unreadable_file": {"docs": 1, "bytes": 0}}]
    assert sum(s["kept_docs"] for s in stats) == 1
    if log:
        assert f"{locked}: unreadable_file: cannot be opened (Permission denied)" in log


def test_symlink_loops(tmp_path):
    folder = tmp_path / "in"
    (folder / "sub").mkdir(parents=True)
    write_jsonl(folder / "sub" / "ok.jsonl", prose_records(1))
    os.symlink(folder / "b.jsonl", folder / "a.jsonl")
    os.symlink(folder / "a.jsonl", folder / "b.jsonl")
    os.symlink(folder, folder / "sub" / "up")          # a folder cycle
    out = run(tmp_path, [{"domain": "p", "paths": [str(folder)]},
                         {"domain": "q", "paths": [str(folder / "a.jsonl")]}])
    assert len(out["docs"]) == 1
    assert sorted((r["path"].replace(str(folder), ""), r["reason"]) for r in out["rejects"]) == [
        ("/a.jsonl", "symlink_loop"), ("/a.jsonl", "symlink_loop"), ("/b.jsonl", "symlink_loop"),
        ("/sub/up", "symlink_loop")]
    assert "symbolic link back to an enclosing folder" in {r["detail"].split(" (")[0] for r in out["rejects"]}
    assert f"{folder / 'a.jsonl'}: symlink_loop: symbolic link loop" in strict_message(
        tmp_path, [{"domain": "q", "paths": [str(folder / "a.jsonl")]}])


def test_source_matching_nothing_fails_at_plan_time(tmp_path):
    """A source none of whose paths names a file stops the plan, naming the source and each pattern."""
    from pipeline.config import ConfigError

    write_jsonl(tmp_path / "ok.jsonl", prose_records(1))
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes.txt").write_text("not jsonl")
    sources = [{"domain": "p", "paths": [str(tmp_path / "ok.jsonl")]},
               {"domain": "p", "name": "later", "paths": [str(tmp_path / "nope" / "*.jsonl"), str(tmp_path / "empty"),
                                                          str(tmp_path / "*.txt")]}]
    with pytest.raises(ConfigError) as err:
        run(tmp_path, sources)
    assert str(err.value) == (
        f"sources[1] 'later' (jsonl): its paths match no file: {str(tmp_path / 'nope' / '*.jsonl')!r} (no such file "
        f"or folder); {str(tmp_path / 'empty')!r} (folder holds no files); {str(tmp_path / '*.txt')!r} (none of 1 "
        "files has a jsonl suffix). Fix 'paths', or set 'allow_empty: true' on this source to run without it")
    sources[1]["allow_empty"] = True
    empty: list[dict] = []
    specs = plan_ingest(config_from_dict({"data_root": str(tmp_path / "d"), "sources": sources}), empty)
    assert [s["source"] for s in specs] == ["p"] and [e["source"] for e in empty] == ["later"]
    out = run(tmp_path / "allowed", sources)
    assert len(out["docs"]) == 1 and out["removed"] == {}
