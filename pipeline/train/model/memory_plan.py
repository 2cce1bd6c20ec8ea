"""Bytes per device of a training layout, buffer by buffer, computed before any compile; the refusal of a plan that
cannot fit.

Why a closed form: a 70B job should fail in a second with "raise tensor_parallel", not after an hour of compile and
an out-of-memory kill. Every term follows what this trainer allocates (no MindSpore import here), from the exact
per-rank parameter shapes (``param_shapes`` mirrors ``model.py``'s TP split; a test checks it against built models):

* ``weights``: the model's parameters: fp32, or 16-bit under the distributed optimizer;
* ``gradients``: one tensor per parameter in its dtype; ``grad_accum > 1`` adds fp32 accumulation buffers (whole
  tensors, reduced once per step; under the distributed optimizer with ``grad_reduce: micro_batch`` only this
  rank's blocks, reduce-scattered per micro-batch);
* ``optimizer``: AdamW's two fp32 moments; with ZeRO-1 a parameter whose rows divide by DP keeps only its row block;
* ``master``: fp32 master weights of the distributed optimizer (same blocks as the moments), else 0;
* ``step_buffers``: one fp32 working copy of the gradients (all-reduce output -> unscaled -> clipped, each step
  freeing its input); under the distributed optimizer instead the fp32 reduction output (the whole gradient on
  CPU, where the reduce-scatter is an all-reduce, see ``adamw.GradReduceScatter``; blocks elsewhere) and the fp32
  blocks handed to AdamW; plus the all-gather output of the largest sharded parameter (ZeRO, fp32; distributed
  optimizer, 16 bit; CPU sub-groups emulate it with a zero-padded all-reduce: twice that);
* ``activations``: per layer, the tensors this model keeps for its backward (no dropout; RMSNorm keeps an fp32 copy;
  softmax in fp32; GQA K/V repeated to all heads), with ``recompute`` only each block's input plus one layer's
  tensors, plus one layer's transient attention scores and their gradient (fp32); plus the attention mask: the
  math path's fp32 causal ``[S, S]`` constant, and with document masking (``eod_id``) the per-row fp32
  ``[B, S, S]`` mask every layer reads; flash attention keeps its compressed uint8 2048 x 2048 causal mask and,
  by document, the int64 cumulative ends of its variable-length form (no ``[S, S]`` mask);
* ``logits``: fp32 logits, their log-softmax and gradient (and the 16-bit copy under mixed precision) of this rank's
  vocabulary block;
* ``host_init`` (host memory, reported apart from the device total): each rank builds its model without weights
  (``no_init_parameters``) and draws them one parameter at a time (``shard_init.py``): its shard in the weights'
  dtype, plus twice its largest parameter shard in fp32 (the draw and the Tensor made from it) plus one 4 MiB
  chunk (``HOST_INIT_CONSTANT``).

A fraction ``HEADROOM`` of the device is kept free for the framework workspace and fragmentation. Checked on CPU by
``benchmarks/bench_memory_plan.py``: weights, gradients and optimizer (+ master) bytes equal what the job allocates;
the peak RSS is well above ``floor + max(total, host_init)`` (MindSpore's CPU GRAPH backend keeps several times the
activations and logits counted here), so the activation terms describe a memory-reusing device backend (Ascend);
nor does it realise ``recompute`` (activation memory with it against without, ``bench_train.py``:
``train.recompute_activation_saving``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ..config import TrainConfig
from ..documents import FLASH_MASK_SIDE
from .config import ModelConfig, check_layout
from .layout import ParallelLayout

GiB = 1 << 30
HEADROOM = 0.10
HOST_INIT_CONSTANT = 4 << 20  # one fp32 chunk of shard_init.CHUNK_ELEMS values
PRECISIONS = ("fp32", "bf16", "fp16")


@dataclass(frozen=True)
class Layout(ParallelLayout):
    """A parallel layout (``layout.ParallelLayout``: tp, dp, zero, distributed optimizer, nodes) with what the
    memory of one device also depends on: batch, sequence, precision, recompute, device."""

    recompute: bool = False
    precision: str = "fp32"
    seq_len: int = 2048
    micro_batch: int = 1
    grad_accum: int = 1
    grad_reduce: str = TrainConfig.grad_reduce  # train.grad_reduce: whole fp32 buffer, or blocks per micro-batch
    device: str = "Ascend"  # Ascend: flash attention (no [s, s] scores kept); CPU: mccl emulations (adamw.py)


# A layout per preset that fits 64 GB devices (910B) under this trainer; see README "Pretraining".
PRESET_LAYOUTS: dict[str, Layout] = {
    "debug": Layout(seq_len=256, micro_batch=8),
    "125m": Layout(dp=8, precision="bf16", seq_len=2048, micro_batch=8),
    "1b": Layout(dp=8, zero=True, precision="bf16", seq_len=2048, micro_batch=4, recompute=True),
    "7b": Layout(tp=4, dp=2, zero=True, recompute=True, precision="bf16", seq_len=4096, micro_batch=1),
    "13b": Layout(tp=8, dp=4, zero=True, recompute=True, precision="bf16", seq_len=4096, micro_batch=1),
    # 1M tokens per step (16 x 16 x 4096): fits because the distributed optimizer accumulates fp32 blocks only
    # (reduce-scattered per micro-batch: a whole fp32 buffer would add 4 bytes per parameter of the rank, 33 GiB)
    "70b": Layout(tp=8, dp=16, zero=True, distributed_optimizer=True, recompute=True, precision="bf16",
                  seq_len=4096, micro_batch=1, grad_accum=16, grad_reduce="micro_batch"),
}


def param_shapes(cfg: ModelConfig, tp: int = 1) -> list[tuple[str, tuple[int, ...], bool]]:
    """``(name, shape on one TP rank, split by TP)`` of every trainable parameter (MindSpore Dense: ``[out, in]``)."""
    d, hd, t = cfg.dim, cfg.head_dim, tp
    q, kv, f = cfg.n_heads * hd // t, cfg.n_kv_heads * hd // t, cfg.ffn_hidden // t
    out = [("tok_embeddings.embedding_table", (cfg.vocab_size // t, d), True)]
    for i in range(cfg.n_layers):
        out += [(f"layers.{i}.attention_norm.weight", (d,), False), (f"layers.{i}.attention.wq.weight", (q, d), True),
                (f"layers.{i}.attention.wk.weight", (kv, d), True), (f"layers.{i}.attention.wv.weight", (kv, d), True),
                (f"layers.{i}.attention.wo.weight", (d, q), True), (f"layers.{i}.ffn_norm.weight", (d,), False),
                (f"layers.{i}.feed_forward.w1.weight", (f, d), True),
                (f"layers.{i}.feed_forward.w3.weight", (f, d), True),
                (f"layers.{i}.feed_forward.w2.weight", (d, f), True)]
    out.append(("norm.weight", (d,), False))
    if not cfg.tie_embeddings:
        out.append(("output.weight", (cfg.vocab_size // t, d), True))
    return out


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _state_numel(shape, dp: int, sharded: bool) -> int:
    """Elements of one parameter's optimizer state on a rank: its row block when ZeRO shards it (rows divide)."""
    if sharded and dp > 1 and shape[0] % dp == 0:
        return _numel(shape) // dp
    return _numel(shape)


