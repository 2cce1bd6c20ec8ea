"""Hash-partitioned exact dedup: same survivors for any partition or batch count, first copy in plan order kept."""

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
    write_jsonl(tmp / "b.jsonl",
                [prose[0], {**prose[1], "text": prose[1]["text"] + "\n\n\n   "}, prose[2]] + prose[15:])
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


def survivors(rdir: pathlib.Path, shards: list[str], n: int, enabled: bool = True,
              batches: int = 1) -> tuple[dict, list[str]]:
    out = rdir.parent / f"copy-{n}-{enabled}-{batches}"
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(rdir / "ingest", out / "ingest")
    info = exact_dedup.build_exact_index(out, shards, enabled=enabled, n_partitions=n, n_batches=batches)
    stats = exact_dedup.drop_exact_duplicates(out, shards, n_partitions=n, n_batches=batches)
    kept = []
    for shard, st in zip(shards, stats, strict=True):
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
    removed = {s: read_json(rdir.parent / "copy-4-True-1" / "stats" / "exact_dedup" / f"{s}.json")["removed"]
               for s in shards}
    assert {s: v.get("exact_duplicate", {}).get("docs", 0) for s, v in removed.items()} == {
        "a-00000": 0, "a-00001": 0, "a-00002": 2, "b-00000": 8, "code-00000": 1}


@pytest.mark.parametrize("n", [1, 3, 16])
def test_partition_count_does_not_change_the_result(ingested, n):
    rdir, shards, _ = ingested
    assert survivors(rdir, shards, n)[1] == survivors(rdir, shards, 4)[1]


@pytest.mark.parametrize("batches", [2, 3, 5])
def test_batch_count_does_not_change_the_result(ingested, batches):
    """Copies across batches (b's copies of a's documents) are found; plan order decides, not the batching."""
    rdir, shards, _ = ingested
    info, kept = survivors(rdir, shards, 3, batches=batches)
    assert kept == survivors(rdir, shards, 4)[1] and info["duplicates"] == 11
    out = rdir.parent / f"copy-3-True-{batches}"
    assert sorted(p.name for p in (out / "exact_dedup" / "hashes").glob("*.parquet")) == [
        f"batch-{b:05d}-of-{batches:05d}.parquet" for b in range(batches)]         # one hash file per batch


def test_hash_chunks_bound_step_one_and_change_nothing_after_it(ingested, monkeypatch):
    """Step 1 sorts at most HASH_CHUNK_DOCS documents at a time; the partition files are byte-identical."""
    rdir, shards, _ = ingested
    whole = survivors(rdir, shards, 3, batches=2)
    files = sorted((rdir.parent / "copy-3-True-2" / "exact_dedup" / "partitions").glob("*.parquet"))
    before = {f.name: f.read_bytes() for f in files}
    monkeypatch.setattr(exact_dedup, "HASH_CHUNK_DOCS", 7)
    assert survivors(rdir, shards, 3, batches=2) == whole
    out = rdir.parent / "copy-3-True-2"
    assert {f.name: f.read_bytes() for f in files} == before
    chunks = [read_json(p)["info"]["chunks"] for p in sorted((out / "exact_dedup" / "hashes").glob("*.done"))]
    assert chunks == [1, 3]       # shards of 6 + 9, then 7, 8, 7 documents: a chunk closes at a shard's end from 7


def test_file_opens_grow_with_partitions_times_batches_not_shards(ingested, monkeypatch):
    """Step 2 opens each batch's hash file once per partition, step 3 each partition file once per batch: P x B
    (was P x S; with S growing with the corpus, exact_partition grew with exponent 1.99 from 1 to 4 GB)."""
    import pyarrow.parquet as pq_mod

    rdir, shards, _ = ingested
    opened: list[str] = []
    real = pq_mod.read_table
    monkeypatch.setattr(pq_mod, "read_table", lambda path, *a, **kw: opened.append(str(path)) or real(path, *a, **kw))
    survivors(rdir, shards, 3, batches=2)
    hash_reads = [p for p in opened if "/hashes/" in p]
    partition_reads = [p for p in opened if "/partitions/" in p]
    assert len(shards) == 5 and len(hash_reads) == 3 * 2 and len(partition_reads) == 3 * 2


