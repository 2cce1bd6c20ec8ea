"""Initial weights drawn one parameter at a time, each rank drawing only what its tensor-parallel shard needs.

Why: a rank that built the whole fp32 model to slice its shard needed 4 bytes of host memory per parameter of the
whole model, hundreds of GiB for 70b (a rank's plan now: ``memory_plan.70b_host_build_gib``). Megatron's
``_initialize_affine_weight_cpu`` draws one full parameter at a time and splits it; this goes one step further and
draws a parameter in fixed row chunks, each from its own seed, so that a rank skips the chunks it does not keep.

The values of parameter ``name`` with full shape ``[rows, cols...]`` are defined independently of any layout:
chunk ``c`` (rows ``c*R .. (c+1)*R``, ``R = max(1, CHUNK_ELEMS // cols)``, a function of the full shape only) is
``std * standard_normal((R, cols...))`` from ``numpy.random.Generator(PCG64(SeedSequence([seed, crc32(name), c])))``.
So TP=1 and every TP degree start from the same full tensors (a TP=2 run still equals a TP=1 run), and:

* a row-split parameter (``split_axis`` 0: wq/wk/wv/w1/w3, the embedding table, the LM head) draws only the chunks
  that overlap its row block;
* a column-split one (axis 1: wo, w2) draws every chunk and keeps its columns of each;
* a replicated one (RMSNorm gains) is ones, drawn by nobody.

Host memory while drawing: the rank's own shard of the parameter plus one chunk (``CHUNK_ELEMS`` fp32 values,
4 MiB) at a time; the whole model is never held. Standard deviations follow ``model.py``: ``init_std`` everywhere,
``init_std / sqrt(2 * n_layers)`` for the residual outputs (wo, w2), GPT-2's scaling.
"""

from __future__ import annotations

import math
import re
import zlib

import numpy as np

from .parallel import split_axis

CHUNK_ELEMS = 1 << 20
_RESIDUAL_OUT = re.compile(r"\.(wo|w2)\.weight$")
_NORM = re.compile(r"norm\.weight$")


def param_std(name: str, init_std: float, n_layers: int) -> float | None:
    """The standard deviation of parameter ``name``'s draw, or None for a norm gain (initialised to ones)."""
    if _NORM.search(name):
        return None
    return init_std / math.sqrt(2 * n_layers) if _RESIDUAL_OUT.search(name) else init_std


def full_shape(shard_shape: tuple, axis: int | None, tp: int) -> tuple:
    if axis is None or tp == 1:
        return tuple(shard_shape)
    return tuple(n * tp if i == axis else n for i, n in enumerate(shard_shape))


def _chunk(name: str, seed: int, c: int, rows: int, rest: tuple, std: float) -> np.ndarray:
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, zlib.crc32(name.encode()), c])))
    out = rng.standard_normal((rows, *rest), dtype=np.float32)
    out *= np.float32(std)
    return out


def draw_shard(name: str, shape: tuple, std: float | None, seed: int, tp: int = 1, tp_rank: int = 0,
               axis: int | None = None) -> np.ndarray:
    """This rank's shard (shape ``shape``) of parameter ``name``: the same values as the full draw, sliced."""
    if std is None:
        return np.ones(shape, np.float32)
    full = full_shape(shape, axis, tp)
    rows, rest = full[0], full[1:]
    per = max(1, CHUNK_ELEMS // max(1, int(np.prod(rest, dtype=np.int64))))
    out = np.empty(shape, np.float32)
    lo, hi = (tp_rank * shape[0], (tp_rank + 1) * shape[0]) if axis == 0 and tp > 1 else (0, rows)
    if axis == 1 and tp > 1:
        c_lo, c_hi = tp_rank * shape[1], (tp_rank + 1) * shape[1]
    for c in range(lo // per, (hi - 1) // per + 1):
        r0, r1 = c * per, min(rows, (c + 1) * per)
        block = _chunk(name, seed, c, r1 - r0, rest, std)
        a, b = max(r0, lo), min(r1, hi)
        block = block[a - r0:b - r0]
        if axis == 1 and tp > 1:
            block = block[:, c_lo:c_hi]
        out[a - lo:b - lo] = block
    return out


def init_rank_weights(net, cfg, seed: int, tp: int = 1, tp_rank: int = 0, dtype=None) -> int:
    """Set every trainable parameter of ``net`` (this rank's shards; built under ``no_init_parameters`` or not)
    to its layout-independent draw, one parameter at a time, cast to ``dtype`` (e.g. 16-bit for the distributed
    optimizer; default: the parameter's). Returns the bytes of the largest single draw held at once."""
    import mindspore as ms

    largest = 0
    for p in net.trainable_params():
        axis = split_axis(p.name)
        arr = draw_shard(p.name, tuple(p.shape), param_std(p.name, cfg.init_std, cfg.n_layers), seed, tp, tp_rank,
                         axis)
        largest = max(largest, arr.nbytes)
        if dtype is not None and p.dtype != dtype:
            p.set_dtype(dtype)
        p.set_data(ms.Tensor(arr, dtype=p.dtype))
        del arr
    return largest
