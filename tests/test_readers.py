"""Every reader on real files: slices of ``../shared/corpora`` (skipped when absent) or files built from the
running interpreter's standard library, with exact document counts, ids, offsets and metadata."""

from __future__ import annotations

import bz2
import gzip
import json
import pathlib
import shutil
import sysconfig

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from conftest import SHARED_CORPORA, stdlib_records, write_jsonl

from pipeline.config import config_from_dict
from pipeline.configkit import ConfigError
from pipeline.ingest.normalize import doc_id, normalize_text
from pipeline.ingest.run import plan_ingest, run_ingest_shard

corpus = pytest.mark.skipif(not SHARED_CORPORA.exists(), reason="../shared/corpora is absent")


def ingest(tmp: pathlib.Path, sources: list[dict], **ingest_opts) -> dict:
    cfg = config_from_dict({"data_root": str(tmp / "data"), "sources": sources,
                            "ingest": {"workers": 1, **ingest_opts}})
    rdir = tmp / "data" / "run"
    specs = plan_ingest(cfg)
    json.dumps(specs)                                   # specs travel through XCom
    stats = [run_ingest_shard(cfg, rdir, s) for s in specs]
    docs, rejects = [], []
    for part in (p for st in stats for p in st["parts"]):        # every output shard, in plan order
        docs += pq.read_table(rdir / "ingest" / f"{part}.parquet").to_pylist()
        rej = rdir / "rejects" / "ingest" / f"{part}.parquet"
        rejects += pq.read_table(rej).to_pylist() if rej.exists() else []
    return {"cfg": cfg, "rdir": rdir, "specs": specs, "stats": stats, "docs": docs, "rejects": rejects}


def jsonl_lines(name: str, n: int) -> list[bytes]:
    with open(SHARED_CORPORA / name, "rb") as fh:
        return [next(fh) for _ in range(n)]


# ------------------------------------------------------------------------------------------------------ JSONL

@corpus
@pytest.mark.parametrize("suffix,compress", [("", bytes), (".gz", gzip.compress), (".bz2", bz2.compress),
                                             (".zst", zstandard.ZstdCompressor().compress)])
def test_jsonl_plain_and_compressed(tmp_path, suffix, compress):
    lines = jsonl_lines("zh.jsonl", 40)
    path = tmp_path / f"zh.jsonl{suffix}"
    path.write_bytes(compress(b"".join(lines)))
    out = ingest(tmp_path, [{"domain": "zh", "paths": [str(path)]}], docs_per_shard=15)
    records = [json.loads(x) for x in lines]
    assert [d["text"] for d in out["docs"]] == [normalize_text(r["text"]) for r in records]
    offsets = [sum(map(len, lines[:i])) for i in range(40)]
    assert [d["doc_id"] for d in out["docs"]] == [doc_id("zh", f"zh/zh.jsonl{suffix}", o) for o in offsets]
    assert [json.loads(d["meta"])["source_id"] for d in out["docs"]] == [r["id"] for r in records]
    assert out["docs"][0]["source"] == "fortunes-zh"
    # a plain file's lines are located by byte offset (its ranges start mid-file), a compressed file's by line number
    where = ["byte 0", f"byte {offsets[1]}"] if not suffix else ["line 1", "line 2"]
    assert [d["origin"] for d in out["docs"][:2]] == [f"zh.jsonl{suffix}:{w}" for w in where]
    # plain files are cut into line-aligned byte ranges, compressed ones cannot be entered mid-stream
    assert len(out["specs"]) == (3 if not suffix else 1)
    assert out["rejects"] == []


@corpus
def test_jsonl_ids_are_golden(tmp_path):
    """Ids must never change between releases: they key every later stage and every published manifest."""
    path = tmp_path / "web.jsonl"
    path.write_bytes(b"".join(jsonl_lines("web.jsonl", 2)))
    out = ingest(tmp_path, [{"domain": "web", "name": "docs-sites", "paths": [str(path)]}])
    assert [d["doc_id"] for d in out["docs"]] == ["web-8445c93e40e1edb7", "web-835f204f05e075ce"]


def test_jsonl_custom_fields(tmp_path):
    recs = [{"body": r["text"], "uid": r["id"], "extra": {"repo": "cpython"}, "lang_tag": "py"}
            for r in stdlib_records(3)]
    path = write_jsonl(tmp_path / "code.jsonl", recs)
    out = ingest(tmp_path, [{"domain": "code", "paths": [str(path)], "text_field": "body", "id_field": "uid",
                             "lang": "code", "options": {"meta_field": "extra", "keep_fields": ["lang_tag"]}}])
    assert len(out["docs"]) == 3
    assert json.loads(out["docs"][0]["meta"]) == {"source_id": recs[0]["uid"], "repo": "cpython", "lang_tag": "py"}
    assert {(d["lang"], d["lang_score"]) for d in out["docs"]} == {("code", 1.0)}


