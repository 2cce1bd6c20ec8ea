"""Hash-partitioned exact dedup: same survivors for any partition count, first copy in shard order kept."""

from __future__ import annotations

import pathlib
import shutil

import pyarrow.parquet as pq
import pytest
from conftest import prose_records, stdlib_records, write_jsonl

from pipeline.config import config_from_dict
from pipeline.dedup import exact as exact_dedup
from pipeline.ingest.run import plan_ingest, run_ingest_shard
from pipeline.io import read_json


@pytest.fixture(scope="module")
def ingested(tmp_path_factory) -> tuple[pathlib.Path, list[str], list[dict]]:
    tmp = tmp_path_factory.mktemp("dedup")
    prose, code = prose_records(20), stdlib_records(6)
    # a: 20 docs with 2 internal copies; b: copies of a's docs 0-2 (one normalizes to the same text); code: own copy
    write_jsonl(tmp / "a.jsonl", prose + [prose[4], prose[9]])
    write_jsonl(tmp / "b.jsonl", [prose[0], {**prose[1], "text": prose[1]["text"] + "\n\n\n   "}, prose[2]] + prose[15:])
    write_jsonl(tmp / "code.jsonl", code + [code[0]])
    cfg = config_from_dict({"data_root": str(tmp), "ingest": {"docs_per_shard": 8, "workers": 1},
                            "sources": [{"domain": "a", "paths": [str(tmp / "a.jsonl")]},
                                        {"domain": "b", "paths": [str(tmp / "b.jsonl")]},
                                        {"domain": "code", "paths": [str(tmp / "code.jsonl")], "lang": "code"}]})
    rdir = tmp / "run"
    specs = plan_ingest(cfg)
    for s in specs:
        run_ingest_shard(cfg, rdir, s)
    rows = [r for s in specs for r in pq.read_table(rdir / "ingest" / f"{s['shard']}.parquet").to_pylist()]
    return rdir, [s["shard"] for s in specs], rows


def survivors(rdir: pathlib.Path, shards: list[str], n: int, enabled: bool = True) -> tuple[dict, list[str]]:
    out = rdir.parent / f"copy-{n}-{enabled}"
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(rdir / "ingest", out / "ingest")
    info = exact_dedup.build_exact_index(out, shards, enabled=enabled, n_partitions=n)
    kept = []
    for shard in shards:
        st = exact_dedup.run_exact_dedup_shard(out, shard, n_partitions=n)
        assert st == read_json(out / "stats" / "exact_dedup" / f"{shard}.json")
        kept += pq.read_table(out / "exact_dedup" / f"{shard}.parquet", columns=["doc_id"]).column(0).to_pylist()
    return info, kept


def test_first_copy_in_shard_order_survives(ingested):
    rdir, shards, rows = ingested                                 # rows are in shard order, then row order
    assert shards == ["a-00000", "a-00001", "a-00002", "b-00000", "code-00000"]
    info, kept = survivors(rdir, shards, 4)
    first: dict[str, str] = {}
    for r in rows:
        first.setdefault(r["text_hash"], r["doc_id"])
    assert kept == list(first.values())
    assert info == {"unique_texts": 26, "duplicates": 2 + 8 + 1, "partitions": 4}
    removed = {s: read_json(rdir.parent / "copy-4-True" / "stats" / "exact_dedup" / f"{s}.json")["removed"]
               for s in shards}
    assert {s: v.get("exact_duplicate", {}).get("docs", 0) for s, v in removed.items()} == {
        "a-00000": 0, "a-00001": 0, "a-00002": 2, "b-00000": 8, "code-00000": 1}


@pytest.mark.parametrize("n", [1, 3, 16])
def test_partition_count_does_not_change_the_result(ingested, n):
    rdir, shards, _ = ingested
    assert survivors(rdir, shards, n)[1] == survivors(rdir, shards, 4)[1]


def test_mapped_steps_equal_the_single_call_and_are_idempotent(ingested, tmp_path):
    rdir, shards, _ = ingested
    out = tmp_path / "run"
    shutil.copytree(rdir / "ingest", out / "ingest")
    for shard in reversed(shards):                               # mapped tasks finish in any order
        exact_dedup.run_exact_hash_shard(out, shard, 5)
    exact_dedup.run_exact_partition(out, shards, 0, 5)
    with pytest.raises(FileNotFoundError, match="partition 1 of 5 is missing"):
        exact_dedup.run_exact_dedup_shard(out, shards[0], 5)
    for p in (4, 2, 3, 1):
        exact_dedup.run_exact_partition(out, shards, p, 5)
    files = sorted(out.rglob("*.parquet"))
    before = {f: f.read_bytes() for f in files}
    for p in range(5):
        exact_dedup.run_exact_partition(out, shards, p, 5)
    assert {f: f.read_bytes() for f in files} == before
    kept = []
    for shard in shards:
        exact_dedup.run_exact_dedup_shard(out, shard, 5)
        kept += pq.read_table(out / "exact_dedup" / f"{shard}.parquet", columns=["doc_id"]).column(0).to_pylist()
    assert kept == survivors(rdir, shards, 5)[1]


def test_disabled_keeps_everything(ingested):
    rdir, shards, rows = ingested
    info, kept = survivors(rdir, shards, 4, enabled=False)
    assert info["duplicates"] == 0 and len(kept) == len(rows)
