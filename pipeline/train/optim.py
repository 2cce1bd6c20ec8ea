"""Optimizer, LR schedule and the functional training step.

Why functional (``value_and_grad`` + explicit optimizer call) rather than ``TrainOneStepWithLossScaleCell``: the
stock loss-scale cells do not run on CPU, ``cb_params`` never exposes the gradient norm, and we want the pre-clip
norm in ``metrics.jsonl``. The same Python function is ``ms.jit``-compiled in GRAPH mode and run eagerly in PYNATIVE.

Weight decay policy (AdamW, decoupled): decay only 2-D Dense weights (attention q/k/v/o, MLP w1/w2/w3, untied LM
head). Norm gains and the embedding table (also the LM head when tied) get no decay: shrinking a norm gain towards 0
or a rarely-seen token's embedding towards 0 only hurts, which is the usual GPT/LLaMA practice.
"""

from __future__ import annotations

import math

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn, ops


def lr_at(step0: int, lr: float, min_lr: float, warmup: int, total: int) -> float:
    """LR of 0-based step ``step0``: linear warmup from lr/warmup to lr, then cosine from lr to ``min_lr``."""
    if step0 < warmup:
        return lr * (step0 + 1) / warmup
    progress = min(1.0, (step0 - warmup) / max(1, total - warmup))
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * progress))


def lr_table(job) -> np.ndarray:
    """Per-step LR array handed to the optimizer, which indexes it by its own ``global_step`` (restored on resume)."""
    return np.array([lr_at(i, job.lr, job.min_lr, job.warmup_steps, job.steps) for i in range(job.steps + 1)],
                    dtype=np.float32)


def param_groups(params) -> tuple[list, list]:
    """(decay, no_decay) per the policy in the module docstring."""
    decay = [p for p in params if len(p.shape) == 2 and "embedding" not in p.name]
    ids = {id(p) for p in decay}
    return decay, [p for p in params if id(p) not in ids]


def build_optimizer(net: nn.Cell, job) -> nn.AdamWeightDecay:
    decay, no_decay = param_groups(net.trainable_params())
    groups = [{"params": decay, "weight_decay": job.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return nn.AdamWeightDecay(groups, learning_rate=Tensor(lr_table(job)), beta1=job.beta1, beta2=job.beta2,
                              eps=job.eps)


def global_norm(grads):
    return ops.sqrt(ops.addn([ops.reduce_sum(ops.square(g.astype(ms.float32))) for g in grads]))


def make_train_step(loss_net: nn.Cell, opt: nn.AdamWeightDecay, grad_clip: float, world: int = 1, jit: bool = True):
    """``step(tokens) -> (loss, pre-clip grad norm)``; updates the weights in place.

    Clipping scales all gradients by ``clip / max(norm, clip)`` (a no-op below the threshold), the same rule as
    ``torch.nn.utils.clip_grad_norm_``. With data parallelism the gradients are all-reduced (mean) before the norm, so
    every rank clips identically and weights stay bit-identical; the returned loss is the mean over ranks too, so
    rank 0's metrics describe the global batch.
    """
    grad_fn = ms.value_and_grad(loss_net, None, opt.parameters)
    reducer = nn.DistributedGradReducer(opt.parameters, mean=True, degree=world) if world > 1 else None
    all_reduce = ops.AllReduce() if world > 1 else None

    def step(tokens):
        loss, grads = grad_fn(tokens)
        if reducer is not None:
            grads = reducer(grads)
        gnorm = global_norm(grads)
        if grad_clip > 0:
            scale = grad_clip / ops.maximum(gnorm, grad_clip)
            grads = tuple(g * scale.astype(g.dtype) for g in grads)
        loss = ops.depend(loss, opt(grads))
        if all_reduce is not None:
            loss = all_reduce(loss) / world
        return loss, gnorm

    return ms.jit(step) if jit else step