def test_unknown_reader_option_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"options\.separatr: unknown field"):
        config_from_dict({"sources": [{"domain": "b", "reader": "text", "paths": ["x"],
                                       "options": {"separatr": "\f"}}]})
    with pytest.raises(ConfigError, match=r"options\.extractor: must be one of"):
        config_from_dict({"sources": [{"domain": "w", "reader": "warc", "paths": ["x"],
                                       "options": {"extractor": "regex"}}]})


# ---------------------------------------------------------------------------------------------------- Parquet

@corpus
def test_parquet_row_groups_become_shards(tmp_path):
    recs = [json.loads(x) for x in jsonl_lines("books.jsonl", 30)]
    table = pa.table({"content": [r["text"] for r in recs], "doc": [r["id"] for r in recs],
                      "title": [r["meta"].get("title", "") for r in recs], "unused": list(range(30))})
    pq.write_table(table, tmp_path / "books.parquet", row_group_size=7)
    out = ingest(tmp_path, [{"domain": "books", "reader": "parquet", "paths": [str(tmp_path / "books.parquet")],
                             "text_field": "content", "id_field": "doc", "options": {"columns": ["title"],
                                                                                     "batch_rows": 4}}],
                 docs_per_shard=14)
    assert [[u["rg"] for u in s["units"]] for s in out["specs"]] == [[[0, 2]], [[2, 4]], [[4, 5]]]
    assert len(out["docs"]) == 30
    assert [d["doc_id"] for d in out["docs"]] == [doc_id("books", "books/books.parquet", i) for i in range(30)]
    assert json.loads(out["docs"][3]["meta"]) == {"source_id": recs[3]["id"], "title": recs[3]["meta"]["title"]}
    assert {d["lang"] for d in out["docs"]} == {"en"}


# ------------------------------------------------------------------------------------------------------- text

@corpus
def test_text_one_document_per_file_keeps_long_documents_whole(tmp_path):
    recs = [json.loads(x) for x in jsonl_lines("long.jsonl", 3)]
    folder = tmp_path / "novels"
    folder.mkdir()
    for i, r in enumerate(recs):
        (folder / f"{i:02d}.txt").write_text(r["text"], encoding="utf-8")
    (folder / "01.txt.gz").write_bytes(gzip.compress(recs[1]["text"].encode("utf-8")))
    out = ingest(tmp_path, [{"domain": "long", "reader": "text", "paths": [str(folder)]}])
    assert [json.loads(d["meta"])["path"] for d in out["docs"]] == ["00.txt", "01.txt", "01.txt.gz", "02.txt"]
    assert [d["n_chars"] for d in out["docs"]] == [len(normalize_text(recs[i]["text"])) for i in (0, 1, 1, 2)]
    assert min(d["n_chars"] for d in out["docs"]) > 300_000          # whole novels, not cut
    assert out["docs"][0]["doc_id"] == doc_id("long", "long/00.txt", 0)


@corpus
def test_text_split_on_separator(tmp_path):
    entries = [json.loads(x)["text"] for x in jsonl_lines("encyclopedia.jsonl", 12)]
    path = tmp_path / "dict.txt"
    path.write_text("\f".join(entries), encoding="utf-8")
    out = ingest(tmp_path, [{"domain": "enc", "reader": "text", "paths": [str(path)], "options": {"separator": "\f"}}])
    assert [d["text"] for d in out["docs"]] == [normalize_text(e) for e in entries]
    starts = [sum(len(e) + 1 for e in entries[:i]) for i in range(12)]
    assert [d["doc_id"] for d in out["docs"]] == [doc_id("enc", "enc/dict.txt", s) for s in starts]


