"""The corpus chain without Airflow on real text: accounting, idempotent reruns, and an exact MindRecord round trip."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from conftest import tiny_config

from pipeline.config import load_config
from pipeline.io import read_json, read_parquet
from pipeline.tasks.corpus import collect_stats, run_all


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    import yaml

    tmp = tmp_path_factory.mktemp("chain")
    path = tiny_config(tmp)
    data = yaml.safe_load(path.read_text(encoding="utf-8"))   # plus a source that matches nothing yet
    data["sources"].append({"domain": "prose", "name": "prose-later", "allow_empty": True,
                            "paths": [str(tmp / "in" / "later" / "*.jsonl")]})
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    cfg = load_config(path)
    from pipeline.tasks import corpus

    plan_tasks = corpus.plan_tasks

    def plan_then_hide(*args, **kwargs):       # no later task may read the whole plan: take it away after planning
        handles = plan_tasks(*args, **kwargs)
        (Path(handles[0]["run_dir"]) / "plan.json").rename(Path(handles[0]["run_dir"]) / "plan.hidden")
        return handles

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(corpus, "plan_tasks", plan_then_hide)
        summary = run_all(cfg, "manual__2026-11-29T10:00:00+00:00", progress=False)
    return cfg, summary


def test_the_cli_runs_the_dags_batch_tasks(chain):
    """Same steps as the DAG: every per-shard stage as ``parallelism`` (2) batch tasks, each profiled."""
    from pipeline.profile import read_profiles
    from pipeline.tasks.steps import STEPS

    _, summary = chain
    prof = read_profiles(summary["run_dir"])
    for step in STEPS:
        if step.kind == "batch":
            assert [p["unit"] for p in prof[step.stage]] == ["task-0000-of-0002", "task-0001-of-0002"], step.stage
            assert sum(p["shards"] for p in prof[step.stage]) == 4
    assert len(prof["minhash_band"]) == 14 and len(prof["exact_partition"]) >= 1
    assert (Path(summary["run_dir"]) / "plan.hidden").exists()     # the run went on without plan.json


def test_run_dir_derives_from_run_id_without_colons(chain):
    _, summary = chain
    assert Path(summary["run_dir"]).name == "manual__2026-11-29T10_00_00_00_00"


def test_allowed_empty_source_is_listed_in_the_run_summary(chain):
    from pipeline.report.summary import render_summary

    cfg, summary = chain
    full = read_json(Path(summary["run_dir"]) / "corpus_summary.json")
    pattern = cfg.sources[2].paths[0]
    assert full["empty_sources"] == [{"source": "prose-later", "domain": "prose", "reader": "jsonl",
                                      "paths": [pattern], "detail": f"{pattern!r} (no such file or folder)"}]
    assert f"  empty source prose-later (prose, allow_empty): {pattern!r} (no such file or folder)" \
        in render_summary(cfg.data_root).splitlines()


def test_every_shard_accounts_for_every_document(chain):
    _, summary = chain
    files = sorted(Path(summary["run_dir"], "stats").rglob("*.json"))
    assert files
    for f in files:
        s = read_json(f)
        removed = sum(v["docs"] for v in s["removed"].values())
        assert s["in_docs"] == s["kept_docs"] + removed, f
    stats = collect_stats(summary["run_dir"])
    assert stats["ingest"]["prose"]["in_docs"] == 43
    assert stats["exact_dedup"]["prose"]["removed"] == {"exact_duplicate": 3}
    # each stage starts from what the previous one kept
    for dom in ("code", "prose"):
        assert stats["exact_dedup"][dom]["in_docs"] == stats["ingest"][dom]["kept_docs"]
        assert stats["quality"][dom]["in_docs"] == stats["exact_dedup"][dom]["kept_docs"]
    assert stats["quality"]["code"]["removed"] == {}       # prose rules skip the code domain


def test_mindrecord_round_trip_is_exact_and_decodes_to_corpus_text(chain):
    import mindspore.dataset as ds
    import sentencepiece as spm

    _, summary = chain
    manifest = read_json(summary["manifest"])
    files = [str(Path(summary["mindrecord_dir"]) / s["file"]) for s in manifest["shards"]]
    rows = [r for f in files for (r,) in ds.MindDataset(f, columns_list=["input_ids"], shuffle=False)
            .create_tuple_iterator(output_numpy=True, num_epochs=1)]
    assert len(rows) == manifest["samples"] and all(r.dtype == np.int32 and len(r) == 33 for r in rows)
    # Every file is its own packed stream, in manifest order: compare with the recorded digests bit for bit.
    stacked = np.stack(rows)
    offset, digests = 0, []
    for s in manifest["shards"]:
        digests.append(hashlib.sha256(stacked[offset:offset + s["samples"]].tobytes()).hexdigest())
        offset += s["samples"]
    assert digests == [s["rows_sha256"] for s in manifest["shards"]]
    assert hashlib.sha256("".join(digests).encode()).hexdigest() == manifest["rows_sha256"]
    sp = spm.SentencePieceProcessor(model_file=summary["tokenizer"])
    corpus_text = "\n".join(t for f in sorted(Path(summary["run_dir"], "quality").glob("*.parquet"))
                            for t in read_parquet(f, columns=["text"]).column("text").to_pylist())
    for row in stacked[:5]:
        pieces = [p for p in sp.decode(row.tolist()).split(sp.id_to_piece(2)) if len(p) > 20]
        assert pieces and all(p[2:-2] in corpus_text for p in pieces)


def test_rerun_is_idempotent_and_byte_identical(chain, tmp_path, monkeypatch):
    import pipeline.io
    import pipeline.sink.verify
    import pipeline.sink.writer
    import pipeline.tokenizer.run

    cfg, summary = chain
    first = {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
             for p in Path(summary["mindrecord_dir"]).iterdir()}
    hashed = []
    for mod in (pipeline.io, pipeline.sink.verify, pipeline.sink.writer, pipeline.tokenizer.run):
        monkeypatch.setattr(mod, "sha256_file", lambda path, *a, _real=mod.sha256_file: hashed.append(path) or
                            _real(path, *a))
    again = run_all(cfg, "manual__2026-11-29T10:00:00+00:00", progress=False)   # same run: skipped by markers
    assert again["tokens"] == summary["tokens"]
    assert hashed == []          # completion checks trust markers: a complete chain is not re-read to be skipped
    monkeypatch.undo()
    other = run_all(cfg, "second_run", progress=False)                          # fresh run, same seed
    second = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in Path(other["mindrecord_dir"]).iterdir()}
    assert first == second
    assert json.loads(Path(other["manifest"]).read_text())["tokens_per_domain"] == summary["tokens_per_domain"]
