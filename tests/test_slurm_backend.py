"""The Slurm backend's pieces without a cluster: the config checks, the batch script, each task's MindSpore
environment, and how a job's state reads when Slurm says it is queued or over (the real cluster: test_train_slurm)."""

from __future__ import annotations

import json

import pytest

from pipeline.configkit import ConfigError


def _train(**kw):
    from pipeline.train.config import TrainConfig

    return TrainConfig(**kw)


def test_nodes_and_workers_are_checked_per_node():
    assert _train(backend="slurm", nodes=2, workers=16).workers == 16  # 8 per node = max_workers
    for kw, msg in ((dict(nodes=2, workers=4), "train.nodes: the local backend runs one node"),
                    (dict(backend="slurm", nodes=3, workers=4), r"train.nodes: must divide train.workers \(4\)"),
                    (dict(backend="slurm", nodes=2, workers=32),
                     r"train.workers: 32 is more than this deployment launches over 2 nodes \(16 per node"),
                    (dict(backend="slurm", nodes=2, workers=4, tensor_parallel=4, model_overrides={"n_heads": 4,
                          "n_kv_heads": 4}), r"train.tensor_parallel: must divide the ranks of one node"),
                    (dict(backend="slurm", slurm_args=["--time=1:00:00", "-N 4"]), r"train.slurm_args: .*'-N 4'"),
                    (dict(backend="slurm", env=["HCCL_CONNECT_TIMEOUT"]), r"train.env\[0\]: must be KEY=VALUE"),
                    (dict(backend="slurm", env=["1X=2"]), r"train.env\[0\]: must be KEY=VALUE"),
                    (dict(backend="slurm", slurm_setup=["module load cann\nrm -rf /"]),
                     r"train.slurm_setup: one shell line per item")):
        with pytest.raises(ConfigError, match=msg):
            _train(**kw)


def test_the_batch_script_allocates_nodes_by_tasks_and_exports_the_job_id(tmp_path):
    from pipeline.train.jobs.slurm import batch_script

    text = batch_script(tmp_path / "job.json", tmp_path, nodes=4, tasks_per_node=8, python="/venv/bin/python",
                        env={"PATH": "/venv/bin:/usr/bin", "MINDLOOM_JOB_ID": "abc", "SECRET": "x"},
                        stage="main", partition="llm", extra=["--time=72:00:00"])
    lines = text.splitlines()
    assert lines[:3] == ["#!/bin/bash", "#SBATCH --job-name=mindloom-main-abc", "#SBATCH --nodes=4"]
    for want in ("#SBATCH --ntasks-per-node=8", f"#SBATCH --output={tmp_path}/slurm-%j.log",
                 "#SBATCH --partition=llm", "#SBATCH --time=72:00:00", "export MINDLOOM_JOB_ID=abc",
                 "export PATH=/venv/bin:/usr/bin"):
        assert want in lines, (want, text)
    assert "SECRET" not in text  # only what a rank needs is exported, not the submitter's whole environment
    assert "#SBATCH --export=NONE" in lines     # the job starts empty: nothing else of the worker's environment
    assert lines[-1].endswith(" --kill-on-bad-exit=1 --export=ALL --distribution=block /venv/bin/python -m "
                              f"pipeline.train.jobs.slurm --job {tmp_path}/job.json")


