"""A two-node Slurm cluster on loopback for tests and the demo: munge, one slurmctld, two slurmd (``-N node1/2``).

Debian's ``slurm-wlm`` builds slurmd with multiple-slurmd support, so two Slurm nodes share this machine (both
``NodeAddr=127.0.0.1``, distinct ports). Everything lives in one scratch folder (``--root``): state, spool, logs,
pid files and the ``slurm.conf`` itself (``SLURM_CONF`` points the clients at it; nothing under ``/etc/slurm`` is
touched). ``start`` is idempotent (an answering controller with both nodes idle is left alone) and prints the
``SLURM_CONF`` to export; ``stop`` lets the jobs end, then kills the daemons by their pid files. Needs root (the
daemons run as root) and ``apt-get install slurm-wlm munge``.

    python scripts/slurm_local.py start --root /tmp/mindloom-slurm     # prints SLURM_CONF=/tmp/.../slurm.conf
    python scripts/slurm_local.py stop --root /tmp/mindloom-slurm
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

NODES = ("node1", "node2")
CTLD_PORT, SLURMD_PORTS = 16817, (17001, 17002)
MUNGE_KEY = Path("/etc/munge/munge.key")


def conf_text(root: Path, cpus: int, mem_mb: int) -> str:
    host = socket.gethostname().split(".")[0]
    nodes = "\n".join(f"NodeName={n} NodeHostname={host} NodeAddr=127.0.0.1 Port={p} CPUs={cpus} "
                      f"RealMemory={mem_mb} State=UNKNOWN" for n, p in zip(NODES, SLURMD_PORTS, strict=True))
    return f"""ClusterName=mindloom