def sharded_and_replicated_params(cfg: ModelConfig) -> tuple[int, int]:
    """(parameters split by TP, parameters every TP rank holds whole: the norm gains)."""
    replicated = (2 * cfg.n_layers + 1) * cfg.dim
    return cfg.num_params() - replicated, replicated


def activation_bytes(cfg: ModelConfig, layout: Layout) -> tuple[int, int]:
    """(activations kept for the backward incl. one layer's transients, logits-and-loss bytes) of one micro-batch."""
    s, b, h, a, t = layout.seq_len, layout.micro_batch, cfg.dim, cfg.n_heads, layout.tp
    c = 4 if layout.precision == "fp32" else 2  # compute dtype
    sbh = s * b * h
    f_ratio = cfg.ffn_hidden / h
    if layout.device == "Ascend":  # flash attention keeps the output and the fp32 row log-sum-exp only
        scores, transient = 4 * a * s * b / t, 0
    else:  # math path: softmax output (fp32) + its compute-dtype copy for P @ V; fp32 scores and their gradient
        scores, transient = (4 + c) * a * s * s * b / t, 8 * a * s * s * b // t
    per_layer = int(sbh * (2 * (4 + c)  # two RMSNorms: fp32 copy of the input + the normed output
                           + 4 * c / t  # q, repeated k, repeated v, attention output (wo input)
                           + 4 * c * f_ratio / t)  # w1 out, w3 out, silu(w1), w2 input
                    + scores)
    if layout.recompute:
        act = cfg.n_layers * c * sbh + per_layer + transient
    else:
        act = cfg.n_layers * per_layer + transient
    act += mask_bytes(cfg, layout)
    v = cfg.vocab_size // t
    logits = s * b * v * (12 + (c if c != 4 else 0))
    return act, logits