def test_mapped_steps_equal_the_single_call_and_are_idempotent(ingested, tmp_path):
    rdir, shards, _ = ingested
    out = tmp_path / "run"
    shutil.copytree(rdir / "ingest", out / "ingest")
    groups = [shards[:2], shards[2:]]
    for b in (1, 0):                                              # mapped tasks finish in any order
        exact_dedup.run_exact_hash_batch(out, b, 2, groups[b], 5)
    exact_dedup.run_exact_partition(out, 2, 0, 5)
    with pytest.raises(FileNotFoundError, match="partition 1 of 5 is missing"):
        exact_dedup.attach_drops(out, 0, 2, [{"shard": s} for s in groups[0]], 5)
    for p in (4, 2, 3, 1):
        exact_dedup.run_exact_partition(out, 2, p, 5)
    files = sorted(out.rglob("*.parquet"))
    before = {f: f.read_bytes() for f in files}
    for p in range(5):
        exact_dedup.run_exact_partition(out, 2, p, 5)
    assert {f: f.read_bytes() for f in files} == before
    kept = []
    for b in (1, 0):
        for spec in exact_dedup.attach_drops(out, b, 2, [{"shard": s} for s in groups[b]], 5):
            exact_dedup.run_exact_dedup_shard(out, spec["shard"], 5, spec["exact_drops"])
    for shard in shards:
        kept += pq.read_table(out / "exact_dedup" / f"{shard}.parquet", columns=["doc_id"]).column(0).to_pylist()
    assert kept == survivors(rdir, shards, 5)[1]


def test_a_changed_ingest_shard_is_refused_not_misdropped(ingested, tmp_path):
    """Step 3 drops rows by position; if the shard changed under it, the listed ids do not match and it says so."""
    rdir, shards, _ = ingested
    out = tmp_path / "run"
    shutil.copytree(rdir / "ingest", out / "ingest")
    exact_dedup.build_exact_index(out, shards, n_partitions=2)
    spec = exact_dedup.attach_drops(out, 0, 1, [{"shard": s} for s in shards], 2)[3]      # b-00000: 8 copies
    assert spec["shard"] == "b-00000" and len(spec["exact_drops"]["rows"]) == 8
    spec["exact_drops"]["ids"][0] = "b-elsewhere"
    with pytest.raises(ValueError, match=r"b-00000\.parquet: the exact-dedup partitions list rows"):
        exact_dedup.run_exact_dedup_shard(out, "b-00000", 2, spec["exact_drops"])


def test_disabled_keeps_everything(ingested):
    rdir, shards, rows = ingested
    info, kept = survivors(rdir, shards, 4, enabled=False)
    assert info["duplicates"] == 0 and len(kept) == len(rows)


def test_partition_count_follows_the_corpus_and_stays_bounded():
    count = exact_dedup.exact_partition_count
    assert count(50 << 20, 20_000) == 1                          # the demo corpus: one partition task
    four_gb = count(4 << 30, 0)                                  # 4 M documents assumed at 1 KB each
    assert four_gb == 3 and 4_194_304 / four_gb * exact_dedup.PARTITION_BYTES_PER_DOC <= 256 << 20
    assert count(4 << 30, 40_000_000) > four_gb                  # a document count above the estimate wins
    assert count(1 << 50, 10**12) == exact_dedup.MAX_PARTITIONS == 1024
    for step in (lambda: exact_dedup.run_exact_hash_batch(pathlib.Path("/nonexistent"), 0, 1, ["a-00000"], 0),
                 lambda: exact_dedup.run_exact_partition(pathlib.Path("/nonexistent"), 1, 0, 0),
                 lambda: exact_dedup.run_exact_dedup_shard(pathlib.Path("/nonexistent"), "a-00000", 0, {}),
                 lambda: exact_dedup.build_exact_index(pathlib.Path("/nonexistent"), [], n_partitions=2000)):
        with pytest.raises(ValueError, match="0 = auto"):            # the caller resolves 0 first
            step()


def test_partition_memory_per_document(tmp_path):
    """Step 2 holds numpy words and Arrow ids, not a Python object per document (the dict it replaced: ~190 B)."""
    import tracemalloc

    import numpy as np
    import pyarrow as pa

    from pipeline.io import write_marker, write_parquet

    n, shards = 200_000, ["web-00000", "web-00001"]
    rng = np.random.default_rng(0)
    words = rng.integers(0, 2**63, size=(n * 9 // 10, 2), dtype=np.uint64)
    words = np.concatenate([words, words[: n - len(words)]])     # 10 % duplicates
    for b, shard in enumerate(shards):                           # two batches of one shard each
        part = slice(b * n // 2, (b + 1) * n // 2)
        path = tmp_path / "exact_dedup" / "hashes" / f"batch-{b:05d}-of-00002.parquet"
        write_parquet(pa.table({"partition": pa.array([0] * (n // 2), pa.int32()), "h0": words[part, 0],
                                "h1": words[part, 1],
                                "doc_id": [f"web-{i:016x}" for i in range(part.start, part.stop)],
                                "ord": pa.array([0] * (n // 2), pa.int32()),
                                "row": pa.array(range(n // 2), pa.int32())}), path)
        write_marker(path, {"info": {"shards": [shard]}})
    tracemalloc.start()
    info = exact_dedup.run_exact_partition(tmp_path, 2, 0, 1)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert info["unique_texts"] == n * 9 // 10 and info["duplicates"] == n // 10
    # Python and numpy allocations only (Arrow's pool is not traced): measured 43 B per document
    assert peak / n < 80, peak / n