SlurmctldHost={host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.%n.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.%n.log
SlurmctldPort={CTLD_PORT}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
ReturnToService=2
MinJobAge=3600
KillWait=10
{nodes}
PartitionName=debug Nodes={','.join(NODES)} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
"""


def _env(root: Path) -> dict:
    return {**os.environ, "SLURM_CONF": str(root / "slurm.conf")}


def _run(argv, root: Path, check: bool = False, timeout: float = 20) -> subprocess.CompletedProcess:
    return subprocess.run(argv, env=_env(root), capture_output=True, text=True, timeout=timeout, check=check)


def _ready(root: Path) -> bool:
    try:
        out = _run(["sinfo", "-h", "-N", "-o", "%N %t"], root).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return False
    states = dict(zip(out[::2], out[1::2], strict=False))
    return all(states.get(n, "").rstrip("*") in ("idle", "mix", "alloc") for n in NODES)


def running(root: Path) -> bool:
    """Whether a cluster under ``root`` answers with both nodes up."""
    return (root / "slurm.conf").exists() and _ready(root.resolve())


def start_munge() -> None:
    if subprocess.run(["sh", "-c", "munge -n | unmunge"], capture_output=True).returncode == 0:
        return
    if not MUNGE_KEY.exists():
        MUNGE_KEY.parent.mkdir(parents=True, exist_ok=True)
        MUNGE_KEY.write_bytes(os.urandom(1024))
    for d in ("/etc/munge", "/run/munge", "/var/log/munge", "/var/lib/munge"):
        os.makedirs(d, exist_ok=True)
        shutil.chown(d, "munge", "munge")
    shutil.chown(MUNGE_KEY, "munge", "munge")
    MUNGE_KEY.chmod(0o400)
    subprocess.run(["su", "-s", "/bin/sh", "munge", "-c", "/usr/sbin/munged"], check=True)
    for _ in range(50):
        if subprocess.run(["sh", "-c", "munge -n | unmunge"], capture_output=True).returncode == 0:
            return
        time.sleep(0.1)
    raise RuntimeError("munged started but munge -n | unmunge fails")


def start(root: Path, cpus: int = 0, mem_mb: int = 8000, wait_s: float = 60) -> Path:
    """Start (or find running) the cluster under ``root``; returns the path of its slurm.conf (see
    :func:`running` to tell whether it was already up)."""
    for tool in ("slurmctld", "slurmd", "munged", "sbatch"):
        if not shutil.which(tool) and not os.path.exists(f"/usr/sbin/{tool}"):
            raise RuntimeError(f"{tool} not found: apt-get install slurm-wlm munge")
    root = root.resolve()
    if _ready(root):
        cancel_orphans(root)
        return root / "slurm.conf"
    for d in ("state", "spool", "log"):
        (root / d).mkdir(parents=True, exist_ok=True)
    (root / "slurm.conf").write_text(conf_text(root, cpus or os.cpu_count() or 2, mem_mb))
    start_munge()
    env = _env(root)
    subprocess.run(["slurmctld"], env=env, check=True)
    for n in NODES:
        subprocess.run(["slurmd", "-N", n], env=env, check=True)
    deadline = time.time() + wait_s
    while time.time() < deadline:
        if _ready(root):
            cancel_orphans(root)      # jobs recovered from the saved state whose folders are gone
            return root / "slurm.conf"
        time.sleep(0.5)
    log = (root / "log" / "slurmctld.log").read_text(errors="replace")[-2000:] if (root / "log").exists() else ""
    raise RuntimeError(f"the Slurm nodes did not become idle within {wait_s:.0f} s; slurmctld.log ends:\n{log}")


def cancel_orphans(root: Path) -> list[str]:
    """scancel every job whose working folder no longer exists, and return their ids.

    Such a job belongs to no one: a test's temporary folder was deleted while its job still ran (its test process
    was killed, then pytest pruned the folder). Left alone, a job Slurm still counts as RUNNING holds both nodes,
    and every later job waits behind it for ever."""
    try:
        out = _run(["squeue", "-h", "-o", "%i %Z"], root).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    gone = [job for job, _, folder in (line.partition(" ") for line in out.splitlines() if line.strip())
            if folder and not Path(folder).is_dir()]
    if gone:
        _run(["scancel", *gone], root)
    return gone


def _jobs(root: Path) -> list[str]:
    """The ids of the jobs Slurm still lists (pending, running or completing); none when it does not answer."""
    try:
        return _run(["squeue", "-h", "-o", "%i"], root, timeout=10).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return []


def queue(root: Path) -> str:
    """``squeue``'s view of the cluster, for an error message."""
    try:
        return _run(["squeue", "-o", "%i %T %r %M %Z"], root).stdout
    except (OSError, subprocess.SubprocessError) as e:
        return f"squeue failed: {e}"


def stop(root: Path, drain_s: float = 120) -> None:
    """Let the cluster's jobs end (up to ``drain_s``), scancel what is left and wait for it to leave the queue, then
    kill the daemons by their pid files. Stopping slurmctld under a job that is still exiting saves it as RUNNING;
    the next start recovers it so, with no process behind it, and it holds both nodes for ever."""
    deadline = time.time() + drain_s
    cancelled = False
    while (jobs := _jobs(root)) and time.time() < deadline + 30:
        if time.time() >= deadline and not cancelled:
            _run(["scancel", *jobs], root)
            cancelled = True
        time.sleep(0.5)
    for pid_file in sorted(root.glob("slurmd.*.pid")) + [root / "slurmctld.pid"]:
        try:
            os.kill(int(pid_file.read_text().strip()), signal.SIGTERM)
        except (OSError, ValueError):
            pass


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("action", choices=("start", "stop"))
    ap.add_argument("--root", default=os.environ.get("MINDLOOM_SLURM_ROOT", "/tmp/mindloom-slurm"))
    ap.add_argument("--cpus", type=int, default=0)
    args = ap.parse_args(argv)
    root = Path(args.root)
    if args.action == "stop":
        stop(root)
        return 0
    try:
        conf = start(root, args.cpus)
    except (RuntimeError, subprocess.CalledProcessError) as e:
        print(f"slurm_local: {e}", file=sys.stderr)
        return 1
    print(f"SLURM_CONF={conf}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