@corpus
def test_text_charset_detection(tmp_path):
    """Non-UTF-8 text files are decoded by detection, not dropped: a French page in Latin-1, Chinese in GB18030."""
    recs = [json.loads(x) for x in jsonl_lines("web.jsonl", 253)]
    fr = next(r["text"] for r in recs if r["meta"].get("lang") == "fr" and len(r["text"]) > 3000)
    zh = next(json.loads(x)["text"] for x in jsonl_lines("zh.jsonl", 1104)
              if "linux-doc" in json.loads(x)["source"] and len(json.loads(x)["text"]) > 3000)
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "fr.txt").write_bytes(fr.encode("latin-1", errors="replace"))
    (tmp_path / "t" / "zh.txt").write_bytes(zh.encode("gb18030"))
    out = ingest(tmp_path, [{"domain": "t", "reader": "text", "paths": [str(tmp_path / "t")]}])
    by_path = {json.loads(d["meta"])["path"]: d for d in out["docs"]}
    assert by_path["fr.txt"]["text"] == normalize_text(fr.encode("latin-1", errors="replace").decode("latin-1"))
    assert by_path["fr.txt"]["lang"] == "fr"
    assert by_path["zh.txt"]["text"] == normalize_text(zh) and by_path["zh.txt"]["lang"] == "zh"
    assert json.loads(by_path["zh.txt"]["meta"])["encoding"] == "gb18030"
    assert out["rejects"] == []


# ------------------------------------------------------------------------------------------------- HTML, WARC

@corpus
def test_html_folder_with_title_and_url(tmp_path):
    out = ingest(tmp_path, [{"domain": "web", "reader": "html",
                             "paths": [str(SHARED_CORPORA / "web_html" / "python3.11-doc")],
                             "options": {"url_prefix": "https://docs.python.org/3.11/"}}])
    assert len(out["docs"]) == 20 and out["rejects"] == []
    first = out["docs"][0]
    meta = json.loads(first["meta"])
    assert meta["path"] == "library/__future__.html"
    assert meta["url"] == "https://docs.python.org/3.11/library/__future__.html"
    assert meta["title"] == "__future__ — Future statement definitions — Python 3.11.2 documentation"
    assert first["doc_id"] == doc_id("web", "web/library/__future__.html", 0)
    assert "__future__ is a real module" in first["text"] and "Navigation" not in first["text"]
    assert {d["lang"] for d in out["docs"]} == {"en"}


@corpus
def test_html_trafilatura_extractor_and_meta_charset(tmp_path):
    src = sorted((SHARED_CORPORA / "web_html" / "debian-faq-zh-cn").iterdir())[0]
    page = src.read_bytes().decode("utf-8")
    assert "charset=UTF-8" in page or "charset=utf-8" in page
    gbk = page.replace("charset=UTF-8", "charset=GBK").replace("charset=utf-8", "charset=GBK")
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "gbk.html").write_bytes(gbk.encode("gbk", errors="xmlcharrefreplace"))
    (tmp_path / "p" / "utf8.htm").write_bytes(src.read_bytes())
    for extractor in ("resiliparse", "trafilatura"):
        out = ingest(tmp_path / extractor, [{"domain": "zh", "reader": "html", "paths": [str(tmp_path / "p")],
                                             "options": {"extractor": extractor}}])
        texts = {json.loads(d["meta"])["path"]: d for d in out["docs"]}
        assert set(texts) == {"gbk.html", "utf8.htm"}
        assert json.loads(texts["gbk.html"]["meta"])["encoding"] == "gbk"
        assert texts["gbk.html"]["text"] == texts["utf8.htm"]["text"] and texts["gbk.html"]["lang"] == "zh"


@corpus
def test_warc_response_records(tmp_path):
    out = ingest(tmp_path, [{"domain": "web", "reader": "warc", "paths": [str(SHARED_CORPORA / "web.warc.gz")]}])
    assert len(out["docs"]) == 253 and out["rejects"] == [] and len(out["specs"]) == 1
    meta = json.loads(out["docs"][0]["meta"])
    assert meta["url"] == "https://docs.python.org/3.11/library/__future__.html"
    assert meta["title"].startswith("__future__ — Future statement definitions")
    assert out["docs"][0]["doc_id"] == doc_id("web", "web/web.warc.gz", 0)
    assert out["docs"][1]["origin"].startswith("web.warc.gz:record 2 @ byte ")
    assert {d["lang"] for d in out["docs"]} == {"en", "fr"}                    # apache2-doc ships fr pages


def warc_record(uri: str, http_head: bytes, body: bytes, rtype: str = "response") -> bytes:
    """One gzip member holding one WARC record, written byte by byte (warcio refuses to write broken ones)."""
    block = http_head + b"\r\n\r\n" + body
    head = (f"WARC/1.0\r\nWARC-Type: {rtype}\r\nWARC-Target-URI: {uri}\r\nWARC-Record-ID: <urn:uuid:{uri[-8:]}>\r\n"
            f"WARC-Date: 2026-01-01T00:00:00Z\r\nContent-Type: application/http; msgtype={rtype}\r\n"
            f"Content-Length: {len(block)}\r\n\r\n").encode()
    return gzip.compress(head + block + b"\r\n\r\n")


