"""Merge the per-rank checkpoints of a tensor-parallel run into one TP=1 weights file.

Why: a model trained with ``tensor_parallel=t`` leaves ``t`` shards per committed step (rank 0 in
``out_dir/checkpoints``, rank r in ``out_dir/ranks/rank_<r>/checkpoints``, each a ``step_X.weights.ckpt`` listed
with its digest in the step's commit marker); evaluation, export and a follow-up stage of another TP degree want the
whole model. The weights of the first data-parallel replica (ranks ``0..t-1``) are concatenated along each parameter's
split axis (``parallel.split_axis``); Adam moments are not merged (a merged file is for ``init_mode="weights"`` and
evaluation). A weights-only stage that changes the TP degree uses :func:`resliced_weights` instead, which reads only
the previous shards overlapping each rank's new slice and never merges the whole model.

    python -m pipeline.train.checkpoint.tp_merge OUT_DIR --out merged.ckpt [--step N]
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

from ..model.parallel import merge_tp, split_axis
from . import checkpoint as ckpt
from . import commit


def merged_weights(marker: dict) -> dict:
    """Whole-model weights (numpy) of a committed step: TP ranks ``0..t-1`` of its first data-parallel replica,
    each checked against the marker's digest and its layout metadata, merged along the split axes."""
    return merge_tp([_verified_shard(marker, r) for r in range(marker["layout"]["tensor_parallel"])])


def _verified_shard(marker: dict, r: int) -> dict:
    tp = marker["layout"]["tensor_parallel"]
    path, digest = commit.weights_of(marker, r)  # the weights file alone: no optimizer state is read
    pd, meta = ckpt.load_verified(path, digest)
    ckpt.check_file_layout(path, meta, {"tensor_parallel": tp, "tp_rank": r, "dp_rank": 0})
    return {k: v.asnumpy() for k, v in ckpt.weights_only(pd).items()}


def resliced_weights(marker: dict, tp: int, tp_rank: int) -> dict:
    """The weights TP rank ``tp_rank`` of a ``tp``-way layout needs from a committed step of another TP degree,
    without merging the model: only the previous ranks whose slice overlaps this rank's are read, one file at a
    time, and only the overlap of each is kept. Host memory: this rank's new shard plus one previous shard."""
    return reslice(lambda r: _verified_shard(marker, r), marker["layout"]["tensor_parallel"], tp, tp_rank)


def reslice(load_rank, prev_tp: int, tp: int, tp_rank: int) -> dict:
    """``load_rank(r)`` -> the weight dict (numpy) of previous TP rank ``r``; returns this rank's slices. Every
    split parameter divides the same way (rank r holds fraction ``[r/prev_tp, (r+1)/prev_tp)`` of its split axis),
    so the previous ranks to read are the same for every parameter."""
    lo_f, hi_f = tp_rank * prev_tp, (tp_rank + 1) * prev_tp  # this rank's range, in units of 1/(tp * prev_tp)
    out: dict = {}
    for r in range(prev_tp):
        r_lo, r_hi = r * tp, (r + 1) * tp
        if r_hi <= lo_f or r_lo >= hi_f:
            continue
        for name, piece in load_rank(r).items():
            axis = split_axis(name)
            if axis is None:
                out.setdefault(name, piece)
                continue
            n_prev = piece.shape[axis]  # rows (or columns) of one previous shard
            unit = n_prev // tp          # rows per 1/(tp * prev_tp) of the full axis
            a, b = max(lo_f, r_lo), min(hi_f, r_hi)
            src = [slice(None)] * piece.ndim
            src[axis] = slice((a - r_lo) * unit, (b - r_lo) * unit)
            if name not in out:
                shape = list(piece.shape)
                shape[axis] = n_prev * prev_tp // tp
                out[name] = np.empty(shape, piece.dtype)
            dst = [slice(None)] * piece.ndim
            dst[axis] = slice((a - lo_f) * unit, (b - lo_f) * unit)
            out[name][tuple(dst)] = piece[tuple(src)]
    return out


def merge_checkpoints(out_dir: str, dest: str, step: int | None = None) -> dict:
    """Write the merged TP=1 weights of committed ``step`` (default: the newest) to ``dest``; returns its info."""
    import mindspore as ms

    steps = commit.committed_steps(out_dir)
    if not steps:
        raise FileNotFoundError(f"no committed checkpoints in {ckpt.ckpt_dir(out_dir)}")
    step = steps[0] if step is None else step
    marker = commit.read_marker(commit.commit_file(out_dir, step))
    merged = merged_weights(marker)
    os.makedirs(os.path.dirname(os.path.abspath(dest)), exist_ok=True)
    ms.save_checkpoint([{"name": k, "data": ms.Tensor(v)} for k, v in sorted(merged.items())], dest)
    return {"step": step, "tensor_parallel": marker["layout"]["tensor_parallel"], "tensors": len(merged),
            "dest": dest}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipeline.train.checkpoint.tp_merge",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("out_dir")
    ap.add_argument("--out", required=True, help="merged TP=1 weights file")
    ap.add_argument("--step", type=int, default=None)
    args = ap.parse_args(argv)
    print(merge_checkpoints(args.out_dir, args.out, args.step))
    return 0


if __name__ == "__main__":
    sys.exit(main())
