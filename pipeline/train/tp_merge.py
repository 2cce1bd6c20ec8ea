"""Merge the per-rank checkpoints of a tensor-parallel run into one TP=1 weights file.

Why: a model trained with ``tensor_parallel=t`` leaves ``t`` shards per committed step (rank 0 in
``out_dir/checkpoints``, rank r in ``out_dir/ranks/rank_<r>/checkpoints``, listed with their digests in the step's
commit marker); evaluation, export and a follow-up stage of another TP degree want the whole model. The weights of
the first data-parallel replica (ranks ``0..t-1``) are concatenated along each parameter's split axis
(``parallel.split_axis``); Adam moments are not merged (a merged file is for ``init_mode="weights"`` and
evaluation). The trainer uses :func:`merged_weights` itself when a weights-only stage changes the TP degree.

    python -m pipeline.train.tp_merge OUT_DIR --out merged.ckpt [--step N]
"""

from __future__ import annotations

import argparse
import os
import sys

from . import checkpoint as ckpt
from . import commit
from .parallel import merge_tp


def merged_weights(marker: dict) -> dict:
    """Whole-model weights (numpy) of a committed step: TP ranks ``0..t-1`` of its first data-parallel replica,
    each checked against the marker's digest and its layout metadata, merged along the split axes."""
    tp = marker["layout"]["tensor_parallel"]
    shards = []
    for r in range(tp):
        path, digest = commit.file_of(marker, r)
        pd, meta = ckpt.load_verified(path, digest)
        ckpt.check_layout(path, meta, {"tensor_parallel": tp, "tp_rank": r, "dp_rank": 0})
        shards.append({k: v.asnumpy() for k, v in ckpt.weights_only(pd).items()})
    return merge_tp(shards)


def merge_checkpoints(out_dir: str, dest: str, step: int | None = None) -> dict:
    """Write the merged TP=1 weights of committed ``step`` (default: the newest) to ``dest``; returns its info."""
    import mindspore as ms

    steps = commit.committed_steps(out_dir)
    if not steps:
        raise FileNotFoundError(f"no committed checkpoints in {ckpt.ckpt_dir(out_dir)}")
    step = steps[0] if step is None else step
    marker = commit.read_marker(commit.marker_path(out_dir, step))
    merged = merged_weights(marker)
    os.makedirs(os.path.dirname(os.path.abspath(dest)), exist_ok=True)
    ms.save_checkpoint([{"name": k, "data": ms.Tensor(v)} for k, v in sorted(merged.items())], dest)
    return {"step": step, "tensor_parallel": marker["layout"]["tensor_parallel"], "tensors": len(merged),
            "dest": dest}


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
