"""End-to-end training on real text (stdlib source as byte tokens) in MindRecord: learning, exact resume (after an
exception and after SIGKILL), corrupt-checkpoint fallback, init_from, GRAPH == PYNATIVE == recompute == gradient
accumulation, CLI failure reporting, two-rank msrun.

Each run is a tiny model (dim 64, 2 layers, seq 32) so a GRAPH compile takes a few seconds on 2 cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace

import pytest

pytest.importorskip("mindspore")

from bytes_data import BYTE_VOCAB, pack_bytes, stdlib_text, write_mindrecord  # noqa: E402

from pipeline.train.job import TrainJob  # noqa: E402

SEQ = 32
TINY = {"preset": "debug", "vocab_size": BYTE_VOCAB, "dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2,
        "max_seq_len": SEQ}
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Two MindRecord sets: 'big' (~3000 rows of argparse.py) and 'small' (40 rows -> 5 batches/epoch, so resume
    tests cross epoch boundaries and exercise the per-epoch reshuffle)."""
    root = tmp_path_factory.mktemp("mr")
    rows = pack_bytes(stdlib_text("argparse"), SEQ)
    write_mindrecord(rows, str(root / "big"), shards=2)
    write_mindrecord(rows[:40], str(root / "small"), shards=2)
    return root


def _job(data, out, **kw) -> TrainJob:
    base = dict(stage="test", data_dir=str(data / "small"), out_dir=str(out), model=TINY, steps=10, micro_batch=8,
                lr=3e-3, min_lr=3e-4, warmup_steps=3, checkpoint_every=5, keep_checkpoints=3, log_every=5, seed=7)
    base.update(kw)
    return TrainJob(**base)


def _metrics(out) -> dict[int, dict]:
    with open(os.path.join(out, "metrics.jsonl")) as f:
        rows = [json.loads(ln) for ln in f if ln.strip()]
    steps = [r["step"] for r in rows]
    assert steps == sorted(set(steps)), f"duplicate/unordered steps in metrics.jsonl: {steps}"
    return {r["step"]: r for r in rows}


def _read(path):
    with open(path) as f:
        return json.load(f)


def _train(job):
    from pipeline.train.trainer import run_training

    return run_training(job)


@pytest.fixture(scope="module")
def reference(data, tmp_path_factory):
    """An uninterrupted 10-step run on the small set that resume tests compare against."""
    out = tmp_path_factory.mktemp("ref")
    summary = _train(_job(data, out))
    return out, summary, _metrics(out)


