"""The pretrain DAG gains its ``export`` task (after ``report``, publishing the ``mindloom_model`` Asset) only when
``export.formats`` is set; the task's work is ``pipeline.tasks.export.export_run`` (tests/test_export_hf.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import tiny_config

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("formats", [[], ["mindformers", "hf"]])
def test_export_task_exists_only_when_formats_are_configured(tmp_path, monkeypatch, airflow_db, formats):
    from airflow.dag_processing.dagbag import DagBag

    path = tiny_config(tmp_path)
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    path.write_text(yaml.safe_dump({**data, "export": {"formats": formats}}), encoding="utf-8")
    monkeypatch.setenv("MINDLOOM_CONFIG", str(path))
    bag = DagBag(dag_folder=str(REPO / "dags" / "pretrain.py"))
    assert bag.import_errors == {}, bag.import_errors
    dag = bag.get_dag("pretrain")
    assert ("export" in dag.task_ids) == bool(formats)
    if formats:
        task = dag.get_task("export")
        assert task.upstream_task_ids == {"report"}
        assert [(a.name, a.uri) for a in task.outlets] == [
            ("mindloom_model", f"file://{tmp_path / 'data' / 'models' / 'LATEST.json'}")]
