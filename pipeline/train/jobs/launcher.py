"""Multi-node ``msrun`` launch (argv + environment) for a cluster layout, checked against the job's parallel layout.

Why this module exists: a month-long job on N nodes × M devices fails in the first minute — or, worse, hangs for
the whole ``cluster_time_out`` — when one node gets a different ``--worker_num``, a loopback master address, or a
stale ``RANK_ID`` inherited from its parent process.  Everything that must agree across nodes is therefore derived
from one validated :class:`ClusterLayout`; each node differs only in ``node_rank``.  Errors name the field.

The command is always a list (never a shell string), and the first word of the program must be ``python`` (the one
on ``PATH``) or a ``.py`` script: ``msrun`` runs ``python <task_script> ...`` for anything else, so an absolute
interpreter path would be run *as a script*.  ``python -m pipeline.train.jobs.launcher`` is the training image's
entrypoint: it reads the layout from flags or ``MINDLOOM_*`` variables (node rank also from Kubernetes'
``JOB_COMPLETION_INDEX``) and execs ``msrun``.  No MindSpore import here.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import re
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]
DEVICES = ("CPU", "Ascend", "GPU")
MAX_WORLD = 4096  # set_auto_parallel_context(device_num=...) accepts [1, 4096]
# Set by msrun itself for every worker; a value inherited from the launching process (an Airflow worker started
# inside another job, a shell that ran a dry run) would change rank assignment or switch msrun into simulation.
MSRUN_OWNED_VARS = ("MS_ROLE", "MS_NODE_ID", "MS_WORKER_NUM", "MS_SCHED_HOST", "MS_SCHED_PORT", "MS_TOPO_TIMEOUT",
                    "MS_SIMULATION_LEVEL", "RANK_ID", "RANK_SIZE", "DEVICE_ID", "RANK_TABLE_FILE")
_HOST_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_CPU_LIST = re.compile(r"^(\d+-\d+|\d+(,\d+)*)$")


class LaunchError(ValueError):
    """A launch setting is invalid; ``field`` names it (layout field, env variable or ``program[i]``)."""

    def __init__(self, field_name: str, problem: str):
        super().__init__(f"{field_name}: {problem}")
        self.field = field_name


def _int(name: str, value, lo: int, hi: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise LaunchError(name, f"must be an integer (got {value!r})")
    if value < lo or (hi is not None and value > hi):
        bound = f"between {lo} and {hi}" if hi is not None else f">= {lo}"
        raise LaunchError(name, f"must be {bound} (got {value})")


def _check_host(addr, nodes: int) -> None:
    if not isinstance(addr, str) or not addr or addr != addr.strip():
        raise LaunchError("master_addr", f"must be a non-empty host name or IP address (got {addr!r})")
    try:
        ip = ipaddress.ip_address(addr.strip("[]"))
    except ValueError:
        ip = None
        if len(addr) > 253 or not all(_HOST_LABEL.match(label) for label in addr.rstrip(".").split(".")):
            raise LaunchError("master_addr",
                              f"is neither an IP address nor a valid host name (got {addr!r})") from None
    if ip is not None and ip.is_unspecified:
        raise LaunchError("master_addr", f"{addr} is not an address a worker can connect to; use the master's IP")
    loopback = ip.is_loopback if ip is not None else addr.lower().rstrip(".") == "localhost"
    if nodes > 1 and loopback:
        raise LaunchError("master_addr", f"{addr} is loopback, but nodes={nodes}: every node must reach the "
                                         "scheduler on node 0 — use its cluster IP or DNS name")


def _bind_core_value(value, devices_per_node: int) -> str | None:
    """msrun's ``--bind_core`` text: True (automatic) or a JSON map ``{"device<i>"|"scheduler": ["0-7", ...]}``."""
    if value is False:
        return None
    if value is True:
        return "True"
    if not isinstance(value, Mapping) or not value:
        raise LaunchError("bind_core", f"must be true, false or a non-empty mapping of device to CPU lists "
                                       f"(got {value!r})")
    for key, cpus in value.items():
        m = re.fullmatch(r"device(\d+)|scheduler", str(key))
        if not m:
            raise LaunchError(f"bind_core[{key!r}]", "key must be 'scheduler' or 'device<i>'")
        if m.group(1) is not None and int(m.group(1)) >= devices_per_node:
            raise LaunchError(f"bind_core[{key!r}]", f"device index is not below devices_per_node={devices_per_node}")
        if not isinstance(cpus, (list, tuple)) or not cpus or not all(
                isinstance(c, str) and _CPU_LIST.match(c.replace(" ", "")) for c in cpus):
            raise LaunchError(f"bind_core[{key!r}]", f"must be a list of CPU ranges like '0-23' or '0,1,2' "
                                                     f"(got {cpus!r})")
    return json.dumps({str(k): [c.replace(" ", "") for c in v] for k, v in value.items()}, separators=(",", ":"))


