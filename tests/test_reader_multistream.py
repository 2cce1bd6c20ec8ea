"""MediaWiki multistream dumps: planned into byte ranges of whole bz2 streams (from the index, or by scanning for
verified stream headers), read by several tasks in parallel; the result equals reading the dump as one file."""

from __future__ import annotations

import bz2
import io
import itertools
import random
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import REPO

from pipeline.config import config_from_dict
from pipeline.democorpus import write_multistream
from pipeline.ingest.readers.multistream import STREAM_MAGIC, _Probe
from pipeline.ingest.run import plan_ingest, run_ingest_shard

SAMPLE = REPO / "tests" / "fixtures" / "enwiki-sample.xml"
NAME = "enwiki-pages-articles-multistream.xml.bz2"


def config(root: Path, dump: Path, **ingest):
    return config_from_dict({"data_root": str(root), "ingest": {"workers": 1, **ingest},
                             "sources": [{"domain": "encyclopedia", "reader": "mediawiki", "paths": [str(dump)]}]})


def _task(args: tuple) -> dict:
    cfg, rdir, spec = args
    return run_ingest_shard(cfg, rdir, spec)


def ingest(root: Path, dump: Path, parallel: bool = False, **ingest) -> tuple[list[dict], list[dict], dict]:
    """(plan units, document rows of every output shard in plan order, summed stats)."""
    cfg = config(root, dump, **ingest)
    specs = plan_ingest(cfg)
    rdir = root / "run"
    jobs = [(cfg, rdir, s) for s in specs]
    if parallel:
        with ProcessPoolExecutor(len(jobs), mp_context=get_context("spawn")) as pool:
            stats = list(pool.map(_task, jobs))
    else:
        stats = [_task(j) for j in jobs]
    rows = [r for st in stats for part in st["parts"]
            for r in pq.read_table(rdir / "ingest" / f"{part}.parquet").to_pylist()]
    total: dict = {"in_docs": 0, "in_bytes": 0, "kept_docs": 0, "kept_bytes": 0, "removed": {}}
    for st in stats:
        for k in ("in_docs", "in_bytes", "kept_docs", "kept_bytes"):
            total[k] += st[k]
        for reason, v in st["removed"].items():
            slot = total["removed"].setdefault(reason, {"docs": 0, "bytes": 0})
            slot["docs"] += v["docs"]
            slot["bytes"] += v["bytes"]
    return [u for s in specs for u in s["units"]], rows, total


def as_one_file(root: Path, dump: Path) -> tuple[list[dict], dict]:
    """The same bytes under the same name, without an index and below shard_bytes: one task reads it whole."""
    (root / "whole").mkdir(parents=True)
    (root / "whole" / dump.name).write_bytes(dump.read_bytes())
    units, rows, total = ingest(root / "whole-run", root / "whole" / dump.name)
    assert [("start" in u, u.get("whole_file", "")[:12]) for u in units] == [(False, "one bz2 stre")]
    return rows, total


def assert_stream_ranges(dump: Path, units: list[dict]) -> None:
    data = dump.read_bytes()
    assert units[0]["start"] == 0 and units[-1]["end"] == len(data)
    assert all(a["end"] == b["start"] and STREAM_MAGIC.match(data[b["start"]:]) for a, b in itertools.pairwise(units))


