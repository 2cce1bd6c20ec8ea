"""Optimizer, LR schedule, mixed precision and the functional training step (with gradient accumulation).

Why functional (``value_and_grad`` + explicit optimizer call) rather than ``TrainOneStepWithLossScaleCell``: the
stock loss-scale cells do not run on CPU (``NPUGetFloatStatusV2``/``FloatStatus`` kernels), ``cb_params`` never
exposes the gradient norm, and we want the pre-clip norm, the loss scale and skipped steps in ``metrics.jsonl``.
The same Python functions are ``ms.jit``-compiled in GRAPH mode and run eagerly in PYNATIVE.

Weight decay policy (AdamW, decoupled): decay only 2-D Dense weights (attention q/k/v/o, MLP w1/w2/w3, untied LM
head). Norm gains and the embedding table (also the LM head when tied) get no decay: shrinking a norm gain towards 0
or a rarely-seen token's embedding towards 0 only hurts, which is the usual GPT/LLaMA practice. The model has no
biases; any 1-D parameter would land in the no-decay group.

Order inside a step: (accumulate micro-batch gradients) -> all-reduce mean over ranks (distributed optimizer:
reduce-scatter, each rank keeps its block) -> unscale (fp16) -> finite check (fp16: skip the update and halve the
scale when not finite) -> global norm -> clip -> AdamW. Reducing before the norm makes every rank clip identically,
so weights stay bit-identical across ranks. The finite flag is all-reduced over every rank of the job (TP x DP) before
the update and the loss-scale change: under tensor parallel or the distributed optimizer each rank sees only its own
slice of the gradients, and a rank that skipped a step its peers applied would silently desynchronise the shards.
"""

from __future__ import annotations

import math

import mindspore as ms
import numpy as np
from mindspore import Parameter, ParameterTuple, Tensor, nn, ops

from ..config import TrainConfig
from .adamw import AdamW
from .precision import uses_loss_scaling


def lr_at(step0: int, lr: float, min_lr: float, warmup: int, total: int) -> float:
    """LR of 0-based update ``step0``: linear warmup from lr/warmup to lr, then cosine from lr to ``min_lr``."""
    if step0 < warmup:
        return lr * (step0 + 1) / warmup
    progress = min(1.0, (step0 - warmup) / max(1, total - warmup))
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * progress))


def lr_table(job) -> np.ndarray:
    """Per-update LR array handed to the optimizer, which indexes it by its own ``global_step`` (restored on resume;
    not advanced by skipped fp16 steps, so skipped steps do not eat the schedule)."""
    return np.array([lr_at(i, job.lr, job.min_lr, job.warmup_steps, job.steps) for i in range(job.steps + 1)],
                    dtype=np.float32)


def param_groups(params) -> tuple[list, list]:
    """(decay, no_decay) per the policy in the module docstring."""
    decay = [p for p in params if len(p.shape) == 2 and "embedding" not in p.name]
    ids = {id(p) for p in decay}
    return decay, [p for p in params if id(p) not in ids]


