"""Merge the per-rank checkpoints of a tensor-parallel run into one TP=1 weights file.

Why: a model trained with ``tensor_parallel=t`` leaves ``t`` shards per step (rank 0 in ``out_dir/checkpoints``,
rank r in ``out_dir/ranks/rank_<r>/checkpoints``); evaluation, export and a smaller follow-up stage want one
ordinary checkpoint. The weights of the first data-parallel replica (ranks ``0..t-1``) are concatenated along each
parameter's split axis (``parallel.split_axis``); Adam moments are not merged (a merged file is for
``init_mode="weights"`` and evaluation).

    python -m pipeline.train.tp_merge OUT_DIR --out merged.ckpt [--step N]
"""

from __future__ import annotations

import argparse
import os
import sys

from . import checkpoint as ckpt
from .parallel import merge_tp

_NOT_WEIGHTS = ("adam_m.", "adam_v.", "accum.")
_OPT_SCALARS = ("global_step", "learning_rate", "beta1_power", "beta2_power")


def rank_out_dir(out_dir: str, rank: int) -> str:
    return out_dir if rank == 0 else os.path.join(out_dir, "ranks", f"rank_{rank:05d}")


def _weights(path: str) -> tuple[dict, dict]:
    pd, meta = ckpt.load_file(path)
    w = {k: v.asnumpy() for k, v in pd.items()
         if not k.startswith(_NOT_WEIGHTS) and k not in _OPT_SCALARS and k not in ckpt.META_ARRAY}
    return w, meta


def merge_checkpoints(out_dir: str, dest: str, step: int | None = None) -> dict:
    """Write the merged TP=1 weights of ``step`` (default: rank 0's newest) to ``dest``; returns its metadata."""
    import mindspore as ms

    found = ckpt.list_checkpoints(out_dir)
    if not found:
        raise FileNotFoundError(f"no checkpoints in {ckpt.ckpt_dir(out_dir)}")
    step = found[0][0] if step is None else step
    first, meta = _weights(ckpt.ckpt_path(out_dir, step))
    tp = meta.get("tensor_parallel", 1)
    shards = [first] + [_weights(ckpt.ckpt_path(rank_out_dir(out_dir, r), step))[0] for r in range(1, tp)]
    merged = merge_tp(shards)
    os.makedirs(os.path.dirname(os.path.abspath(dest)), exist_ok=True)
    ms.save_checkpoint([{"name": k, "data": ms.Tensor(v)} for k, v in sorted(merged.items())], dest)
    return {"step": step, "tensor_parallel": tp, "tensors": len(merged), "dest": dest}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipeline.train.tp_merge", description=__doc__.splitlines()[0])
    ap.add_argument("out_dir")
    ap.add_argument("--out", required=True, help="merged TP=1 weights file")
    ap.add_argument("--step", type=int, default=None)
    args = ap.parse_args(argv)
    print(merge_checkpoints(args.out_dir, args.out, args.step))
    return 0


if __name__ == "__main__":
    sys.exit(main())
