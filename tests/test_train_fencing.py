"""Fenced job control with real trainer processes (``python -m pipeline.train`` and a two-rank ``msrun``):

* a second trainer on a running stage is refused and writes nothing; the first job's status stays RUNNING (under its
  job id) and ends SUCCEEDED;
* a job whose lease is taken away (another job claims the next generation) stops without another checkpoint,
  status or metrics write;
* a cancel request stops every rank of a two-rank job.

The jobs are paused with SIGSTOP at the moment under test, so the outcome does not depend on how fast this machine is.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import MSRUN_CRASH_ENV

pytest.importorskip("mindspore")

from bytes_data import BYTE_VOCAB, pack_bytes, stdlib_text, write_mindrecord  # noqa: E402

from pipeline.io import write_json  # noqa: E402
from pipeline.tasks.pretrain import job_state, launch_env  # noqa: E402
from pipeline.train.job import TrainJob  # noqa: E402
from pipeline.train.jobs.lease import CLAIMS, read_lease, request_cancel  # noqa: E402

SEQ = 32
TINY = {"preset": "debug", "vocab_size": BYTE_VOCAB, "dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2,
        "max_seq_len": SEQ}
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("mr")
    write_mindrecord(pack_bytes(stdlib_text("argparse"), SEQ), str(root / "big"), shards=2)
    return root / "big"


def _job(data, out: Path, **kw) -> Path:
    base = dict(stage="fence", data_dir=str(data), out_dir=str(out), model=TINY, steps=30, micro_batch=8, lr=3e-3,
                min_lr=3e-4, warmup_steps=3, checkpoint_every=2, keep_checkpoints=100, log_every=1, seed=7,
                metrics_every=1)
    base.update(kw)
    path = out.parent / f"{out.name}.json"
    TrainJob(**base).to_json(path)
    return path


def _start(job_path: Path, job_id: str, argv: list[str] | None = None, env: dict | None = None) -> subprocess.Popen:
    argv = argv or [sys.executable, "-m", "pipeline.train", "--job", str(job_path)]
    return subprocess.Popen(argv, cwd=str(job_path.parent), env={**launch_env(job_id), **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _wait(pred, proc: subprocess.Popen, timeout: float = 240.0, what: str = "") -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return
        if proc.poll() is not None:
            raise AssertionError(f"job ended ({proc.returncode}) before {what}: {proc.stderr.read()[-3000:]}")
        time.sleep(0.01)
    raise TimeoutError(what)


def _metric_rows(out: Path) -> list[dict]:
    path = out / "metrics.jsonl"
    return [json.loads(ln) for ln in path.read_text().splitlines()] if path.exists() else []


def _snapshot(out: Path) -> dict:
    """Every file of the stage folder that the job writes, with its bytes and mtime (the lease and claims aside)."""
    snap = {}
    for p in sorted(out.rglob("*")):
        if p.is_file() and p.name != "lease.json" and CLAIMS not in p.parts and p.suffix != ".log":
            snap[str(p.relative_to(out))] = (p.read_bytes(), p.stat().st_mtime_ns)
    return snap


@pytest.mark.slow
def test_a_second_trainer_is_refused_and_the_first_job_runs_on_to_success(data, tmp_path):
    out = tmp_path / "stage"
    job = _job(data, out)
    first = _start(job, "first-job")
    try:
        _wait(lambda: (_read(out / "status.json") or {}).get("state") == "RUNNING", first, what="RUNNING")
        first.send_signal(signal.SIGSTOP)      # the first job is mid-stage (it holds the lock) for as long as needed
        before = _snapshot(out)
        second = subprocess.run([sys.executable, "-m", "pipeline.train", "--job", str(job)], cwd=str(tmp_path),
                                env=launch_env("second-job"), capture_output=True, text=True, timeout=300)
        assert second.returncode == 3, second.stderr[-3000:]
        assert "StageBusy: stage folder" in second.stderr and "locked by job first-job" in second.stderr
        assert _snapshot(out) == before                          # the refused trainer wrote nothing at all
        st = job_state(out, job_id="first-job")
        assert st["state"] == "RUNNING" and st["job_id"] == "first-job"
    finally:
        first.send_signal(signal.SIGCONT)
    assert first.wait(timeout=600) == 0, first.stderr.read()[-3000:]
    st = job_state(out, job_id="first-job")
    assert (st["state"], st["step"], st["job_id"]) == ("SUCCEEDED", 30, "first-job")
    rows = _metric_rows(out)
    assert [r["step"] for r in rows] == list(range(1, 31)) and {r["job_id"] for r in rows} == {"first-job"}
    assert [p.name for p in (out / CLAIMS).iterdir()] == ["0000000001"]
    assert read_lease(out)["job_id"] == "first-job" and read_lease(out)["released"] is True


@pytest.mark.slow
def test_a_job_whose_lease_is_taken_stops_without_another_write(data, tmp_path):
    out = tmp_path / "stage"
    job = _job(data, out, steps=2000)
    proc = _start(job, "victim")
    try:
        # Pause right after a status write (step >= 4, checkpoints at 2 and 4), before the next step's writes.
        for _ in range(50):
            _wait(lambda: (_read(out / "status.json") or {}).get("step", 0) >= 4, proc, what="step 4")
            step = _read(out / "status.json")["step"]
            proc.send_signal(signal.SIGSTOP)
            time.sleep(0.05)
            quiet = not list(out.rglob("*.tmp*")) and len(_metric_rows(out)) == step
            if quiet and _read(out / "status.json")["step"] == step:
                break
            proc.send_signal(signal.SIGCONT)
        else:
            pytest.fail("could not pause the job between two steps")
        lease = read_lease(out)
        gen = lease["generation"] + 1        # another job takes the folder the way a trainer does: claim, then lease
        os.close(os.open(out / CLAIMS / f"{gen:010d}", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        thief = {"job_id": "thief", "generation": gen, "beat": 0, "host": socket.gethostname(), "pid": 1,
                 "released": False, "stop": None}
        write_json(out / "lease.json", thief)
        before = _snapshot(out)
        ckpts = sorted(p.name for p in (out / "checkpoints").glob("step_????????.ckpt"))
        assert ckpts and ckpts[-1] == f"step_{step - step % 2:08d}.ckpt"
    finally:
        proc.send_signal(signal.SIGCONT)
    t0 = time.time()
    rc = proc.wait(timeout=300)
    stopped_s = time.time() - t0
    err = proc.stderr.read()
    assert rc == 3, err[-3000:]
    assert "LeaseLost: job victim (rank 0) lost its lease" in err
    after = _snapshot(out)
    # The pause can land between the rename of the step's status.json and the fence after it (fenced.publish): the
    # job then takes that file back on resuming, as designed, and it is the one file allowed to be gone.
    withdrawn = set(before) - set(after)
    assert withdrawn <= {"status.json"}, withdrawn
    assert after == {k: v for k, v in before.items() if k not in withdrawn}   # no byte and no mtime changed
    assert read_lease(out) == thief          # nor was the other job's lease overwritten by a release
    if not withdrawn:
        assert _read(out / "status.json")["job_id"] == "victim" and _read(out / "status.json")["state"] == "RUNNING"
    print(f"lease taken at step {step}: the job stopped {stopped_s:.2f} s after it resumed")


@pytest.mark.slow
def test_cancel_stops_every_rank_of_a_two_rank_job(data, tmp_path):
    from pipeline.train.jobs.launch import train_command

    with socket.socket() as s_:
        s_.bind(("127.0.0.1", 0))
        port = s_.getsockname()[1]
    out = tmp_path / "stage"
    job = _job(data, out, steps=2000, micro_batch=4, world_size=2, checkpoint_every=1000)
    argv = train_command(str(job), workers=2, log_dir=str(tmp_path / "msrun_log"), master_port=port,
                         cluster_timeout_s=180)
    proc = _start(job, "dp-job", argv, MSRUN_CRASH_ENV)     # it ends cancelled, like a crash (conftest)
    try:
        _wait(lambda: (_read(out / "status.json") or {}).get("step", 0) >= 3, proc, timeout=400, what="step 3")
        t0 = time.time()
        request_cancel(out, "test: stop both ranks", job_id="dp-job")
        rc = proc.wait(timeout=180)
        stopped_s = time.time() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    logs = {r: (tmp_path / "msrun_log" / f"worker_{r}.log").read_text(errors="replace") for r in (0, 1)}
    assert rc != 0
    st = _read(out / "status.json")
    assert st["state"] == "FAILED" and "cancelled after step" in st["error"] and "stop both ranks" in st["error"]
    stops = [re.findall(r"JobCancelled: cancelled after step (\d+)", logs[r]) for r in (0, 1)]
    assert stops[0] and stops[0] == stops[1], (logs[0][-2000:], logs[1][-2000:])   # each rank stopped itself,
    assert f"cancelled after step {stops[0][0]}:" in st["error"]                    # both at the same step
    lease = read_lease(out)
    assert lease["released"] is True and lease["stop"].startswith("JobCancelled")
    ps = subprocess.run(["pgrep", "-f", str(job)], capture_output=True, text=True)
    assert ps.stdout.strip() == "", ps.stdout         # no rank left behind
    print(f"cancel stopped both ranks after step {stops[0][0]} in {stopped_s:.1f} s (rc {rc}), "
          f"rank 0's stop_after {lease['stop_after']}")


@pytest.mark.slow
def test_a_job_paused_between_fence_and_rename_leaves_nothing_after_a_takeover(data, tmp_path):
    """The step-4 save passes its fence, then the process stalls (``fail_mode="pause_after_fence"``) while another
    job takes the folder over. When it goes on, its rename is taken back: no step-4 file, sidecar or marker, the
    new holder's lease and the status row stay as they were, and the job stops with LeaseLost."""
    from pipeline.train.checkpoint import commit
    from pipeline.train.testing_hooks import PAUSED, RESUME

    out = tmp_path / "stage"
    job = _job(data, out, steps=8, fail_at_step=4, fail_mode="pause_after_fence")
    proc = _start(job, "stalled")
    try:
        _wait(lambda: (out / PAUSED).exists(), proc, what="the pause after the step-4 fence")
        gen = read_lease(out)["generation"] + 1
        adopted = [m["step"] for m in commit.committed(str(out))]
        assert adopted == [2]
        fd = os.open(out / CLAIMS / f"{gen:010d}", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        with os.fdopen(fd, "w") as fh:  # a claim as Lease._claim writes it: what the new job takes over as valid
            json.dump({"job_id": "new", "adopted_steps": adopted}, fh)
        new = {"job_id": "new", "generation": gen, "beat": 0, "host": "elsewhere", "pid": 1, "released": False,
               "stop": None}
        write_json(out / "lease.json", new)
        status = (out / "status.json").read_bytes()
        rows = _metric_rows(out)
    finally:
        (out / RESUME).touch()
    rc = proc.wait(timeout=300)
    err = proc.stderr.read()
    assert rc == 3, err[-3000:]
    assert "LeaseLost: job stalled" in err
    assert not list((out / "checkpoints").glob("step_00000004*")), sorted(os.listdir(out / "checkpoints"))
    assert not list((out / "checkpoints").glob(".step_*")) and not list(out.glob(".*.tmp"))
    assert [m["step"] for m in commit.committed(str(out))] == [2]
    assert read_lease(out) == new
    assert (out / "status.json").read_bytes() == status
    assert _metric_rows(out) == rows