def test_loss_decreases_and_outputs_are_written(data, tmp_path):
    out = tmp_path / "run"
    s = _train(_job(data, out, data_dir=str(data / "big"), steps=30, warmup_steps=5, checkpoint_every=10,
                    keep_checkpoints=2, peak_flops=1e9))
    m = _metrics(out)
    assert sorted(m) == list(range(1, 31))
    first = sum(m[i]["loss"] for i in range(1, 6)) / 5
    last = sum(m[i]["loss"] for i in range(26, 31)) / 5
    assert last < first - 1.0, (first, last)  # ~5.5 (ln 258) -> ~3 on byte-level Python source
    for k in ("step", "loss", "lr", "grad_norm", "loss_scale", "skipped", "tokens_per_s", "mfu", "step_time_s",
              "data_sha1"):
        assert k in m[30]
    assert m[30]["loss_scale"] == 1.0 and m[30]["skipped"] is False  # fp32: no loss scaling
    n_params = s["params"]  # MFU = 6 N tokens/s / (peak x world), peak_flops = 1e9 here
    assert m[30]["mfu"] == pytest.approx(6 * n_params * m[30]["tokens_per_s"] / 1e9)
    assert m[5]["lr"] == pytest.approx(3e-3) and m[30]["lr"] < m[10]["lr"]  # warmup peak, then cosine decay
    st = _read(out / "status.json")
    assert st["state"] == "SUCCEEDED" and st["step"] == 30 and st["pid"] == os.getpid() and st["error"] is None
    assert _read(out / "summary.json") == json.loads(json.dumps(s))
    assert s["resumed_from"] is None and s["steps"] == 30 and s["tokens"] == 30 * 8 * SEQ
    assert s["attention_impl"] == "math" and s["mode"] == "graph" and s["params"] > 0 and s["tokens_per_s"] > 0
    ckpts = sorted(os.listdir(out / "checkpoints"))
    assert ckpts == [f"step_000000{s}{kind}" for s in (20, 30) for kind in (
        ".ckpt", ".ckpt.sha256", ".commit.json", ".weights.ckpt", ".weights.ckpt.sha256")]
    assert s["checkpoint"] == str(out / "checkpoints" / "step_00000030.ckpt")
    marker = _read(out / "checkpoints" / "step_00000030.commit.json")  # one rank: a marker with rank count 1
    assert marker["ranks"] == 1 and marker["files"][0]["path"] == "checkpoints/step_00000030.ckpt"
    assert marker["files"][0]["sha256"] == (out / "checkpoints" / "step_00000030.ckpt.sha256").read_text().split()[0]
    assert marker["files"][0]["weights"] == {"path": "checkpoints/step_00000030.weights.ckpt", "sha256": (
        out / "checkpoints" / "step_00000030.weights.ckpt.sha256").read_text().split()[0]}
    assert s["commit"] == str(out / "checkpoints" / "step_00000030.commit.json")


@pytest.fixture(scope="module")
def crashed(data, tmp_path_factory):
    """A run that raised right after step 6 (checkpoints at 3 and 6); tests resume copies of it."""
    from pipeline.train.testing_hooks import SimulatedCrash

    out = tmp_path_factory.mktemp("crashed") / "run"
    job = _job(data, out, checkpoint_every=3, fail_at_step=6)
    with pytest.raises(SimulatedCrash):
        _train(job)
    return out, job


def _copy_of(crashed, dest):
    import shutil

    src, job = crashed
    shutil.copytree(src, dest)
    return replace(job, out_dir=str(dest))


def test_resume_after_crash_matches_uninterrupted(tmp_path, reference, crashed, caplog):
    _, ref_summary, ref = reference
    out = tmp_path / "crash"
    job = _copy_of(crashed, out)
    st = _read(out / "status.json")
    assert st["state"] == "FAILED" and st["step"] == 6 and "simulated crash" in st["error"]
    from mindspore.log import _get_logger

    ms_logger = _get_logger()                  # MindSpore's own logger does not propagate to the root
    ms_logger.addHandler(caplog.handler)
    try:
        s = _train(replace(job, fail_at_step=None))  # the job again, as a retrying orchestrator would
    finally:
        ms_logger.removeHandler(caplog.handler)
    assert s["resumed_from"] == 6 and s["start_step"] == 6
    assert "not loaded" not in caplog.text     # the LR table is the job's own, on purpose (no warning)
    m = _metrics(out)
    assert sorted(m) == list(range(1, 11))
    for step in range(1, 11):  # includes step 7, the first one after the restore (epoch 0 -> 1 boundary at 5)
        assert m[step]["loss"] == pytest.approx(ref[step]["loss"], abs=1e-4), step
        assert m[step]["data_sha1"] == ref[step]["data_sha1"], step  # the same samples, in the same order
    assert s["final_loss"] == pytest.approx(ref_summary["final_loss"], abs=1e-4)
    assert _read(out / "status.json")["state"] == "SUCCEEDED"
    from pipeline.train.checkpoint.checkpoint import load_file

    _, meta = load_file(str(out / "checkpoints" / "step_00000006.ckpt"))
    assert meta["ms_rng_state"].shape == (16,) and meta["numpy_rng_keys"].shape == (624,)
    assert (meta["data_epoch"], meta["data_sample"], meta["data_consumed"]) == (1, 8, 48)


