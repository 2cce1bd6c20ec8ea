"""``recompute: true`` (each decoder block recomputed in the backward) trains to the same losses as without it.
What it saves is measured, per mode, by benchmarks/bench_train.py (``activation_bound``)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("mindspore")

import mindspore as ms  # noqa: E402


def test_recompute_trains_to_the_same_losses():
    from pipeline.train.job import TrainJob
    from pipeline.train.model.model import CausalLMLoss, Transformer
    from pipeline.train.optim.optim import TrainStep, build_optimizer

    ms.set_context(mode=ms.GRAPH_MODE)
    tokens = np.random.RandomState(1).randint(0, 256, (2, 33)).astype(np.int32)
    losses = {}
    for rc in (False, True):
        job = TrainJob(stage="r", data_dir="-", out_dir="-", steps=4, micro_batch=2, warmup_steps=1, lr=1e-2,
                       model={"preset": "debug", "vocab_size": 256, "dim": 32, "n_layers": 2, "n_heads": 4,
                              "n_kv_heads": 2, "max_seq_len": 32, "recompute": rc})
        ms.set_seed(0)
        net = Transformer(job.model_config())
        step = TrainStep(CausalLMLoss(net), build_optimizer(net, job), grad_clip=1.0)
        losses[rc] = [step([tokens])["loss"] for _ in range(3)]
    np.testing.assert_allclose(losses[True], losses[False], atol=1e-5)
    assert losses[False][2] < losses[False][0]
