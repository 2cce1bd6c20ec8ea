"""``mindloom export --format mindformers`` read by the real client, mindformers 1.9.0 (mindspore 2.9.0) in its own
venv (``tests/mindformers_venv.py``, built here on first use): from the exported ``pretrain.yaml`` alone it builds
``LlamaForCausalLM``, loads every parameter of the weights-only checkpoint, gives mindloom's logits for the main
stage and the NTK long-context stage, and reads the corpus through ``CausalLanguageModelDataset`` row for row.

The pad-masking difference is measured, not just described: on a row ending in pad, mindformers' loss equals the
cross-entropy masked where the *input* is pad, mindloom's where the *label* is pad (see README).

The same export folder is the mindformers 2.x checkpoint: ``model.safetensors`` (Hugging Face names, full tensors)
with ``config.json``, and ``pretrain_megatron.yaml`` over the corpus' Megatron files. The safetensors file is read by
``safetensors`` and by mindspore 2.10's ``load_checkpoint(format="safetensors")`` and reproduces mindloom's held-out
loss; in the mindformers venv, mindformers' own ``load_safetensors_checkpoint`` (``llama.py`` and the loader are the
same code in 2.1.0) loads it into ``LlamaForCausalLM``: every parameter equal to the ``.ckpt`` route's.

Without the venv the client tests skip, or fail when ``MINDLOOM_STRICT=1`` (CI).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mindspore")

from export_chain import build, mindloom_logits, mindloom_loss, mindrecord_rows, validation_rows  # noqa: E402

pytestmark = pytest.mark.slow
PROBE = Path(__file__).with_name("mindformers_probe.py")
PAD = 3


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    return build(tmp_path_factory)


@pytest.fixture(scope="module")
def exported(chain):
    """Each stage exported once into its default folder (``<stage>/export/mindformers``): {stage: manifest}."""
    from pipeline.export.run import export_stage

    return {st: export_stage(chain["stages"][st], "mindformers") for st in ("main", "long_context")}


@pytest.fixture(scope="module")
def mindformers_python():
    import mindformers_venv

    py, how = mindformers_venv.ensure()
    if py is None:
        if os.environ.get("MINDLOOM_STRICT") == "1":
            pytest.fail(f"MINDLOOM_STRICT=1: the mindformers client venv is required: {how}")
        pytest.skip(how)
    print(f"mindformers venv: {how}")
    return py


def test_the_checkpoint_is_weights_only_with_mindformers_names(chain, exported, tmp_path):
    import mindspore as ms
    import yaml

    from pipeline.export.run import export_stage

    out = tmp_path / "mf"
    export_stage(chain["stages"]["long_context"], "mindformers", out=out, device="Ascend")
    names = set(ms.load_checkpoint(str(out / "mindloom.ckpt")))
    assert len(names) == 21 and {"model.tok_embeddings.embedding_weight", "model.norm_out.weight",
                                 "lm_head.weight", "model.layers.1.attention.wk.weight"} <= names
    assert not [n for n in names if n.startswith(("adam_", "accum")) or "embedding_table" in n
                or n in ("global_step", "learning_rate", "step", "ms_rng_state")]
    model = yaml.safe_load((out / "model.yaml").read_text())["model"]["model_config"]
    d = 32
    assert model["theta"] == pytest.approx(10000.0 * 4.0 ** (d / (d - 2)), rel=1e-12)
    assert (model["extend_method"], model["intermediate_size"], model["seq_length"], model["pad_token_id"],
            model["use_flash_attention"], model["use_rope_slice"]) == ("None", 176, 128, PAD, True, False)
    full = yaml.safe_load((out / "pretrain.yaml").read_text())
    assert full["model"]["model_config"] == model and full["load_checkpoint"] == str(out / "mindloom.ckpt")
    assert full["train_dataset_task"]["dataset_config"]["data_loader"] == {
        "type": "MindDataset", "dataset_dir": str(chain["stages"]["long_context"] / "data" / "seq128"),
        "shuffle": True}
    main = yaml.safe_load((Path(exported["main"]["dir"]) / "pretrain.yaml").read_text())
    assert main["train_dataset"]["data_loader"]["dataset_dir"] == chain["corpus"]["mindrecord_dir"]
    assert main["model"]["model_config"]["use_flash_attention"] is False   # the stage trained on CPU

    # mindformers 2.x: the safetensors folder (legacy LlamaForCausalLM) and the Megatron dataset over the corpus
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "export.json", "generation_config.json",
                                                     "mindloom.ckpt", "model.safetensors", "model.yaml",
                                                     "pretrain.yaml", "pretrain_megatron.yaml",
                                                     "special_tokens_map.json", "tokenizer.json", "tokenizer.model",
                                                     "tokenizer_config.json"]
    v2 = yaml.safe_load((out / "pretrain_megatron.yaml").read_text())
    assert (v2["use_legacy"], v2["load_checkpoint"], v2["load_ckpt_format"], v2["auto_trans_ckpt"],
            v2["model"]["arch"]) == (True, str(out), "safetensors", False, {"type": "LlamaForCausalLM"})
    assert v2["model"]["model_config"] == {**model, "input_sliced_sig": True}
    mr = Path(chain["corpus"]["mindrecord_dir"])
    blend = json.loads((mr / "manifest.json").read_text())["megatron"]["data_path"]
    assert len(blend) == 4 and blend[1::2] == ["corpus-00000-of-00002", "corpus-00001-of-00002"]
    loader = v2["train_dataset"]["data_loader"]
    assert (loader["type"], loader["datasets_type"], loader["sizes"]) == ("BlendedMegatronDatasetDataLoader",
                                                                         "GPTDataset", [2 * 2, 0, 0])
    assert loader["config"] == {"seed": 7, "split": "1, 0, 0", "seq_length": 128, "eod_mask_loss": False,
                                "reset_position_ids": False, "reset_attention_mask": False,
                                "create_attention_mask": False, "create_compressed_eod_mask": False, "eod": 2,
                                "pad": PAD, "data_path": [blend[0], str(mr / blend[1]), blend[2], str(mr / blend[3])]}
    assert all((mr / f"{p}.bin").is_file() and (mr / f"{p}.idx").is_file() for p in blend[1::2])
    assert v2["train_dataset"]["input_columns"] == v2["train_dataset"]["construct_args_key"] == [
        "input_ids", "labels", "loss_mask", "position_ids"]
    assert v2["train_dataset_task"]["dataset_config"] == v2["train_dataset"]


def test_megatron_blend_from_the_corpus_manifest_and_its_errors(tmp_path):
    from types import SimpleNamespace

    from pipeline.export.mindformers import megatron_blend

    src = SimpleNamespace(corpus_dir=str(tmp_path))
    assert megatron_blend(src) is None                                  # no manifest
    (tmp_path / "manifest.json").write_text(json.dumps({"shards": []}))
    assert megatron_blend(src) is None                                  # a corpus without Megatron files
    blend = [0.25, "corpus-00000-of-00002", 0.75, "corpus-00001-of-00002"]
    (tmp_path / "manifest.json").write_text(json.dumps({"megatron": {"data_path": blend}}))
    with pytest.raises(FileNotFoundError, match=r"corpus-00000-of-00002\.bin: named by .*manifest\.json "
                                                r"\(megatron\.data_path\[1\]\) but missing"):
        megatron_blend(src)
    for prefix in blend[1::2]:
        (tmp_path / f"{prefix}.bin").write_bytes(b"")
        (tmp_path / f"{prefix}.idx").write_bytes(b"")
    assert megatron_blend(src) == [0.25, str(tmp_path / blend[1]), 0.75, str(tmp_path / blend[3])]
    (tmp_path / "manifest.json").write_text(json.dumps({"megatron": {"data_path": blend[:3]}}))
    with pytest.raises(ValueError, match=r"manifest\.json: megatron\.data_path must be a non-empty"):
        megatron_blend(src)
    (tmp_path / "manifest.json").write_text(json.dumps({"megatron": {"data_path": ["x", blend[1]]}}))
    with pytest.raises(ValueError, match=r"megatron\.data_path\[0\] must be a weight >= 0, got 'x'"):
        megatron_blend(src)


@pytest.mark.parametrize("stage, seq_len", [("main", 32), ("long_context", 128)])
def test_the_safetensors_file_reproduces_the_held_out_loss(chain, exported, stage, seq_len):
    """Read by two readers nobody here wrote (safetensors, mindspore's safetensors loader), mapped back by name
    alone into mindloom's model: the held-out loss of the trained checkpoint."""
    import mindspore as ms
    from safetensors.numpy import load_file

    from pipeline.export.names import hf_name, model_params
    from pipeline.export.source import stage_source
    from pipeline.train.model.model import CausalLMLoss, Transformer

    out = Path(exported[stage]["dir"])
    plain = load_file(str(out / "model.safetensors"))
    loaded = ms.load_checkpoint(str(out / "model.safetensors"), format="safetensors")
    cfg = stage_source(chain["stages"][stage]).model
    back = {hf_name(k): k for k in model_params(cfg)}
    assert sorted(plain) == sorted(loaded) == sorted(back) and len(plain) == 21
    for name, arr in plain.items():
        assert arr.dtype == np.float32 and tuple(arr.shape) == model_params(cfg)[back[name]]
        assert np.array_equal(arr, loaded[name].asnumpy()), name
    rows = validation_rows(chain["corpus"], seq_len)
    mode = ms.get_context("mode")
    ms.set_context(mode=ms.PYNATIVE_MODE)              # the trainer left GRAPH mode: ~4 s of compile per net
    try:
        net = CausalLMLoss(Transformer(cfg))           # the loss cell: the checkpoint's names
        assert ms.load_param_into_net(net, {back[k]: ms.Parameter(v, name=back[k]) for k, v in loaded.items()},
                                      strict_load=True) == ([], [])
        loss = float(net(ms.Tensor(rows)).asnumpy())
        assert abs(loss - mindloom_loss(chain["stages"][stage], rows)) <= 1e-5
    finally:
        ms.set_context(mode=mode)


@pytest.mark.parametrize("stage, seq_len", [("main", 32), ("long_context", 128)])
def test_mindformers_loads_the_export_and_gives_mindloom_logits(chain, exported, mindformers_python, tmp_path,
                                                                stage, seq_len):
    manifest = exported[stage]
    rows = validation_rows(chain["corpus"], seq_len)
    padded = rows[:1].copy()
    padded[0, -5:] = PAD                               # a row whose document ended early: the last 5 are pad
    rows = np.concatenate([rows, padded])
    np.save(tmp_path / "rows.npy", rows)
    proc = subprocess.run([str(mindformers_python), str(PROBE), manifest["dir"], str(tmp_path / "rows.npy"),
                           str(tmp_path / "out.npz"), "--batches", "2"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    assert info["not_loaded"] == [] and info["unused"] == [] and info["params"] == 21
    got = np.load(tmp_path / "out.npz")
    ours = mindloom_logits(chain["stages"][stage], rows)
    assert got["logits"].shape == ours.shape == (5, seq_len, 600)

    # the mindformers 2.x route: model.safetensors (Hugging Face names) through mindformers' own loader
    sf = info["safetensors"]
    assert (sf["files"], sf["is_hf"], sf["differ"], sf["input_sliced_sig"]) == (["model.safetensors"], True, [], True)
    assert sf["params"] == 21 and sf["clean_rows"] == 4
    np.testing.assert_array_equal(got["sf_logits"], got["logits"])
    assert abs(float(got["sf_loss_clean"]) - mindloom_loss(chain["stages"][stage], rows[:4])) <= 1e-5
    real = rows[:, :-1] != PAD                         # mindformers also hides pad keys from attention, so the
    diff = np.abs(got["logits"] - ours).max(-1)        # outputs AT pad inputs differ; no loss counts them
    assert diff[real].max() <= 1e-4 and diff[~real].max() > 1e-3

    # mindformers' own dataset over the stage's MindRecord folder: the rows a plain MindDataset read gives
    stage_rows = mindrecord_rows(manifest["data_dir"])
    batch = 4 if stage == "main" else 2                # train.batch_size of the stage
    assert info["batch_shape"] == [batch, seq_len + 1] and info["dataset_size"] == len(stage_rows) // batch
    np.testing.assert_array_equal(got["batches"].reshape(-1, seq_len + 1), stage_rows[:2 * batch])

    # pad masking: mindformers drops positions whose INPUT is pad, mindloom those whose LABEL is pad
    logp = ours - np.log(np.exp(ours - ours.max(-1, keepdims=True)).sum(-1, keepdims=True)) - ours.max(
        -1, keepdims=True)
    nll = -np.take_along_axis(logp, rows[:, 1:, None].astype(np.int64), -1)[..., 0]
    by_input, by_label = rows[:, :-1] != PAD, rows[:, 1:] != PAD
    extra = by_input & ~by_label                       # the one position that predicts the first pad
    assert extra.sum() == 1 and extra[4, seq_len - 5] and not (by_label & ~by_input).any()
    assert float(got["loss"]) == pytest.approx(nll[by_input].mean(), rel=1e-5)
    assert mindloom_loss(chain["stages"][stage], rows) == pytest.approx(nll[by_label].mean(), rel=1e-5)
    assert abs(nll[by_input].mean() - nll[by_label].mean()) > 1e-5
