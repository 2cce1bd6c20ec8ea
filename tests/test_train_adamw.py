"""The trainer's optimizer is AdamW as PyTorch defines it: bias-corrected moments, decoupled weight decay.

Same model (``benchmarks/torch_llama.py`` mirrors ``pipeline.train.model.model``), same initial weights, same data,
same per-step LR table (warmup + cosine), global-norm clip 1.0, weight decay 0.1 on matrices only: the MindSpore
training step and ``torch.optim.AdamW`` agree on every loss of 20 steps within 1e-5. With identical gradients fed to
both optimizers the parameters agree within 1e-6; ``nn.AdamWeightDecay`` (no bias correction) does not.
"""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from tests.conftest import REPO

torch = pytest.importorskip("torch")
pytest.importorskip("mindspore")
sys.path.insert(0, str(REPO / "benchmarks"))

SEQ, BATCH, STEPS = 32, 4, 20


def _job(**kw):
    base = dict(lr=3e-3, min_lr=3e-4, warmup_steps=5, steps=STEPS, weight_decay=0.1, beta1=0.9, beta2=0.95,
                eps=1e-8)
    base.update(kw)
    return types.SimpleNamespace(**base)


def _cfg():
    from bytes_data import BYTE_VOCAB

    from pipeline.train.model.config import ModelConfig

    return ModelConfig.from_preset("debug", vocab_size=BYTE_VOCAB, dim=64, n_layers=2, n_heads=4, n_kv_heads=2,
                                   max_seq_len=SEQ)


def _batches():
    from bytes_data import pack_bytes, stdlib_text

    rows = pack_bytes(stdlib_text("argparse"), SEQ)
    return [rows[i * BATCH:(i + 1) * BATCH] for i in range(STEPS)]


