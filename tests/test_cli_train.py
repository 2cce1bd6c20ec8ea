"""``mindloom train``: the CLI runs a stage's job through the same task functions as the DAG and prints its result."""

from __future__ import annotations

import json

import pytest
import yaml


@pytest.mark.slow
def test_train_all_with_one_stage_prints_its_result(tmp_path, capsys):
    """#50: ``--stage all`` (the default) over a config with one stage printed a KeyError traceback."""
    pytest.importorskip("mindspore")
    from bytes_data import BYTE_VOCAB, EOS, pack_bytes, stdlib_paragraphs, write_mindrecord

    from pipeline.cli import main

    seq = 32
    write_mindrecord(pack_bytes(stdlib_paragraphs("json.decoder"), seq)[:64], str(tmp_path / "mr"), shards=1)
    summary = tmp_path / "corpus_summary.json"
    summary.write_text(json.dumps({"mindrecord_dir": str(tmp_path / "mr"), "seq_len": seq, "vocab_size": BYTE_VOCAB,
                                   "eos_id": EOS}))
    config = tmp_path / "cfg.yaml"
    config.write_text(yaml.safe_dump({
        "run_name": "cli", "seed": 3, "data_root": str(tmp_path / "data"),
        "train": {"steps": 2, "batch_size": 4, "warmup_steps": 1, "checkpoint_every": 2, "eval_tokens": 0,
                  "model_overrides": {"dim": 32, "n_layers": 1, "n_heads": 2, "n_kv_heads": 1}}}))
    rc = main(["train", "--config", str(config), "--corpus", str(summary), "--run-id", "r1"])
    out = capsys.readouterr()
    assert rc == 0, out.err[-2000:]
    assert "Traceback" not in out.err
    result = json.loads(out.out)
    assert result["state"] == "SUCCEEDED" and result["steps"] == 2 and result["model"]["eod_id"] == EOS