def test_multistream_dump_with_index_is_read_by_several_tasks_as_if_whole(tmp_path):
    dump = tmp_path / "dump" / NAME
    dump.parent.mkdir()
    index = write_multistream(SAMPLE.read_bytes(), dump, pages_per_stream=1)
    assert index.name == "enwiki-pages-articles-multistream-index.txt.bz2"
    lines = bz2.decompress(index.read_bytes()).decode().splitlines()
    assert [ln.split(":", 1)[1] for ln in lines] == [
        "635:ANOVA", "675:Affirming the consequent", "694:Asia Minor (disambiguation)",
        "724:Wikipedia:Adding Wikipedia articles to Nupedia", "742:Algorithms (journal)", "766:Abstract (law)"]
    data = dump.read_bytes()
    assert all(STREAM_MAGIC.match(data[int(ln.split(":")[0]):]) for ln in lines)
    units, rows, total = ingest(tmp_path / "ranges", dump, parallel=True, docs_per_shard=2)
    assert [(u["streams"], u["docs_estimate"]) for u in units] == [("index", 2)] * 3
    assert_stream_ranges(dump, units)
    rows1, total1 = as_one_file(tmp_path, dump)
    assert [r["origin"] for r in rows] == [f"{NAME}:page id {i}" for i in (675, 742, 766)]
    assert rows == rows1 and total == total1
    assert total["removed"] == {"wiki_redirect": {"docs": 1, "bytes": 53},
                                "wiki_disambiguation": {"docs": 1, "bytes": 429},
                                "wiki_namespace": {"docs": 1, "bytes": 45}}


def test_without_the_index_stream_starts_are_found_by_scanning(tmp_path):
    dump = tmp_path / "dump" / NAME
    dump.parent.mkdir()
    write_multistream(SAMPLE.read_bytes(), dump, pages_per_stream=1).unlink()
    units, rows, total = ingest(tmp_path / "ranges", dump, parallel=False, shard_bytes=1500)
    assert {u["streams"] for u in units} == {"scan"} and len(units) >= 3
    assert_stream_ranges(dump, units)
    assert (rows, total) == as_one_file(tmp_path, dump)


def test_a_stream_header_inside_data_is_not_taken_for_a_stream(tmp_path):
    """The magic bytes can occur inside compressed data: a candidate counts only once it decompresses to a whole
    stream of pages.  A parallel compressor's streams (pbzip2: cut anywhere in the text) are not page streams."""
    xml = SAMPLE.read_bytes()
    real = bz2.compress(xml[xml.index(b"  <page>"):xml.index(b"  </page>") + 10])
    fake = b"BZh91AY&SY" + bytes(random.Random(1).randrange(256) for _ in range(3000))
    blob = bz2.compress(b"<mediawiki>\n") + fake + real
    probe = _Probe(io.BytesIO(blob), len(blob))
    assert [m.start() for m in STREAM_MAGIC.finditer(blob)][:2] == [0, blob.index(fake)]
    assert probe.next_stream(1) == blob.index(real)
    cut = tmp_path / "pbzip2" / NAME
    cut.parent.mkdir()
    cut.write_bytes(b"".join(bz2.compress(xml[i:i + 2000]) for i in range(0, len(xml), 2000)))
    units, rows, total = ingest(tmp_path / "cut", cut, shard_bytes=1500)
    assert len(units) == 1 and "start" not in units[0] and len(rows) == 3


@pytest.mark.slow
def test_demo_articles_as_a_multistream_dump(tmp_path):
    """The demo's encyclopedia dump (gensim's enwiki excerpt, 60 sampled articles and every other page), written
    with 10 pages per stream and an index: 4 parallel tasks give what one task reading it whole gives."""
    from pipeline import democorpus

    wheels = sorted((REPO / ".cache" / "demo-sources").glob("gensim-4.3.3-*.whl"))
    if not wheels:
        pytest.skip("gensim 4.3.3 wheel not cached (make corpus)")
    single = tmp_path / "encyclopedia.xml.bz2"
    k = democorpus._write_encyclopedia_dump(wheels[0].parent, single, random.Random("0/encyclopedia"), 60)
    dump = tmp_path / "dump" / NAME
    dump.parent.mkdir()
    write_multistream(bz2.decompress(single.read_bytes()), dump, pages_per_stream=10)
    units, rows, total = ingest(tmp_path / "ranges", dump, parallel=True, docs_per_shard=40)
    assert k == 60 and [u["docs_estimate"] for u in units] == [40, 40, 40, 40]     # 160 pages, from the index
    assert_stream_ranges(dump, units)
    rows1, total1 = as_one_file(tmp_path, dump)
    assert len(rows) == total["kept_docs"] > 40 and rows == rows1 and total == total1
