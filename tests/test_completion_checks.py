"""Completion checks read markers, never data (#23): a fan-in task that checks every input reads kilobytes.

Exact dedup's partition step checks every batch's hash file, its dedup step every partition file, and a sink
writer every scatter part.  They used to sha256 each whole input (the tokenized corpus once per writer);
now a check is a stat and a small JSON read.  Measured with the kernel's count of bytes this process read
(``/proc/self/io`` ``rchar``) and by counting calls of the one hashing function.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import prose_records, stdlib_records, write_jsonl

from pipeline import io as pio
from pipeline.config import config_from_dict
from pipeline.dedup import exact
from pipeline.ingest.run import plan_ingest, run_ingest_shard

N_PARTITIONS = 3
N_BATCHES = 2


def rchar() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


class Counted:
    """Bytes read and files hashed while the block runs."""

    def __init__(self, monkeypatch):
        self.hashed: list[str] = []
        real = pio.sha256_file

        def counting(path, *a, **kw):
            self.hashed.append(str(path))
            return real(path, *a, **kw)

        monkeypatch.setattr(pio, "sha256_file", counting)

    def __enter__(self):
        self.start = rchar()
        return self

    def __exit__(self, *exc):
        self.read = rchar() - self.start


def marker_bytes(paths) -> int:
    return sum(pio.marker_path(p).stat().st_size for p in paths)


@pytest.fixture(scope="module")
def dedup_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("checks")
    prose, code = prose_records(30), stdlib_records(8)
    write_jsonl(tmp / "a.jsonl", prose + prose[:5])
    write_jsonl(tmp / "code.jsonl", code)
    cfg = config_from_dict({"data_root": str(tmp), "ingest": {"docs_per_shard": 6, "workers": 1},
                            "sources": [{"domain": "a", "paths": [str(tmp / "a.jsonl")]},
                                        {"domain": "code", "paths": [str(tmp / "code.jsonl")], "lang": "code"}]})
    rdir = tmp / "run"
    specs = plan_ingest(cfg)
    for s in specs:
        run_ingest_shard(cfg, rdir, s)
    shards = [s["shard"] for s in specs]
    exact.build_exact_index(rdir, shards, n_partitions=N_PARTITIONS, n_batches=N_BATCHES)
    exact.drop_exact_duplicates(rdir, shards, N_PARTITIONS, n_batches=N_BATCHES)
    return rdir, shards


def test_exact_partition_checks_every_batch_by_its_marker(dedup_run, monkeypatch):
    rdir, shards = dedup_run
    inputs = [exact._hash_path(rdir, b, N_BATCHES) for b in range(N_BATCHES)]
    out = exact._partition_path(rdir, 1, N_PARTITIONS)
    with Counted(monkeypatch) as c:
        info = exact.run_exact_partition(rdir, N_BATCHES, 1, N_PARTITIONS)
    assert info["partition"] == 1 and c.hashed == []
    data = sum(p.stat().st_size for p in inputs)
    # what the check reads is the markers (plus this very /proc read), not the inputs' data
    assert c.read <= marker_bytes([*inputs, out]) + 512 and c.read * 4 < data, (c.read, data)
    print(f"exact_partition rerun: {c.read} bytes read for {len(inputs)} inputs of {data} bytes")


def test_exact_dedup_checks_every_partition_by_its_marker(dedup_run, monkeypatch):
    """A complete batch's gather reads the partitions' markers and its shards' markers, no partition data."""
    rdir, shards = dedup_run
    inputs = [exact._partition_path(rdir, p, N_PARTITIONS) for p in range(N_PARTITIONS)]
    group = shards[:len(shards) // N_BATCHES]
    ingest = [rdir / "ingest" / f"{s}.parquet" for s in group]
    outs = [rdir / "exact_dedup" / f"{s}.parquet" for s in group]
    import pyarrow.parquet as pq

    opened: list[str] = []
    real = pq.read_table
    monkeypatch.setattr(pq, "read_table", lambda path, *a, **kw: opened.append(str(path)) or real(path, *a, **kw))
    with Counted(monkeypatch) as c:
        specs = exact.attach_drops(rdir, 0, N_BATCHES, [{"shard": s} for s in group], N_PARTITIONS)
        exact.run_exact_dedup_shard(rdir, group[0], N_PARTITIONS, specs[0]["exact_drops"])
    assert c.hashed == [] and opened == []
    (rdir / "exact_dedup" / f"{group[0]}.parquet.done").rename(rdir / "held.done")     # one shard not complete:
    try:                                                                              # the gather reads the data
        exact.attach_drops(rdir, 0, N_BATCHES, [{"shard": s} for s in group], N_PARTITIONS)
    finally:
        (rdir / "held.done").rename(rdir / "exact_dedup" / f"{group[0]}.parquet.done")
    assert sorted(opened) == [str(p) for p in inputs]
    assert c.read <= marker_bytes([*inputs, *inputs, *ingest, *ingest, *outs, *outs]) + 512, c.read


def test_a_changed_input_redoes_the_step_without_hashing_anything_twice(dedup_run, tmp_path, monkeypatch):
    """The config digest chains input digests: rewriting one hash file redoes every partition, nothing else."""
    rdir, shards = dedup_run
    run = tmp_path / "run"
    shutil.copytree(rdir, run)
    path = exact._hash_path(run, 0, N_BATCHES)
    before = pio.read_marker(exact._partition_path(run, 0, N_PARTITIONS))
    info = pio.read_marker(path)["info"]
    pio.write_marker(path, {"info": info}, config="other", sha256="0" * 64)   # same bytes, another recorded input
    with Counted(monkeypatch) as c:
        exact.run_exact_partition(run, N_BATCHES, 0, N_PARTITIONS)
    after = pio.read_marker(exact._partition_path(run, 0, N_PARTITIONS))
    assert after["config"] != before["config"] and after["sha256"] == before["sha256"]      # redone, same result
    assert c.hashed == []          # the rewritten output's digest was computed while writing it


def test_sink_writer_checks_every_scatter_part_by_its_marker(tmp_path, monkeypatch):
    pytest.importorskip("mindspore")
    from test_sink_rows import tokenized

    from pipeline.sink import scatter, shards

    rng = np.random.default_rng(1)
    docs = {f"web-{s:05d}": [rng.integers(3, 500, int(n), dtype=np.int32) for n in rng.integers(100, 4_000, 20)]
            for s in range(4)}
    names = tokenized(tmp_path, docs)
    for name in names:
        pio.write_parquet(__import__("pyarrow").table({"doc_id": [f"{name}/{i}" for i in range(20)],
                                                       "copies": [1] * 20}), tmp_path / "mixture" / f"{name}.parquet")
    parts = [scatter.part_name(t, 2) for t in range(2)]          # two scatter tasks of two shards each
    for t, part in enumerate(parts):
        scatter.run_scatter_part(tmp_path, part, names[2 * t:2 * t + 2], seed=3, n_files=2, domains=["web"])
    args = dict(seq_len=127, eos_id=2, bos_id=None, pad_id=0, remainder="drop", domain_field=True, boundaries=False,
                n_domains=1)
    first = shards.write_output_file(tmp_path, 1, 2, parts, **args)
    inputs = [scatter.part_path(tmp_path, p) for p in parts]
    out = shards.output_path(tmp_path, 1, 2)
    with Counted(monkeypatch) as c:
        again = shards.write_output_file(tmp_path, 1, 2, parts, **args)
    assert again == first and c.hashed == []
    data = sum(p.stat().st_size for p in inputs)
    assert c.read <= marker_bytes([*inputs, out]) + 512 and c.read * 20 < data, (c.read, data)
    print(f"sink_write rerun: {c.read} bytes read for {len(inputs)} scatter parts of {data} bytes")


def test_a_config_change_makes_ingest_and_tokenize_markers_stale(tmp_path):
    """Ingest and tokenize markers carry their config digest: a Clear after a config change redoes the unit."""
    from test_tokenizer import SMALL, write_quality_shards

    from pipeline.tokenizer import run as tok

    write_jsonl(tmp_path / "a.jsonl", prose_records(6))
    base = {"data_root": str(tmp_path), "ingest": {"workers": 1},
            "sources": [{"domain": "a", "paths": [str(tmp_path / "a.jsonl")]}]}
    spec = plan_ingest(config_from_dict(base))[0]
    out = tmp_path / "run" / "ingest" / f"{spec['shard']}.parquet"
    run_ingest_shard(config_from_dict(base), tmp_path / "run", spec)
    first = pio.read_marker(out)
    assert pio.completed(out, first["config"]) and first["bytes"] == out.stat().st_size
    run_ingest_shard(config_from_dict({**base, "ingest": {"workers": 2}}), tmp_path / "run", spec)
    assert pio.read_marker(out) == first                       # worker count changes no output: still complete
    changed = config_from_dict({**base, "ingest": {"workers": 1, "max_doc_chars": 500}})
    stats = run_ingest_shard(changed, tmp_path / "run", spec)
    assert pio.read_marker(out)["config"] != first["config"] and stats["kept_docs"] < first["stats"]["kept_docs"]

    rdir = tmp_path / "tok"
    shards = write_quality_shards(rdir, {"prose": prose_records(30)}, per_shard=30)
    tok.train_tokenizer(SMALL, rdir, shards, 1)
    tok.run_tokenize_shard(rdir, shards[0], workers=1)
    path = rdir / "tokenize" / f"{shards[0]}.parquet"
    before = pio.read_marker(path)
    tok.train_tokenizer(SMALL, rdir, shards, 2)        # another seed, the same sample: the same model bytes,
    tok.run_tokenize_shard(rdir, shards[0], workers=1)  # so the tokenized shard is still complete
    assert pio.read_marker(path) == before
    tok.train_tokenizer(dataclasses.replace(SMALL, vocab_size=SMALL.vocab_size + 50), rdir, shards, 2)
    tok.run_tokenize_shard(rdir, shards[0], workers=1)  # another model: tokenized again
    assert pio.read_marker(path)["config"] != before["config"]


def test_training_start_checks_the_published_manifest_digest_and_sizes_only(tmp_path, monkeypatch):
    """``pretrain`` compares the manifest with the digest publish recorded and every file's size: no file hashed."""
    import hashlib
    import json

    from pipeline.sink import verify
    from pipeline.tasks.corpus_choice import check_manifest_digest

    mr = tmp_path / "mindrecord"
    mr.mkdir()
    (mr / "a.mindrecord").write_bytes(b"x" * 100)
    (mr / "a.mindrecord.db").write_bytes(b"y")
    manifest = {"format": "mindrecord", "samples": 4, "shards": [{"file": "a.mindrecord", "bytes": 100,
                                                                  "sha256": "0" * 64, "db_sha256": "0" * 64}]}
    raw = json.dumps(manifest).encode()
    (mr / "manifest.json").write_bytes(raw)
    summary = {"mindrecord_dir": str(mr), "manifest_sha256": hashlib.sha256(raw).hexdigest()}
    with Counted(monkeypatch) as c:
        monkeypatch.setattr(verify, "sha256_file", pio.sha256_file)
        check_manifest_digest(summary)
        assert verify.verify(mr, full_read=False, hashes=False, num_shards=2)["ranks"]["rows_per_rank"] == 2
    assert c.hashed == []           # the recorded sha256 values are wrong on purpose: never looked at
    with pytest.raises(verify.ShardError, match="differs from the published corpus"):
        check_manifest_digest({**summary, "manifest_sha256": "1" * 64})
    with pytest.raises(verify.ShardError, match="4 rows cannot be split over 8"):
        verify.verify(mr, full_read=False, hashes=False, num_shards=8)
    (mr / "a.mindrecord").write_bytes(b"x" * 99)
    with pytest.raises(verify.ShardError, match="99 bytes, manifest says 100"):
        verify.verify(mr, full_read=False, hashes=False)


def test_quality_markers_chain_their_inputs_recorded_digest(dedup_run, tmp_path, monkeypatch):
    """A quality shard is complete for its settings *and* its input: an unchanged rerun reads only markers, a
    rewritten exact-dedup shard (another recorded sha256) redoes it."""
    from pipeline.quality.run import run_quality_shard

    rdir, shards = dedup_run
    run = tmp_path / "run"
    shutil.copytree(rdir, run)
    q = config_from_dict({}).quality
    first = run_quality_shard(q, run, shards[0])
    out = run / "quality" / f"{shards[0]}.parquet"
    before = pio.read_marker(out)
    with Counted(monkeypatch) as c:
        assert run_quality_shard(q, run, shards[0]) == first
    src = run / "exact_dedup" / f"{shards[0]}.parquet"
    assert c.hashed == [] and c.read <= marker_bytes([src, out]) + 512, c.read
    kept = {k: v for k, v in pio.read_marker(src).items() if k not in ("output", "bytes", "sha256")}
    pio.write_marker(src, kept, sha256="0" * 64)                           # same bytes, another recorded input
    run_quality_shard(q, run, shards[0])
    after = pio.read_marker(out)
    assert after["config"] != before["config"] and after["sha256"] == before["sha256"]   # redone, same result
    assert before["sha256"] == pio.sha256_file(out)                       # the digest recorded while writing
