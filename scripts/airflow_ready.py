"""Wait for `airflow standalone` (started by `make airflow`) to be healthy, unpause `pretrain`, print URL and login.

`airflow standalone` prints a great deal while it starts, and the UI answers only when all four components are up,
so `make airflow` runs this next to it: it polls ``/api/v2/monitor/health`` and, once every component is healthy,
unpauses ``pretrain`` (a DAG created before ``is_paused_upon_creation=False`` existed, or paused by hand, would
drop the next corpus publish) and prints one banner with the URL and the login.  It exits with the deployment.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from pipeline.train.jobs.lease import pid_alive

COMPONENTS = ("metadatabase", "scheduler", "triggerer", "dag_processor")


def _healthy(base: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base}/api/v2/monitor/health", timeout=5) as r:
            health = json.load(r)
    except (OSError, ValueError):
        return False
    return all((health.get(c) or {}).get("status") == "healthy" for c in COMPONENTS)


def _unpause(dag_id: str) -> bool:
    airflow = str(Path(sys.executable).parent / "airflow")
    res = subprocess.run([airflow, "dags", "unpause", dag_id], capture_output=True, text=True,
                         stdin=subprocess.DEVNULL, timeout=120)
    return res.returncode == 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=8080)
    ap.add_argument("--watch-pid", type=int, default=0, help="exit when this process (airflow standalone) ends")
    ap.add_argument("--timeout", type=float, default=600)
    args = ap.parse_args(argv)
    base = f"http://127.0.0.1:{args.port}"
    deadline = time.time() + args.timeout
    while not _healthy(base):
        if args.watch_pid and not pid_alive(args.watch_pid):
            return 1
        if time.time() > deadline:
            print(f"mindloom: Airflow at {base} is not healthy after {args.timeout:.0f} s; see the output above",
                  flush=True)
            return 1
        time.sleep(2)
    while not _unpause("pretrain"):          # the DAG exists once the dag-processor has parsed it
        if time.time() > deadline or (args.watch_pid and not pid_alive(args.watch_pid)):
            print("mindloom: could not unpause pretrain; unpause it in the UI", flush=True)
            break
        time.sleep(3)
    line = "=" * 78
    print(f"\n{line}\nmindloom: Airflow is ready at {base}  (login admin / admin)\n"
          f"  corpus_build publishes the mindloom_corpus Asset; pretrain (unpaused) starts on every publish.\n"
          f"{line}\n", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
