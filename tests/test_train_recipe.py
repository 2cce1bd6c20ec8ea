"""Mixed precision as the device capability table says: fp16 O2 trains in GRAPH on CPU and dynamic loss scaling
skips overflowing steps without touching weights, moments or the LR schedule; unsupported combinations are refused
up front naming ``TrainJob.precision``."""

from __future__ import annotations

import json
import math

import pytest

from pipeline.train.job import TrainJob
from pipeline.train.optim.precision import SUPPORT, capability_table, check_precision

SEQ = 32


@pytest.mark.parametrize("device, mode, precision", [("CPU", "graph", "bf16"), ("CPU", "pynative", "bf16"),
                                                     ("CPU", "pynative", "fp16"), ("GPU", "graph", "bf16")])
def test_unsupported_precision_is_refused_naming_the_field(device, mode, precision):
    with pytest.raises(ValueError, match=rf"TrainJob\.precision='{precision}': not supported with "
                                         rf"device='{device}', mode='{mode}'"):
        TrainJob(stage="s", data_dir="d", out_dir="o", device=device, mode=mode, precision=precision)


def test_capability_table_is_complete_and_cpu_rows_are_measured():
    rows = capability_table()
    assert {(r["device"], r["precision"]) for r in rows} == {(d, p) for d in ("CPU", "GPU", "Ascend")
                                                             for p in ("fp32", "bf16", "fp16")}
    assert all(r["source"] == "measured" for r in rows if r["device"] == "CPU")
    assert SUPPORT["CPU"]["fp16"][0] == ("graph",) and SUPPORT["Ascend"]["bf16"][0] == ("graph", "pynative")
    check_precision("Ascend", "graph", "bf16")  # allowed: no exception


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    pytest.importorskip("mindspore")
    from bytes_data import pack_bytes, stdlib_text, write_mindrecord

    d = tmp_path_factory.mktemp("fp16")
    write_mindrecord(pack_bytes(stdlib_text("argparse"), SEQ)[:200], str(d), shards=2)
    return str(d)


def test_fp16_dynamic_loss_scaling_skips_overflowing_steps(small, tmp_path):
    """Initial scale 2^24: the fp16 backward overflows, so the first steps are skipped while the scale halves;
    once it fits, updates apply. Skipped steps change neither weights nor the LR schedule (the optimizer's
    global_step counts applied updates only)."""
    from bytes_data import BYTE_VOCAB

    from pipeline.train.checkpoint.checkpoint import load_file
    from pipeline.train.optim.optim import lr_at
    from pipeline.train.trainer import run_training

    out = tmp_path / "fp16"
    job = TrainJob(stage="fp16", data_dir=small, out_dir=str(out), steps=16, micro_batch=8, lr=3e-3, min_lr=3e-4,
                   warmup_steps=3, seed=7, precision="fp16", loss_scale=2.0 ** 24, loss_scale_window=1000,
                   checkpoint_every=16, model={"preset": "debug", "vocab_size": BYTE_VOCAB, "dim": 64, "n_layers": 2,
                                               "n_heads": 4, "n_kv_heads": 2, "max_seq_len": SEQ})
    s = run_training(job)
    with open(out / "metrics.jsonl") as f:
        m = [json.loads(ln) for ln in f]
    skipped = [r["skipped"] for r in m]
    k = skipped.index(False)
    assert k >= 2, skipped  # the first steps overflow at 2^24
    n = sum(skipped)
    assert s["skipped_steps"] == n and s["precision"] == "fp16"
    scale, applied = 2.0 ** 24, 0
    for r in m:  # exact scaler and schedule semantics, whatever the overflow pattern after the first steps
        assert r["loss_scale"] == scale and r["lr"] == pytest.approx(lr_at(applied, 3e-3, 3e-4, 3, 16)), r
        if r["skipped"]:
            scale /= 2  # overflow: halve and skip (window 1000: never doubles here)
        else:
            applied += 1  # only applied updates advance the LR schedule
    assert all(math.isfinite(r["loss"]) for r in m)
    assert all((r["grad_norm"] is None) == r["skipped"] for r in m)  # no NaN/Infinity in the JSONL
    assert sum(r["loss"] for r in m[-3:]) / 3 < m[0]["loss"] - 0.3  # it trains once the scale fits
    pd, meta = load_file(s["checkpoint"])
    assert int(pd["global_step"].asnumpy().reshape(-1)[0]) == 16 - n  # skipped steps did not update
    assert meta["loss_scale_value"] == scale  # scaler state after the last step, checkpointed for exact resume


def test_mfu_counts_every_device_of_the_job():
    """6 N FLOPs per token of global throughput over TP x DP devices: a TP=2 x DP=2 job at 4,000 tokens/s of a 1e9
    model on 1e14 FLOP/s chips is 6% utilised, not 12% (the DP ranks alone)."""
    from pipeline.train.jobs.metrics import mfu

    assert mfu(10**9, 4000.0, 1e14, devices=2 * 2) == pytest.approx(0.06)
    assert mfu(10**9, 4000.0, 0.0, devices=4) is None
