"""Airflow on CeleryExecutor for end-to-end tests: Postgres, Redis, the four core components and two Celery workers.

Everything runs on 127.0.0.1 in throw-away folders and is stopped (process groups) and removed by ``stop()``:

- Postgres (``initdb``/``postgres`` from PATH or Debian's ``/usr/lib/postgresql/<v>/bin``): the metadata DB and the
  Celery result backend.  ``initdb`` refuses root, so as root the cluster belongs to ``nobody``.
- Redis (Debian's ``redis-server``): the Celery broker, no persistence.
- ``AirflowDeployment`` with ``CeleryExecutor`` plus the workers ``worker-data`` (``-q data,default``) and
  ``worker-train`` (``-q train``), routed by ``MINDLOOM_DATA_QUEUE=data`` / ``MINDLOOM_TRAIN_QUEUE=train``.

Both workers share this host, so each reports its Celery node name as the task instance ``hostname`` (through
``[core] hostname_callable`` = ``worker_hostname`` below): a task's REST record then names the worker that ran it, as
the machine's host name does on a real multi-host deployment.  A test can SIGKILL a worker and start it again with
``stack.airflow.kill_component("worker-train")`` / ``start_component("worker-train")``.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from airflow_services import AirflowDeployment, free_port

TESTS = Path(__file__).resolve().parent
HOST = "127.0.0.1"
# component name -> (queues, Celery node name, concurrency)
WORKERS = {"worker-data": ("data,default", "data@mindloom", 2), "worker-train": ("train", "train@mindloom", 1)}
UNPRIVILEGED = "nobody"


def worker_hostname() -> str:
    """``[core] hostname_callable`` of the test workers: the Celery node name this worker was started with."""
    return os.environ["MINDLOOM_WORKER_HOSTNAME"]


def pg_binary(name: str) -> str | None:
    """A Postgres server binary on PATH, else from Debian's versioned folder (the package keeps it off PATH)."""
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), key=lambda p: int(p.split("/")[4]))
    return candidates[-1] if candidates else None


def missing_services() -> str | None:
    """Why the Celery stack cannot start here (one line), or None."""
    missing = [n for n in ("initdb", "postgres") if not pg_binary(n)]
    missing += [n for n in ("redis-server",) if not shutil.which(n)]
    if missing:
        return (f"{', '.join(missing)} not found (Debian packages postgresql / redis-server; `make test` installs "
                "them when it runs as root with apt)")
    try:
        import celery  # noqa: F401
        import psycopg2  # noqa: F401
        import redis  # noqa: F401
    except ImportError as e:
        return f"Celery/Postgres client packages missing from the venv ({e}); run `make setup`"
    return None


def _wait_port(port: int, proc: subprocess.Popen, what: str, log: Path, timeout: float = 60) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}:\n{log.read_text(errors='replace')[-3000:]}")
        with socket.socket() as s:
            if s.connect_ex((HOST, port)) == 0:
                return
        time.sleep(0.3)
    raise TimeoutError(f"{what} not listening on {HOST}:{port} after {timeout} s")


def _stop_group(proc: subprocess.Popen | None, sig: int, timeout: float = 30) -> None:
    if proc is None:
        return
    try:
        os.killpg(proc.pid, sig)
        proc.wait(timeout=timeout)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


class Postgres:
    """A private cluster: unix socket in its folder, TCP on a free loopback port, trust auth, database ``airflow``."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="mindloom_pg_"))
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.user = UNPRIVILEGED if os.geteuid() == 0 else None

    @property
    def url(self) -> str:
        return f"postgresql+psycopg2://airflow@{HOST}:{self.port}/airflow"

    def start(self) -> None:
        if self.user:                       # initdb and postgres refuse to run as root
            shutil.chown(self.root, self.user)
        data, log = self.root / "data", self.root / "postgres.log"
        res = subprocess.run([pg_binary("initdb"), "-D", str(data), "-U", "airflow", "-A", "trust", "-E", "UTF8",
                              "--locale=C", "--no-sync"], capture_output=True, text=True, user=self.user,
                             stdin=subprocess.DEVNULL, timeout=120, cwd=self.root)
        if res.returncode:
            raise RuntimeError(f"initdb failed:\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}")
        with open(log, "wb") as out:
            if self.user:
                shutil.chown(log, self.user)
            # Durability off: a throw-away test cluster, and fsync on a loaded 2-core box costs minutes.
            self.proc = subprocess.Popen(
                [pg_binary("postgres"), "-D", str(data), "-p", str(self.port), "-h", HOST, "-k", str(self.root),
                 "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
                 "-c", "max_connections=200"],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, user=self.user,
                start_new_session=True, cwd=self.root)
        _wait_port(self.port, self.proc, "postgres", log)
        import psycopg2

        for _ in range(50):                 # listening is not yet accepting: retry through "starting up"
            try:
                conn = psycopg2.connect(host=HOST, port=self.port, user="airflow", dbname="postgres")
                break
            except psycopg2.OperationalError:
                time.sleep(0.3)
        else:
            raise TimeoutError(f"postgres refuses connections:\n{log.read_text(errors='replace')[-2000:]}")
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("CREATE DATABASE airflow")
        conn.close()

    def stop(self) -> None:
        _stop_group(self.proc, signal.SIGINT)   # SIGINT: fast shutdown (SIGTERM would wait for every client)
        shutil.rmtree(self.root, ignore_errors=True)


class Redis:
    """A broker without persistence on a free loopback port."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="mindloom_redis_"))
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    def start(self) -> None:
        log = self.root / "redis.log"
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                [shutil.which("redis-server"), "--port", str(self.port), "--bind", HOST, "--save", "",
                 "--appendonly", "no", "--dir", str(self.root), "--protected-mode", "yes"],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        _wait_port(self.port, self.proc, "redis-server", log)

    def stop(self) -> None:
        _stop_group(self.proc, signal.SIGTERM)
        shutil.rmtree(self.root, ignore_errors=True)


