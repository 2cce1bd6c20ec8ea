"""Regenerate the README screenshots: a real deployment, the demo corpus config with a short training run.

    python scripts/screenshots.py docs/screenshots

Starts api-server, scheduler, dag-processor and triggerer on a free loopback port (throw-away home), triggers
``corpus_build`` from the UI form, waits for the Asset-triggered ``pretrain`` run, and captures the trigger form,
the run graphs and the run reports in headless Chromium.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from airflow_services import AirflowDeployment  # noqa: E402
from browser_flow import capture_run, trigger_from_form  # noqa: E402


def main(out: str) -> None:
    shots = Path(out)
    shots.mkdir(parents=True, exist_ok=True)
    home = Path(tempfile.mkdtemp(prefix="mindloom_shots_"))
    dep = AirflowDeployment(home / "airflow", REPO / "configs" / "default.yaml")
    try:
        dep.start()
        for dag_id in ("corpus_build", "pretrain"):
            dep.wait_for_dag(dag_id)
            dep.api("PATCH", f"/dags/{dag_id}", json={"is_paused": False})
        run_id = trigger_from_form(dep.base, "corpus_build", {"run_name": "screenshots"}, shots)
        assert dep.wait_run("corpus_build", run_id, timeout=900)["state"] == "success", dep.logs_tail()
        capture_run(dep.base, "corpus_build", run_id, shots)
        deadline, train_run = time.time() + 300, None
        while time.time() < deadline and not train_run:
            runs = dep.api("GET", "/dags/pretrain/dagRuns").json()["dag_runs"]
            train_run = next((r["dag_run_id"] for r in runs if r["run_type"] == "asset_triggered"), None)
            time.sleep(3)
        assert train_run and dep.wait_run("pretrain", train_run, timeout=900)["state"] == "success", dep.logs_tail()
        capture_run(dep.base, "pretrain", train_run, shots)
        print("\n".join(str(p) for p in sorted(shots.glob("*.png"))))
    finally:
        dep.stop()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "docs/screenshots")
