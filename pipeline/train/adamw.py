"""AdamW with bias correction and decoupled weight decay, optionally with ZeRO-1 sharded moments.

Why not ``nn.AdamWeightDecay``: it has no bias correction (MindSpore's documented formula), so during warmup its
updates differ from AdamW by up to ~2x. ``mint.optim.AdamW`` has no CPU kernel and
``mindspore.experimental.optim.AdamW`` does not keep the ``nn.Optimizer`` interface the trainer and the
checkpoints rely on (``global_step``, the per-step LR table, ``adam_m.*``/``adam_v.*`` moments). This class keeps
that interface and computes exactly ``torch.optim.AdamW``::

    t = step + 1;  p *= 1 - lr * wd
    m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
    p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)

ZeRO-1 (``zero=ZeroShard``): every data-parallel rank keeps the moments of one row block (dim 0) of each parameter
whose first dimension divides by the DP size, updates only that block, and all-gathers the blocks back into the full
parameter. Gradients arrive already averaged over DP ranks (all-reduce = reduce-scatter + all-gather, so each rank
simply reads its block). Parameters whose rows do not divide keep full, replicated moments.
"""

from __future__ import annotations

from dataclasses import dataclass

import mindspore as ms
import numpy as np
from mindspore import Parameter, ParameterTuple, Tensor, nn, ops

from .tp_layers import GatherRows


@dataclass(frozen=True)
class ZeroShard:
    """This rank's place among the data-parallel ranks that share optimizer state."""

    rank: int
    size: int
    group: str | None = None  # communication group of the DP ranks; None = the world group

    def rows(self, n_rows: int) -> tuple[int, int] | None:
        """(lo, hi) row block of a parameter with ``n_rows`` rows, or None when it is not sharded."""
        if self.size <= 1 or n_rows % self.size:
            return None
        k = n_rows // self.size
        return self.rank * k, (self.rank + 1) * k


class AdamW(nn.Optimizer):
    """``torch.optim.AdamW`` semantics on the ``nn.Optimizer`` interface (see the module docstring).

    ``groups``: ``[{"params": [...], "weight_decay": float}, ...]``; ``learning_rate``: a per-step LR table Tensor
    (indexed by ``global_step``) or a float.
    """

    def __init__(self, groups, learning_rate, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8,
                 zero: ZeroShard | None = None):
        wd_of = {}
        for g in groups:
            for p in g["params"]:
                wd_of[p.name] = float(g.get("weight_decay", 0.0))
        super().__init__(learning_rate, [{"params": g["params"]} for g in groups])
        self.beta1, self.beta2, self.eps = float(beta1), float(beta2), float(eps)
        self._b1 = Tensor(self.beta1, ms.float32)
        self._b2 = Tensor(self.beta2, ms.float32)
        params = list(self._parameters)
        self._wds = tuple(wd_of[p.name] for p in params)
        self._blocks = tuple((zero.rows(p.shape[0]) if zero is not None and len(p.shape) else None) for p in params)
        self._sharded = any(b is not None for b in self._blocks)
        self.moments1 = ParameterTuple([self._moment("adam_m", p, b) for p, b in zip(params, self._blocks, strict=True)])
        self.moments2 = ParameterTuple([self._moment("adam_v", p, b) for p, b in zip(params, self._blocks, strict=True)])
        self._gather = GatherRows(zero.size, zero.rank, zero.group) if self._sharded else None
        self._n = len(params)

    @staticmethod
    def _moment(prefix: str, p, block) -> Parameter:
        shape = tuple(p.shape) if block is None else (block[1] - block[0], *p.shape[1:])
        return Parameter(Tensor(np.zeros(shape, np.float32)), name=f"{prefix}.{p.name}", requires_grad=False)

    def state_bytes(self) -> int:
        """Bytes of optimizer state held by this rank (both moments)."""
        return sum(int(np.prod(m.shape)) * 4 for m in (*self.moments1, *self.moments2))

    def construct(self, gradients):
        lr = self.get_lr()
        self.assignadd(self.global_step, self.global_step_increase_tensor)
        t = self.global_step.astype(ms.float32)
        bc1 = 1.0 - ops.pow(self._b1, t)
        bc2_sqrt = ops.sqrt(1.0 - ops.pow(self._b2, t))
        step_size = lr / bc1
        done = True
        for i in range(self._n):
            p, m, v, g = self._parameters[i], self.moments1[i], self.moments2[i], gradients[i]
            block = self._blocks[i]
            g = g.astype(ms.float32)
            if block is None:
                p_s = p
            else:
                p_s = p[block[0]:block[1]]
                g = g[block[0]:block[1]]
            wd = self._wds[i]
            if wd != 0.0:
                p_s = p_s * (1.0 - lr * wd)
            m_new = m * self.beta1 + g * (1.0 - self.beta1)
            v_new = v * self.beta2 + ops.square(g) * (1.0 - self.beta2)
            p_new = p_s - step_size * m_new / (ops.sqrt(v_new) / bc2_sqrt + self.eps)
            if block is not None:
                p_new = self._gather(p_new)
            done = ops.depend(done, ops.assign(m, m_new))
            done = ops.depend(done, ops.assign(v, v_new))
            done = ops.depend(done, ops.assign(p, p_new.astype(p.dtype)))
        return done
