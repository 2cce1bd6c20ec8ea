"""The ``airflow:`` config section: checked like every field, left out of the digest, and read by the DAG files.

These settings were ``MINDLOOM_*`` environment variables (train retries, deferral, the two crons); a deployment now
sets them in its YAML, and the DAG files take them from the config they load at parse time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from conftest import REPO, tiny_config

from pipeline.config import DEFAULT_CONFIG, load_config
from pipeline.configkit import ConfigError


def test_defaults_are_the_former_switch_defaults():
    a = load_config(DEFAULT_CONFIG).airflow
    assert (a.train_retries, a.train_deferrable, a.refresh_schedule, a.pretrain_cron) == (1, False, "0 3 * * 0", "")
    assert load_config(DEFAULT_CONFIG).pack.verify_mem_mb == 6144


@pytest.mark.parametrize("field,value,message", [
    ("airflow.refresh_schedule", "every sunday", "airflow.refresh_schedule: not a cron expression"),
    ("airflow.refresh_schedule", "0 3 * *", "airflow.refresh_schedule: not a cron expression"),
    ("airflow.refresh_schedule", "0 3 * * 0 2027", "airflow.refresh_schedule: not a cron expression"),
    ("airflow.pretrain_cron", "61 4 * * 0", "airflow.pretrain_cron: not a cron expression"),
    ("airflow.train_retries", -1, "airflow.train_retries: must be >= 0"),
    ("airflow.train_deferrable", "1", "airflow.train_deferrable: expected true or false"),
    ("pack.verify_mem_mb", 100, "pack.verify_mem_mb: must be >= 512"),
])
def test_a_bad_value_names_the_field(field, value, message):
    with pytest.raises(ConfigError, match=message.replace("*", r"\*")):
        load_config(DEFAULT_CONFIG, {field: value})


def test_presets_and_crons_are_accepted():
    cfg = load_config(DEFAULT_CONFIG, {"airflow.refresh_schedule": "@weekly", "airflow.pretrain_cron": "0 4 * * 1-5"})
    assert (cfg.airflow.refresh_schedule, cfg.airflow.pretrain_cron) == ("@weekly", "0 4 * * 1-5")


def test_deployment_settings_leave_the_digest_alone():
    base = load_config(DEFAULT_CONFIG).digest()
    for field, value in (("airflow.train_retries", 5), ("airflow.train_deferrable", True),
                         ("airflow.refresh_schedule", "0 1 * * *"), ("airflow.pretrain_cron", "0 4 * * 0"),
                         ("pack.verify_mem_mb", 2048)):
        assert load_config(DEFAULT_CONFIG, {field: value}).digest() == base, field
    assert load_config(DEFAULT_CONFIG, {"pack.seq_len": 64}).digest() != base


def test_dag_files_read_the_section_from_their_config(tmp_path):
    """A real DagBag parses dags/ under a config with every airflow field set: retries and deferral of each
    training stage, pretrain's cron next to the Asset, corpus_refresh's cron."""
    config = tiny_config(tmp_path, airflow={"train_retries": 3, "train_deferrable": True,
                                            "refresh_schedule": "0 5 * * 1", "pretrain_cron": "0 4 * * 0"})
    script = textwrap.dedent("""
        import json, sys, warnings
        from airflow.dag_processing.dagbag import DagBag
        warnings.simplefilter("ignore")
        bag = DagBag(dag_folder=sys.argv[1] + "/dags")
        pre, ref = bag.dags["pretrain"], bag.dags["corpus_refresh"]
        trains = [t for t in pre.tasks if t.task_id.startswith("train_")]
        print(json.dumps({"errors": [str(e) for e in bag.import_errors.values()],
                          "retries": sorted({t.retries for t in trains}),
                          "deferrable": sorted({t.deferrable for t in trains}),
                          "pretrain": type(pre.timetable).__name__,
                          "pretrain_cron": pre.timetable.timetable._expression,
                          "refresh": ref.timetable.expression}))
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MINDLOOM_")}
    env.update({"MINDLOOM_CONFIG": str(config), "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
                "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "PYTHONPATH": str(REPO)})
    res = subprocess.run([sys.executable, "-c", script, str(REPO)], capture_output=True, text=True, timeout=300,
                         env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["errors"] == []
    assert (out["retries"], out["deferrable"]) == ([3], [True])
    assert (out["pretrain"], out["pretrain_cron"]) == ("AssetOrTimeSchedule", "0 4 * * 0")
    assert out["refresh"] == "0 5 * * 1"


def test_mindloom_verify_limits_its_reader_by_the_config(tmp_path, monkeypatch):
    """``pack.verify_mem_mb`` (formerly an environment variable) is the reader's limit in ``mindloom verify``."""
    from pipeline import cli
    from pipeline.sink import mindrecord

    seen = {}
    monkeypatch.setattr(mindrecord, "verify", lambda d, **kw: seen.update(kw) or {"ok": True})
    config = tmp_path / "c.yaml"
    config.write_text("pack: {verify_mem_mb: 2048}\n", encoding="utf-8")
    assert cli.main(["verify", str(tmp_path), "--config", str(config)]) == 0
    assert seen["mem_limit_mb"] == 2048
