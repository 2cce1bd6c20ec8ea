"""Tensor x data parallel layout from msrun ranks: groups, parameter shards, the TP-aware gradient norm.

Rank layout (TP inside a node): ``rank = dp_rank * tp + tp_rank``, so the ranks of one TP group are consecutive
(one host, fast links) and each DP group takes one rank from every TP group. Data is read by DP rank: all ranks of a
TP group see the same batch.

Which axis of each parameter is split (``split_axis``): MindSpore ``Dense`` weights are ``[out, in]``, so
column-parallel layers (wq/wk/wv, w1/w3, the LM head) split axis 0 and row-parallel ones (wo, w2) axis 1; the
embedding table splits its vocabulary rows (axis 0); RMSNorm gains are replicated (None).

Initial weights: every TP degree starts from the same full tensors, drawn per parameter in seeded row chunks, and
each rank draws only the chunks its shard needs (``shard_init.py``): no rank ever holds the whole model.
"""

from __future__ import annotations

import re

import numpy as np

from .layout import ParallelLayout, RankLayout  # noqa: F401 - RankLayout is part of this module's API

_COLUMN = re.compile(r"(\.(wq|wk|wv|w1|w3)\.weight|^(model\.)?output\.weight|embedding_table)$")
_ROW = re.compile(r"\.(wo|w2)\.weight$")




def rank_layout(rank: int, world: int, tp: int) -> RankLayout:
    """Pure arithmetic of the layout; group names are filled in only where a group is smaller than the world."""
    if tp < 1 or world % tp:
        raise ValueError(f"TrainJob.tensor_parallel={tp}: must divide the {world} ranks the launcher started")
    return ParallelLayout(tp=tp, dp=world // tp).rank(rank)


def create_groups(lay: RankLayout) -> None:
    """Create the communication groups this rank belongs to (every rank must call it, in the same order)."""
    from mindspore.communication import create_group

    for i in range(lay.dp):  # every TP group, then every DP group: identical call order on all ranks
        if lay.tp_group is not None:
            name, ranks = f"tp_{i}", [i * lay.tp + j for j in range(lay.tp)]
            if name == lay.tp_group:
                create_group(name, ranks)
    for j in range(lay.tp):
        if lay.dp_group is not None:
            name, ranks = f"dp_{j}", [i * lay.tp + j for i in range(lay.dp)]
            if name == lay.dp_group:
                create_group(name, ranks)


def split_axis(name: str) -> int | None:
    if _ROW.search(name):
        return 1
    if _COLUMN.search(name):
        return 0
    return None


def take_shard(full: np.ndarray, axis: int | None, tp: int, tp_rank: int) -> np.ndarray:
    if axis is None or tp == 1:
        return full
    return np.split(full, tp, axis=axis)[tp_rank]


def merge_tp(shards: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """One TP=1 weight dict from the weight dicts of TP ranks 0..t-1 (moments and metadata are not merged)."""
    out = {}
    for name, first in shards[0].items():
        axis = split_axis(name)
        out[name] = first if axis is None else np.concatenate([s[name] for s in shards], axis=axis)
    return out


def make_tp_global_norm(params, tp_group: str | None):
    """Global gradient norm under TP: squares of split parameters summed over the TP group, replicated ones once."""
    import mindspore as ms
    from mindspore import ops

    split = tuple(split_axis(p.name) is not None for p in params)
    reduce = ops.AllReduce(group=tp_group) if tp_group else ops.AllReduce()

    n = len(split)

    def norm(grads):
        sharded = ops.zeros((), ms.float32)
        replicated = ops.zeros((), ms.float32)
        for i in range(n):
            sq = ops.reduce_sum(ops.square(grads[i].astype(ms.float32)))
            if split[i]:
                sharded = sharded + sq
            else:
                replicated = replicated + sq
        return ops.sqrt(reduce(sharded) + replicated)

    return norm
