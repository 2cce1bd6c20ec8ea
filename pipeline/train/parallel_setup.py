"""Building the model, optimizer and gradient norm of one rank of a TP x DP (x ZeRO-1) layout, and where it saves.

Kept out of ``trainer.py`` so the stage loop stays about stages. With ``tensor_parallel=1`` and no ZeRO everything
is exactly the one-process / data-parallel path the trainer had before (same parameters, same checkpoint place).
"""

from __future__ import annotations

import numpy as np

from . import commit
from .adamw import ZeroShard, make_shard_norm
from .model import Transformer
from .optim import build_optimizer, cast_weights
from .parallel import RankLayout, load_shards_from_full, make_tp_global_norm, split_axis
from .tp_layers import TPGroup


def build_parallel(cfg, job, lay: RankLayout):
    """(net, optimizer, gradient-norm function or None) for this rank. Seeds must be set by the caller."""
    if lay.tp == 1:
        net = Transformer(cfg)
        norm_fn = None
    else:
        full = Transformer(cfg)  # same draws as a one-process run; this rank keeps its slice
        net = Transformer(cfg, TPGroup(lay.tp, lay.tp_rank, lay.tp_group))
        load_shards_from_full(net, full, lay.tp, lay.tp_rank)
        del full
        norm_fn = make_tp_global_norm(net.trainable_params(), lay.tp_group)
    zero = ZeroShard(lay.dp_rank, lay.dp, lay.dp_group) if job.zero and lay.dp > 1 else None
    master = bool(getattr(job, "distributed_optimizer", False))
    if master:  # Megatron's distributed optimizer: 16-bit weights/gradients, fp32 master blocks in the optimizer
        cast_weights(net, job.precision)
    opt = build_optimizer(net, job, zero, master=master)
    if master:  # the step hands the norm gradient blocks: sum what each rank holds over the whole world
        params = list(opt.parameters)
        norm_fn = make_shard_norm(params, opt._blocks, [split_axis(p.name) is not None and lay.tp > 1
                                                        for p in params], lay.tp, lay.dp, lay.tp * lay.dp)
    elif norm_fn is not None:  # the optimizer's parameter order is what the step hands the norm
        norm_fn = make_tp_global_norm(opt.parameters, lay.tp_group)
    return net, opt, norm_fn


def sharded(lay: RankLayout, zero: bool) -> bool:
    """Whether ranks hold different state (TP weight shards or ZeRO moment blocks), so every rank saves its own."""
    return lay.tp > 1 or (zero and lay.dp > 1)


def writers(lay: RankLayout, zero: bool) -> int:
    """How many ranks write a file per checkpoint: all of them when sharded, else rank 0 for all."""
    return lay.tp * lay.dp if sharded(lay, zero) else 1


def ckpt_root(out_dir: str, rank: int, lay: RankLayout, zero: bool) -> str:
    """Where this rank's checkpoints live: ``out_dir`` when every rank holds the same state (rank 0 saves),
    else rank 0 in ``out_dir`` and rank r in ``out_dir/ranks/rank_<r>`` (sharded weights or moments)."""
    return commit.rank_dir(out_dir, rank if sharded(lay, zero) else 0)


def layout_meta(lay: RankLayout, zero: bool) -> dict:
    """What a checkpoint file records about the rank that wrote it (checkpoint.check_layout compares it)."""
    return {"tensor_parallel": lay.tp, "tp_rank": lay.tp_rank, "data_parallel": lay.dp, "dp_rank": lay.dp_rank,
            "zero_shards": lay.dp if zero else 1}


def expected_file_layout(lay: RankLayout, zero: bool) -> dict:
    """``layout_meta`` of the file this rank must load for full state (its own, or rank 0's when replicated;
    without ZeRO the data-parallel degree may change between runs: the global batch check covers the data)."""
    want = layout_meta(lay, zero) if sharded(lay, zero) else layout_meta(RankLayout(1, lay.dp, 0, 0, None, None),
                                                                          False)
    if not zero:
        del want["data_parallel"], want["dp_rank"]
    return want


def param_bytes(net) -> int:
    return int(sum(int(np.prod(p.shape)) * p.itemsize for p in net.trainable_params()))


def grad_bytes(net, grad_accum: int) -> int:
    """Bytes of the gradients one step holds (one tensor per parameter, in its dtype) plus the accumulation buffers
    ``TrainStep`` allocates when ``grad_accum > 1`` (a clone of the parameters)."""
    return param_bytes(net) * (2 if grad_accum > 1 else 1)