def test_warc_http_charset_and_encodings(tmp_path):
    zh = ("<html><head><title>长江</title></head><body><article><p>"
          + "长江是中国最长的河流，全长约六千三百公里。" * 20 + "</p></article></body></html>")
    en = "<html><body><main><p>" + normalize_text(stdlib_records(1)[0]["text"][:3000]).replace("<", " ") + \
         "</p></main></body></html>"
    gz = gzip.compress(en.encode())
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(gz), gz)
    data = (warc_record("http://x/zh", b"HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=GB18030",
                        zh.encode("gb18030"))
            + warc_record("http://x/req", b"GET /zh HTTP/1.1\r\nHost: x", b"", rtype="request")
            + warc_record("http://x/en", b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Encoding: gzip\r\n"
                                         b"Transfer-Encoding: chunked", chunked)
            + warc_record("http://x/png", b"HTTP/1.1 200 OK\r\nContent-Type: image/png", b"\x89PNG\r\n")
            + warc_record("http://x/404", b"HTTP/1.1 404 Not Found\r\nContent-Type: text/html", b"<p>gone</p>"))
    (tmp_path / "c.warc.gz").write_bytes(data)
    out = ingest(tmp_path, [{"domain": "web", "reader": "warc", "paths": [str(tmp_path / "c.warc.gz")]}])
    assert [json.loads(d["meta"])["url"] for d in out["docs"]] == ["http://x/zh", "http://x/en"]
    assert out["docs"][0]["text"].startswith("长江是中国最长的河流") and out["docs"][0]["lang"] == "zh"
    assert json.loads(out["docs"][0]["meta"])["title"] == "长江"
    assert out["docs"][1]["lang"] == "en"
    assert out["stats"][0]["removed"] == {"warc_non_response": {"docs": 1, "bytes": 0},
                                          "unsupported_content_type": {"docs": 1, "bytes": 6},
                                          "http_status": {"docs": 1, "bytes": 11}}
    assert [r["reason"] for r in out["rejects"]] == ["unsupported_content_type", "http_status"]


PAGE = ("<html><head><title>T</title></head><body><header><nav><ul><li><a href='/'>Home</a></li>"
        "<li><a href='/docs'>Docs</a></li><li><a href='/blog'>Blog</a></li></ul></nav></header><main><article>"
        "<h1>Rivers of the world</h1>" + "".join(f"<p>The river number {i} runs a long way through the valley and "
                                                 "feeds the towns along its banks with water for the fields.</p>"
                                                 for i in range(6))
        + "</article></main><footer><p>Copyright 2026 Example Org.</p><p><a href='/privacy'>Privacy</a> | "
          "<a href='/terms'>Terms</a></p></footer></body></html>")


def test_page_templates_are_the_lines_extraction_drops_around_the_main_content(tmp_path):
    """#51: the positive control's navigation junk comes from the sources' own pages: per page, the lines of its
    whole text that main-content extraction drops, before and after the content; pages without any, and records
    that are no pages (a request, an image, a JSONL source), give none."""
    from pipeline.ingest.readers.html import page_template
    from pipeline.ingest.templates import page_templates

    assert page_template(PAGE.encode()) == (["• Home", "• Docs", "• Blog"], ["Copyright 2026 Example Org.",
                                                                            "Privacy | Terms"])
    bare = "<html><body><p>" + "A page that is all content and nothing else, said at length. " * 8 + "</p></body>"
    assert page_template(bare.encode()) == ([], [])
    data = (warc_record("http://x/a", b"HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8", PAGE.encode())
            + warc_record("http://x/req", b"GET /a HTTP/1.1\r\nHost: x", b"", rtype="request")
            + warc_record("http://x/bare", b"HTTP/1.1 200 OK\r\nContent-Type: text/html", bare.encode())
            + warc_record("http://x/png", b"HTTP/1.1 200 OK\r\nContent-Type: image/png", b"\x89PNG\r\n")
            + warc_record("http://x/b", b"HTTP/1.1 200 OK\r\nContent-Type: text/html", PAGE.encode()))
    (tmp_path / "c.warc.gz").write_bytes(data)
    (tmp_path / "d.jsonl").write_text(json.dumps({"id": "1", "text": "no page"}) + "\n")
    cfg = config_from_dict({"data_root": str(tmp_path / "data"),
                            "sources": [{"domain": "books", "reader": "jsonl", "paths": [str(tmp_path / "d.jsonl")]},
                                        {"domain": "web", "reader": "warc", "paths": [str(tmp_path / "c.warc.gz")]}]})
    expected = page_template(PAGE.encode())
    assert page_templates(cfg) == [expected, expected]
    assert page_templates(cfg, limit=1) == [expected]