def test_corrupt_newest_checkpoint_falls_back(tmp_path, reference, crashed):
    _, _, ref = reference
    out = tmp_path / "corrupt"
    job = _copy_of(crashed, out)
    newest = out / "checkpoints" / "step_00000006.ckpt"
    raw = bytearray(newest.read_bytes())
    raw[len(raw) // 2: len(raw) // 2 + 64] = b"\xff" * 64  # bit rot inside the tensors
    newest.write_bytes(bytes(raw))
    s = _train(replace(job, fail_at_step=None))
    assert s["resumed_from"] == 3
    m = _metrics(out)
    for step in range(4, 11):
        assert m[step]["loss"] == pytest.approx(ref[step]["loss"], abs=1e-4), step


def test_init_from_loads_weights_only(data, tmp_path, reference):
    ref_out, ref_summary, ref = reference
    out = tmp_path / "stage2"
    s = _train(_job(data, out, steps=2, init_from=ref_summary["checkpoint"], stage="stage2"))
    assert s["resumed_from"] is None and s["init_from"] == ref_summary["checkpoint"]
    assert s["first_loss"] < ref[1]["loss"] - 1.0  # starts from the trained weights, not from scratch
    bad = _job(data, tmp_path / "bad", steps=2, init_from=str(tmp_path / "missing.ckpt"))
    with pytest.raises(FileNotFoundError, match="init_from"):
        _train(bad)
    assert _read(tmp_path / "bad" / "status.json")["state"] == "FAILED"


def test_pynative_matches_graph(data, tmp_path, reference):
    _, _, ref = reference
    out = tmp_path / "pyn"
    _train(_job(data, out, steps=3, mode="pynative"))
    m = _metrics(out)
    for step in (1, 2, 3):  # different LR table (steps=3) only changes lr after warmup; warmup=3 covers all
        assert m[step]["loss"] == pytest.approx(ref[step]["loss"], abs=1e-4)


def test_recompute_leaves_losses_unchanged(data, tmp_path, reference):
    _, _, ref = reference
    out = tmp_path / "recompute"
    s = _train(_job(data, out, steps=3, model={**TINY, "recompute": True}))
    assert s["recompute"] is True
    m = _metrics(out)
    for step in (1, 2, 3):
        assert m[step]["loss"] == pytest.approx(ref[step]["loss"], abs=1e-4)


def test_gradient_accumulation_equals_the_big_batch(data, tmp_path, reference):
    """2 micro-batches of 4 rows == 1 batch of 8 rows (same rows, same update) over all 10 steps."""
    _, _, ref = reference
    out = tmp_path / "accum"
    s = _train(_job(data, out, micro_batch=4, grad_accum=2))
    assert s["global_batch"] == 8 and s["tokens"] == 10 * 8 * SEQ
    m = _metrics(out)
    for step in range(1, 11):
        assert m[step]["data_sha1"] == ref[step]["data_sha1"], step
        assert m[step]["loss"] == pytest.approx(ref[step]["loss"], abs=2e-4), step
        assert m[step]["grad_norm"] == pytest.approx(ref[step]["grad_norm"], rel=1e-3), step


@pytest.mark.slow
def test_resume_after_sigkill(data, tmp_path, reference):
    """A hard kill (no exception handler runs) after step 8 with the last checkpoint at 6: status stays RUNNING, the
    orchestrator sees LOST, metrics rows 7-8 are rewritten by the resumed run, and every step matches."""
    from pipeline.tasks.pretrain import job_state

    _, _, ref = reference
    out = tmp_path / "kill"
    job = _job(data, out, checkpoint_every=6, fail_at_step=8, fail_mode="kill")
    job.to_json(tmp_path / "kill.json")
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-m", "pipeline.train", "--job", str(tmp_path / "kill.json")],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert r.returncode == -9, r.stderr[-2000:]
    assert _read(out / "status.json")["state"] == "RUNNING" and job_state(out)["state"] == "LOST"
    assert sorted(_metrics(out)) == list(range(1, 9))
    s = _train(replace(job, fail_at_step=None))
    assert s["resumed_from"] == 6
    m = _metrics(out)
    assert sorted(m) == list(range(1, 11))
    for step in range(1, 11):
        assert m[step]["loss"] == pytest.approx(ref[step]["loss"], abs=1e-4), step
        assert m[step]["data_sha1"] == ref[step]["data_sha1"], step


def test_cli_failure_is_one_clear_line(data, tmp_path):
    out = tmp_path / "cli"
    job = _job(data, out, data_dir=str(tmp_path / "nope"))
    job_path = tmp_path / "job.json"
    job.to_json(job_path)
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-m", "pipeline.train", "--job", str(job_path)], capture_output=True,
                       text=True, env=env, cwd=tmp_path, timeout=120)
    assert r.returncode == 1
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("mindloom.train: error: FileNotFoundError:") and "nope" in last
    assert "Traceback" not in r.stderr
    st = _read(out / "status.json")
    assert st["state"] == "FAILED" and "nope" in st["error"]
    # invalid job file: also exit 1 with the field named
    job_path.write_text(json.dumps({"stage": "x", "data_dir": "d", "out_dir": str(out), "steps": 0}))
    r = subprocess.run([sys.executable, "-m", "pipeline.train", "--job", str(job_path)], capture_output=True,
                       text=True, env=env, cwd=tmp_path, timeout=60)
    assert r.returncode == 1 and "TrainJob.steps=0" in r.stderr.strip().splitlines()[-1]


