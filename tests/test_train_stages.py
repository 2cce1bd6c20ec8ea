"""Named stages: config validation, re-packing to another context length, per-domain evaluation, and the chain
warmup -> main (continue) -> long_context (4x seq_len, NTK RoPE) through ``pipeline.tasks.pretrain.build_job``."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest

from pipeline.config import config_from_dict
from pipeline.configkit import ConfigError

SEQ = 32


def _cfg(tmp_path, stages, **train):
    base = {"preset": "debug", "steps": 4, "batch_size": 8, "lr": 3e-3, "min_lr": 3e-4, "warmup_steps": 2,
            "checkpoint_every": 2, "eval_tokens": 4 * SEQ,
            "model_overrides": {"dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2}, "stages": stages, **train}
    return config_from_dict({"run_name": "t", "seed": 7, "data_root": str(tmp_path / "data"), "train": base})


CHAIN = [
    {"name": "warmup", "overrides": {"steps": 4, "warmup_steps": 4, "min_lr": 3e-3}},
    {"name": "main", "init": "continue", "overrides": {"steps": 4, "warmup_steps": 0}},
    {"name": "long_context", "seq_len": 4 * SEQ, "overrides": {"steps": 2, "batch_size": 2, "lr": 1e-3,
                                                               "min_lr": 1e-4, "warmup_steps": 1},
     "model_overrides": {"rope_scaling_type": "ntk", "rope_scaling_factor": 4.0}},
]


def test_stage_settings_inherit_and_override(tmp_path):
    t = _cfg(tmp_path, CHAIN).train
    assert [s.name for s in t.stage_list()] == ["warmup", "main", "long_context"]
    lc = t.stage_settings("long_context")
    assert (lc["steps"], lc["batch_size"], lc["lr"], lc["weight_decay"], lc["previous"], lc["seq_len"]) == \
        (2, 2, 1e-3, 0.1, "main", 4 * SEQ)
    assert lc["model_overrides"] == {"dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2,
                                     "rope_scaling_type": "ntk", "rope_scaling_factor": 4.0}
    assert _cfg(tmp_path, []).train.stage_list()[0].name == "main"  # no stages: one implicit 'main'
    with pytest.raises(ConfigError, match="no stage named 'nope'"):
        t.stage_settings("nope")


@pytest.mark.parametrize("stages, train, field", [
    ([{"name": "a"}, {"name": "a"}], {}, r"train\.stages\[1\]\.name: duplicate"),
    ([{"name": "Bad Name"}], {}, r"train\.stages\[0\]\.name"),
    ([{"name": "a", "overrides": {"stepz": 3}}], {}, r"train\.stages\[0\]\.overrides\.stepz: not a per-stage"),
    ([{"name": "a", "overrides": {"steps": "many"}}], {}, r"train\.stages\[0\]\.overrides\.steps: expected an int"),
    ([{"name": "a", "overrides": {"warmup_steps": 9}}], {}, r"train\.stages\[0\]\.overrides\.warmup_steps: "
                                                            r"warmup_steps must be <= steps \(4\)"),
    ([{"name": "a", "overrides": {"steps": 1}}], {}, r"train\.stages\[0\]\.overrides\.steps: warmup_steps"),
    ([], {"min_lr": 1.0}, r"train\.min_lr: must be <= train\.lr"),
    ([{"name": "a", "init": "continue"}], {}, r"train\.stages\[0\]\.init: 'continue' needs a preceding"),
    ([{"name": "a"}, {"name": "b", "init": "continue", "seq_len": 64}], {}, r"train\.stages\[1\]\.init"),
    ([{"name": "a", "model_overrides": {"n_kv_heads": 3}}], {}, r"train\.stages\[0\]\.model_overrides: "
                                                                 r"ModelConfig\.n_kv_heads"),
    ([{"name": "a", "overrides": {"precision": "bf16"}}], {}, r"train\.stages\[0\]\.overrides\.precision: not "
                                                              r"supported with device='CPU'"),
    ([], {"precision": "fp16", "mode": "pynative"}, r"train\.precision: not supported .*mode='pynative'"),
    ([], {"model_overrides": {"dim": 66, "n_heads": 4}}, r"train\.model_overrides: ModelConfig\.dim"),
])
def test_stage_config_errors_name_the_field(tmp_path, stages, train, field):
    with pytest.raises(ConfigError, match=field):
        _cfg(tmp_path, stages, **train)


def test_regroup_longer_and_shorter_rows_from_the_token_stream():
    from pipeline.train.repack import regroup

    stream = np.arange(10 * 9, dtype=np.int32)  # 10 rows of seq_len 8 (+1) cut from one token stream
    rows = stream.reshape(10, 9)
    longer = list(regroup(rows, 8, 32))  # 4 rows -> 1 row of 33 tokens: the first 33 of 36 consecutive tokens
    assert len(longer) == 2 and all(len(r) == 33 for r in longer)
    np.testing.assert_array_equal(longer[1], stream[36:69])
    shorter = list(regroup(rows, 8, 4))  # each row -> 2 rows of 5 overlapping by one token: nothing lost
    assert len(shorter) == 20
    np.testing.assert_array_equal(shorter[0], stream[0:5])
    np.testing.assert_array_equal(shorter[1], stream[4:9])
    with pytest.raises(ValueError, match=r"TrainJob\.seq_len=12: must be a multiple or a divisor"):
        list(regroup(rows, 8, 12))


def test_stream_order_and_repack_are_contiguous_and_reused(tmp_path):
    pytest.importorskip("mindspore")
    from pipeline.train.repack import repack, stage_data, stream_rows, write_rows

    stream = np.arange(11 * 9, dtype=np.int32).reshape(11, 9)
    write_rows(list(stream), str(tmp_path / "src"), shards=3)  # round-robin like the corpus packer
    digest = {}
    np.testing.assert_array_equal(np.stack(list(stream_rows(str(tmp_path / "src"), digest))), stream)
    assert digest == {"rows": 11, "sha256": digest["sha256"], "contiguous_verified": True}
    d, info = stage_data(str(tmp_path / "src"), 16, str(tmp_path / "stage"), rank=0)
    assert info["repacked"] and info["rows"] == 5 and info["contiguous_verified"] and info["source_seq_len"] == 8
    out = np.stack(list(stream_rows(d)))
    np.testing.assert_array_equal(out[2], stream.reshape(-1)[36:53])
    mtime = os.path.getmtime(os.path.join(d, "manifest.json"))
    repack(str(tmp_path / "src"), d, 16)  # same source: reused, not rewritten
    assert os.path.getmtime(os.path.join(d, "manifest.json")) == mtime
    assert stage_data(str(tmp_path / "src"), 0, str(tmp_path / "stage"), rank=0)[1]["repacked"] is False


def test_find_eval_sets(tmp_path):
    from pipeline.tasks.corpus_choice import find_eval_sets

    run = tmp_path / "run"
    for dom in ("code", "zh"):
        (run / "mindrecord_val" / dom).mkdir(parents=True)
        (run / "mindrecord_val" / dom / "val-00000-of-00001.mindrecord").write_bytes(b"x")
    (run / "mindrecord_val" / "empty").mkdir()
    assert find_eval_sets({"run_dir": str(run)}) == {"code": str(run / "mindrecord_val" / "code"),
                                                     "zh": str(run / "mindrecord_val" / "zh")}
    assert find_eval_sets({"run_dir": str(tmp_path / "none")}) == {}
    assert find_eval_sets({"val_mindrecord_dirs": {"web": str(run)}}) == {"web": str(run)}
    with pytest.raises(FileNotFoundError, match=r"val_mindrecord_dirs\['web'\]"):
        find_eval_sets({"val_mindrecord_dirs": {"web": str(tmp_path / "gone")}})


def test_launch_accepts_an_argv_that_runs_this_job(tmp_path):
    from pipeline.train.jobs.launch import train_command

    job = str(tmp_path / "job.json")
    multi = ["msrun", "--worker_num=16", "--local_worker_num=8", "--master_addr=10.0.0.1", "--node_rank=1",
             "python", "-m", "pipeline.train", "--job", job]
    assert train_command(job, argv=multi) == multi
    assert train_command(job, 1)[-3:] == ["pipeline.train", "--job", job]
    assert train_command(job, 2)[1:3] == ["--worker_num=2", "--local_worker_num=2"]
    with pytest.raises(ValueError, match="never a shell string"):
        train_command(job, argv="msrun python -m pipeline.train --job " + job)
    with pytest.raises(ValueError, match="does not run this job"):
        train_command(job, argv=multi[:-1] + [str(tmp_path / "other.json")])


def test_evaluate_pools_exact_token_sums(monkeypatch):
    ms = pytest.importorskip("mindspore")
    from mindspore import Tensor

    from pipeline.train.evaluate import evaluate, make_scorer
    from pipeline.train.model.config import ModelConfig
    from pipeline.train.model.model import CausalLMLoss, Transformer

    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_seed(0)
    cfg = ModelConfig.from_preset("debug", vocab_size=40, dim=32, n_layers=1, n_heads=4, n_kv_heads=2,
                                  max_seq_len=16)
    net = Transformer(cfg)
    rows = {d: np.random.RandomState(i).randint(0, 40, (n, 9)).astype(np.int32)
            for i, (d, n) in enumerate((("a", 5), ("b", 3)))}
    import pipeline.train.evaluate as ev_mod

    monkeypatch.setattr(ev_mod, "eval_rows", lambda d, seq_len, max_tokens: rows[d])  # reading: tested above
    ev = evaluate(make_scorer(CausalLMLoss(net, reduction="sum"), jit=False), {"a": "a", "b": "b"}, seq_len=8,
                  batch_size=2, max_tokens=10_000, pad_id=cfg.pad_id)
    mean = CausalLMLoss(net)
    for d in ("a", "b"):  # batch 2 over 5 and 3 rows: the padded last batch adds nothing
        want = float(mean(Tensor(rows[d])).asnumpy())
        assert ev["per_domain"][d]["loss"] == pytest.approx(want, rel=1e-5)
        assert ev["per_domain"][d]["ppl"] == pytest.approx(math.exp(want), rel=1e-5)
        assert ev["per_domain"][d]["tokens"] == rows[d].shape[0] * 8
    want_all = float(mean(Tensor(np.concatenate([rows["a"], rows["b"]]))).asnumpy())
    assert ev["all"]["loss"] == pytest.approx(want_all, rel=1e-5) and ev["all"]["tokens"] == 64


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A byte-level 'published corpus': training rows + per-domain validation sets, like the corpus DAG's."""
    pytest.importorskip("mindspore")
    from bytes_data import BYTE_VOCAB, pack_bytes, stdlib_text, write_mindrecord

    run = tmp_path_factory.mktemp("corpus_run")
    write_mindrecord(pack_bytes(stdlib_text("argparse"), SEQ)[:400], str(run / "mindrecord"), shards=2)
    write_mindrecord(pack_bytes(stdlib_text("json.decoder"), SEQ), str(run / "mindrecord_val" / "code"), shards=1)
    prose = [__import__("inspect").getdoc(__import__(m)) for m in ("argparse", "difflib", "heapq", "textwrap")]
    write_mindrecord(pack_bytes(prose, SEQ), str(run / "mindrecord_val" / "prose"), shards=1)
    return {"run_dir": str(run), "mindrecord_dir": str(run / "mindrecord"), "seq_len": SEQ,
            "vocab_size": BYTE_VOCAB}


