"""Multi-node msrun command building: exact argv/env for 2 nodes × 8 devices, checked against msrun's own parser and
rank assignment; errors that name the field; the auto-parallel context accepted by MindSpore itself."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from pipeline.train.jobs.launcher import (
    MSRUN_OWNED_VARS,
    ClusterLayout,
    LaunchError,
    build_launch,
    layout_from_env,
    msrun_argv,
    train_program,
)

REPO = Path(__file__).resolve().parents[1]
BASE_ENV = {"PATH": "/usr/bin:/bin", "HOME": "/home/airflow", "RANK_ID": "5", "MS_ROLE": "MS_WORKER",
            "MS_SIMULATION_LEVEL": "1", "RANK_SIZE": "2", "HCCL_CONNECT_TIMEOUT": "120"}


def two_by_eight(node_rank: int, **kw) -> ClusterLayout:
    return ClusterLayout(nodes=2, devices_per_node=8, node_rank=node_rank, master_addr="10.20.0.11",
                         master_port=8118, log_dir="/shared/run1/msrun_log", cluster_time_out=900, device="Ascend",
                         **kw)


def test_two_nodes_eight_devices_argv_and_env(tmp_path):
    job = tmp_path / "job.json"
    program = train_program(job)
    assert program == ["python", "-m", "pipeline.train", "--job", str(job.resolve())]
    expected_common = ["--worker_num=16", "--local_worker_num=8", "--master_addr=10.20.0.11", "--master_port=8118"]
    tail = ["--log_dir=/shared/run1/msrun_log", "--join=True", "--cluster_time_out=900", *program]
    for rank in (0, 1):
        launch = build_launch(two_by_eight(rank), program, python="/opt/venv/bin/python", base_env=BASE_ENV,
                              extra_env={"HCCL_SOCKET_IFNAME": "eth1"})
        assert launch.argv == ["msrun", *expected_common, f"--node_rank={rank}", *tail]
        assert launch.env == {"PATH": "/opt/venv/bin:/usr/bin:/bin", "HOME": "/home/airflow",
                              "PYTHONPATH": str(REPO), "HCCL_CONNECT_TIMEOUT": "900", "HCCL_SOCKET_IFNAME": "eth1"}
    assert list(two_by_eight(0).global_ranks) == list(range(0, 8))
    assert list(two_by_eight(1).global_ranks) == list(range(8, 16))
    assert two_by_eight(0).for_node(1) == two_by_eight(1)


def test_msrun_parses_our_argv_and_assigns_the_same_ranks(monkeypatch):
    """The argv goes through msrun's real argument parser; its rank formula gives our global_ranks."""
    run = pytest.importorskip("mindspore.parallel.cluster.run")
    from mindspore.parallel.cluster.process_entity._api import _ProcessManager

    bind = {"device0": ["0-11"], "device7": ["84-95"], "scheduler": ["96"]}
    for rank in (0, 1):
        layout = two_by_eight(rank, bind_core=bind)
        monkeypatch.setattr(sys, "argv", msrun_argv(layout, train_program("/shared/run1/job.json")))
        args = run.get_args()
        assert (args.worker_num, args.local_worker_num, args.node_rank) == (16, 8, rank)
        assert (args.master_addr, args.master_port, args.join, args.cluster_time_out) == ("10.20.0.11", 8118, True,
                                                                                          900)
        assert args.bind_core == bind and args.log_dir == "/shared/run1/msrun_log"
        assert (args.task_script, args.task_script_args) == ("python", ["-m", "pipeline.train", "--job",
                                                                        "/shared/run1/job.json"])
        fake = SimpleNamespace(local_worker_num=8, worker_num=16, node_rank=rank, log_dir="/l",
                               format_worker_log_name=lambda: "worker")
        ids = [_ProcessManager._get_node_id_and_log_path(fake, i)[0] for i in range(8)]
        assert ids == list(layout.global_ranks)


def test_single_node_defaults():
    argv = msrun_argv(ClusterLayout(devices_per_node=2), ["pipeline/train/jobs/launch.py", "--job", "j.json"])
    assert argv == ["msrun", "--worker_num=2", "--local_worker_num=2", "--master_addr=127.0.0.1",
                    "--master_port=8118", "--node_rank=0", "--log_dir=msrun_log", "--join=True",
                    "--cluster_time_out=600", "pipeline/train/jobs/launch.py", "--job", "j.json"]


def test_msrun_owned_variables_are_never_inherited():
    env = build_launch(ClusterLayout(), ["python", "x.py"], base_env={v: "1" for v in MSRUN_OWNED_VARS}).env
    assert not set(env) & set(MSRUN_OWNED_VARS)
    assert "HCCL_CONNECT_TIMEOUT" not in env           # CPU: no HCCL
    assert build_launch(ClusterLayout(device="Ascend", cluster_time_out=30), ["python"],
                        base_env={}).env["HCCL_CONNECT_TIMEOUT"] == "120"   # HCCL's minimum


