"""Queue/executor routing by environment: exact kwargs, clear errors, and DAG files that import on every host."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap
import warnings

import pytest

from operators.routing import RoutingError, data_task_kwargs, executor_names, train_task_kwargs

REPO = pathlib.Path(__file__).resolve().parents[1]
CLUSTER = {"MINDLOOM_DATA_QUEUE": "data", "MINDLOOM_TRAIN_QUEUE": "train"}


def test_nothing_configured_gives_no_kwargs():
    assert data_task_kwargs({}, "LocalExecutor") == {}
    assert train_task_kwargs({"MINDLOOM_TRAIN_QUEUE": "  ", "MINDLOOM_TRAIN_EXECUTOR": ""}, "LocalExecutor") == {}


def test_queues_per_role():
    assert data_task_kwargs(CLUSTER, "CeleryExecutor") == {"queue": "data"}
    assert train_task_kwargs(CLUSTER, "CeleryExecutor") == {"queue": "train"}


@pytest.mark.parametrize("bad", ["data,train", "data train", "-data", "dätä"])
def test_bad_queue_names_the_variable(bad):
    with pytest.raises(RoutingError, match=r"^MINDLOOM_TRAIN_QUEUE: .* is not a valid queue name"):
        train_task_kwargs({"MINDLOOM_TRAIN_QUEUE": bad}, "LocalExecutor")


def test_executor_kept_when_configured():
    env = {**CLUSTER, "MINDLOOM_TRAIN_EXECUTOR": "CeleryExecutor"}
    assert train_task_kwargs(env, "LocalExecutor,CeleryExecutor") == {"queue": "train", "executor": "CeleryExecutor"}
    edge = "LocalExecutor,npu:airflow.providers.edge3.executors.EdgeExecutor"
    for name in ("npu", "EdgeExecutor", "airflow.providers.edge3.executors.EdgeExecutor"):
        assert train_task_kwargs({"MINDLOOM_TRAIN_EXECUTOR": name}, edge) == {"executor": name}


def test_unconfigured_executor_is_dropped_with_a_warning():
    env = {**CLUSTER, "MINDLOOM_TRAIN_EXECUTOR": "EdgeExecutor"}
    with pytest.warns(RuntimeWarning, match=r"MINDLOOM_TRAIN_EXECUTOR='EdgeExecutor' is not among"):
        assert train_task_kwargs(env, "LocalExecutor") == {"queue": "train"}


def test_strict_mode_turns_it_into_an_error():
    env = {"MINDLOOM_DATA_EXECUTOR": "CeleryExecutor", "MINDLOOM_ROUTING_STRICT": "true"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(RoutingError, match=r"^MINDLOOM_DATA_EXECUTOR='CeleryExecutor' .*'LocalExecutor'"):
            data_task_kwargs(env, "LocalExecutor")
    with pytest.raises(RoutingError, match=r"^MINDLOOM_ROUTING_STRICT: must be true or false"):
        data_task_kwargs({**env, "MINDLOOM_ROUTING_STRICT": "maybe"}, "LocalExecutor")


def test_executor_names_match_airflows_own_lookup():
    """Our parser must accept exactly the names Airflow's ExecutorLoader resolves (no false drops, no traps)."""
    configs = ["LocalExecutor", "LocalExecutor,CeleryExecutor", "CeleryExecutor,KubernetesExecutor",
               "LocalExecutor,npu:airflow.providers.edge3.executors.EdgeExecutor",
               "LocalExecutor,my.pkg.executors.GpuExecutor", "fast:LocalExecutor"]
    candidates = ["LocalExecutor", "CeleryExecutor", "KubernetesExecutor", "EdgeExecutor", "npu", "fast",
                  "GpuExecutor", "my.pkg.executors.GpuExecutor", "airflow.providers.edge3.executors.EdgeExecutor",
                  "airflow.executors.local_executor.LocalExecutor",
                  "airflow.providers.celery.executors.celery_executor.CeleryExecutor", "celery", "Local"]
    script = textwrap.dedent("""
        import json, sys
        from airflow.configuration import conf
        from airflow.exceptions import UnknownExecutorException
        from airflow.executors import executor_loader as el
        out = {}
        for cfg in json.loads(sys.argv[1]):
            for cache in (el._alias_to_executors_per_team, el._module_to_executors_per_team,
                          el._classname_to_executors_per_team, el._team_name_to_executors):
                cache.clear()
            el._executor_names.clear()
            conf.set("core", "executor", cfg)
            ok = []
            for name in json.loads(sys.argv[2]):
                try:
                    el.ExecutorLoader.lookup_executor_name_by_str(name, validate_teams=False)
                    ok.append(name)
                except UnknownExecutorException:
                    pass
            out[cfg] = ok
        print(json.dumps(out))
    """)
    # An AIRFLOW__CORE__EXECUTOR in the environment (the Makefile exports one) would win over conf.set().
    env = {k: v for k, v in os.environ.items() if k != "AIRFLOW__CORE__EXECUTOR"}
    res = subprocess.run([sys.executable, "-c", script, json.dumps(configs), json.dumps(candidates)],
                         capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    airflow_view = json.loads(res.stdout.strip().splitlines()[-1])
    for cfg in configs:
        ours = sorted(n for n in candidates if n in executor_names(cfg))
        assert ours == sorted(airflow_view[cfg]), cfg


DAG_FILE = '''
import pendulum
from airflow.sdk import dag, task
from operators.routing import data_task_kwargs, train_task_kwargs

@dag(dag_id="routed", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"))
def routed():
    @task(**data_task_kwargs())
    def prep():
        return 1

    @task(**train_task_kwargs())
    def train(x):
        return x

    train(prep())

routed()
'''

HARDCODED = DAG_FILE.replace("@task(**train_task_kwargs())", "@task(executor='CeleryExecutor')").replace(
    'dag_id="routed"', 'dag_id="hardcoded"')


def test_dag_files_import_with_and_without_executors(tmp_path):
    """A real DagBag (LocalExecutor only) parses the routed DAG under each environment; a hard-coded executor is the
    import error this module exists to avoid."""
    (tmp_path / "dags").mkdir()
    (tmp_path / "dags" / "routed.py").write_text(DAG_FILE)
    (tmp_path / "hard").mkdir()
    (tmp_path / "hard" / "hardcoded.py").write_text(HARDCODED)
    script = textwrap.dedent("""
        import json, os, sys, warnings
        from airflow.dag_processing.dagbag import DagBag
        warnings.simplefilter("ignore")
        out = {}
        for name, env in json.loads(sys.argv[2]).items():
            for k in [k for k in os.environ if k.startswith("MINDLOOM_")]:
                del os.environ[k]
            os.environ.update(env)
            bag = DagBag(dag_folder=sys.argv[1] + "/dags")
            errors = [str(e) for e in bag.import_errors.values()]
            dag = bag.dags.get("routed")
            tasks = {t.task_id: [t.queue, t.executor] for t in dag.tasks} if dag else None
            out[name] = {"errors": errors, "tasks": tasks}
        hard = DagBag(dag_folder=sys.argv[1] + "/hard")
        out["hardcoded"] = [str(e) for e in hard.import_errors.values()]
        print(json.dumps(out))
    """)
    envs = {
        "laptop": {},
        "cluster": {**CLUSTER, "MINDLOOM_ROUTING_STRICT": "true"},
        "configured": {**CLUSTER, "MINDLOOM_TRAIN_EXECUTOR": "LocalExecutor", "MINDLOOM_ROUTING_STRICT": "true"},
        "missing": {**CLUSTER, "MINDLOOM_TRAIN_EXECUTOR": "EdgeExecutor"},
        "missing_strict": {**CLUSTER, "MINDLOOM_TRAIN_EXECUTOR": "EdgeExecutor", "MINDLOOM_ROUTING_STRICT": "1"},
    }
    env = {**os.environ, "AIRFLOW__CORE__EXECUTOR": "LocalExecutor", "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
           "PYTHONPATH": str(REPO)}
    res = subprocess.run([sys.executable, "-c", script, str(tmp_path), json.dumps(envs)], capture_output=True,
                         text=True, timeout=180, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["laptop"] == {"errors": [], "tasks": {"prep": ["default", None], "train": ["default", None]}}
    assert out["cluster"] == {"errors": [], "tasks": {"prep": ["data", None], "train": ["train", None]}}
    assert out["configured"] == {"errors": [], "tasks": {"prep": ["data", None], "train": ["train", "LocalExecutor"]}}
    assert out["missing"] == {"errors": [], "tasks": {"prep": ["data", None], "train": ["train", None]}}
    assert out["missing_strict"]["tasks"] is None
    assert len(out["missing_strict"]["errors"]) == 1
    assert "MINDLOOM_TRAIN_EXECUTOR='EdgeExecutor' is not among" in out["missing_strict"]["errors"][0]
    assert len(out["hardcoded"]) == 1
    assert "specifies executor 'CeleryExecutor', which is not available" in out["hardcoded"][0]
