"""#50: document boundaries as the graph computes them (flash attention's variable-length ends, per-document RoPE
positions), checked against their numpy twins, and the flash path's TND call checked against the math path with a
stand-in for the Ascend-only kernel that follows its documented semantics (no NPU here)."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.train.documents import document_ends, document_positions, rows_over_document_cap
from pipeline.train.model.config import ModelConfig

EOD = 49
ROWS = np.array([[5, EOD, 7, 8, EOD, 1, 2, EOD],     # a final EOD ends the row, not a segment of its own
                 [EOD, EOD, 3, 4, 5, 6, 7, 8],       # a one-token document, an empty-looking start
                 [1, 2, 3, 4, 5, 6, 7, 8],           # one document
                 [EOD, 1, EOD, 2, EOD, 3, EOD, 4]],  # four ends before the last token: over a cap of 4
                np.int32)


def test_numpy_twins_give_the_documented_values():
    assert document_positions(ROWS, EOD).tolist() == [[0, 1, 0, 1, 2, 0, 1, 2],
                                                      [0, 0, 0, 1, 2, 3, 4, 5],
                                                      [0, 1, 2, 3, 4, 5, 6, 7],
                                                      [0, 0, 1, 0, 1, 0, 1, 0]]
    # per row: k - 1 = 3 ends, then the row's end; rows flattened (TND), so row r is offset by 8 r
    assert document_ends(ROWS, EOD, 4).tolist() == [2, 5, 8, 8,
                                                    8 + 1, 8 + 2, 16, 16,
                                                    16 + 8, 24, 24, 24,
                                                    24 + 1, 24 + 3, 24 + 5, 32]
    assert document_ends(ROWS[:1], EOD, 100).tolist() == [2, 5, 8, 8, 8, 8, 8, 8]  # k is at most S
    assert rows_over_document_cap(ROWS, EOD, 4) == 1 and rows_over_document_cap(ROWS, EOD, 5) == 0


@pytest.mark.parametrize("mode", ["pynative", "graph"])
def test_the_graph_computes_what_the_twins_say(mode):
    import mindspore as ms
    from mindspore import Tensor

    from pipeline.train.model import attention_masks

    rng = np.random.RandomState(0)
    rows = np.concatenate([ROWS, rng.choice([1, 2, EOD], (4, 8)).astype(np.int32)])

    def both(tokens):
        return (attention_masks.document_ends(tokens, EOD, 4), attention_masks.document_positions(tokens, EOD))

    ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE)
    try:
        ends, pos = (ms.jit(both) if mode == "graph" else both)(Tensor(rows))
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    assert ends.dtype == ms.int64 and ends.asnumpy().tolist() == document_ends(rows, EOD, 4).tolist()
    assert pos.asnumpy().tolist() == document_positions(rows, EOD).tolist()


def _net(monkeypatch=None, **kw):
    import mindspore as ms

    from pipeline.train.model import model

    if monkeypatch is not None:
        monkeypatch.setattr(model, "attention_impl", lambda: "flash")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_seed(0)
    cfg = ModelConfig.from_preset("debug", vocab_size=50, dim=32, n_layers=2, n_heads=4, n_kv_heads=2,
                                  max_seq_len=16, eod_id=EOD, **kw)
    return model.Transformer(cfg)


def test_reset_positions_reads_rope_at_each_documents_own_positions():
    from mindspore import Tensor

    from pipeline.train.model.config import rope_tables

    net = _net(reset_positions=True)
    cos, sin = (t.asnumpy() for t in net._rope(Tensor(ROWS), 8))
    table_cos, table_sin = rope_tables(net.cfg)
    pos = document_positions(ROWS, EOD)
    assert cos.shape == (4, 1, 8, 8)
    np.testing.assert_array_equal(cos[:, 0], table_cos[pos])
    np.testing.assert_array_equal(sin[:, 0], table_sin[pos])
    # RoPE scores depend on distances only, so with the document mask the logits agree with unreset positions
    plain = _net()
    row = Tensor(ROWS[:2])
    np.testing.assert_allclose(net(row).asnumpy(), plain(row).asnumpy(), atol=1e-5)


def test_reset_positions_needs_document_boundaries():
    with pytest.raises(ValueError, match=r"ModelConfig\.reset_positions=True: needs document boundaries"):
        ModelConfig.from_preset("debug", reset_positions=True)
    with pytest.raises(ValueError, match=r"ModelConfig\.max_documents_per_row=0"):
        ModelConfig.from_preset("debug", max_documents_per_row=0)


def _flash_reference(calls):
    """A stand-in for ``ops.flash_attention_score`` in the TND layout with sparse_mode 3, following its documented
    semantics: causal attention inside each segment that ``actual_seq_qlen`` ends; query head h reads KV head
    h // (N1 / N2). It records the arguments so the test can check them."""
    from mindspore import Tensor

    def fa(query, key, value, head_num, **kw):
        calls.append(kw)
        q, k, v = query.asnumpy(), key.asnumpy(), value.asnumpy()
        ends = [int(e) for e in kw["actual_seq_qlen"].asnumpy()]
        rep = head_num // k.shape[1]
        out, start = np.zeros_like(q), 0
        for end in ends:
            if end == start:
                continue
            for h in range(head_num):
                qs, ks, vs = q[start:end, h], k[start:end, h // rep], v[start:end, h // rep]
                scores = qs @ ks.T * kw["scalar_value"]
                scores = np.where(np.tril(np.ones(scores.shape, bool)), scores, -np.inf)
                p = np.exp(scores - scores.max(-1, keepdims=True))
                out[start:end, h] = (p / p.sum(-1, keepdims=True)) @ vs
            start = end
        return Tensor(out)
    return fa


def test_the_flash_path_calls_the_variable_length_form_and_matches_the_math_path(monkeypatch):
    """On Ascend the model hands flash attention every row's tokens on one axis (TND) with the documents'
    cumulative ends and its compressed causal mask; with a stand-in kernel that follows the documented semantics,
    the logits equal the math path's document mask (same weights), so the reshapes, the ends and GQA are right."""
    from mindspore import Tensor, ops

    math_net = _net()
    calls = []
    monkeypatch.setattr(ops, "flash_attention_score", _flash_reference(calls))
    flash_net = _net(monkeypatch, max_documents_per_row=4)
    assert flash_net.mask is None and flash_net.layers[0].attention.use_flash
    rows = Tensor(ROWS[:3])  # within the cap of 4 documents a row
    np.testing.assert_allclose(flash_net(rows).asnumpy(), math_net(rows).asnumpy(), atol=1e-5)
    kw = calls[0]
    assert len(calls) == 2  # one per layer
    assert (kw["input_layout"], kw["sparse_mode"], kw["next_tokens"]) == ("TND", 3, 0)
    assert kw["actual_seq_kvlen"] is kw["actual_seq_qlen"]
    assert kw["actual_seq_qlen"].asnumpy().tolist() == document_ends(ROWS[:3], EOD, 4).tolist()
    mask = kw["attn_mask"].asnumpy()
    assert mask.shape == (2048, 2048) and mask.dtype == np.uint8
    np.testing.assert_array_equal(mask, np.triu(np.ones((2048, 2048), np.uint8), k=1))


def test_train_reset_positions_reaches_the_model_and_needs_document_attention(tmp_path):
    import json

    from pipeline.config import config_from_dict
    from pipeline.tasks.pretrain import build_job

    def job(**train):
        cfg = config_from_dict({"run_name": "t", "data_root": str(tmp_path / "data"),
                                "train": {"preset": "debug", "stages": [{"name": "main"}], **train}})
        corpus = {"mindrecord_dir": str(tmp_path), "seq_len": 32, "vocab_size": 258, "eos_id": 2}
        return json.loads(open(build_job(cfg, corpus, tmp_path / "main")).read())["model"]

    assert job()["eod_id"] == 2 and "reset_positions" not in job()
    assert job(reset_positions=True)["reset_positions"] is True
    with pytest.raises(ValueError, match=r"train\.reset_positions \(stage main\): needs document boundaries, but "
                                         r"train\.document_attention is false"):
        job(reset_positions=True, document_attention=False)


def test_reset_positions_trains_in_graph_mode():
    """The per-document RoPE lookup compiles into GRAPH mode's forward and backward: same loss and gradients as
    the unreset model (with the document mask), to rounding."""
    import mindspore as ms
    from mindspore import Tensor

    from pipeline.train.model.model import CausalLMLoss

    rows = Tensor(np.concatenate([ROWS, ROWS[:, :1]], 1))  # seq_len + 1 tokens a row

    def loss_and_grads(net):
        loss_net = CausalLMLoss(net)
        grad_fn = ms.value_and_grad(loss_net, None, loss_net.trainable_params())
        ms.set_context(mode=ms.GRAPH_MODE)
        try:
            loss, grads = ms.jit(grad_fn)(rows)
        finally:
            ms.set_context(mode=ms.PYNATIVE_MODE)
        return float(loss.asnumpy()), [g.asnumpy() for g in grads]

    (a, ga), (b, gb) = loss_and_grads(_net(reset_positions=True)), loss_and_grads(_net())
    assert a == pytest.approx(b, abs=1e-5) and np.isfinite(a)
    for x, y in zip(ga, gb, strict=True):
        np.testing.assert_allclose(x, y, atol=1e-5)


def test_an_ascend_job_stays_within_the_kernels_segments():
    """Flash attention's TND call takes at most 2,048 segments: micro-batch rows x max_documents_per_row."""
    from pipeline.train.job import TrainJob

    def job(micro_batch, **model):
        return TrainJob(stage="main", data_dir="d", out_dir="o", device="Ascend", precision="bf16",
                        micro_batch=micro_batch, model={"preset": "debug", "eod_id": 2, **model})

    job(micro_batch=16)  # 16 x 128
    with pytest.raises(ValueError, match=r"TrainJob\.micro_batch=17: .* = 2176 segments per flash-attention call"):
        job(micro_batch=17)
    job(micro_batch=17, max_documents_per_row=64)
    TrainJob(stage="main", data_dir="d", out_dir="o", micro_batch=17, model={"preset": "debug", "eod_id": 2})  # CPU
