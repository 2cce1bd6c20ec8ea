"""Megatron's distributed optimizer on CPU (fp16 O2 in GRAPH mode, msrun + mccl): 16-bit weights and gradients,
fp32 master weights and Adam moments sharded over 2 data-parallel ranks, against the unsharded optimizer.

Tiny model of test_train_parallel (dim 64, 2 layers, vocab 260, seq 32), 20 steps at lr 3e-3 with warmup, clipping
and dynamic loss scaling from 2^12 (no overflow on this data). Stated tolerances (measured on this CPU): sharded
(2 ranks x 4 rows, fp32 gradient all-reduce) vs unsharded (1 process x 8 rows, same optimizer): every loss within
5e-4 (measured 9.7e-5); distributed optimizer (16-bit weights, fp32 master) vs classic mixed precision (fp32 weights,
fp16 compute): within 1e-3 (measured 5.2e-5). They differ only by fp16 rounding (the half batches' fp16 forward and
backward; master weights that start from the 16-bit weights); the gradients are summed over the ranks in fp32.

A second sharded run starts at loss scale 2^24, so its first steps overflow in fp16 and are skipped. Each rank checks
only its own block of the gradient; without the world all-reduce of the finite flag one rank would skip a step whose
all-gather the other enters (a hang), or the ranks' weights would differ.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess

import numpy as np
import pytest
from conftest import LONG_FIXTURE, MSRUN_CRASH_ENV

from pipeline.configkit import ConfigError
from pipeline.train.config import TrainConfig
from pipeline.train.job import TrainJob

pytestmark = LONG_FIXTURE

SEQ, STEPS = 32, 20
TINY = {"preset": "debug", "vocab_size": 260, "dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2,
        "max_seq_len": SEQ}
N_PARAMS = 131_904
NORMS = (2 * TINY["n_layers"] + 1) * TINY["dim"]  # 1-D gains: rows 64 divide by 2, so sharded too


def test_distributed_optimizer_needs_zero_and_16_bit():
    with pytest.raises(ConfigError, match=r"^train\.distributed_optimizer: needs train\.zero=true"):
        TrainConfig(distributed_optimizer=True, precision="fp16")
    with pytest.raises(ConfigError, match=r"^train\.distributed_optimizer: needs train\.precision fp16 or bf16"):
        TrainConfig(distributed_optimizer=True, zero=True)
    with pytest.raises(ValueError, match=r"^TrainJob\.distributed_optimizer=True: needs zero=true"):
        TrainJob(stage="s", data_dir="d", out_dir="o", distributed_optimizer=True, zero=True)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    pytest.importorskip("mindspore")
    from bytes_data import pack_bytes, stdlib_text, write_mindrecord

    from pipeline.train.jobs.launch import env_with_venv, train_command
    from pipeline.train.trainer import run_training

    root = tmp_path_factory.mktemp("distopt")
    write_mindrecord(pack_bytes(stdlib_text("argparse"), SEQ), str(root / "data"), shards=2)

    def job(name, **kw):
        base = dict(stage=name, data_dir=str(root / "data"), out_dir=str(root / name), model=TINY, steps=STEPS,
                    micro_batch=8, lr=3e-3, min_lr=3e-4, warmup_steps=3, checkpoint_every=10, log_every=5, seed=7,
                    metrics_every=5, precision="fp16", loss_scale=2.0 ** 12)
        base.update(kw)
        return TrainJob(**base)

    out = {"classic": (run_training(job("classic")), root / "classic"),
           "unsharded": (run_training(job("unsharded", zero=True, distributed_optimizer=True)), root / "unsharded")}
    for name, kw in (("sharded", {}), ("overflow", {"loss_scale": 2.0 ** 24}),
                     ("sharded_accum", {"micro_batch": 1, "grad_accum": 4}),
                     ("sharded_accum_micro", {"micro_batch": 1, "grad_accum": 4, "grad_reduce": "micro_batch"})):
        job(name, **{"zero": True, "distributed_optimizer": True, "world_size": 2, "micro_batch": 4, **kw}).to_json(
            root / f"{name}.json")
        with socket.socket() as s_:
            s_.bind(("127.0.0.1", 0))
            port = s_.getsockname()[1]
        cmd = train_command(str(root / f"{name}.json"), workers=2, log_dir=str(root / f"{name}_log"),
                            master_port=port, cluster_timeout_s=180)
        r = subprocess.run(cmd, capture_output=True, text=True, env=env_with_venv(), cwd=root, timeout=600)
        assert r.returncode == 0, (name, r.stdout[-2000:], r.stderr[-2000:])
        with open(root / name / "summary.json") as f:
            out[name] = (json.load(f), root / name)
    return out


def _metrics(out_dir, n: int = STEPS) -> list[dict]:
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        rows = [json.loads(ln) for ln in f if ln.strip()]
    assert [r["step"] for r in rows] == list(range(1, n + 1))
    return rows


def _rank(out_dir, r: int) -> dict:
    with open(os.path.join(out_dir, "ranks", f"rank_{r:05d}.json")) as f:
        return json.load(f)


@pytest.mark.slow
def test_sharded_16bit_optimizer_matches_the_unsharded_one_over_20_steps(runs):
    one, two = _metrics(runs["unsharded"][1]), _metrics(runs["sharded"][1])
    assert [r["skipped"] for r in two] == [r["skipped"] for r in one]
    diff = np.abs(np.array([r["loss"] for r in one]) - np.array([r["loss"] for r in two]))
    assert diff.max() < 5e-4, diff
    assert one[-1]["loss"] < one[0]["loss"] - 1.0  # it trained
    r0, r1 = _rank(runs["sharded"][1], 0), _rank(runs["sharded"][1], 1)
    assert r0["params_sha256"] == r1["params_sha256"]  # the 16-bit gathers left identical replicas


@pytest.mark.slow
def test_overflow_is_one_decision_for_every_rank(runs):
    """Skipped steps halve the scale and leave the LR schedule alone; both ranks end with the same weights."""
    from pipeline.train.optim.optim import lr_at

    rows = _metrics(runs["overflow"][1])
    skipped = [r["skipped"] for r in rows]
    assert skipped[:2] == [True, True] and not all(skipped), skipped
    scale, applied = 2.0 ** 24, 0
    for r in rows:
        assert r["loss_scale"] == scale and r["lr"] == pytest.approx(lr_at(applied, 3e-3, 3e-4, 3, STEPS)), r
        scale, applied = (scale / 2, applied) if r["skipped"] else (scale, applied + 1)
    r0, r1 = _rank(runs["overflow"][1], 0), _rank(runs["overflow"][1], 1)
    assert r0["params_sha256"] == r1["params_sha256"]
    assert rows[-1]["loss"] < rows[0]["loss"] - 0.5


@pytest.mark.slow
def test_distributed_optimizer_matches_classic_mixed_precision(runs):
    classic, dist = _metrics(runs["classic"][1]), _metrics(runs["unsharded"][1])
    assert [r["skipped"] for r in classic] == [r["skipped"] for r in dist]
    diff = np.abs(np.array([r["loss"] for r in classic]) - np.array([r["loss"] for r in dist]))
    assert diff.max() < 1e-3, diff


@pytest.mark.slow
def test_bytes_per_rank_16bit_weights_and_sharded_master(runs):
    classic, one, two = runs["classic"][0], runs["unsharded"][0], runs["sharded"][0]
    assert classic["param_bytes_per_rank"] == 4 * N_PARAMS and classic["optimizer_bytes_per_rank"] == 8 * N_PARAMS
    assert one["param_bytes_per_rank"] == one["gradient_bytes_per_rank"] == 2 * N_PARAMS  # 16-bit
    assert one["optimizer_bytes_per_rank"] == 12 * N_PARAMS  # fp32 master + two moments
    assert two["param_bytes_per_rank"] == 2 * N_PARAMS
    assert two["optimizer_bytes_per_rank"] == 12 * N_PARAMS // 2  # every row count divides by 2
    for s in (classic, one, two):  # the plan's exact terms
        plan = s["memory_plan"]
        assert (plan["weights"], plan["gradients"], plan["optimizer"] + plan["master"]) == (
            s["param_bytes_per_rank"], s["gradient_bytes_per_rank"], s["optimizer_bytes_per_rank"])


def _msrun(job_path, log_dir, cwd, env: dict | None = None):
    from pipeline.train.jobs.launch import env_with_venv, train_command

    with socket.socket() as s_:
        s_.bind(("127.0.0.1", 0))
        port = s_.getsockname()[1]
    cmd = train_command(str(job_path), workers=2, log_dir=str(log_dir), master_port=port, cluster_timeout_s=180)
    return subprocess.run(cmd, capture_output=True, text=True, env={**env_with_venv(), **(env or {})}, cwd=cwd,
                          timeout=600).returncode


@pytest.mark.slow
def test_sharded_resume_after_crash_is_exact(runs, tmp_path):
    """Crash both ranks after the step-10 checkpoint and rerun: each rank restores its fp32 master block, moments,
    16-bit weights and loss scale, and steps 11..20 equal the uninterrupted sharded run."""
    base = TrainJob.from_json(os.path.join(runs["sharded"][1], "job.json")).to_dict()
    base.update(out_dir=str(tmp_path / "resumed"), fail_at_step=10)
    codes = []
    for attempt in ("crash", "resume"):
        TrainJob.from_dict(base).to_json(tmp_path / "resumed.json")
        codes.append(_msrun(tmp_path / "resumed.json", tmp_path / f"{attempt}_log", tmp_path,
                            MSRUN_CRASH_ENV if attempt == "crash" else None))
        base["fail_at_step"] = None
    assert codes[0] != 0 and codes[1] == 0
    with open(tmp_path / "resumed" / "summary.json") as f:
        assert json.load(f)["resumed_from"] == 10
    assert [r["loss"] for r in _metrics(tmp_path / "resumed")] == [r["loss"] for r in _metrics(runs["sharded"][1])]


@pytest.mark.slow
def test_weights_only_init_seeds_the_master_weights(runs, tmp_path):
    """A stage that starts from an fp32 checkpoint's weights (``init_from``, weights only) casts them to 16 bit and
    seeds the master weights from them on its first step: its losses match classic mixed precision started from
    the same checkpoint (fresh master weights would instead restart from the random initialisation)."""
    from pipeline.train.trainer import run_training

    src = runs["classic"][0]["checkpoint"]
    base = TrainJob.from_json(os.path.join(runs["unsharded"][1], "job.json")).to_dict()
    out = {}
    for name, kw in (("dist", {}), ("o2", {"zero": False, "distributed_optimizer": False})):
        job = dict(base, stage=name, out_dir=str(tmp_path / name), init_from=src, init_mode="weights", steps=5,
                   warmup_steps=1, checkpoint_every=5, **kw)
        run_training(TrainJob.from_dict(job))
        out[name] = np.array([r["loss"] for r in _metrics(tmp_path / name, 5)])
    assert np.abs(out["dist"] - out["o2"]).max() < 1e-3, out
    assert out["dist"][0] < _metrics(runs["classic"][1])[0]["loss"] - 1.0  # it started from the trained weights



@pytest.mark.slow
def test_tensor_parallel_fp16_ranks_take_one_overflow_decision(tmp_path):
    """TP=2 in fp16 from loss scale 2^24: each rank holds half of the vocabulary and of every matrix, so it sees
    only its slice of the gradients; with the finite flag all-reduced over the world both ranks skip the same
    steps, and their checkpoints end with the same loss scale and step count."""
    pytest.importorskip("mindspore")
    from bytes_data import pack_bytes, stdlib_text, write_mindrecord

    from pipeline.train.checkpoint.checkpoint import load_file

    write_mindrecord(pack_bytes(stdlib_text("argparse"), SEQ), str(tmp_path / "data"), shards=2)
    TrainJob(stage="tp2", data_dir=str(tmp_path / "data"), out_dir=str(tmp_path / "tp2"), model=TINY, steps=12,
             micro_batch=8, lr=3e-3, min_lr=3e-4, warmup_steps=3, checkpoint_every=12, log_every=6, seed=7,
             metrics_every=6, precision="fp16", loss_scale=2.0 ** 24, tensor_parallel=2,
             world_size=2).to_json(tmp_path / "tp2.json")
    assert _msrun(tmp_path / "tp2.json", tmp_path / "tp2_log", tmp_path) == 0
    rows = _metrics(tmp_path / "tp2", 12)
    skipped = [r["skipped"] for r in rows]
    assert skipped[:2] == [True, True] and not all(skipped), skipped
    metas = [load_file(str(tmp_path / "tp2" / d / "checkpoints" / "step_00000012.ckpt"))
             for d in (".", "ranks/rank_00001")]
    scales = [m["loss_scale_value"] for _, m in metas]
    assert scales == [2.0 ** 24 / 2 ** sum(skipped)] * 2
    steps = [int(pd["global_step"].asnumpy().reshape(-1)[0]) for pd, _ in metas]
    assert steps == [12 - sum(skipped)] * 2  # applied updates: the same on both ranks


@pytest.mark.slow
@pytest.mark.parametrize("name, grad_reduce, acc_bytes", [("sharded_accum", "step", 4 * N_PARAMS),
                                                          ("sharded_accum_micro", "micro_batch", 4 * N_PARAMS // 2)])
def test_accumulation_keeps_fp32_sums_and_matches_one_process(runs, name, grad_reduce, acc_bytes):
    """DP 2 x grad_accum 4 under the distributed optimizer, fp16 (#50). ``grad_reduce: step``: each rank adds its
    micro-batches' gradients into a whole fp32 buffer, reduce-scattered once per step; ``micro_batch``: each
    micro-batch's gradients are reduced in fp32 (cast and divided by DP first) and only this rank's fp32 blocks
    accumulate (half the fp32 gradient per rank here). Either way: the losses, skipped steps and loss scales of the
    one-process run of the same global batch, and the bytes the plan counts."""
    from pipeline.train.model.config import ModelConfig
    from pipeline.train.model.memory_plan import Layout, plan

    one, acc = _metrics(runs["unsharded"][1]), _metrics(runs[name][1])
    diff = np.abs(np.array([r["loss"] for r in one]) - np.array([r["loss"] for r in acc]))
    print(f"\nDP2 x accum 4 ({grad_reduce}) vs one process, max loss difference:", diff.max())
    assert diff.max() < 5e-4, diff
    assert [(r["skipped"], r["loss_scale"]) for r in acc] == [(r["skipped"], r["loss_scale"]) for r in one]
    cfg = ModelConfig.from_preset(TINY["preset"], **{k: v for k, v in TINY.items() if k != "preset"})
    p = plan(cfg, Layout(dp=2, zero=True, distributed_optimizer=True, precision="fp16", seq_len=SEQ, micro_batch=1,
                         grad_accum=4, grad_reduce=grad_reduce, device="CPU"))
    assert runs[name][0]["grad_reduce"] == grad_reduce
    for r in (0, 1):
        assert _rank(runs[name][1], r)["gradient_bytes"] == p.gradients == 2 * N_PARAMS + acc_bytes