@dataclass(frozen=True)
class ClusterLayout:
    """Where the ranks of one training job run: ``nodes`` hosts with ``devices_per_node`` ranks each.

    Every field except ``node_rank`` must be identical on all nodes; :meth:`for_node` gives each node's copy.
    Global ranks of node ``r`` are ``r*devices_per_node .. (r+1)*devices_per_node-1`` (msrun's assignment when
    ``--node_rank`` is given), so worker logs and checkpoints are named the same on every rerun.
    """

    nodes: int = 1
    devices_per_node: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 8118
    log_dir: str = "msrun_log"
    join: bool = True
    cluster_time_out: int = 600
    bind_core: bool | dict = False
    device: str = "CPU"

    def __post_init__(self) -> None:
        _int("nodes", self.nodes, 1, MAX_WORLD)
        _int("devices_per_node", self.devices_per_node, 1, MAX_WORLD)
        if self.nodes * self.devices_per_node > MAX_WORLD:
            raise LaunchError("devices_per_node", f"nodes × devices_per_node = {self.world_size} exceeds "
                                                  f"MindSpore's limit of {MAX_WORLD} ranks")
        _int("node_rank", self.node_rank, 0, self.nodes - 1)
        _check_host(self.master_addr, self.nodes)
        _int("master_port", self.master_port, 1024, 65535)
        if not isinstance(self.log_dir, (str, os.PathLike)) or not str(self.log_dir).strip() or any(
                c in str(self.log_dir) for c in "\0\n"):
            raise LaunchError("log_dir", f"must be a non-empty path (got {self.log_dir!r})")
        if not isinstance(self.join, bool):
            raise LaunchError("join", f"must be true or false (got {self.join!r})")
        # msrun accepts a negative timeout ("wait forever"); an orchestrator then never learns a node is missing.
        _int("cluster_time_out", self.cluster_time_out, 1)
        if self.device not in DEVICES:
            raise LaunchError("device", f"must be one of {', '.join(DEVICES)} (got {self.device!r})")
        object.__setattr__(self, "log_dir", str(self.log_dir))
        _bind_core_value(self.bind_core, self.devices_per_node)

    @property
    def world_size(self) -> int:
        return self.nodes * self.devices_per_node

    @property
    def global_ranks(self) -> range:
        """Global rank ids of the workers this node starts."""
        start = self.node_rank * self.devices_per_node
        return range(start, start + self.devices_per_node)

    def for_node(self, node_rank: int) -> ClusterLayout:
        return replace(self, node_rank=node_rank)


def train_program(job_path: str | Path) -> list[str]:
    """The per-rank program of a mindloom training job (absolute path: msrun workers start in any folder)."""
    return ["python", "-m", "pipeline.train", "--job", str(Path(job_path).resolve())]


def _check_program(program: Sequence[str]) -> list[str]:
    if isinstance(program, (str, bytes)) or not program:
        raise LaunchError("program", "must be a non-empty list of arguments, never a shell string")
    for i, arg in enumerate(program):
        if not isinstance(arg, str) or "\0" in arg:
            raise LaunchError(f"program[{i}]", f"must be a string without NUL bytes (got {arg!r})")
    first = program[0]
    if first not in ("python", "python3") and not first.endswith(".py"):
        raise LaunchError("program[0]", f"msrun runs 'python <program[0]> ...' unless program[0] is literally "
                                        f"'python' or 'python3'; use 'python' (first on PATH) or a .py script, "
                                        f"not {first!r}")
    return list(program)


