"""``mindloom export --format mindformers`` read by the real client, mindformers 1.9.0 (mindspore 2.9.0) in its own
venv (``tests/mindformers_venv.py``, built here on first use): from the exported ``pretrain.yaml`` alone it builds
``LlamaForCausalLM``, loads every parameter of the weights-only checkpoint, gives mindloom's logits for the main
stage and the NTK long-context stage, and reads the corpus through ``CausalLanguageModelDataset`` row for row.

The pad-masking difference is measured, not just described: on a row ending in pad, mindformers' loss equals the
cross-entropy masked where the *input* is pad, mindloom's where the *label* is pad (see README).

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
def mindformers_python():
    import mindformers_venv

    py, how = mindformers_venv.ensure()
    if py is None:
        if os.environ.get("MINDLOOM_STRICT") == "1":
            pytest.fail(f"MINDLOOM_STRICT=1: the mindformers client venv is required: {how}")
        pytest.skip(how)
    print(f"mindformers venv: {how}")
    return py


def test_the_checkpoint_is_weights_only_with_mindformers_names(chain, tmp_path):
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
    main = yaml.safe_load((Path(export_stage(chain["stages"]["main"], "mindformers")["dir"]) / "pretrain.yaml")
                          .read_text())
    assert main["train_dataset"]["data_loader"]["dataset_dir"] == chain["corpus"]["mindrecord_dir"]
    assert main["model"]["model_config"]["use_flash_attention"] is False   # the stage trained on CPU


@pytest.mark.parametrize("stage, seq_len", [("main", 32), ("long_context", 128)])
def test_mindformers_loads_the_export_and_gives_mindloom_logits(chain, mindformers_python, tmp_path, stage,
                                                                seq_len):
    from pipeline.export.run import export_stage

    manifest = export_stage(chain["stages"][stage], "mindformers")
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
