"""Both DAGs end to end through Airflow (``dag.test``), as a UI trigger runs them: no logical date."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.profile import read_profiles

pytestmark = pytest.mark.slow


def test_dagbag_imports_cleanly(dagbag):
    assert dagbag.import_errors == {}, dagbag.import_errors
    assert {"corpus_build", "pretrain"} <= set(dagbag.dag_ids)


def test_bad_param_is_refused(dagbag):
    from airflow.sdk import ParamsDict
    from airflow.sdk.exceptions import ParamValidationError

    with pytest.raises(ParamValidationError):
        ParamsDict(dagbag.get_dag("pretrain").params).update({"train_mode": "turbo"})
    with pytest.raises(ParamValidationError):
        ParamsDict(dagbag.get_dag("corpus_build").params).update({"seq_len": 2})


def test_corpus_then_pretrain_through_airflow(dagbag, airflow_db, tiny_config_path):
    from airflow.utils.state import DagRunState

    corpus_run = dagbag.get_dag("corpus_build").test(logical_date=None, run_conf={"run_name": "e2e"})
    assert corpus_run.state == DagRunState.SUCCESS
    summary = corpus_run.get_task_instance("publish").xcom_pull(task_ids="publish")
    assert summary["samples"] > 0 and set(summary["tokens_per_domain"]) == {"code", "prose"}
    stats = json.loads((Path(summary["run_dir"]) / "corpus_summary.json").read_text())["stats"]
    assert stats["exact_dedup"]["prose"]["removed"] == {"exact_duplicate": 3}
    plan = json.loads((Path(summary["run_dir"]) / "plan.json").read_text())
    for task_id in ("ingest.ingest_shard", "clean.exact_dedup", "filter.quality_filter", "tokenize.encode"):
        tis = [ti for ti in corpus_run.get_task_instances() if ti.task_id == task_id]
        assert len(tis) == 2 < len(plan), (task_id, len(tis), len(plan))   # parallelism 2, not one per shard
    # the sink is mapped too: scatter per shard batch, one writer task per batch of output files
    assert len([ti for ti in corpus_run.get_task_instances() if ti.task_id == "sink.scatter"]) == 2
    files = json.loads((Path(summary["run_dir"]) / "mindrecord" / "manifest.json").read_text())["shards"]
    writers = [ti for ti in corpus_run.get_task_instances() if ti.task_id == "sink.write_files"]
    assert len(writers) == min(2, len(files)) and summary["shards"] == len(files)
    # every task reported its cost under profile/: wall, CPU-seconds and the peak RSS of its process tree
    prof = read_profiles(summary["run_dir"])
    assert {"ingest", "exact_hash", "minhash_signatures", "quality", "tokenize", "sink_scatter", "sink_write",
            "sink_finalize"} <= set(prof)
    assert len(prof["exact_hash"]) == len(prof["minhash_signatures"]) == 2     # in the ingest / exact dedup tasks
    assert all(p["cpu_s"] >= 0 and p["peak_rss_mb"] > 0 for p in prof["sink_write"]) and len(prof["ingest"]) == 2

    train_run = dagbag.get_dag("pretrain").test(logical_date=None, run_conf={"fail_at_step": 8})
    assert train_run.state == DagRunState.SUCCESS
    ti = train_run.get_task_instance("train_main")
    assert ti.try_number == 2                       # the first try crashed after step 8's checkpoint
    result = ti.xcom_pull(task_ids="train_main")
    assert result["state"] == "SUCCEEDED" and result["steps"] == 12
    assert result["resumed_from"] == 8              # the retry resumed from the checkpoint
    report = train_run.get_task_instance("report").xcom_pull(task_ids="report")
    assert report["stages"]["main"]["final_loss"] < report["stages"]["main"]["first_loss"]


def test_dag_files_parse_quickly(dagbag, tmp_path):
    """Parse time per DAG file, recorded in a file and bounded loosely (the scheduler re-parses them all the time)."""
    import time

    from airflow.dag_processing.dagbag import DagBag

    times = {}
    for path in sorted(Path(dagbag.dag_folder).glob("*.py")):
        start = time.perf_counter()
        bag = DagBag(dag_folder=str(path))
        times[path.name] = round(time.perf_counter() - start, 3)
        assert bag.import_errors == {}, bag.import_errors
    (tmp_path / "dag_parse_times.json").write_text(json.dumps(times))
    print("DAG parse times (s):", times)
    assert all(t < 10 for t in times.values()), times


def test_pretrain_has_a_task_and_an_evaluation_per_stage(dagbag):
    from operators.params import config_path
    from pipeline.config import load_config
    from pipeline.tasks.pretrain import repack_stages, stage_names

    cfg = load_config(config_path())
    stages = stage_names(cfg)
    ids = set(dagbag.get_dag("pretrain").task_ids)
    assert {f"train_{s}" for s in stages} | {f"eval_{s}" for s in stages} | {f"repack_{s}" for s in
                                                                             repack_stages(cfg)} \
        | {"resolve_corpus", "report"} == ids


def test_readme_dag_table_describes_pretrain_as_wired():
    """The DAG table (docs/operations.md) names every task the default config gives pretrain."""
    from pipeline.config import DEFAULT_CONFIG, load_config
    from pipeline.tasks.pretrain import repack_stages, stage_names

    readme = (Path(__file__).resolve().parents[1] / "docs" / "operations.md").read_text(encoding="utf-8")
    row = next(line for line in readme.splitlines() if line.startswith("| `pretrain` |"))
    cfg = load_config(DEFAULT_CONFIG)
    stages = stage_names(cfg)
    assert len(stages) > 1 and repack_stages(cfg)
    for task_id in ["resolve_corpus", "report"] + [f"{k}_{s}" for s in stages for k in ("train", "eval")] + \
            [f"repack_{s}" for s in repack_stages(cfg)]:
        assert task_id in row, task_id


def test_an_incremental_refresh_with_nothing_new_ends_skipped_without_an_asset_event(dagbag, airflow_db,
                                                                                     tiny_config_path):
    """#53: the same sources again with the dedup index on: every document duplicates a release already shipped
    (this test's first run, or an earlier test's), so the tokenizer task skips with one line why, every task after
    it skips, publish records no corpus Asset event (so no pretrain run is scheduled) and the run ends successful."""
    from airflow.models.asset import AssetEvent
    from airflow.utils.session import create_session
    from airflow.utils.state import DagRunState, TaskInstanceState

    def events() -> int:
        with create_session() as s:
            return s.query(AssetEvent).count()

    dag = dagbag.get_dag("corpus_build")
    dag.test(logical_date=None, run_conf={"run_name": "inc1", "incremental_dedup": True})
    before = events()
    run = dag.test(logical_date=None, run_conf={"run_name": "inc2", "incremental_dedup": True})
    assert run.state == DagRunState.SUCCESS
    states = {ti.task_id: ti.state for ti in run.get_task_instances()}
    assert states["tokenize.train_tokenizer"] == TaskInstanceState.SKIPPED
    assert states["publish"] == TaskInstanceState.SKIPPED and states["sink.plan_mixture"] == TaskInstanceState.SKIPPED
    assert states["filter.quality_filter"] == TaskInstanceState.SUCCESS
    assert events() == before                                  # nothing published: pretrain is not scheduled
    from pipeline.config import load_config
    from pipeline.io import run_dir
    from pipeline.tasks.corpus import collect_stats

    stats = collect_stats(run_dir(load_config(tiny_config_path).data_root, run.run_id))
    assert sum(d["kept_docs"] for d in stats["quality"].values()) == 0
    assert sum(d["removed"].get("near_duplicate_of_previous_release", 0) for d in stats["minhash"].values()) > 0