@pytest.mark.parametrize(("kwargs", "field", "text"), [
    ({"nodes": 0}, "nodes", "must be between 1 and 4096 (got 0)"),
    ({"devices_per_node": "8"}, "devices_per_node", "must be an integer (got '8')"),
    ({"nodes": True}, "nodes", "must be an integer (got True)"),
    ({"nodes": 2, "node_rank": 2, "master_addr": "10.0.0.1"}, "node_rank", "must be between 0 and 1 (got 2)"),
    ({"nodes": 2, "master_addr": "127.0.0.1"}, "master_addr", "is loopback, but nodes=2"),
    ({"nodes": 2, "master_addr": "localhost"}, "master_addr", "is loopback, but nodes=2"),
    ({"master_addr": "0.0.0.0"}, "master_addr", "is not an address a worker can connect to"),
    ({"master_addr": "bad host"}, "master_addr", "neither an IP address nor a valid host name"),
    ({"master_port": 80}, "master_port", "must be between 1024 and 65535 (got 80)"),
    ({"cluster_time_out": -1}, "cluster_time_out", "must be >= 1 (got -1)"),
    ({"join": "True"}, "join", "must be true or false"),
    ({"device": "NPU"}, "device", "must be one of CPU, Ascend, GPU"),
    ({"log_dir": " "}, "log_dir", "must be a non-empty path"),
    ({"devices_per_node": 8, "bind_core": {"device8": ["0-3"]}}, "bind_core['device8']", "not below"),
    ({"bind_core": {"device0": ["0-3x"]}}, "bind_core['device0']", "list of CPU ranges"),
    ({"nodes": 64, "devices_per_node": 128, "master_addr": "10.0.0.1"}, "devices_per_node", "exceeds"),
])
def test_bad_layout_names_the_field(kwargs, field, text):
    with pytest.raises(LaunchError, match="^" + re.escape(field) + ": ") as err:
        ClusterLayout(**kwargs)
    assert err.value.field == field and text in str(err.value)


@pytest.mark.parametrize(("program", "field"), [
    ("python -m pipeline.train", "program"),
    ([], "program"),
    (["/opt/venv/bin/python", "-m", "pipeline.train"], "program[0]"),
    (["python", None], "program[1]"),
])
def test_bad_program_names_the_argument(program, field):
    with pytest.raises(LaunchError) as err:
        msrun_argv(ClusterLayout(), program)
    assert err.value.field == field


def test_extra_env_cannot_override_msrun_variables():
    with pytest.raises(LaunchError, match=r"^extra_env\['RANK_ID'\]: is set by msrun"):
        build_launch(ClusterLayout(), ["python"], base_env={}, extra_env={"RANK_ID": "0"})


def test_layout_from_env_errors_name_the_variable():
    env = {"MINDLOOM_NODES": "2", "MINDLOOM_DEVICES_PER_NODE": "8", "MINDLOOM_MASTER_ADDR": "train-0.train",
           "JOB_COMPLETION_INDEX": "1", "MINDLOOM_DEVICE": "Ascend"}
    layout = layout_from_env(env)
    assert (layout.nodes, layout.devices_per_node, layout.node_rank, layout.master_addr) == (2, 8, 1, "train-0.train")
    assert layout_from_env({**env, "MINDLOOM_NODE_RANK": "0"}).node_rank == 0   # explicit wins over the index
    with pytest.raises(LaunchError, match=r"^MINDLOOM_NODES: must be an integer \(got 'two'\)"):
        layout_from_env({**env, "MINDLOOM_NODES": "two"})
    with pytest.raises(LaunchError, match=r"^JOB_COMPLETION_INDEX: must be between 0 and 1 \(got 2\)"):
        layout_from_env({**env, "JOB_COMPLETION_INDEX": "2"})
    with pytest.raises(LaunchError, match=r"^MINDLOOM_BIND_CORE\['device9'\]: "):
        layout_from_env({**env, "MINDLOOM_BIND_CORE": '{"device9": ["0-3"]}'})
    with pytest.raises(LaunchError, match=r"^--master-addr: .*loopback"):
        layout_from_env(env, {"master_addr": "127.0.0.1"})


def test_entrypoint_dry_run_and_error(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "MINDLOOM_NODES": "2", "MINDLOOM_DEVICES_PER_NODE": "8",
           "MINDLOOM_MASTER_ADDR": "10.20.0.11", "JOB_COMPLETION_INDEX": "1", "PYTHONPATH": str(REPO)}
    job = tmp_path / "run1" / "job.json"
    job.parent.mkdir()
    job.write_text(json.dumps({"world_size": 16, "tensor_parallel": 8}))
    cmd = [sys.executable, "-m", "pipeline.train.jobs.launcher", "--dry-run", "--job", str(job)]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60, cwd=REPO)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["argv"][:7] == ["msrun", "--worker_num=16", "--local_worker_num=8", "--master_addr=10.20.0.11",
                               "--master_port=8118", "--node_rank=1", "--log_dir=msrun_log"]
    assert out["argv"][-5:] == ["python", "-m", "pipeline.train", "--job", str(job)]
    assert out["global_ranks"] == list(range(8, 16))
    bad = subprocess.run(cmd, env={**env, "MINDLOOM_MASTER_PORT": "99999"}, capture_output=True, text=True,
                         timeout=60, cwd=REPO)
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.strip() == "mindloom.launcher: error: MINDLOOM_MASTER_PORT: must be between 1024 and 65535 " \
                                 "(got 99999)"


# -- the job's parallel layout against the cluster ----------------------------------------------------------------

def test_the_launcher_refuses_a_cluster_that_does_not_fit_the_jobs_layout(tmp_path):
    from pipeline.train.jobs.launcher import check_job_layout

    job = tmp_path / "job.json"
    job.write_text(json.dumps({"world_size": 16, "tensor_parallel": 8}))
    check_job_layout(ClusterLayout(nodes=2, devices_per_node=8, master_addr="10.0.0.1"), job)
    with pytest.raises(LaunchError, match=r"= 12, but the job .* was planned for 16 ranks"):
        check_job_layout(ClusterLayout(nodes=2, devices_per_node=6, master_addr="10.0.0.1"), job)
    job.write_text(json.dumps({"world_size": 16, "tensor_parallel": 8}))
    with pytest.raises(LaunchError, match="tensor_parallel=8 does not divide devices_per_node=4"):
        check_job_layout(ClusterLayout(nodes=4, devices_per_node=4, master_addr="10.0.0.1"), job)