class CeleryStack:
    """Postgres + Redis + ``AirflowDeployment`` on CeleryExecutor with a ``data`` and a ``train`` worker."""

    def __init__(self, home: Path, config_path: Path, extra_env: dict[str, str] | None = None):
        self.postgres, self.redis = Postgres(), Redis()
        env = {"AIRFLOW__CELERY__BROKER_URL": self.redis.url,
               # db+postgresql:// alone picks psycopg 3 under SQLAlchemy 2.1; the driver installed is psycopg2.
               "AIRFLOW__CELERY__RESULT_BACKEND": "db+" + self.postgres.url,
               "AIRFLOW__CELERY__SYNC_PARALLELISM": "1",
               "AIRFLOW__CORE__PARALLELISM": "8",
               "MINDLOOM_DATA_QUEUE": "data", "MINDLOOM_TRAIN_QUEUE": "train",
               **(extra_env or {})}
        workers = {
            name: (["celery", "worker", "--queues", queues, "--celery-hostname", node, "--concurrency", str(slots),
                    "--skip-serve-logs"],     # the log server binds every interface; logs are read from the home
                   {"MINDLOOM_WORKER_HOSTNAME": node,
                    "AIRFLOW__CORE__HOSTNAME_CALLABLE": "celery_services.worker_hostname",
                    "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))})
            for name, (queues, node, slots) in WORKERS.items()}
        self.airflow = AirflowDeployment(home, config_path, env, executor="CeleryExecutor",
                                         db_url=self.postgres.url, extra_components=workers)
        self.airflow.commands["triggerer"] = (["triggerer", "--skip-serve-logs"], {})

    def start(self, timeout: float = 300) -> None:
        self.postgres.start()
        self.redis.start()
        self.airflow.start(timeout=timeout)
        for name in WORKERS:
            self.wait_worker(name)

    def restart_worker(self, name: str) -> None:
        """Start a (killed) worker again and wait until it consumes its queues."""
        log = self.airflow.home / f"{name}.log"
        since = log.stat().st_size if log.exists() else 0
        self.airflow.start_component(name)
        self.wait_worker(name, since=since)

    def wait_worker(self, name: str, since: int = 0, timeout: float = 180) -> None:
        """Until the worker's log (after byte ``since``) says its Celery node is ready: connected, consuming."""
        node = WORKERS[name][1]
        log = self.airflow.home / f"{name}.log"
        deadline = time.time() + timeout
        while time.time() < deadline:
            self.airflow.check_alive()
            if log.exists():
                with open(log, "rb") as fh:
                    fh.seek(since)
                    if f"{node} ready".encode() in fh.read():
                        return
            time.sleep(1)
        raise TimeoutError(f"{name} not ready after {timeout} s\n{self.airflow.logs_tail()}")

    def pids(self) -> set[int]:
        """Every live process of the stack: the components, Postgres, Redis and all their descendants."""
        import psutil

        roots = [p.pid for p in self.airflow.procs.values()]
        roots += [svc.proc.pid for svc in (self.postgres, self.redis) if svc.proc is not None]
        out: set[int] = set()
        for pid in roots:
            try:
                proc = psutil.Process(pid)
                out |= {pid, *(c.pid for c in proc.children(recursive=True))}
            except psutil.NoSuchProcess:
                pass
        return out

    def listening(self) -> list[tuple[str, int, str]]:
        """``(address, port, process name)`` of every TCP socket the stack listens on."""
        import psutil

        pids = self.pids()
        out = []
        for conn in psutil.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.pid in pids:
                try:
                    name = " ".join(psutil.Process(conn.pid).cmdline()[:3])
                except psutil.NoSuchProcess:
                    name = "?"
                out.append((conn.laddr.ip, conn.laddr.port, name))
        return out

    def stop(self) -> None:
        try:
            self.airflow.stop()
        finally:
            self.redis.stop()
            self.postgres.stop()
