"""Fenced publication (pipeline/train/jobs/fenced.py) and what readers make of a late writer: markers and metric rows
of a lease generation that a later one did not adopt are ignored (pipeline/train/checkpoint/commit.py); the lease's own
checks (no hostname shortcut, no-lock filesystems, a stale holder's late lease write, the stall timer)."""

from __future__ import annotations

import errno
import json
import os
import time

import pytest

from pipeline.io import write_json
from pipeline.train.checkpoint import commit
from pipeline.train.jobs import fenced
from pipeline.train.jobs.lease import CLAIMS, Lease, LeaseLost, StageBusy, boot_id, read_lease


def _lost():
    raise LeaseLost("another job took the folder")


def test_publish_takes_back_a_rename_made_after_the_lease_was_lost(tmp_path):
    dest = tmp_path / "status.json"
    write_json(dest, {"job": "new holder"})
    calls = []

    def fence():  # passes, then the takeover happens before the rename
        calls.append(1)
        if len(calls) > 1:
            _lost()

    with pytest.raises(LeaseLost):
        fenced.write_json(dest, {"job": "stalled"}, fence)
    assert not dest.exists()  # withdrawn: the stalled job's bytes are not left behind ...
    assert not list(tmp_path.glob(".*.tmp"))


def test_publish_never_withdraws_a_file_it_did_not_write(tmp_path):
    dest = tmp_path / "eval.json"
    calls = []

    def fence():
        calls.append(1)
        if len(calls) > 1:
            write_json(dest, {"job": "new holder"})  # the new holder renamed its own file in between
            _lost()

    with pytest.raises(LeaseLost):
        fenced.write_json(dest, {"job": "stalled"}, fence)
    assert json.loads(dest.read_text()) == {"job": "new holder"}
    with pytest.raises(LeaseLost):  # lost before the rename: nothing is renamed, the temp file is gone
        fenced.write_json(tmp_path / "x.json", {}, _lost)
    assert not (tmp_path / "x.json").exists() and not list(tmp_path.glob(".*.tmp"))


def _marker(out, step: int, generation: int | None) -> None:
    ck = out / "checkpoints"
    ck.mkdir(parents=True, exist_ok=True)
    for name in (f"step_{step:08d}.ckpt", f"step_{step:08d}.weights.ckpt"):
        (ck / name).write_bytes(b"x")
        (ck / f"{name}.sha256").write_text(f"00  {name}\n")
    commit.write_marker(str(out), step, {"tensor_parallel": 1, "data_parallel": 1, "zero_shards": 1}, 1,
                        job_id=f"job{generation}", generation=generation)


def _claim(out, gen: int, adopted) -> None:
    (out / CLAIMS).mkdir(parents=True, exist_ok=True)
    body = {"job_id": f"job{gen}"} if adopted is None else {"job_id": f"job{gen}", "adopted_steps": adopted}
    (out / CLAIMS / f"{gen:010d}").write_text(json.dumps(body))


def test_a_marker_no_later_generation_adopted_is_not_history(tmp_path):
    out = tmp_path / "s"
    _claim(out, 1, [])
    for step in (2, 4):
        _marker(out, step, 1)
    _claim(out, 2, [2, 4])        # job 2 took over with steps 2 and 4 as valid ...
    _marker(out, 6, 1)            # ... then job 1's late step-6 marker appeared
    _marker(out, 5, 2)
    assert [m["step"] for m in commit.committed(str(out))] == [5, 4, 2]
    assert commit.committed_steps(str(out)) == [6, 5, 4, 2]  # names alone cannot tell
    _claim(out, 3, None)          # a claim from before claims recorded what they adopted: no verdict from it
    assert [m["step"] for m in commit.committed(str(out))] == [5, 4, 2]
    rows = [{"step": s, "generation": 1} for s in range(1, 8)] + [{"step": 5, "generation": 2}]
    assert [(r["step"], r["generation"]) for r in commit.valid_rows(str(out), rows)] == [
        (1, 1), (2, 1), (3, 1), (4, 1), (5, 2)]


def test_a_lock_error_that_is_not_busy_falls_back_to_the_lease(tmp_path, monkeypatch, caplog):
    import fcntl

    real = fcntl.flock

    def no_locks(fh, op):
        if op & fcntl.LOCK_EX:
            raise OSError(errno.ENOLCK, "No locks available")
        return real(fh, op)

    monkeypatch.setattr(fcntl, "flock", no_locks)
    with Lease(tmp_path, heartbeat_s=60) as lease:
        assert not lease.locked and lease.generation == 1
        lease.fence()
    assert "flock is not available here (ENOLCK)" in caplog.text


def test_the_same_host_name_is_no_proof_that_the_holder_is_gone(tmp_path):
    """A lease that names this host but another kernel (a pod that reused the name) is watched like any other."""
    import socket

    write_json(tmp_path / "lease.json", {"job_id": "pod-a", "generation": 1, "beat": 7, "host": socket.gethostname(),
                                         "boot_id": "another-kernel", "pid": 1, "released": False})
    t0 = time.monotonic()
    with Lease(tmp_path, heartbeat_s=60, takeover_wait_s=1.0) as lease:
        assert time.monotonic() - t0 >= 1.0 and lease.generation == 2
    write_json(tmp_path / "lease.json", {"job_id": "same-kernel", "generation": 2, "beat": 7,
                                         "host": socket.gethostname(), "boot_id": boot_id(), "pid": 1,
                                         "released": False})
    t0 = time.monotonic()
    with Lease(tmp_path, heartbeat_s=60, takeover_wait_s=5.0) as lease:  # granted flock in this kernel: at once
        assert time.monotonic() - t0 < 4.0 and lease.generation == 3


def test_a_stale_holders_late_lease_write_does_not_take_the_folder(tmp_path):
    with Lease(tmp_path, heartbeat_s=60) as lease:
        gen = lease.generation
        write_json(tmp_path / "lease.json", {"job_id": "stalled", "generation": gen - 1, "beat": 99})
        lease.fence()  # an older generation's write: the claims decide, this job still holds the folder
        write_json(tmp_path / "lease.json", {"job_id": "newer", "generation": gen + 1, "beat": 0})
        with pytest.raises(LeaseLost, match="names job newer"):
            lease.fence()


def test_the_stall_timer_starts_with_the_first_step_not_with_the_lease(tmp_path, monkeypatch):
    import pipeline.train.jobs.lease as lease_mod

    ended = []
    monkeypatch.setattr(lease_mod.Lease, "_end", lambda self, msg, write=True: ended.append(msg))
    with Lease(tmp_path, heartbeat_s=0.05, stall_timeout_s=0.2) as lease:
        time.sleep(0.6)                # building the model, resuming: not a stall
        assert not ended
        lease.compiling()              # the first step (with its compile) starts now
        time.sleep(0.6)
        assert ended and ended[0].startswith("stalled: no step finished")
        assert read_lease(tmp_path)["compiling"] is True


def test_startup_refusal_still_names_the_holder(tmp_path):
    with Lease(tmp_path, heartbeat_s=60):
        with pytest.raises(StageBusy, match="is locked by job"):
            with Lease(tmp_path, heartbeat_s=60):
                pass
    assert os.path.exists(tmp_path / "lease.json")
