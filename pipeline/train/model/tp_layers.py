"""Hand-written tensor-parallel building blocks (Megatron's column/row split) that run on CPU (mccl) and Ascend.

Why by hand: SEMI_AUTO/AUTO parallel (``.shard()``, ``Layout``) fail to compile on CPU ("Invalid backend: CPU"),
while explicit collectives inside Cells with a custom ``bprop`` train exactly like one process (notes §13). The two
conjugate operators of Megatron-LM:

* ``CopyToTP`` ("f"): identity forward, all-reduce of the gradient backward; at the entry of a column-parallel
  region, so replicated activations receive the gradient of every rank's shard;
* ``ReduceFromTP`` ("g"): all-reduce forward, identity backward; at the exit of a row-parallel region. Without the
  custom bprop MindSpore's AllReduce backward sums the gradient across ranks again and training goes wrong from step 2.

The vocabulary is split in contiguous blocks: rank r owns ids ``[r*V/t, (r+1)*V/t)`` of the embedding table and of
the LM head, and the cross-entropy is computed from the local logits with three all-reduces of ``[N]`` vectors, so the
full ``[N, V]`` logits never exist on one rank.
"""

from __future__ import annotations

from dataclasses import dataclass

import mindspore as ms
from mindspore import Parameter, nn, ops
from mindspore.common.initializer import initializer

NATIVE_DEVICES = ("Ascend", "GPU")


def native_collectives(device: str) -> bool:
    """Whether the job's ``device`` has sub-group AllGather and ReduceScatter (HCCL, NCCL). mccl on CPU has
    AllGather in the world group only and no ReduceScatter at all (checked with msrun, 2 ranks), so CPU emulates
    both. Decided once from ``TrainJob.device`` (``parallel_setup.build_parallel``), not from the context."""
    return device in NATIVE_DEVICES


def collectives_label(native: bool) -> str:
    """The log line's words for the choice."""
    return ("native AllGather / ReduceScatter in sub-groups" if native
            else "CPU emulation: zero-padded all-reduce for sub-group gathers, all-reduce + slice for reduce-scatter")


@dataclass(frozen=True)
class TPGroup:
    """This rank's place in its tensor-parallel group; ``group`` None means the world group; ``native``: the
    device has sub-group collectives (:func:`native_collectives`)."""

    size: int = 1
    rank: int = 0
    group: str | None = None
    native: bool = False


NO_TP = TPGroup()


def _all_reduce(tp: TPGroup):
    return ops.AllReduce(group=tp.group) if tp.group else ops.AllReduce()


class GatherRows(nn.Cell):
    """Concatenate every group member's ``x`` along axis 0 (no gradient use).

    ``native`` (Ascend, GPU) or the world group: ``ops.AllGather``. On CPU, mccl's AllGather accepts only the
    world group, so inside a sub-group each rank puts its block into a zero tensor of the full size at its own offset
    and the group all-reduces (sums) it (``emulated``): exact, at the cost of sending and holding the full size
    instead of one block."""

    def __init__(self, size: int, rank: int, group: str | None, native: bool = False):
        super().__init__()
        self.size, self.rank = size, rank
        self.emulated = group is not None and not native
        if self.emulated:
            self.op = ops.AllReduce(group=group)
        else:
            self.op = ops.AllGather(group=group) if group else ops.AllGather()

    def construct(self, x):
        if not self.emulated:
            return self.op(x)
        zero = ops.zeros_like(x)
        blocks = [zero] * self.rank + [x] + [zero] * (self.size - self.rank - 1)
        return self.op(ops.cat(blocks, 0))


class CopyToTP(nn.Cell):
    """Megatron "f": identity forward, gradient all-reduced over the TP group backward."""

    def __init__(self, tp: TPGroup):
        super().__init__()
        self.reduce = _all_reduce(tp)

    def construct(self, x):
        return x

    def bprop(self, x, out, dout):
        return (self.reduce(dout),)


class ReduceFromTP(nn.Cell):
    """Megatron "g": all-reduce (sum) forward, gradient passed through unchanged backward."""

    def __init__(self, tp: TPGroup):
        super().__init__()
        self.reduce = _all_reduce(tp)

    def construct(self, x):
        return self.reduce(x)

    def bprop(self, x, out, dout):
        return (dout,)


class VocabParallelEmbedding(nn.Cell):
    """Rows ``[rank*V/t, (rank+1)*V/t)`` of the table; other ids contribute zeros, summed over the group by "g"."""

    def __init__(self, vocab_size: int, dim: int, tp: TPGroup, init):
        super().__init__()
        self.part = vocab_size // tp.size
        self.start = tp.rank * self.part
        self.embedding_table = Parameter(initializer(init, [self.part, dim], ms.float32), name="embedding_table")
        self.reduce = ReduceFromTP(tp)

    def construct(self, ids):
        local = ids - self.start
        inside = ops.logical_and(local >= 0, local < self.part)
        rows = ops.gather(self.embedding_table, ops.where(inside, local, ops.zeros_like(local)), 0)
        rows = rows * ops.expand_dims(inside, -1).astype(rows.dtype)
        return self.reduce(rows)


class VocabParallelNLL(nn.Cell):
    """Per-row negative log-likelihood from vocab-split logits ``[N, V/t]`` and global labels ``[N]``.

    ``nll = log(sum_all exp(z - max)) - (z_label - max)``: the max is all-gathered without gradient (CPU AllReduce only
    sums) (the result does not depend on it), the exp-sum and the label logit (held by exactly one rank) are
    all-reduced by "g", so each rank gets the softmax-minus-one-hot gradient of its own vocabulary block.
    """

    def __init__(self, vocab_size: int, tp: TPGroup):
        super().__init__()
        self.part = vocab_size // tp.size
        self.start = tp.rank * self.part
        self.tp = tp.size
        self.gather = GatherRows(tp.size, tp.rank, tp.group, tp.native)  # AllReduce sums only: gather the maxes
        self.sum_exp = ReduceFromTP(tp)
        self.sum_label = ReduceFromTP(tp)

    def construct(self, logits, labels):
        local_max = ops.stop_gradient(logits.max(axis=-1))
        zmax = self.gather(local_max).reshape(self.tp, -1).max(axis=0).reshape(-1, 1)
        z = logits - zmax
        sum_exp = self.sum_exp(ops.exp(z).sum(-1))
        local = labels - self.start
        inside = ops.logical_and(local >= 0, local < self.part)
        idx = ops.where(inside, local, ops.zeros_like(local)).reshape(-1, 1)
        z_label = ops.gather_d(z, 1, idx).reshape(-1) * inside.astype(z.dtype)
        return ops.log(sum_exp) - self.sum_label(z_label)