# ------------------------------------------------------------------------------------------------------- code

def test_code_tree(tmp_path):
    repo = tmp_path / "repo"
    stdlib = pathlib.Path(sysconfig.get_paths()["stdlib"])
    files = {"src/pkg/__init__.py": "", "src/pkg/queue.py": (stdlib / "queue.py").read_bytes(),
             "src/pkg/bisect.py": (stdlib / "bisect.py").read_bytes(),
             "tools/build.sh": b"#!/bin/sh\nset -e\nmake -C src all\n",
             "Makefile": b"all:\n\tpython -m build\n",
             "node_modules/left-pad/index.js": b"module.exports = function leftPad() {}\n",
             "web/app.min.js": b"function a(){return 1}",
             "api/service_pb2.py": b"# -*- coding: utf-8 -*-\n# Generated by the protocol buffer compiler.\n",
             "gen/parser.go": b"// Code generated by goyacc. DO NOT EDIT.\npackage gen\n",
             "assets/logo.png": b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR",
             "assets/blob.c": b"\x00\x01\x02binary\x00",
             "README.rst": ((stdlib.parent / "LICENSE.txt").read_bytes()[:500]
                            if (stdlib.parent / "LICENSE.txt").exists() else b"Project\n=======\n")}
    for rel, data in files.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_bytes(data if isinstance(data, bytes) else data.encode())
    out = ingest(tmp_path, [{"domain": "code", "reader": "code", "paths": [str(repo)]}])
    kept = {json.loads(d["meta"])["path"]: json.loads(d["meta"])["language"] for d in out["docs"]}
    assert kept == {"Makefile": "makefile", "README.rst": "restructuredtext", "src/pkg/bisect.py": "python",
                    "src/pkg/queue.py": "python", "tools/build.sh": "shell"}
    assert {d["lang"] for d in out["docs"]} == {"code"}
    assert {r["path"].split("repo/", 1)[1]: r["reason"] for r in out["rejects"]} == {
        "api/service_pb2.py": "generated_file", "assets/blob.c": "binary_file", "assets/logo.png": "not_code",
        "gen/parser.go": "generated_file", "node_modules/left-pad/index.js": "vendored_file",
        "src/pkg/__init__.py": "empty_file", "web/app.min.js": "generated_file"}
    queue = next(d for d in out["docs"] if d["origin"] == "src/pkg/queue.py")
    assert queue["doc_id"] == doc_id("code", "code/src/pkg/queue.py", 0)
    assert queue["text"].startswith("'''A multi-producer, multi-consumer queue.'''")
    assert "    def __init__(self, maxsize=0):\n        self.maxsize = maxsize" in queue["text"]   # indentation kept


def test_same_input_same_ids_wherever_it_is_mounted(tmp_path):
    recs = stdlib_records(4)
    for where in ("a/deep/mount", "b"):
        write_jsonl(tmp_path / where / "corpus" / "part-0.jsonl", recs)
    runs = [ingest(tmp_path / f"run{i}", [{"domain": "code", "paths": [str(tmp_path / where / "corpus" / "*.jsonl")]}])
            for i, where in enumerate(("a/deep/mount", "b"))]
    assert [d["doc_id"] for d in runs[0]["docs"]] == [d["doc_id"] for d in runs[1]["docs"]]
    shutil.rmtree(tmp_path / "b")


def test_glob_and_same_relative_path_collision(tmp_path):
    recs = stdlib_records(2)
    write_jsonl(tmp_path / "x" / "p.jsonl", recs)
    write_jsonl(tmp_path / "y" / "p.jsonl", recs)
    out = ingest(tmp_path, [{"domain": "c", "paths": [str(tmp_path / "**" / "*.jsonl")]}])
    assert sorted({d["origin"].split(":")[0] for d in out["docs"]}) == ["x/p.jsonl", "y/p.jsonl"]
    with pytest.raises(ConfigError, match="same relative path 'p.jsonl'"):
        ingest(tmp_path / "again", [{"domain": "c", "paths": [str(tmp_path / "x" / "p.jsonl"),
                                                              str(tmp_path / "y" / "p.jsonl")]}])
