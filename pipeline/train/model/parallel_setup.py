"""Building the model, optimizer and gradient norm of one rank of a TP x DP (x ZeRO-1) layout, and where it saves.

Kept out of ``trainer.py`` so the stage loop stays about stages. With ``tensor_parallel=1`` and no ZeRO everything
is exactly the one-process / data-parallel path the trainer had before (same parameters, same checkpoint place).
"""

from __future__ import annotations

import logging

import numpy as np

from ..checkpoint import commit
from ..optim.adamw import ZeroShard, make_shard_norm
from ..optim.optim import build_optimizer, low_dtype
from .model import Transformer
from .parallel import RankLayout, make_tp_global_norm, split_axis
from .parallelize import parallelize
from .shard_init import init_rank_weights
from .tp_layers import NO_TP, TPGroup, collectives_label, native_collectives

log = logging.getLogger("mindloom.train")


def build_parallel(cfg, job, lay: RankLayout):
    """(net, optimizer, gradient-norm function or None) for this rank. The weights are drawn parameter by
    parameter from ``job.seed`` (``shard_init``): the same full tensors for every TP degree, and this rank holds
    only its shard (plus one parameter's shard twice and a 4 MiB chunk while drawing; the model is built with
    ``no_init_parameters``, so MindSpore allocates no weights of its own)."""
    from mindspore.nn.utils import no_init_parameters

    master = bool(getattr(job, "distributed_optimizer", False))
    native = native_collectives(job.device)  # once, from the job: sub-group AllGather / ReduceScatter or emulation
    if lay.tp > 1 or (job.zero and lay.dp > 1):
        log.info("collectives (device %s): %s", job.device, collectives_label(native))
    with no_init_parameters():  # shapes only: nothing is drawn or allocated until init_rank_weights
        tp = TPGroup(lay.tp, lay.tp_rank, lay.tp_group, native) if lay.tp > 1 else NO_TP
        net = parallelize(Transformer(cfg), tp)
    norm_fn = make_tp_global_norm(net.trainable_params(), lay.tp_group) if lay.tp > 1 else None
    # Megatron's distributed optimizer: 16-bit weights/gradients (cast one parameter at a time as it is drawn),
    # fp32 master blocks in the optimizer
    init_rank_weights(net, cfg, job.seed, lay.tp, lay.tp_rank, dtype=low_dtype(job.precision) if master else None)
    zero = ZeroShard(lay.dp_rank, lay.dp, lay.dp_group, native) if job.zero and lay.dp > 1 else None
    opt = build_optimizer(net, job, zero, master=master)
    if master:  # the step hands the norm gradient blocks: sum what each rank holds over the whole world
        params = list(opt.parameters)
        norm_fn = make_shard_norm(params, opt.row_blocks(), [split_axis(p.name) is not None and lay.tp > 1
                                                        for p in params], lay.tp, lay.dp, lay.tp * lay.dp)
    elif norm_fn is not None:  # the optimizer's parameter order is what the step hands the norm
        norm_fn = make_tp_global_norm(opt.parameters, lay.tp_group)
    return net, opt, norm_fn


def sharded(lay: RankLayout, zero: bool) -> bool:
    """Whether ranks hold different state (TP weight shards or ZeRO moment blocks), so every rank saves its own."""
    return lay.tp > 1 or (zero and lay.dp > 1)


def writers(lay: RankLayout, zero: bool) -> int:
    """How many ranks write a file per checkpoint: one copy of replicated state. Every rank under ZeRO (each holds
    its own moment blocks; only data-parallel rank 0 of each TP group also saves the weights, see
    :func:`saves_weights`), the first data-parallel replica (ranks ``0..tp-1``) under tensor parallel alone, else
    rank 0 for all."""
    if zero and lay.dp > 1:
        return lay.tp * lay.dp
    return lay.tp if lay.tp > 1 else 1


def saves_weights(lay: RankLayout) -> bool:
    """Whether this rank's file holds the model weights: the weights of a TP shard are the same on every
    data-parallel rank, so only data-parallel rank 0 keeps them (a 70b checkpoint at TP 8 x DP 16 holds its
    weights once, not 16 times)."""
    return lay.dp_rank == 0


def ckpt_root(out_dir: str, rank: int, lay: RankLayout, zero: bool) -> str:
    """Where this rank's checkpoints live: ``out_dir`` when every rank holds the same state (rank 0 saves),
    else rank 0 in ``out_dir`` and rank r in ``out_dir/ranks/rank_<r>`` (sharded weights or moments)."""
    return commit.rank_dir(out_dir, rank if sharded(lay, zero) else 0)


def layout_meta(lay: RankLayout, zero: bool) -> dict:
    """What a checkpoint file records about the rank that wrote it (checkpoint.check_file_layout compares it)."""
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


def grad_bytes(net, accum_bytes: int) -> int:
    """Bytes of the gradients one step holds (one tensor per parameter, in its dtype) plus the fp32 accumulation
    buffers the step allocated (``TrainStep.accum_bytes``: whole tensors, or this rank's blocks when the distributed
    optimizer reduces each micro-batch; 0 without accumulation)."""
    return param_bytes(net) + accum_bytes
