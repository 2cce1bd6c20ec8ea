"""#53 through Airflow (``dag.test``): two incremental refreshes, the model trained on the first continued on the
second, and the held-out loss on the first release reported before and after.

``corpus_refresh`` runs twice on the test's own config (``minhash.use_index``, ``approval: never``: the approval
itself is tested over REST in ``test_airflow_live.py``); between them the code source gains 12 new documents.
``pretrain`` trains release 1 from scratch, then release 2 with ``train.from_release: weights`` and
``train.replay_share``: it starts from release 1's final checkpoint and mixes in rows of release 1.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from conftest import REPO, stdlib_records, tiny_config, write_jsonl

pytestmark = pytest.mark.slow


def test_two_incremental_refreshes_and_a_continued_model_through_airflow(own_assets, tmp_path, monkeypatch):
    from airflow.dag_processing.dagbag import DagBag
    from airflow.utils.state import DagRunState

    from pipeline.io import sha256_file
    from pipeline.tasks.pretrain import stage_dir
    from pipeline.train.checkpoint.commit import commit_file

    path = tiny_config(tmp_path, approval="never", minhash={"use_index": True},
                       train={"steps": 8, "from_release": "weights", "replay_share": 0.25, "eval_tokens": 2048})
    monkeypatch.setenv("MINDLOOM_CONFIG", str(path))
    bag = DagBag(dag_folder=str(REPO / "dags"))
    assert bag.import_errors == {}, bag.import_errors
    refresh, pretrain = bag.get_dag("corpus_refresh"), bag.get_dag("pretrain")
    data = Path(yaml.safe_load(path.read_text())["data_root"])

    def corpus_run(name: str):
        run = refresh.test(logical_date=None, run_conf={"run_name": name})
        assert run.state == DagRunState.SUCCESS
        summary = run.get_task_instance("publish").xcom_pull(task_ids="publish")
        return run, json.loads((Path(summary["run_dir"]) / "corpus_summary.json").read_text())

    def train_on(run_id: str) -> dict:
        run = pretrain.test(logical_date=None, run_conf={"corpus_run": run_id})
        assert run.state == DagRunState.SUCCESS
        report = run.get_task_instance("report").xcom_pull(task_ids="report")
        return run, run.get_task_instance("train_main").xcom_pull(task_ids="train_main"), report

    first, s1 = corpus_run("weekly-1")
    assert s1["extends_release"] is None
    t1, before, report1 = train_on(first.run_id)
    assert before["init_from"] is None and "replay" not in before["data"]      # release 1 extends nothing

    write_jsonl(tmp_path / "in" / "code.jsonl", stdlib_records(24))           # 12 old documents, 12 new ones
    second, s2 = corpus_run("weekly-2")
    r1, r2 = Path(s1["run_dir"]), Path(s2["run_dir"])
    assert s2["extends_release"]["name"] == r1.name
    tokenizer = sha256_file(r1 / "tokenizer" / "spm.model")
    assert sha256_file(r2 / "tokenizer" / "spm.model") == tokenizer
    for summary in (s1, s2):
        assert json.loads((Path(summary["mindrecord_dir"]) / "manifest.json").read_text())["tokenizer_sha256"] \
            == tokenizer
    stats = json.loads((r2 / "corpus_summary.json").read_text())["stats"]
    assert stats["minhash"]["code"]["removed"]["near_duplicate_of_previous_release"] == 12

    t2, after, report2 = train_on(second.run_id)
    assert after["init_from"] == commit_file(str(stage_dir(data, t1.run_id, "main")), 8)   # release 1's final step
    assert after["first_loss"] < before["first_loss"] - 0.1                # it continued the trained model
    own = json.loads((Path(s2["mindrecord_dir"]) / "manifest.json").read_text())["samples"]
    r1_rows = {f["file"]: f["samples"] for f in
               json.loads((Path(s1["mindrecord_dir"]) / "manifest.json").read_text())["shards"]}
    replay = after["data"]["replay"]      # whole files of release 1: here one of its two (0.25 asked)
    assert replay["own_rows"] == own and replay["files"] == 1 and replay["rows"] in r1_rows.values()
    assert replay["share"] == round(replay["rows"] / (own + replay["rows"]), 4)
    # release 1's held-out sets: the same rows scored by release 1's run (before) and release 2's (after), both in
    # the run reports
    reported = [report["stages"]["main"]["eval"]["per_domain"] for report in (report1, report2)]
    assert reported == [before["eval"]["per_domain"], after["eval"]["per_domain"]]
    old = reported[0]
    assert set(old) == {"code", "prose"} and set(reported[1]) == {"code"} | {f"{d}@{r1.name}" for d in old}
    for d in old:
        assert reported[1][f"{d}@{r1.name}"]["tokens"] == old[d]["tokens"] > 0
        print(f"\nheld-out {d} of release 1: {old[d]['loss']:.4f} before, "
              f"{reported[1][d + '@' + r1.name]['loss']:.4f} after release 2")