def test_stage_chain_warmup_main_long_context(tmp_path, corpus):
    from pipeline.tasks.pretrain import build_job, prepare_stage_data, repack_stages, stage_dir
    from pipeline.train.checkpoint.checkpoint import load_file
    from pipeline.train.job import TrainJob
    from pipeline.train.trainer import run_training

    cfg = _cfg(tmp_path, CHAIN)
    out = {s: stage_dir(cfg.data_root, "run1", s) for s in ("warmup", "main", "long_context")}
    with pytest.raises(FileNotFoundError, match="run stage 'warmup' of the same run first"):
        build_job(cfg, corpus, out["main"], stage="main")
    # the DAG's repack_<stage> tasks: only long_context has its own seq_len; its rows are ready before its job
    assert repack_stages(cfg) == ["long_context"]
    assert prepare_stage_data(cfg, corpus, out["main"], "main") == {"stage": "main", "repacked": False,
                                                                     "seq_len": SEQ}
    ready = prepare_stage_data(cfg, corpus, out["long_context"], "long_context")
    assert ready["repacked"] and ready["seq_len"] == 4 * SEQ and ready["contiguous_verified"]
    manifest = Path(ready["dir"]) / "manifest.json"
    written = manifest.stat().st_mtime_ns
    summaries = {}
    for name in ("warmup", "main", "long_context"):
        job = TrainJob.from_json(build_job(cfg, corpus, out[name], stage=name))
        summaries[name] = run_training(job)
    assert manifest.stat().st_mtime_ns == written       # the job trained on the task's rows, not its own re-pack
    w, m, lc = summaries["warmup"], summaries["main"], summaries["long_context"]
    assert w["init_from"] is None and w["steps"] == 4
    with open(out["warmup"] / "metrics.jsonl") as f:
        lrs = [json.loads(ln)["lr"] for ln in f]
    assert lrs == pytest.approx([3e-3 * k / 4 for k in (1, 2, 3, 4)], rel=1e-5)  # linear warmup, whole stage
    assert m["init_from"] == w["commit"] and m["init_mode"] == "continue"  # every rank's file of warmup's step 4
    _, meta = load_file(m["checkpoint"])
    assert meta["data_consumed"] == 8 * 8 and meta["step"] == 4  # main continued warmup's data stream
    assert lc["init_from"] == m["commit"] and lc["init_mode"] == "weights"
    assert lc["seq_len"] == 4 * SEQ and lc["data"]["repacked"] and lc["data"]["contiguous_verified"]
    assert lc["data"]["dir"] == ready["dir"] and lc["data"]["rows"] == ready["rows"]
    assert lc["model"]["rope_scaling_type"] == "ntk" and lc["model"]["max_seq_len"] == 4 * SEQ
    assert lc["tokens"] == 2 * 2 * 4 * SEQ
    for s, seq in ((w, SEQ), (m, SEQ), (lc, 4 * SEQ)):
        ev = s["eval"]
        assert set(ev["per_domain"]) == {"code", "prose"} and ev["seq_len"] == seq
        for d in ev["per_domain"].values():
            assert 0 < d["loss"] < math.log(258) and d["ppl"] == pytest.approx(math.exp(d["loss"]))
            assert d["tokens"] == 4 * SEQ  # eval_tokens per domain, at every context length
    assert m["eval"]["all"]["loss"] < w["eval"]["all"]["loss"]  # more training, lower held-out loss
    assert json.loads((out["main"] / "eval.json").read_text())["per_domain"] == m["eval"]["per_domain"]


def test_a_cleared_stage_keeps_its_repacked_rows(tmp_path):
    """Clearing a succeeded stage archives its folder; the re-packed rows (derived from the corpus alone) stay."""
    from pipeline.tasks.pretrain import archive_stage

    stage = tmp_path / "train" / "run1" / "long_context"
    (stage / "data" / "seq64").mkdir(parents=True)
    (stage / "data" / "seq64" / "manifest.json").write_text("{}")
    (stage / "summary.json").write_text("{}")
    kept = archive_stage(stage)
    assert kept.name == "long_context.cleared-1" and (kept / "summary.json").exists()
    assert sorted(p.name for p in stage.iterdir()) == ["data"]
    assert (stage / "data" / "seq64" / "manifest.json").exists()
    assert not (kept / "data").exists()