def test_an_ascend_sites_setup_runs_before_srun_with_its_variables_and_interpreter(tmp_path):
    from pipeline.train.jobs.slurm import batch_script

    text = batch_script(tmp_path / "job.json", tmp_path, nodes=16, tasks_per_node=8, python="/opt/venv/bin/python",
                        env={"PATH": "/usr/bin", "MINDLOOM_JOB_ID": "abc", "AIRFLOW__CORE__FERNET_KEY": "k",
                             "RANK_TABLE_FILE": "/stray.json"},
                        setup=["source /usr/local/Ascend/ascend-toolkit/set_env.sh", "module load cann/8.0"],
                        rank_env=["HCCL_CONNECT_TIMEOUT=1800", "HCCL_SOCKET_IFNAME=eth0 eth1"], cpus_per_task=24,
                        container="/images/mindspore.sqsh")
    lines = text.splitlines()
    order = [lines.index(x) for x in ("export MINDLOOM_JOB_ID=abc", "export HCCL_CONNECT_TIMEOUT=1800",
                                      "export HCCL_SOCKET_IFNAME='eth0 eth1'", "export SRUN_CPUS_PER_TASK=24",
                                      "source /usr/local/Ascend/ascend-toolkit/set_env.sh", "module load cann/8.0")]
    assert order == sorted(order) and order[-1] < len(lines) - 1      # setup after the exports, before srun
    assert "AIRFLOW__" not in text and "RANK_TABLE_FILE" not in text
    assert " --distribution=block --cpus-per-task=24 --container-image=/images/mindspore.sqsh /opt/venv/bin/python " \
        in lines[-1]


def test_the_master_port_stays_below_the_ephemeral_range():
    from pipeline.train.jobs.slurm import master_port

    ports = [master_port(j) for j in range(0, 200_000, 7)]
    assert min(ports) >= 10_000 and max(ports) < 32_768


def test_each_task_gets_its_rank_and_the_first_nodes_scheduler():
    from pipeline.train.jobs.slurm import rank_env

    env = {"SLURM_PROCID": "5", "SLURM_NTASKS": "16", "SLURM_JOB_ID": "20123", "SLURM_LOCALID": "1",
           "SLURM_LAUNCH_NODE_IPADDR": "10.0.0.5", "MINDLOOM_JOB_ID": "abc"}
    got, sched = rank_env(env)
    assert not sched
    assert {k: got[k] for k in ("MS_ROLE", "MS_NODE_ID", "RANK_ID", "MS_WORKER_NUM", "RANK_SIZE", "MS_SCHED_HOST",
                                "MS_SCHED_PORT", "DEVICE_ID", "MINDLOOM_JOB_ID")} == {
        "MS_ROLE": "MS_WORKER", "MS_NODE_ID": "5", "RANK_ID": "5", "MS_WORKER_NUM": "16", "RANK_SIZE": "16",
        "MS_SCHED_HOST": "10.0.0.5", "MS_SCHED_PORT": "10123", "DEVICE_ID": "1", "MINDLOOM_JOB_ID": "abc"}
    assert rank_env({**env, "SLURM_PROCID": "0"})[1]  # task 0 starts the scheduler
    assert rank_env({**env, "MINDLOOM_MASTER_ADDR": "head"})[0]["MS_SCHED_HOST"] == "head"
    assert rank_env({**env, "SLURM_JOB_ID": "40124"})[0]["MS_SCHED_PORT"] == "10124"  # per job: no collision


@pytest.mark.parametrize("slurm_says, want", [("PENDING", "PENDING"), ("CANCELLED+", "LOST"), (None, "LOST"),
                                              ("COMPLETED", "LOST")])
def test_a_queued_job_waits_and_an_ended_one_without_a_status_is_lost(tmp_path, monkeypatch, slurm_says, want):
    from pipeline.tasks import pretrain
    from pipeline.train.jobs import slurm

    monkeypatch.setattr(slurm, "state", lambda sid: slurm_says)
    (tmp_path / "launch.json").write_text(json.dumps({"job_id": "j1", "slurm_job_id": "77", "pid": None,
                                                      "host": "elsewhere"}))
    far = pretrain.STARTUP_GRACE_S * 10  # queued for hours: never LOST for want of a lease
    got = pretrain.job_state(tmp_path, job_id="j1", now=far, seen={"pending_since": 0.0})
    assert got["state"] == want
    if want == "LOST":
        assert got["error"].startswith(f"Slurm job 77 ended ({slurm_says or 'forgotten by Slurm'}) without a final "
                                       f"status; see {tmp_path}/slurm-77.log")
    (tmp_path / "status.json").write_text(json.dumps({"state": "SUCCEEDED", "step": 4, "job_id": "j1"}))
    assert pretrain.job_state(tmp_path, job_id="j1")["state"] == "SUCCEEDED"  # the job's own final word wins