def msrun_argv(layout: ClusterLayout, program: Sequence[str], msrun: str = "msrun") -> list[str]:
    """``msrun`` argument list for this node of ``layout`` running ``program`` on every local rank."""
    argv = [msrun, f"--worker_num={layout.world_size}", f"--local_worker_num={layout.devices_per_node}",
            f"--master_addr={layout.master_addr}", f"--master_port={layout.master_port}",
            f"--node_rank={layout.node_rank}", f"--log_dir={layout.log_dir}", f"--join={layout.join}",
            f"--cluster_time_out={layout.cluster_time_out}"]
    bind_core = _bind_core_value(layout.bind_core, layout.devices_per_node)
    if bind_core is not None:
        argv.append(f"--bind_core={bind_core}")
    return argv + _check_program(program)


def msrun_env(layout: ClusterLayout, *, python: str | None = None, base_env: Mapping[str, str] | None = None,
              extra_env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for ``msrun``: msrun-owned variables removed, ``python``'s folder first on PATH, repo on
    PYTHONPATH; on Ascend ``HCCL_CONNECT_TIMEOUT`` follows ``cluster_time_out`` (clamped to HCCL's 120–7200 s);
    ``extra_env`` (e.g. ``HCCL_SOCKET_IFNAME``) is applied last."""
    env = {k: v for k, v in (os.environ if base_env is None else base_env).items() if k not in MSRUN_OWNED_VARS}
    if python:
        env["PATH"] = os.pathsep.join(p for p in (str(Path(python).parent), env.get("PATH", "")) if p)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    if layout.device == "Ascend":
        env["HCCL_CONNECT_TIMEOUT"] = str(min(max(layout.cluster_time_out, 120), 7200))
    for key, value in (extra_env or {}).items():
        if not isinstance(key, str) or not _ENV_NAME.match(key):
            raise LaunchError(f"extra_env[{key!r}]", "is not a valid environment variable name")
        if key in MSRUN_OWNED_VARS:
            raise LaunchError(f"extra_env[{key!r}]", "is set by msrun for each worker; do not set it")
        if not isinstance(value, str) or "\0" in value:
            raise LaunchError(f"extra_env[{key!r}]", f"must be a string without NUL bytes (got {value!r})")
        env[key] = value
    return env


@dataclass(frozen=True)
class Launch:
    argv: list[str]
    env: dict[str, str]


def build_launch(layout: ClusterLayout, program: Sequence[str], *, python: str | None = None,
                 base_env: Mapping[str, str] | None = None, extra_env: Mapping[str, str] | None = None) -> Launch:
    """argv + env for this node; ``msrun`` is taken from ``python``'s folder when given, else from PATH."""
    msrun = "msrun"
    if python:
        msrun = shutil.which("msrun", path=str(Path(python).parent)) or msrun
    return Launch(msrun_argv(layout, program, msrun), msrun_env(layout, python=python, base_env=base_env,
                                                                extra_env=extra_env))


def check_job_layout(layout: ClusterLayout, job_path: str | Path) -> None:
    """The job's parallel layout (``TrainJob.layout``) must fit the cluster: as many ranks as the job was planned
    for, and each tensor-parallel group inside one node."""
    try:
        with open(job_path, encoding="utf-8") as f:
            job = json.load(f)
    except (OSError, ValueError) as e:
        raise LaunchError("job", f"{job_path}: cannot be read ({type(e).__name__}: {e})") from None
    want, tp = int(job.get("world_size") or 0), int(job.get("tensor_parallel") or 1)
    if want and want != layout.world_size:
        raise LaunchError("devices_per_node", f"nodes × devices_per_node = {layout.world_size}, but the job "
                                              f"{job_path} was planned for {want} ranks (train.workers)")
    if layout.devices_per_node % tp:
        raise LaunchError("devices_per_node", f"the job's tensor_parallel={tp} does not divide devices_per_node="
                                              f"{layout.devices_per_node}: a tensor-parallel group would span nodes")


# -- entrypoint of the training image ----------------------------------------------------------------------------

ENV_FIELDS = {"nodes": "MINDLOOM_NODES", "devices_per_node": "MINDLOOM_DEVICES_PER_NODE",
              "node_rank": "MINDLOOM_NODE_RANK", "master_addr": "MINDLOOM_MASTER_ADDR",
              "master_port": "MINDLOOM_MASTER_PORT", "log_dir": "MINDLOOM_MSRUN_LOG_DIR",
              "cluster_time_out": "MINDLOOM_CLUSTER_TIME_OUT", "bind_core": "MINDLOOM_BIND_CORE",
              "device": "MINDLOOM_DEVICE"}
NODE_RANK_FALLBACKS = ("JOB_COMPLETION_INDEX", "VC_TASK_INDEX")  # Kubernetes Indexed Job, Volcano


def _parse_value(name: str, raw: str, kind: type | str):
    if kind is int:
        try:
            return int(raw)
        except ValueError:
            raise LaunchError(name, f"must be an integer (got {raw!r})") from None
    if kind == "bind":
        low = raw.strip().lower()
        if low in ("true", "false", ""):
            return low == "true"
        try:
            return json.loads(raw)
        except json.JSONDecodeError as e:
            raise LaunchError(name, f"must be true, false or a JSON object ({e})") from None
    return raw


def layout_from_env(env: Mapping[str, str], overrides: Mapping | None = None) -> ClusterLayout:
    """Layout from ``MINDLOOM_*`` variables (see :data:`ENV_FIELDS`), then ``overrides``; errors name the variable."""
    kinds = {f.name: f.type for f in fields(ClusterLayout)}
    values: dict = {}
    for name, var in ENV_FIELDS.items():
        raw = env.get(var)
        if raw is None and name == "node_rank":
            var, raw = next(((v, env[v]) for v in NODE_RANK_FALLBACKS if env.get(v)), (var, None))
        if raw not in (None, ""):
            kind = int if kinds[name] == "int" else "bind" if name == "bind_core" else str
            values[name] = (var, _parse_value(var, raw, kind))
    for name, value in (overrides or {}).items():
        if value is not None:
            values[name] = (f"--{name.replace('_', '-')}", value)
    try:
        return ClusterLayout(**{k: v for k, (_, v) in values.items()})
    except LaunchError as e:
        base = e.field.split("[")[0]
        source = values[base][0] + e.field[len(base):] if base in values else e.field
        raise LaunchError(source, str(e).split(": ", 1)[1]) from None


def main(argv: list[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipeline.train.jobs.launcher",
                                 description="Validate a cluster layout and exec msrun for this node.")
    ap.add_argument("--job", help="TrainJob JSON (runs python -m pipeline.train --job JOB on every rank)")
    for name in ("nodes", "devices_per_node", "node_rank", "master_port", "cluster_time_out"):
        ap.add_argument(f"--{name.replace('_', '-')}", dest=name, type=int)
    for name in ("master_addr", "log_dir", "device"):
        ap.add_argument(f"--{name.replace('_', '-')}", dest=name)
    ap.add_argument("--dry-run", action="store_true", help="print the argv and the variables set, do not run")
    ap.add_argument("program", nargs=argparse.REMAINDER, help="after '--': the per-rank program")
    args = ap.parse_args(argv)
    env = dict(os.environ if env is None else env)
    program = args.program[1:] if args.program[:1] == ["--"] else args.program
    try:
        if bool(args.job) == bool(program):
            raise LaunchError("program", "give exactly one of --job JOB or '-- python ...'")
        layout = layout_from_env(env, {k: getattr(args, k) for k in ENV_FIELDS if k != "bind_core"})
        if args.job:
            check_job_layout(layout, args.job)
        launch = build_launch(layout, train_program(args.job) if args.job else program, base_env=env)
    except LaunchError as e:
        print(f"mindloom.launcher: error: {e}", file=sys.stderr)
        return 2
    if args.dry_run:
        changed = {k: v for k, v in launch.env.items() if env.get(k) != v}
        print(json.dumps({"argv": launch.argv, "env": changed, "global_ranks": list(layout.global_ranks)}))
        return 0
    os.execvpe(launch.argv[0], launch.argv, launch.env)
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main())