FLASH_MASK = FLASH_MASK_SIDE ** 2  # flash attention's compressed causal mask (uint8), whatever the sequence length


def mask_bytes(cfg: ModelConfig, layout: Layout) -> int:
    """The attention mask of one micro-batch (``model.Transformer._attention_mask``)."""
    s, b = layout.seq_len, layout.micro_batch
    if layout.device == "Ascend":
        return FLASH_MASK + (8 * b * min(cfg.max_documents_per_row, s) if cfg.eod_id >= 0 else 0)
    return 4 * cfg.max_seq_len ** 2 + (4 * b * s * s if cfg.eod_id >= 0 else 0)


@dataclass(frozen=True)
class MemoryPlan:
    weights: int
    gradients: int
    optimizer: int
    activations: int
    device_bytes: int  # 0: no device limit declared
    master: int = 0
    step_buffers: int = 0
    logits: int = 0
    host_init: int = 0  # host memory at model build (not on the device)

    @property
    def total(self) -> int:
        return (self.weights + self.gradients + self.optimizer + self.master + self.step_buffers + self.activations
                + self.logits)

    @property
    def usable(self) -> int:
        return int(self.device_bytes * (1 - HEADROOM))

    @property
    def fits(self) -> bool:
        return self.device_bytes == 0 or self.total <= self.usable

    def to_dict(self) -> dict:
        return {**asdict(self), "total": self.total, "usable": self.usable, "fits": self.fits}

    def describe(self) -> str:
        parts = ", ".join(f"{k.replace('_', ' ')} {getattr(self, k) / GiB:.2f}" for k in
                          ("weights", "gradients", "optimizer", "master", "step_buffers", "activations", "logits"))
        limit = f" of {self.usable / GiB:.2f} usable" if self.device_bytes else ""
        return f"{self.total / GiB:.2f} GiB per device{limit} ({parts} GiB; host at build {self.host_init / GiB:.2f})"