def test_a_running_slurm_job_without_a_lease_waits_past_the_local_grace(tmp_path, monkeypatch):
    """Ranks still sourcing CANN or meeting at the scheduler: RUNNING on Slurm without a lease is PENDING for
    ``SLURM_STARTUP_GRACE_S`` (MS_TOPO_TIMEOUT and a margin), not the local backend's 300 s."""
    from pipeline.tasks import pretrain
    from pipeline.train.jobs import slurm

    monkeypatch.setattr(slurm, "state", lambda sid: "RUNNING")
    (tmp_path / "launch.json").write_text(json.dumps({"job_id": "j1", "slurm_job_id": "77", "pid": None,
                                                      "host": "elsewhere"}))
    seen = {"pending_since": 0.0}
    assert pretrain.job_state(tmp_path, job_id="j1", now=pretrain.STARTUP_GRACE_S * 5, seen=seen)["state"] == "PENDING"
    late = pretrain.job_state(tmp_path, job_id="j1", now=pretrain.SLURM_STARTUP_GRACE_S + 1, seen=seen)
    assert late["state"] == "LOST" and late["error"] == "the job took no lease within 3900 s"
    assert slurm.rank_env({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_ID": "5"})[0]["MS_TOPO_TIMEOUT"] \
        == "3600"


@pytest.mark.parametrize("recorded", [True, False])
def test_a_retry_reattaches_to_the_job_an_earlier_try_submitted(tmp_path, monkeypatch, recorded):
    """A try that died after ``sbatch`` (before Airflow stored the job's id, or even before ``launch.json`` did):
    the retry finds the queued job by its Slurm id, or by the job id in its name, and does not submit again."""
    from pipeline.tasks import submit
    from pipeline.tasks.pretrain import record_launch
    from pipeline.train.jobs import slurm

    (tmp_path / "job.json").write_text(json.dumps({"stage": "main"}))
    argv = ["sbatch", "--parsable", str(tmp_path / slurm.SCRIPT)]
    record_launch(tmp_path, argv, None, try_number=1, job_id="j1", slurm_job_id="88" if recorded else None)
    asked = []
    monkeypatch.setattr(slurm, "find_job", lambda name: asked.append(name) or "88")
    monkeypatch.setattr(slurm, "state", lambda sid: {"88": "PENDING"}.get(sid))
    got = submit.launched_slurm_job(tmp_path)
    assert got == {"out_dir": str(tmp_path), "slurm_job_id": "88", "job_id": "j1",
                   "log": str(tmp_path / "slurm-88.log"), "launched_by_try": 1}
    assert asked == ([] if recorded else ["mindloom-main-j1"])
    assert json.loads((tmp_path / "launch.json").read_text())["slurm_job_id"] == "88"   # recorded now
    monkeypatch.setattr(slurm, "state", lambda sid: "CANCELLED")      # over: a retry submits a new one
    assert submit.launched_slurm_job(tmp_path) is None


def test_a_lost_slurm_job_is_cancelled_before_the_task_fails(tmp_path, monkeypatch):
    from airflow.exceptions import AirflowException

    from operators.training import TrainingStageOperator
    from pipeline.tasks import pretrain
    from pipeline.train.jobs import slurm

    cancelled = []
    monkeypatch.setattr(slurm, "cancel", cancelled.append)
    monkeypatch.setattr(pretrain, "job_state", lambda *a, **k: {"state": "LOST", "step": 3, "error": "stood still"})
    op = TrainingStageOperator(task_id="train_main", corpus={}, stage="main", poll_interval=0.01)
    ext = {"out_dir": str(tmp_path), "slurm_job_id": "91", "job_id": "j1", "log": "x"}
    with pytest.raises(AirflowException, match="training stage main LOST at step 3: stood still"):
        op.poll_until_complete(ext, {})
    assert cancelled == ["91"]
