"""One input of any size → as many output shards as it needs, each of at most ``ingest.shard_bytes`` (plus one
record), with its own accounting; later stages run over them; the task's memory stays under its stated model."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import pathlib
import random
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
from conftest import REPO, prose_records

from pipeline.config import config_from_dict
from pipeline.ingest import run as ingest_run
from pipeline.ingest.output import output_shards, output_specs
from pipeline.ingest.run import plan_ingest, run_ingest_shard
from pipeline.io import read_json
from pipeline.tasks import batches


def varied_jsonl(n_bytes: int, seed: int = 7) -> bytes:
    """Lines of real English words in a seeded random order, 200-3000 words each, until ``n_bytes``."""
    words = " ".join(r["text"] for r in prose_records(40)).split()
    rng = random.Random(seed)
    out, size, i = [], 0, 0
    while size < n_bytes:
        line = json.dumps({"id": i, "text": " ".join(rng.choices(words, k=rng.randint(200, 3000)))}).encode() + b"\n"
        out.append(line)
        size += len(line)
        i += 1
    return b"".join(out)


def expected_parts(lines: list[bytes], limit: int) -> list[list[int]]:
    """The rule: a record starts a new output shard when the current one already holds ``limit`` input bytes."""
    parts: list[list[int]] = [[]]
    held = 0
    for i, line in enumerate(lines):
        if held >= limit:
            parts.append([])
            held = 0
        parts[-1].append(i)
        held += len(line)
    return parts


def ingest(tmp: pathlib.Path, path: pathlib.Path, **ingest) -> tuple[pathlib.Path, list[dict], list[dict]]:
    cfg = config_from_dict({"data_root": str(tmp), "ingest": {"workers": 1, **ingest},
                            "sources": [{"domain": "d", "paths": [str(path)], "lang": "en"}]})
    rdir = tmp / "run"
    specs = [{**s, "run_dir": str(rdir)} for s in plan_ingest(cfg)]
    return rdir, specs, [run_ingest_shard(cfg, rdir, s) for s in specs]


def test_compressed_jsonl_larger_than_shard_bytes_gives_several_output_shards(tmp_path):
    data = varied_jsonl(700_000) + b"{broken\n"
    lines = data.splitlines(keepends=True)
    path = tmp_path / "in" / "big.jsonl.gz"
    path.parent.mkdir()
    path.write_bytes(gzip.compress(data, mtime=0))
    limit = 150_000
    assert path.stat().st_size > limit           # larger than shard_bytes compressed, too
    rdir, specs, stats = ingest(tmp_path / "a", path, shard_bytes=limit)
    (spec,) = specs                               # one plan shard: a gzip stream cannot be entered mid-file
    assert spec["units"][0]["whole_file"].startswith("one gz stream, not splittable")
    want = expected_parts(lines, limit)
    parts = output_shards(rdir, spec["shard"])
    assert len(want) == 5 and parts == ["d-00000"] + [f"d-00000_{k:05d}" for k in range(1, len(want))]
    # the domain, as stages read it
    assert stats[0]["parts"] == parts and {p.rsplit("-", 1)[0] for p in parts} == {"d"}
    rows = []
    for name, idx in zip(parts, want, strict=True):
        st = read_json(rdir / "stats" / "ingest" / f"{name}.json")
        in_bytes = sum(len(lines[i]) for i in idx)
        assert (st["shard"], st["in_docs"], st["in_bytes"]) == (name, len(idx), in_bytes)
        assert st["in_bytes"] - len(lines[idx[-1]]) < limit <= st["in_bytes"] or name == parts[-1]
        assert st["in_docs"] == st["kept_docs"] + sum(v["docs"] for v in st["removed"].values())
        assert st["in_bytes"] == st["kept_bytes"] + sum(v["bytes"] for v in st["removed"].values())
        assert read_json(rdir / "ingest" / f"{name}.parquet.done")["stats"] == st
        rows += pq.read_table(rdir / "ingest" / f"{name}.parquet").to_pylist()
    last = read_json(rdir / "stats" / "ingest" / f"{parts[-1]}.json")
    assert last["removed"] == {"malformed_json": {"docs": 1, "bytes": 8}}
    assert pq.read_table(rdir / "rejects" / "ingest" / f"{parts[-1]}.parquet").column("where").to_pylist() == [
        f"line {len(lines)}"]
    # the same documents, in the same order, as one output shard (the default shard_bytes)
    rdir1, _, stats1 = ingest(tmp_path / "b", path)
    assert stats1[0]["parts"] == ["d-00000"]
    one = pq.read_table(rdir1 / "ingest" / "d-00000.parquet").to_pylist()
    assert len(one) == len(lines) - 1 and rows == one
    total = {k: v for k, v in stats[0].items() if k not in ("parts", "shard")}
    assert total == {k: v for k, v in stats1[0].items() if k not in ("parts", "shard")}
    # a rerun skips (same stats), a fresh run is byte-identical, a cut with fewer parts removes the stale ones
    digest = {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted((rdir / "ingest").iterdir())}
    assert run_ingest_shard(config_from_dict({"data_root": str(tmp_path / "a"), "ingest": {"shard_bytes": limit},
                                              "sources": [{"domain": "d", "paths": [str(path)]}]}),
                            rdir, spec) == stats[0]
    rdir2, _, _ = ingest(tmp_path / "c", path, shard_bytes=limit)
    assert {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted((rdir2 / "ingest").iterdir())} == digest
    (rdir / "ingest" / "d-00000.parquet.done").unlink()
    cfg = config_from_dict({"data_root": str(tmp_path / "a"), "ingest": {"workers": 1, "shard_bytes": 300_000},
                            "sources": [{"domain": "d", "paths": [str(path)], "lang": "en"}]})
    assert run_ingest_shard(cfg, rdir, spec)["parts"] == ["d-00000", "d-00000_00001", "d-00000_00002"]
    assert sorted(f.name for f in (rdir / "stats" / "ingest").iterdir()) == [
        "d-00000.json", "d-00000_00001.json", "d-00000_00002.json"]
    assert not list((rdir / "ingest").glob("d-00000_0000[34]*"))


def test_later_stages_run_over_the_output_shards_in_plan_batches(tmp_path):
    """A batch handle covers plan shards; the stages after ingest run over their output shards."""
    src = tmp_path / "in"
    src.mkdir()
    data = varied_jsonl(200_000, seed=1)
    (src / "a.jsonl.gz").write_bytes(gzip.compress(data, mtime=0))
    (src / "b.jsonl").write_bytes(varied_jsonl(20_000, seed=2))
    rdir, specs, stats = ingest(tmp_path, src, shard_bytes=50_000)
    n = len(expected_parts(data.splitlines(keepends=True), 50_000))
    assert n == 4 and [len(s["parts"]) for s in stats] == [n, 1]
    (rdir / "plan.json").write_text(json.dumps(specs))
    handles = batches.plan_batches(rdir, len(specs), parallelism=4)
    batches.split_plan(specs, handles)                  # what the plan step writes: batch files, shard index
    batches.write_index(rdir, [s["shard"] for s in specs])
    handle = handles[0]
    seen: list[str] = []
    out = batches.run_batch(lambda spec: seen.append(spec["shard"]) or {}, handle, expand=output_specs)
    assert seen == stats[0]["parts"] and out["shards"] == n
    from pipeline.tasks.run_state import run_of as _run_of

    assert _run_of([handle])[1] == stats[0]["parts"] + stats[1]["parts"]


_MEASURE = """
import gzip, json, pathlib, re, sys
from pipeline.config import config_from_dict
from pipeline.ingest.run import plan_ingest, run_ingest_shard

