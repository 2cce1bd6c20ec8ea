"""One orchestration path: the declared chain (pipeline.tasks.steps) is what the DAG wires and what the CLI runs;
fan-in tasks read a compact shard index, never the whole plan."""

from __future__ import annotations

import dataclasses
import json

import pytest

from pipeline.tasks import batches
from pipeline.tasks.steps import STEPS, Step, check_steps


def test_the_declared_chain_runs_top_to_bottom():
    check_steps()
    assert [s.task_id for s in STEPS][:3] == ["plan", "ingest.ingest_shard", "clean.partitions"]
    assert STEPS[-1].task_id == "publish" and STEPS[-1].outlet
    batch = [stage for s in STEPS if s.kind == "batch" for stage in (s.stage, *s.then)]
    assert batch == ["ingest", "exact_hash", "exact_dedup", "minhash_signatures", "minhash_removal", "quality",
                     "release_part", "tokenize", "sink_scatter"]
    # stages with no barrier between them share a mapped task: 6 mapped batch tasks per run, not 9
    assert [s.task_id for s in STEPS if s.kind == "batch"] == [
        "ingest.ingest_shard", "clean.exact_dedup", "near_dedup.removal", "filter.quality_filter", "tokenize.encode",
        "sink.scatter"]


def test_a_batch_step_runs_its_later_stages_in_the_same_task(monkeypatch):
    from pipeline.tasks import corpus

    calls = []

    def fake(stage, batch):
        calls.append((stage, batch["task"]))
        return {"shards": 1, "wall_s": 0.5, "cpu_s": 0.25, "peak_rss_mb": 9.0, "input_bytes": 3}

    monkeypatch.setattr(corpus, "run_stage_batch", fake)
    out = corpus.run_step("clean.exact_dedup", {"run_dir": "/r", "task": 3, "of": 4, "first": 6, "last": 8})
    assert calls == [("exact_dedup", 3), ("minhash_signatures", 3)]
    assert out["then"] == {"minhash_signatures": {"wall_s": 0.5, "cpu_s": 0.25, "peak_rss_mb": 9.0}}


@pytest.mark.parametrize("bad,message", [
    (lambda s: (s[0], s[2], s[1], *s[3:]), "not an earlier step"),
    (lambda s: (*s, s[-1]), "listed twice"),
    (lambda s: (s[1], s[0], *s[2:]), "plan step must come first"),
    (lambda s: (*s[:3], dataclasses.replace(s[3], over="ingest.ingest_shard"), *s[4:]), "not a fan step"),
    (lambda s: (*s, Step("x", None, "loop")), "kind 'loop'"),
])
def test_a_chain_that_cannot_run_in_order_is_refused(bad, message):
    with pytest.raises(ValueError, match=message):
        check_steps(bad(STEPS))


def test_every_step_calls_an_existing_task_function():
    from pipeline.tasks import corpus

    for s in STEPS:
        assert callable(getattr(corpus, s.call)), s
        if s.kind == "batch":
            for stage in (s.stage, *s.then):
                assert stage in corpus.SHARD_STAGES or stage in corpus.BATCH_STAGES, s


def test_shard_index_round_trips_and_stays_small(tmp_path):
    names = ([f"web-{k:05d}" for k in range(5000)] + [f"code-{k:05d}" for k in range(3)] + ["odd"]
             + [f"web-{k:05d}" for k in range(5000, 5002)] + ["zh-7", "zh-8", "zh-010", "zh-011"])
    batches.write_index(tmp_path, names)
    assert batches.shard_names(tmp_path) == names
    index = json.loads((tmp_path / "plan" / "shards.json").read_text())
    assert index["shards"] == len(names) and len(index["runs"]) == 6
    assert len(json.dumps(index)) < 300                           # 5,014 shards, six runs


def test_a_batch_without_its_plan_file_fails_with_its_name(tmp_path):
    handle = batches.plan_batches(tmp_path, 4, 2)[1]
    with pytest.raises(FileNotFoundError, match=r"batch-00001-of-00002\.json: the batch plan file is missing"):
        batches.batch_specs(handle)


@pytest.mark.slow
def test_the_dag_has_one_task_per_step_wired_as_declared(dagbag):
    dag = dagbag.get_dag("corpus_build")
    publish = next(s for s in STEPS if s.outlet)
    ids = [s.task_id for s in STEPS]
    with_approval = ids + ["approve"]  # made right after publish, wired before it
    assert [t.task_id for t in dag.tasks] == with_approval
    for s in STEPS:
        task = dag.get_task(s.task_id)
        data = [] if s.kind == "plan" else [s.over if s.kind == "map" else "plan"]
        assert task.upstream_task_ids == {*s.after, *data, *(["approve"] if s.outlet else [])}, s.task_id
        assert (type(task).__name__ == "DecoratedMappedOperator") == s.mapped, s.task_id
        assert task.outlets if s.outlet else not task.outlets
    assert dag.get_task("approve").upstream_task_ids == set(publish.after)  # a person approves what the chain made
    assert type(dag.get_task("approve")).__name__ == "CorpusApproval"
    assert [t.task_id for t in dagbag.get_dag("corpus_refresh").tasks] == with_approval


@pytest.mark.parametrize("incremental", [True, False])
def test_a_refresh_with_nothing_new_is_a_skip_and_a_build_an_error(tmp_path, monkeypatch, capsys, incremental):
    """#53: a step that finds too little to fill the training files (or the tokenizer task nothing kept) ends an
    incremental refresh as a skip, one line why; the CLI prints it and exits 0.  Without the index it stays an
    error naming the setting."""
    from conftest import tiny_config

    from pipeline import cli
    from pipeline.config import load_config
    from pipeline.io import write_json
    from pipeline.sink.shards import RowDealError
    from pipeline.tasks import corpus
    from pipeline.tasks.run_state import NothingToShip

    path = tiny_config(tmp_path, minhash={"use_index": incremental})
    rdir = tmp_path / "run"
    write_json(rdir / "config.json", load_config(path).to_dict())

    def too_small(_specs):
        raise RowDealError("pack.shard_num: the corpus packs into 1 rows of 33 tokens, fewer than its 2 output files")
    monkeypatch.setattr(corpus, "plan_mixture", too_small)
    with pytest.raises(NothingToShip if incremental else RowDealError, match="packs into 1 rows") as got:
        corpus.run_step("sink.plan_mixture", [{"run_dir": str(rdir), "task": 0, "of": 1, "first": 0, "last": 0}])
    if incremental:
        assert str(got.value).startswith("incremental refresh run: too little new to fill the training files")

    monkeypatch.setattr(corpus, "run_all", lambda cfg, run_id: (_ for _ in ()).throw(NothingToShip("nothing new")))
    assert cli.main(["corpus", "--config", str(path)]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == "mindloom: skipped: nothing new"