@pytest.mark.slow
def test_msrun_data_parallel_equals_single_process(data, tmp_path):
    """2 ranks x batch 4 (msrun, mccl, rank-sharded MindDataset, DistributedGradReducer) == 1 process x batch 8
    (losses within 1e-4): sharding happens after the global shuffle, so the two ranks see exactly the rows of the
    single big batch; both ranks end with bit-identical parameters (sha256 per rank)."""
    import socket

    from pipeline.train.jobs.launch import env_with_venv, train_command

    with socket.socket() as s_:
        s_.bind(("127.0.0.1", 0))
        port = s_.getsockname()[1]
    big = str(data / "big")
    dp = _job(data, tmp_path / "dp", data_dir=big, steps=6, micro_batch=4, checkpoint_every=3, world_size=2,
              eval_data={"code": str(data / "small")}, eval_tokens=4 * SEQ)
    dp.to_json(tmp_path / "dp.json")
    cmd = train_command(str(tmp_path / "dp.json"), workers=2, log_dir=str(tmp_path / "msrun_log"), master_port=port,
                        cluster_timeout_s=180)
    env = env_with_venv()
    env.pop("MS_DEV_HOST_BLOCKING_RUN", None)  # the trainer sets it for a CPU job itself (not this test's conftest)
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])
    s = _read(tmp_path / "dp" / "summary.json")
    assert s["host_dispatch"] == "inline"
    assert s["world_size"] == 2 and s["steps"] == 6 and s["tokens"] == 6 * 2 * 4 * SEQ
    ranks = [_read(tmp_path / "dp" / "ranks" / f"rank_{r:05d}.json") for r in (0, 1)]
    assert ranks[0]["step"] == ranks[1]["step"] == 6
    assert ranks[0]["params_sha256"] == ranks[1]["params_sha256"]  # bit-identical weights on both ranks
    assert s["eval"]["per_domain"]["code"]["tokens"] == 4 * SEQ
    single = tmp_path / "single"
    _train(_job(data, single, data_dir=big, steps=6, micro_batch=8, checkpoint_every=3))
    a, b = _metrics(tmp_path / "dp"), _metrics(single)
    for step in range(1, 7):  # same global batch of rows; only the float summation order differs
        assert a[step]["loss"] == pytest.approx(b[step]["loss"], abs=1e-4), step