def status(key):
    return int(re.search(key + r":\\s+(\\d+) kB", open("/proc/self/status").read()).group(1)) << 10

big, tmp, limit = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), int(sys.argv[3])

def go(path, name):
    cfg = config_from_dict({"data_root": str(tmp / name), "ingest": {"workers": 1, "shard_bytes": limit},
                            "sources": [{"domain": "d", "paths": [str(path)], "lang": "en"}]})
    return [run_ingest_shard(cfg, tmp / name / "run", s) for s in plan_ingest(cfg)]

small = tmp / "warm.jsonl.gz"           # load every library and fill the allocator's pools first
with gzip.open(big) as fh:
    small.write_bytes(gzip.compress(b"".join(fh.readline() for _ in range(300))))
go(small, "warm")
open("/proc/self/clear_refs", "w").write("5")     # reset the peak (VmHWM) to the current RSS
base = status("VmRSS")
stats = go(big, "big")
print(json.dumps({"parts": stats[0]["parts"], "growth": status("VmHWM") - base}))
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux /proc to reset the peak RSS")
def test_peak_memory_of_a_big_compressed_jsonl_task_stays_under_the_model(tmp_path):
    data = varied_jsonl(48_000_000)
    largest = max(map(len, data.splitlines()))
    path = tmp_path / "big.jsonl.gz"
    path.write_bytes(gzip.compress(data, compresslevel=1, mtime=0))
    del data
    limit = 8 << 20
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", _MEASURE, str(path), str(tmp_path), str(limit)], env=env,
                         capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    model = ingest_run.memory_model(1, largest)
    assert len(res["parts"]) == 6                 # 48 MB of input in 8 MiB output shards
    assert res["growth"] < model, f"peak grew by {res['growth'] / 2**20:.1f} MiB > model {model / 2**20:.1f} MiB"
    assert model < 48_000_000 * 3 // 4            # the model is well below the input: holding it would fail


def _chain(tmp: pathlib.Path, shard_bytes: int) -> tuple[dict, dict]:
    import yaml
    from conftest import tiny_config

    from pipeline.config import load_config
    from pipeline.tasks.corpus import collect_stats, run_all

    path = tiny_config(tmp)
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    plain = tmp / "in" / "prose.jsonl"
    (tmp / "in" / "prose.jsonl.gz").write_bytes(gzip.compress(plain.read_bytes(), mtime=0))
    plain.unlink()
    data["sources"][1]["paths"] = [str(tmp / "in" / "prose.jsonl.gz")]
    data["ingest"]["shard_bytes"] = shard_bytes
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    summary = run_all(load_config(path), "r1", progress=False)
    return summary, collect_stats(summary["run_dir"])


@pytest.mark.slow
def test_the_chain_over_output_shards_gives_what_one_shard_per_file_gives(tmp_path):
    """The CLI chain (the DAG's task functions) with the .jsonl.gz cut into 3 output shards: every stage runs over
    them, and the kept documents, tokens and samples are those of the run with one shard per file."""
    cut, cut_stats = _chain(tmp_path / "cut", 40_000)
    one, one_stats = _chain(tmp_path / "one", 64 << 20)
    names = sorted(f.name for f in (pathlib.Path(cut["run_dir"]) / "tokenize").glob("prose*.parquet"))
    assert names == ["prose-00000.parquet", "prose-00000_00001.parquet", "prose-00000_00002.parquet"]
    assert (cut["tokens"], cut["samples"]) == (one["tokens"], one["samples"])
    for stage in ("ingest", "exact_dedup", "quality", "tokenize"):
        assert {d: (v["in_docs"], v["kept_docs"]) for d, v in cut_stats[stage].items()} == {
            d: (v["in_docs"], v["kept_docs"]) for d, v in one_stats[stage].items()}, stage
