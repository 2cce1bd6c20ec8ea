"""``mindloom train``: the CLI runs a stage's job through the same task functions as the DAG and prints its result."""

from __future__ import annotations

import json

import pytest
import yaml


def _stage_inputs(tmp_path):
    """A 64-row byte-level corpus summary and a one-stage config of a tiny model: (config path, summary, dict)."""
    from bytes_data import BYTE_VOCAB, EOS, pack_bytes, stdlib_paragraphs, write_mindrecord

    seq = 32
    write_mindrecord(pack_bytes(stdlib_paragraphs("json.decoder"), seq)[:64], str(tmp_path / "mr"), shards=1)
    summary = tmp_path / "corpus_summary.json"
    summary.write_text(json.dumps({"mindrecord_dir": str(tmp_path / "mr"), "seq_len": seq, "vocab_size": BYTE_VOCAB,
                                   "eos_id": EOS}))
    cfg = {"run_name": "cli", "seed": 3, "data_root": str(tmp_path / "data"),
           "train": {"steps": 2, "batch_size": 4, "warmup_steps": 1, "checkpoint_every": 2, "eval_tokens": 0,
                     "model_overrides": {"dim": 32, "n_layers": 1, "n_heads": 2, "n_kv_heads": 1}}}
    config = tmp_path / "cfg.yaml"
    config.write_text(yaml.safe_dump(cfg))
    return config, summary, cfg


@pytest.mark.slow
def test_train_all_with_one_stage_prints_its_result(tmp_path, capsys):
    """#50: ``--stage all`` (the default) over a config with one stage printed a KeyError traceback."""
    pytest.importorskip("mindspore")
    from bytes_data import EOS

    from pipeline.cli import main

    config, summary, _ = _stage_inputs(tmp_path)
    rc = main(["train", "--config", str(config), "--corpus", str(summary), "--run-id", "r1"])
    out = capsys.readouterr()
    assert rc == 0, out.err[-2000:]
    assert "Traceback" not in out.err
    result = json.loads(out.out)
    assert result["state"] == "SUCCEEDED" and result["steps"] == 2 and result["model"]["eod_id"] == EOS


@pytest.mark.slow
def test_a_rerun_of_mindloom_train_reattaches_to_the_slurm_job_it_left(tmp_path, capsys, monkeypatch):
    """#50: ``mindloom train`` killed while its Slurm job runs, then run again: it finds the job an earlier start
    submitted (``launched_slurm_job``: launch.json's Slurm id, else the job name) and follows it instead of
    submitting a second one. Here the earlier job is a finished local run, and Slurm's answer is stubbed."""
    pytest.importorskip("mindspore")
    from pipeline.cli import main
    from pipeline.tasks import submit

    config, summary, cfg = _stage_inputs(tmp_path)
    argv = ["train", "--config", str(config), "--corpus", str(summary), "--run-id", "r1"]
    assert main(argv) == 0
    first = json.loads(capsys.readouterr().out)
    stage = tmp_path / "data" / "train" / "r1" / "main"
    job_id = json.loads((stage / "status.json").read_text())["job_id"]
    cfg["train"]["backend"] = "slurm"
    config.write_text(yaml.safe_dump(cfg))
    seen = []
    monkeypatch.setattr(submit, "launched_slurm_job", lambda out: seen.append(str(out)) or {
        "out_dir": str(out), "slurm_job_id": "4242", "job_id": job_id, "log": str(stage / "slurm-4242.log")})
    monkeypatch.setattr(submit, "start_stage_job", lambda *a, **k: pytest.fail("submitted a second job"))
    assert main(argv) == 0
    out = capsys.readouterr()
    assert seen == [str(stage)] and "reconnecting to Slurm job 4242 of stage main" in out.err
    assert json.loads(out.out)["final_loss"] == first["final_loss"]
