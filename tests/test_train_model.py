"""Model config, presets, RoPE scaling, loss masking and TrainJob validation (no training; a few seconds)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipeline.train.job import TrainJob
from pipeline.train.model.config import PRESETS, ModelConfig, rope_tables

# Published parameter counts (LLaMA-1/2 papers, TinyLlama model card); they pin the closed form to real models.
KNOWN = {"1b": 1_100_048_384, "7b": 6_738_415_616, "13b": 13_015_864_320, "70b": 68_976_648_192}


@pytest.mark.parametrize("name", sorted(KNOWN))
def test_preset_param_count_matches_published(name):
    assert ModelConfig.from_preset(name).num_params() == KNOWN[name]


def test_presets_cover_the_documented_sizes():
    assert set(PRESETS) == {"debug", "125m", "1b", "7b", "13b", "70b"}
    assert 1e6 <= ModelConfig.from_preset("debug").num_params() <= 5e6
    assert 1.0e8 <= ModelConfig.from_preset("125m").num_params() <= 1.8e8


@pytest.mark.parametrize("overrides", [
    {},  # debug as shipped: GQA 4 heads / 2 kv heads
    {"tie_embeddings": True},
    {"n_kv_heads": 1, "vocab_size": 300, "dim": 64, "n_layers": 2, "ffn_hidden": 100},
])
def test_closed_form_equals_built_cell(overrides):
    from pipeline.train.model.model import Transformer, count_cell_params

    cfg = ModelConfig.from_preset("debug", **overrides)
    assert count_cell_params(Transformer(cfg)) == cfg.num_params()


def test_ffn_hidden_is_derived_llama_style():
    cfg = ModelConfig(dim=4096, n_heads=32, multiple_of=256)  # LLaMA-7B: 11008
    assert cfg.ffn_hidden == 11008
    assert ModelConfig.from_preset("debug", dim=256).ffn_hidden == 704  # re-derived when dim is overridden


@pytest.mark.parametrize("kwargs, field", [
    ({"dim": 100, "n_heads": 3}, "dim"),
    ({"dim": 64, "n_heads": 4, "n_kv_heads": 3}, "n_kv_heads"),
    ({"vocab_size": 0}, "vocab_size"),
    ({"rope_scaling_type": "yarn"}, "rope_scaling_type"),
    ({"rope_scaling_factor": 0.5}, "rope_scaling_factor"),
    ({"norm_eps": 0}, "norm_eps"),
    ({"dim": 96, "n_heads": 32}, "n_heads"),  # head_dim 3 is odd
])
def test_config_validation_names_the_field(kwargs, field):
    with pytest.raises(ValueError, match=rf"ModelConfig\.{field}="):
        ModelConfig(**kwargs)


def test_from_preset_rejects_unknown_names():
    with pytest.raises(ValueError, match="preset"):
        ModelConfig.from_preset("3b")
    with pytest.raises(ValueError, match=r"ModelConfig\.hidden_dim: unknown field"):
        ModelConfig.from_preset("debug", hidden_dim=3)


def test_rope_scaling():
    base = ModelConfig.from_preset("debug", max_seq_len=64)
    cos0, sin0 = rope_tables(base)
    # linear (position interpolation): position 2p with factor 2 is position p unscaled
    cos_l, sin_l = rope_tables(ModelConfig.from_preset("debug", max_seq_len=64, rope_scaling_type="linear",
                                                       rope_scaling_factor=2.0))
    np.testing.assert_allclose(cos_l[10], cos0[5], atol=1e-6)
    np.testing.assert_allclose(sin_l[10], sin0[5], atol=1e-6)
    # NTK: theta * f^(d/(d-2)) keeps the highest frequency and divides the lowest one by exactly f
    cfg = ModelConfig.from_preset("debug", max_seq_len=64, rope_scaling_type="ntk", rope_scaling_factor=4.0)
    cos_n, _ = rope_tables(cfg)
    half = cfg.head_dim // 2
    np.testing.assert_allclose(cos_n[:, 0], cos0[:, 0], atol=1e-6)
    lowest0 = np.arccos(np.clip(cos0[1, half - 1], -1, 1))
    lowest_n = np.arccos(np.clip(cos_n[1, half - 1], -1, 1))
    assert lowest_n == pytest.approx(lowest0 / 4.0, rel=1e-3)


def _tiny_net(**kw):
    import mindspore as ms

    from pipeline.train.model.model import Transformer

    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_seed(0)
    cfg = ModelConfig.from_preset("debug", vocab_size=50, dim=32, n_layers=2, n_heads=4, n_kv_heads=2,
                                  max_seq_len=16, **kw)
    return cfg, Transformer(cfg)


def test_model_is_causal_and_attention_is_math_on_cpu():
    from mindspore import Tensor

    from pipeline.train.model.model import attention_impl

    assert attention_impl() == "math"
    _, net = _tiny_net()
    x = np.random.RandomState(0).randint(0, 50, (2, 12)).astype(np.int32)
    y = x.copy()
    y[:, 8:] = (y[:, 8:] + 1) % 50
    a, b = net(Tensor(x)).asnumpy(), net(Tensor(y)).asnumpy()
    assert a.shape == (2, 12, 50) and a.dtype == np.float32
    np.testing.assert_allclose(a[:, :8], b[:, :8], atol=1e-5)  # the past does not see the future
    assert np.abs(a[:, 8:] - b[:, 8:]).max() > 1e-4


@pytest.mark.parametrize("mode", ["pynative", "graph"])
def test_a_document_packed_after_another_gets_its_logits_alone(mode):
    """#50: with ``eod_id`` a token attends only within its document (ended by eod): the second document of a packed
    row scores as it does alone, to 1e-5; with the causal mask only it does not (so the test can fail)."""
    import mindspore as ms
    from mindspore import Tensor

    from pipeline.train.documents import document_segments
    from pipeline.train.model.model import Transformer

    eod = 49
    rng = np.random.RandomState(3)
    first = np.append(rng.randint(0, eod, 6), eod)
    second = np.append(rng.randint(0, eod, 8), eod)
    row = np.concatenate([first, second])[None].astype(np.int32)  # [1, 16]
    assert document_segments(row, eod).tolist() == [[0] * 7 + [1] * 9]
    cfg, net = _tiny_net(eod_id=eod)
    if mode == "graph":
        ms.set_context(mode=ms.GRAPH_MODE)
    try:
        packed = net(Tensor(row)).asnumpy()[0]
        alone = net(Tensor(second[None].astype(np.int32))).asnumpy()[0]
        first_alone = net(Tensor(first[None].astype(np.int32))).asnumpy()[0]
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    np.testing.assert_allclose(packed[7:], alone, atol=1e-5)
    np.testing.assert_allclose(packed[:7], first_alone, atol=1e-5)
    causal = Transformer(ModelConfig(**{**cfg.to_dict(), "eod_id": -1}))
    ms.load_param_into_net(causal, {p.name: p for p in net.get_parameters()})
    crossing = causal(Tensor(row)).asnumpy()[0]
    np.testing.assert_allclose(crossing[:7], packed[:7], atol=1e-5)  # same weights, same first document
    assert np.abs(crossing[7:] - alone).max() > 1e-3  # causal only: the second document sees the first


def test_eod_id_is_checked():
    with pytest.raises(ValueError, match=r"ModelConfig\.eod_id="):
        ModelConfig.from_preset("debug", vocab_size=50, eod_id=50)


def test_loss_shifts_and_ignores_pad():
    from mindspore import Tensor

    from pipeline.train.model.model import CausalLMLoss

    cfg, net = _tiny_net(pad_id=0)
    rows = np.random.RandomState(1).randint(1, 50, (2, 13)).astype(np.int32)
    rows[1, 9:] = 0  # padded tail: labels 0 are ignored
    loss = float(CausalLMLoss(net)(Tensor(rows)).asnumpy())
    logits = net(Tensor(rows[:, :-1])).asnumpy().astype(np.float64)
    logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
        - logits.max(-1, keepdims=True)
    labels = rows[:, 1:]
    nll = -np.take_along_axis(logp, labels[..., None], -1)[..., 0]
    mask = labels != 0
    assert loss == pytest.approx(nll[mask].mean(), rel=1e-4)


def test_job_json_roundtrip_and_validation(tmp_path):
    job = TrainJob(stage="s1", data_dir="d", out_dir="o", model={"preset": "debug", "vocab_size": 258}, steps=5)
    p = tmp_path / "job.json"
    job.to_json(p)
    assert TrainJob.from_json(p) == job
    assert json.loads(p.read_text())["weight_decay"] == 0.1
    for kwargs, field in [({"steps": 0}, "steps"), ({"mode": "eager"}, "mode"), ({"min_lr": 1.0}, "min_lr"),
                          ({"beta2": 1.0}, "beta2"), ({"fail_at_step": -1}, "fail_at_step")]:
        with pytest.raises(ValueError, match=rf"TrainJob\.{field}="):
            TrainJob(stage="s", data_dir="d", out_dir="o", **kwargs)
    with pytest.raises(ValueError, match=r"TrainJob\.model: ModelConfig\.n_kv_heads="):
        TrainJob(stage="s", data_dir="d", out_dir="o", model={"preset": "debug", "n_kv_heads": 3})
    with pytest.raises(ValueError, match=r"TrainJob\.stepz: unknown field"):
        TrainJob.from_dict({"stage": "s", "data_dir": "d", "out_dir": "o", "stepz": 3})
    with pytest.raises(ValueError, match=r"TrainJob\.out_dir: required"):
        TrainJob.from_dict({"stage": "s", "data_dir": "d"})
