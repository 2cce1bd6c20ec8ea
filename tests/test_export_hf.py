"""``mindloom export --format hf`` read by the real client: transformers loads the folder offline, its
``LlamaForCausalLM`` gives mindloom's logits on held-out rows (main and the NTK long-context stage), and its
tokenizers (slow and fast) give the corpus' SentencePiece ids. Also: reruns are byte-identical, tensor-parallel
shards are merged first, the CLI and the DAG's export task."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

pytest.importorskip("mindspore")

from export_chain import build, mindloom_logits, validation_rows  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    return build(tmp_path_factory)


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")         # the export must load with no network and no hub cache
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


@pytest.mark.parametrize("stage, seq_len", [("main", 32), ("long_context", 128)])
def test_transformers_loads_the_export_and_gives_mindloom_logits(chain, tmp_path, stage, seq_len):
    import torch
    from transformers import AutoModelForCausalLM

    from pipeline.export.run import export_stage

    out = tmp_path / "hf"
    manifest = export_stage(chain["stages"][stage], "hf", out=out)
    assert sorted(manifest["files"]) == ["config.json", "generation_config.json", "model.safetensors",
                                         "special_tokens_map.json", "tokenizer.json", "tokenizer.model",
                                         "tokenizer_config.json"]
    cfg = json.loads((out / "config.json").read_text())
    d = 64 // 2                                        # head_dim of the test model
    want_theta = 10000.0 * (4.0 ** (d / (d - 2)) if stage == "long_context" else 1.0)
    assert cfg["rope_theta"] == pytest.approx(want_theta, rel=1e-12) and cfg["rope_scaling"] is None
    assert (cfg["intermediate_size"], cfg["num_key_value_heads"], cfg["max_position_embeddings"],
            cfg["pad_token_id"]) == (176, 1, seq_len, 3)
    model = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32, local_files_only=True).eval()
    assert type(model).__name__ == "LlamaForCausalLM"
    rows = validation_rows(chain["corpus"], seq_len)
    assert rows.shape == (4, seq_len + 1)             # 2 rows of each held-out domain (code, prose)
    with torch.no_grad():
        hf = model(torch.tensor(rows[:, :-1], dtype=torch.long)).logits.numpy()
    ours = mindloom_logits(chain["stages"][stage], rows)
    assert hf.shape == ours.shape == (4, seq_len, 600)
    assert np.abs(hf - ours).max() <= 1e-4


def test_hf_tokenizers_give_the_corpus_ids(chain, tmp_path):
    import sentencepiece as spm
    from transformers import AutoTokenizer, LlamaTokenizer

    from pipeline.export.run import export_stage

    out = tmp_path / "hf"
    export_stage(chain["stages"]["main"], "hf", out=out)
    sp = spm.SentencePieceProcessor(model_file=chain["corpus"]["tokenizer"])
    texts = [json.loads(line)["text"] for name in ("code", "prose")
             for line in (chain["config"].parent / "in" / f"{name}.jsonl").read_text().splitlines()[:6]]
    texts += ["\n\nindented:\n\tx  = 1\n", " leading space", "中文 mixed 123"]
    slow = LlamaTokenizer.from_pretrained(str(out))
    fast = AutoTokenizer.from_pretrained(str(out))
    assert type(fast).__name__ == "LlamaTokenizerFast"
    for tok in (slow, fast):
        assert (tok.unk_token_id, tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (0, 1, 2, 3)
        assert len(tok) == 600
        for text in texts:                            # pack.add_bos is false: no BOS added, as in the corpus
            assert tok(text).input_ids == sp.encode(text), (type(tok).__name__, text[:40])
            if tok is fast or not text.startswith(" "):   # the slow one drops a leading space (transformers')
                assert tok.decode(sp.encode(text)) == sp.decode(sp.encode(text)) == text


def test_export_reruns_are_byte_identical_and_replace_the_folder(chain):
    from pipeline.export.run import export_stage

    first = export_stage(chain["stages"]["main"], "hf")
    second = export_stage(chain["stages"]["main"], "hf")
    assert first == second and first["dir"] == str(chain["stages"]["main"] / "export" / "hf")
    assert not [p for p in (chain["stages"]["main"] / "export").iterdir() if p.name.startswith(".")]
    assert json.loads((chain["stages"]["main"] / "export" / "hf" / "export.json").read_text()) == first


def test_tensor_parallel_shards_are_merged_before_export(chain, tmp_path):
    """A TP=2 copy of the main stage (each rank's file holding its slices, as the trainer writes them) exports the
    same tensors as the TP=1 original."""
    import mindspore as ms
    from safetensors.numpy import load_file

    from pipeline.export.run import export_stage
    from pipeline.io import read_json, sha256_file, write_json
    from pipeline.train.checkpoint import commit
    from pipeline.train.checkpoint.checkpoint import weights_path
    from pipeline.train.model.parallel import split_axis, take_shard

    src = chain["stages"]["main"]
    tp_dir = tmp_path / "main"
    shutil.copytree(src, tp_dir, ignore=shutil.ignore_patterns("export", "checkpoints"))
    summary = read_json(src / "summary.json")
    full = ms.load_checkpoint(weights_path(summary["checkpoint"]))
    name = os.path.basename(summary["checkpoint"])
    for rank, folder in ((0, tp_dir), (1, tp_dir / "ranks" / "rank_00001")):
        (folder / "checkpoints").mkdir(parents=True)
        path = folder / "checkpoints" / name  # a state file, then the weights file of this shard beside it
        ms.save_checkpoint([{"name": "global_step", "data": ms.Tensor(np.array([4], np.int32))}], str(path))
        ms.save_checkpoint([{"name": k, "data": ms.Tensor(take_shard(v.asnumpy(), split_axis(k), 2, rank))}
                            for k, v in full.items()], weights_path(str(path)))
        for p in (str(path), weights_path(str(path))):
            with open(p + ".sha256", "w") as f:
                f.write(f"{sha256_file(p)}  {os.path.basename(p)}\n")
    commit.write_marker(str(tp_dir), summary["steps"], {"tensor_parallel": 2, "data_parallel": 1,
                                                        "zero_shards": 1}, 2)     # what the trainer commits
    write_json(tp_dir / "summary.json", {**summary, "checkpoint": str(tp_dir / "checkpoints" / name),
                                         "tensor_parallel": 2})
    m_tp = export_stage(tp_dir, "hf", out=tmp_path / "tp")
    m_one = export_stage(src, "hf", out=tmp_path / "one")
    assert m_tp["tensor_parallel"] == 2 and m_one["tensor_parallel"] == 1
    merged, single = load_file(str(tmp_path / "tp" / "model.safetensors")), load_file(
        str(tmp_path / "one" / "model.safetensors"))
    assert sorted(merged) == sorted(single) and len(single) == 21
    assert all(np.array_equal(merged[k], single[k]) for k in single)
    assert m_tp["files"]["model.safetensors"] == m_one["files"]["model.safetensors"]
    mf = export_stage(tp_dir, "mindformers", out=tmp_path / "tp_mf")   # its safetensors (mindformers 2.x): the same
    assert mf["tensor_parallel"] == 2 and mf["files"]["model.safetensors"] == m_one["files"]["model.safetensors"]


def test_cli_export_and_its_errors(chain, capsys):
    from pipeline.cli import main

    base = ["export", "--config", str(chain["config"]), "--run-id", "run1"]
    assert main(base + ["--format", "mindformers"]) == 0     # --stage defaults to the last stage
    out = json.loads(capsys.readouterr().out)
    assert out["stage"] == "long_context" and out["dir"].endswith("long_context/export/mindformers")
    assert main(base + ["--stage", "warmup", "--format", "hf"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("mindloom: error: ") and "warmup/summary.json: stage 'warmup' has not finished" in err
    assert len(err.splitlines()) == 1


def test_export_task_publishes_every_configured_format(chain, monkeypatch):
    import yaml

    from pipeline.config import config_from_dict
    from pipeline.configkit import ConfigError
    from pipeline.tasks.export import export_run, latest_model_path

    data = yaml.safe_load(chain["config"].read_text())
    cfg_path = chain["config"].with_name("export.yaml")
    cfg_path.write_text(yaml.safe_dump({**data, "export": {"formats": ["mindformers", "hf"]}}))
    monkeypatch.setenv("MINDLOOM_CONFIG", str(cfg_path))
    result = export_run({}, "run1")
    assert result["stage"] == "long_context" and sorted(result["formats"]) == ["hf", "mindformers"]
    assert result["formats"]["mindformers"]["files"] == [
        "config.json", "generation_config.json", "mindloom.ckpt", "model.safetensors", "model.yaml", "pretrain.yaml",
        "pretrain_megatron.yaml", "special_tokens_map.json", "tokenizer.json", "tokenizer.model",
        "tokenizer_config.json"]
    assert json.loads(latest_model_path(chain["cfg"].data_root).read_text()) == result
    with pytest.raises(ConfigError, match=r"export\.formats\[1\]: 'onnx' is not one of mindformers, hf"):
        config_from_dict({**data, "export": {"formats": ["hf", "onnx"]}})