def _torch_run(ms_net, cfg, job, batches):
    from torch_llama import copy_weights, torch_model

    from pipeline.train.optim.optim import lr_table

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch_model(cfg)
    copy_weights(ms_net, model)
    named = list(model.named_parameters())
    decay = [p for n, p in named if p.ndim == 2 and "embedding" not in n]
    rest = [p for n, p in named if not (p.ndim == 2 and "embedding" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": job.weight_decay},
                             {"params": rest, "weight_decay": 0.0}],
                            lr=job.lr, betas=(job.beta1, job.beta2), eps=job.eps)
    lrs, losses = lr_table(job), []
    for i, b in enumerate(batches):
        for g in opt.param_groups:
            g["lr"] = float(lrs[i])
        t = torch.from_numpy(b).long()
        logits = model(t[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), t[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(float(loss.detach()))
    return np.array(losses), {n: p.detach().numpy() for n, p in named}


def _ms_net(cfg):
    import mindspore as ms

    from pipeline.train.model.model import Transformer

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(3)
    return Transformer(cfg)


@pytest.mark.slow
def test_training_matches_torch_adamw_over_20_steps():
    from pipeline.train.model.model import CausalLMLoss
    from pipeline.train.optim.optim import TrainStep, build_optimizer

    cfg, job, batches = _cfg(), _job(), _batches()
    net = _ms_net(cfg)
    want, _ = _torch_run(net, cfg, job, batches)  # copies the initial weights before any MindSpore step
    opt = build_optimizer(net, job)
    step = TrainStep(CausalLMLoss(net), opt, grad_clip=1.0)
    got = np.array([step([b])["loss"] for b in batches])
    assert np.abs(got - want).max() < 1e-5, np.abs(got - want)
    assert want[-1] < want[0] - 0.5  # it did train (lr 3e-3 on real text)


def test_optimizer_alone_matches_torch_adamw_on_identical_gradients():
    """Isolates the update rule: the same gradient sequence into both optimizers, 20 steps."""
    import mindspore as ms
    from mindspore import Parameter, Tensor

    from pipeline.train.optim.adamw import AdamW
    from pipeline.train.optim.optim import lr_table

    ms.set_context(mode=ms.GRAPH_MODE)
    job = _job()
    rng = np.random.default_rng(0)
    w0, b0 = rng.normal(size=(6, 5)).astype(np.float32), rng.normal(size=(5,)).astype(np.float32)
    grads = [(rng.normal(size=w0.shape).astype(np.float32) * 10 ** rng.uniform(-3, 0),
              rng.normal(size=b0.shape).astype(np.float32)) for _ in range(STEPS)]

    tw, tb = torch.nn.Parameter(torch.from_numpy(w0.copy())), torch.nn.Parameter(torch.from_numpy(b0.copy()))
    topt = torch.optim.AdamW([{"params": [tw], "weight_decay": 0.1}, {"params": [tb], "weight_decay": 0.0}],
                             lr=job.lr, betas=(0.9, 0.95), eps=1e-8)
    lrs = lr_table(job)
    for i, (gw, gb) in enumerate(grads):
        for g in topt.param_groups:
            g["lr"] = float(lrs[i])
        tw.grad, tb.grad = torch.from_numpy(gw), torch.from_numpy(gb)
        topt.step()

    def run(make):
        w, b = Parameter(Tensor(w0.copy()), name="w"), Parameter(Tensor(b0.copy()), name="b")
        opt = make([{"params": [w], "weight_decay": 0.1}, {"params": [b], "weight_decay": 0.0}])

        @ms.jit
        def step(gw, gb):
            return opt((gw, gb))

        for gw, gb in grads:
            step(Tensor(gw), Tensor(gb))
        return w.asnumpy(), b.asnumpy()

    w, b = run(lambda g: AdamW(g, Tensor(lrs), beta1=0.9, beta2=0.95, eps=1e-8))
    assert np.abs(w - tw.detach().numpy()).max() < 1e-6
    assert np.abs(b - tb.detach().numpy()).max() < 1e-6
    old_w, _ = run(lambda g: ms.nn.AdamWeightDecay(g, Tensor(lrs), beta1=0.9, beta2=0.95, eps=1e-8))
    assert np.abs(old_w - tw.detach().numpy()).max() > 1e-3  # the optimizer this replaces: no bias correction


def test_first_continue_update_equals_the_uninterrupted_optimizers_next_update(tmp_path):
    """A ``continue`` stage restarts the LR schedule, not Adam's bias correction: after 3 updates, a checkpoint,
    and a new stage whose first LR equals the uninterrupted run's 4th, the 4th update is the same within 1e-6.
    Resetting Adam's step count (as ``global_step`` is) would divide the warm moments by ``1 - beta^1`` again."""
    import mindspore as ms
    from mindspore import Parameter, Tensor

    from pipeline.train.checkpoint import checkpoint as ckpt
    from pipeline.train.checkpoint.resume import _continue
    from pipeline.train.data import DataPosition
    from pipeline.train.model.parallel import rank_layout
    from pipeline.train.optim.adamw import AdamW

    ms.set_context(mode=ms.GRAPH_MODE)
    rng = np.random.default_rng(1)
    w0, b0 = rng.normal(size=(6, 5)).astype(np.float32), rng.normal(size=(5,)).astype(np.float32)
    grads = [(Tensor(rng.normal(size=w0.shape).astype(np.float32)), Tensor(rng.normal(size=b0.shape)
                                                                          .astype(np.float32))) for _ in range(4)]
    lrs = np.array([1e-3, 2e-3, 3e-3, 2.5e-3, 2e-3], np.float32)

    def make(table):
        w, b = Parameter(Tensor(w0.copy()), name="w"), Parameter(Tensor(b0.copy()), name="b")
        opt = AdamW([{"params": [w], "weight_decay": 0.1}, {"params": [b], "weight_decay": 0.0}], Tensor(table),
                    beta1=0.9, beta2=0.95, eps=1e-8)
        return opt, w, b

    uninterrupted, uw, ub = make(lrs)
    for g in grads[:3]:
        uninterrupted(g)
    path = str(tmp_path / "step3.ckpt")
    ms.save_checkpoint(uninterrupted, path)
    before = uw.asnumpy().copy()
    uninterrupted(grads[3])
    want_w, want_b = uw.asnumpy(), ub.asnumpy()

    stage, sw, sb = make(lrs[3:])  # the new stage's own schedule starts at the LR of update 4
    job = types.SimpleNamespace(micro_batch=1, grad_accum=1, global_batch=lambda dp: dp)
    meta = {"data_epoch": 0, "data_sample": 3, "data_consumed": 3, "global_batch": 1, "seq_len": 8, "micro_batch": 1,
            "grad_accum": 1, "world_size": 1}
    start, pos, _ = _continue(job, stage, None, rank_layout(0, 1, 1), 8, path, ms.load_checkpoint(path), meta)
    assert (start, pos) == (0, DataPosition.from_meta(meta))
    assert int(stage.global_step.asnumpy()[0]) == 0 and int(stage.adam_step.asnumpy()[0]) == 3
    stage(grads[3])
    assert np.abs(sw.asnumpy() - want_w).max() < 1e-6
    assert np.abs(sb.asnumpy() - want_b).max() < 1e-6
    assert float(stage.get_lr().asnumpy()) == pytest.approx(float(lrs[4]))  # schedule index advanced to 1

    # the defect this guards against: a stage that restarts Adam's count moves the weights about 2.2x as far
    wrong, ww, _ = make(lrs[3:])
    ckpt.restore_full(wrong, ms.load_checkpoint(path))
    wrong.global_step.set_data(Tensor(np.zeros((1,), np.int32)))
    wrong.adam_step.set_data(Tensor(np.zeros((1,), np.int32)))
    wrong(grads[3])
    ratio = np.abs(ww.asnumpy() - before).mean() / np.abs(want_w - before).mean()
    assert ratio > 1.5, ratio


def test_a_checkpoint_from_before_adam_step_resumes_with_its_global_step(tmp_path):
    import mindspore as ms
    from mindspore import Parameter, Tensor

    from pipeline.train.checkpoint import checkpoint as ckpt
    from pipeline.train.optim.adamw import AdamW

    w = Parameter(Tensor(np.ones((2, 2), np.float32)), name="w")
    opt = AdamW([{"params": [w], "weight_decay": 0.0}], Tensor(np.full(8, 1e-3, np.float32)))
    opt.global_step.set_data(Tensor(np.array([5], np.int32)))
    pd = {k: v for k, v in ms.load_checkpoint(_saved(ms, opt, tmp_path)).items() if k != "adam_step"}
    fresh = AdamW([{"params": [Parameter(Tensor(np.ones((2, 2), np.float32)), name="w")], "weight_decay": 0.0}],
                  Tensor(np.full(8, 1e-3, np.float32)))
    ckpt.restore_full(fresh, pd)
    assert int(fresh.adam_step.asnumpy()[0]) == 5 and int(fresh.global_step.asnumpy()[0]) == 5
    assert "adam_step" not in ckpt.weights_only(ms.load_checkpoint(_saved(ms, opt, tmp_path)))


def _saved(ms, opt, tmp_path) -> str:
    path = str(tmp_path / "opt.ckpt")
    ms.save_checkpoint(opt, path)
    return path
