"""Drive the compose stack over REST: corpus_build, then the Asset-triggered pretrain, both to success.

Run by tests/docker_stack/run.sh (not collected by pytest: `make test` has no Docker).  Subcommands:
  config HOST_DIR CONTAINER_DIR   write the tiny config (tests/conftest.py tiny_config) with container paths
  run API_URL PASSWORD            log in, unpause, trigger, wait, check where tasks ran; exit 1 on failure
  host-ports                      stdin -> stdout: a rendered compose model without `ports:` on host-network
                                  services (compose v1 cannot unset a list in an override, and the engine refuses
                                  published ports on host networking)
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from conftest import prose_records, stdlib_records, write_jsonl  # noqa: E402


def write_config(host_dir: Path, container_dir: str) -> None:
    """tiny_config's corpus and settings, but paths as the containers see them (host_dir is mounted there)."""
    import yaml

    write_jsonl(host_dir / "in" / "code.jsonl", stdlib_records(12))
    prose = prose_records(40)
    write_jsonl(host_dir / "in" / "prose.jsonl", prose + prose[:3])
    cfg = {
        "run_name": "docker", "seed": 7, "data_root": f"{container_dir}/run",
        "sources": [{"domain": "code", "paths": [f"{container_dir}/in/code.jsonl"]},
                    {"domain": "prose", "paths": [f"{container_dir}/in/prose.jsonl"]}],
        "ingest": {"docs_per_shard": 20},
        "tokenizer": {"vocab_size": 600, "sample_chars": 200_000},
        "pack": {"seq_len": 32, "shard_num": 2},
        "train": {"steps": 12, "batch_size": 4, "warmup_steps": 2, "checkpoint_every": 4,
                  "model_overrides": {"dim": 64, "n_layers": 2, "n_heads": 2, "n_kv_heads": 1, "multiple_of": 16}},
    }
    (host_dir / "mindloom.yaml").write_text(yaml.safe_dump(cfg), encoding="utf-8")


class Api:
    def __init__(self, base: str, password: str):
        r = httpx.post(f"{base}/auth/token", json={"username": "admin", "password": password}, timeout=30)
        r.raise_for_status()
        self.base, self.headers = f"{base}/api/v2", {"Authorization": f"Bearer {r.json()['access_token']}"}

    def __call__(self, method: str, path: str, **kw) -> httpx.Response:
        return httpx.request(method, self.base + path, headers=self.headers, timeout=60, **kw)

    def wait(self, what: str, probe, timeout: float):
        deadline = time.time() + timeout
        while time.time() < deadline:
            got = probe()
            if got:
                return got
            time.sleep(3)
        raise TimeoutError(f"{what}: not done after {timeout:.0f} s")


def run_state(api: Api, dag_id: str, run_id: str) -> str | None:
    state = api("GET", f"/dags/{dag_id}/dagRuns/{run_id}").json().get("state")
    return state if state in ("success", "failed") else None


def task_summary(api: Api, dag_id: str, run_id: str) -> list[dict]:
    tis = api("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances", params={"limit": 1000}).json()
    return [{k: ti.get(k) for k in ("task_id", "map_index", "state", "queue", "try_number")}
            for ti in tis["task_instances"]]


def check_run(api: Api, dag_id: str, run_id: str, timeout: float) -> list[dict]:
    state = api.wait(f"{dag_id} {run_id}", lambda: run_state(api, dag_id, run_id), timeout)
    tis = task_summary(api, dag_id, run_id)
    bad = [t for t in tis if t["state"] not in ("success", "skipped")]
    if state != "success" or bad:
        raise SystemExit(f"{dag_id} {run_id}: run {state}; tasks not successful: {json.dumps(bad)}")
    queues = sorted({t["queue"] for t in tis})
    print(f"{dag_id} {run_id}: success, {len(tis)} task instances on queues {queues}", flush=True)
    return tis


def drive(base: str, password: str) -> None:
    api = Api(base, password)
    for dag_id in ("corpus_build", "pretrain"):
        api.wait(f"DAG {dag_id} parsed", lambda d=dag_id: api("GET", f"/dags/{d}").status_code == 200, 300)
        r = api("PATCH", f"/dags/{dag_id}", json={"is_paused": False})
        r.raise_for_status()
    errors = api("GET", "/importErrors").json()
    if errors["total_entries"]:
        raise SystemExit(f"import errors: {errors}")
    r = api("POST", "/dags/corpus_build/dagRuns", json={"dag_run_id": "docker_stack", "logical_date": None})
    r.raise_for_status()
    corpus = check_run(api, "corpus_build", "docker_stack", 1200)
    # The publish task's Asset event starts pretrain (run_type asset_triggered); nothing triggers it by hand.
    runs = api.wait("asset-triggered pretrain run", lambda: [
        r for r in api("GET", "/dags/pretrain/dagRuns").json()["dag_runs"] if r["run_type"] == "asset_triggered"],
        120)
    from urllib.parse import quote
    train = check_run(api, "pretrain", quote(runs[0]["dag_run_id"], safe=""), 1800)
    # Routing: data tasks went to the `data` queue (the data worker), training stages to `train` (the only
    # worker whose image has MindSpore); unrouted tasks to `default`.
    assert {t["queue"] for t in corpus} <= {"data", "default"}, corpus
    assert any(t["queue"] == "train" for t in train), train
    print("stack run: corpus_build and asset-triggered pretrain succeeded on Celery workers in containers")


def drop_host_ports(text: str) -> str:
    import yaml

    model = yaml.safe_load(text)
    for svc in model["services"].values():
        if svc.get("network_mode") == "host":
            svc.pop("ports", None)
    return yaml.safe_dump(model, sort_keys=False)


if __name__ == "__main__":
    if sys.argv[1] == "host-ports":
        sys.stdout.write(drop_host_ports(sys.stdin.read()))
    elif sys.argv[1] == "config":
        write_config(Path(sys.argv[2]), sys.argv[3])
    elif sys.argv[1] == "run":
        drive(sys.argv[2], sys.argv[3])
    else:
        raise SystemExit(__doc__)