def plan(cfg: ModelConfig, layout: Layout, device_memory_gb: float = 0.0) -> MemoryPlan:
    """Bytes per device of ``cfg`` trained with ``layout`` (see the module docstring for each term)."""
    if layout.precision not in PRECISIONS:
        raise ValueError(f"TrainJob.precision={layout.precision!r}: must be one of {PRECISIONS}")
    check_layout(cfg, layout.tp)
    dist = layout.distributed_optimizer
    if dist and (layout.precision == "fp32" or not layout.zero):
        raise ValueError("TrainJob.distributed_optimizer=True: needs zero=true and precision fp16 or bf16")
    shapes = [s for _, s, _ in param_shapes(cfg, layout.tp)]
    n_rank = sum(_numel(s) for s in shapes)
    state = sum(_state_numel(s, layout.dp, layout.zero) for s in shapes)
    wbytes = 2 if dist else 4
    weights = wbytes * n_rank
    # fp32 accumulation buffers: whole tensors, or this rank's blocks when the distributed optimizer reduces each
    # micro-batch (optim.py)
    blocks = dist and layout.grad_reduce == "micro_batch"
    gradients = weights + ((4 * state if blocks else 4 * n_rank) if layout.grad_accum > 1 else 0)
    optimizer = 8 * state
    master = 4 * state if dist else 0
    # step buffers: one working copy of the gradients (DP all-reduce output -> unscaled -> clipped, each freeing its
    # input), plus under the distributed optimizer the fp32 reduction output (whole tensors on CPU, blocks with a
    # native reduce-scatter) next to the fp32 blocks handed to AdamW; plus the largest all-gather output
    cpu = layout.device == "CPU"
    if dist:
        working = (4 * (n_rank if cpu else state) if layout.dp > 1 else 0) + 4 * state  # fp32 reduction output
    else:
        working = 4 * n_rank
    gathered = [_numel(s) for s in shapes if layout.zero and layout.dp > 1 and s[0] % layout.dp == 0]
    gather = (max(gathered) * (2 if dist else 4) * (2 if cpu and layout.tp > 1 else 1)) if gathered else 0
    act, logits = activation_bytes(cfg, layout)
    host = wbytes * n_rank + 2 * 4 * max(_numel(s) for s in shapes) + HOST_INIT_CONSTANT
    return MemoryPlan(weights, gradients, optimizer, act, int(device_memory_gb * GiB), master=master,
                      step_buffers=working + gather, logits=logits, host_init=host)


def knob_to_change(p: MemoryPlan, layout: Layout) -> str:
    """The setting that removes the largest term of an over-budget plan."""
    state = p.weights + p.gradients
    if p.activations >= max(state, p.optimizer + p.master):
        if not layout.recompute:
            return "enable model.recompute (activations are the largest term)"
        return "lower TrainJob.micro_batch (train.batch_size) or TrainJob.seq_len (activations are the largest term)"
    if p.optimizer >= state and not layout.zero and layout.dp > 1:
        return "set TrainJob.zero=true (shards the Adam moments over the data-parallel ranks)"
    if not layout.distributed_optimizer and layout.precision != "fp32" and layout.dp > 1:
        return ("set TrainJob.zero=true and TrainJob.distributed_optimizer=true (16-bit weights and gradients, "
                "fp32 master weights sharded over the data-parallel ranks)")
    if layout.distributed_optimizer and layout.grad_accum > 1 and layout.grad_reduce == "step":
        return ("set train.grad_reduce: micro_batch (accumulates only this rank's fp32 blocks, 1/DP of the whole "
                "fp32 gradient buffer)")
    return "raise TrainJob.tensor_parallel (weights and gradients are split only by tensor parallel)"


def require_fit(cfg: ModelConfig, layout: Layout, device_memory_gb: float) -> MemoryPlan:
    """The plan, or ValueError naming ``TrainJob.device_memory_gb`` and the knob to change when it does not fit."""
    p = plan(cfg, layout, device_memory_gb)
    if not p.fits:
        raise ValueError(f"TrainJob.device_memory_gb={device_memory_gb}: plan needs {p.describe()} with "
                         f"tp={layout.tp} dp={layout.dp} zero={layout.zero} "
                         f"distributed_optimizer={layout.distributed_optimizer} recompute={layout.recompute} "
                         f"precision={layout.precision}; {knob_to_change(p, layout)}")
    return p


def job_layout(job, world: int, seq_len: int, recompute: bool) -> Layout:
    """The layout a started ``TrainJob`` runs with (``world`` ranks from the launcher)."""
    par = job.layout(world)
    return Layout(tp=par.tp, dp=par.dp, zero=par.zero, distributed_optimizer=par.distributed_optimizer,
                  recompute=recompute, precision=job.precision, seq_len=seq_len, micro_batch=job.micro_batch,
                  grad_accum=job.grad_accum, grad_reduce=job.grad_reduce, device=job.device)