def build_optimizer(net: nn.Cell, job, zero=None, master: bool = False) -> AdamW:
    """Bias-corrected AdamW (adamw.py); ``zero``: a ``ZeroShard`` to shard the state over DP ranks; ``master``:
    the distributed optimizer (16-bit parameters, drawn that way by ``shard_init.init_rank_weights``)."""
    decay, no_decay = param_groups(net.trainable_params())
    groups = [{"params": decay, "weight_decay": job.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return AdamW(groups, learning_rate=Tensor(lr_table(job)), beta1=job.beta1, beta2=job.beta2, eps=job.eps,
                 zero=zero, master=master)


def low_dtype(precision: str):
    return ms.float16 if precision == "fp16" else ms.bfloat16


def apply_precision(net: nn.Cell, precision: str) -> None:
    """In place: ``O2`` casts the cells' compute to fp16/bf16; the stored parameters keep their dtype (fp32, or
    16-bit under the distributed optimizer)."""
    if precision == "fp32":
        return
    ms.amp.auto_mixed_precision(net, "O2", dtype=low_dtype(precision))


def build_scaler(job):
    """Dynamic loss scaler for fp16 (None otherwise)."""
    if not uses_loss_scaling(job.precision):
        return None
    return ms.amp.DynamicLossScaler(scale_value=float(job.loss_scale), scale_factor=2,
                                    scale_window=int(job.loss_scale_window))


def _zero(param):
    return ops.assign(param, ops.zeros_like(param))


def global_norm(grads):
    return ops.sqrt(ops.addn([ops.reduce_sum(ops.square(g.astype(ms.float32))) for g in grads]))


class TrainStep:
    """``step(micro_batches) -> {"loss", "grad_norm", "applied", "loss_scale", "lr"}`` (floats); updates in place.

    ``micro_batches`` is a list of ``grad_accum`` int32 arrays ``[B, seq_len + 1]``. With one micro-batch the whole
    step is one compiled function; with several, a compiled micro-step adds each gradient into fp32 accumulation
    buffers (fp32 also when the parameters are 16-bit) and a compiled apply-step averages, reduces, clips and updates
    (two graphs, each compiled once, instead of one graph unrolled ``grad_accum`` times).
    """

    def __init__(self, loss_net: nn.Cell, opt: nn.Optimizer, *, grad_clip: float, world: int = 1,
                 grad_accum: int = 1, scaler=None, jit: bool = True, group: str | None = None, norm_fn=None,
                 devices: int = 0, grad_reduce: str = TrainConfig.grad_reduce):
        # Long on purpose: the step, micro-step and apply-step are closures that ms.jit compiles, over the same
        # reducer, scaler, grad_fn and finish; split into methods they would pass all of those around.
        # world/group: the data-parallel ranks (a sub-group under tensor parallel); norm_fn: TP-aware norm;
        # devices: every rank of the job (TP x DP; 0 = world), over which the fp16 finite flag is all-reduced;
        # grad_reduce: with accumulation under the distributed optimizer, reduce once per step or per micro-batch
        self.accum, self.world, self.scaler = grad_accum, world, scaler
        self.accum_bytes = 0  # bytes of the fp32 accumulation buffers this step allocated (grad_accum > 1)
        devices = devices or world
        params = opt.parameters
        kw = {"group": group} if group else {}
        if getattr(opt, "distributed", False):  # distributed optimizer: reduce-scatter to the owner of each block
            reducer = opt.grad_reduce_scatter()
        else:
            reducer = nn.DistributedGradReducer(params, mean=True, degree=world, **kw) if world > 1 else None
        all_reduce = ops.AllReduce(**kw) if world > 1 else None
        finite_reduce = ops.AllReduce() if devices > 1 and scaler is not None else None
        norm_fn = norm_fn or global_norm
        one = Tensor(1.0, ms.float32)

        def fwd(tokens):
            loss = loss_net(tokens)
            return scaler.scale(loss) if scaler is not None else loss

        grad_fn = ms.value_and_grad(fwd, None, params)

        def finish(loss, grads, reduced=False):
            if reducer is not None and not reduced:
                grads = reducer(grads)
            if scaler is not None:
                scale = scaler.scale_value.value()
                grads = scaler.unscale(grads)
                finite = ms.amp.all_finite(grads)
                if finite_reduce is not None:  # one decision for every rank: count the ranks that overflowed
                    finite = finite_reduce(ops.logical_not(finite).astype(ms.float32).reshape((1,))).sum() < 0.5
                scaler.adjust(finite)
            else:
                scale, finite = one, True
            gnorm = norm_fn(grads)
            if grad_clip > 0:
                factor = grad_clip / ops.maximum(gnorm, grad_clip)
                grads = tuple(g * factor.astype(g.dtype) for g in grads)
            lr = opt.get_lr()
            applied = one
            if finite:
                loss = ops.depend(loss, opt(grads))
            else:
                applied = one * 0.0
            if all_reduce is not None:
                loss = all_reduce(loss) / world
            return loss, gnorm, applied, scale, lr

        def unscaled(loss):
            return scaler.unscale(loss) if scaler is not None else loss

        def step(tokens):
            loss, grads = grad_fn(tokens)
            return finish(unscaled(loss), grads)

        if grad_accum == 1:
            self._step = ms.jit(step) if jit else step
            return
        # fp32 buffers whatever the parameters' dtype: 16-bit sums of many micro-batches lose the small ones. By
        # default each rank adds its micro-batches' gradients locally and ``apply`` reduces them once, in fp32
        # (under the distributed optimizer: one reduce-scatter of the fp32 sums per step, Megatron's). With
        # ``grad_reduce: micro_batch`` the distributed optimizer instead reduce-scatters each micro-batch's
        # gradients at once and accumulates only this rank's fp32 blocks (ZeRO-2's buffer: 1/DP of the fp32
        # gradient; a 70b rank at TP 8 x DP 16 keeps 2 GiB instead of 33), so ``apply`` hands them on reduced.
        distributed = getattr(opt, "distributed", False)
        sharded_acc = distributed and grad_reduce == "micro_batch"
        shapes = opt.state_shapes() if sharded_acc else [tuple(p.shape) for p in params]
        acc = ParameterTuple([Parameter(Tensor(np.zeros(shape, np.float32)), name=f"accum.{p.name}",
                                        requires_grad=False) for p, shape in zip(params, shapes, strict=True)])
        # what apply hands to the reduction: fp32 under the distributed optimizer (its reducer works in fp32 and
        # its 16-bit weights would round the sums), else the parameters' dtype
        dtypes = tuple(ms.float32 if distributed else p.dtype for p in params)
        add = ops.HyperMap()
        inv = 1.0 / grad_accum
        n_params = len(dtypes)

        def micro(tokens):
            loss, grads = grad_fn(tokens)
            if sharded_acc:
                grads = reducer(grads)
            done = True
            for i in range(n_params):
                done = ops.depend(done, ops.assign_add(acc[i], grads[i].astype(ms.float32)))
            return ops.depend(unscaled(loss), done)

        def apply(loss_mean):
            grads = tuple((acc[i] * inv).astype(dtypes[i]) for i in range(n_params))
            loss, gnorm, applied, scale, lr = finish(loss_mean, grads, sharded_acc)
            zeroed = add(_zero, acc)
            return ops.depend(loss, zeroed), gnorm, applied, scale, lr

        self._micro = ms.jit(micro) if jit else micro
        self._apply = ms.jit(apply) if jit else apply
        self._acc = acc  # keep the buffers alive with the step
        self.accum_bytes = sum(4 * int(np.prod(shape)) for shape in shapes)

    def launch(self, micro_batches: list[np.ndarray]) -> tuple:
        """Run one step and return its outputs as device tensors, without waiting for them (no host sync)."""
        if len(micro_batches) != self.accum:
            raise ValueError(f"expected {self.accum} micro-batches, got {len(micro_batches)}")
        if self.accum == 1:
            return self._step(Tensor(micro_batches[0]))
        losses = [self._micro(Tensor(mb)) for mb in micro_batches]
        return self._apply(ops.addn(losses) / len(losses))

    @staticmethod
    def fetch(out: tuple) -> dict:
        """Host values of ``launch``'s outputs (this is the sync point)."""
        loss, gnorm, applied, scale, lr = (float(np.asarray(t.asnumpy()).reshape(-1)[0]) for t in out)
        return {"loss": loss, "grad_norm": gnorm, "applied": applied > 0.5, "loss_scale": scale, "lr": lr}

    def __call__(self, micro_batches: list[np.ndarray]) -> dict:
        return self.fetch(self.launch(micro_batches))
