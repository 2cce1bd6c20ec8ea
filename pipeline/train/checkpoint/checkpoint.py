"""Crash-safe training checkpoints: per step, a weights file and a state file, each with its sha256 sidecar.

Why two files: under ZeRO every data-parallel rank saves its own optimizer blocks, but the weights of a TP shard
are the same on every replica and are saved once, by data-parallel rank 0. When they shared rank 0's file, every
other rank read that whole file (weights *and* rank 0's moment blocks) to take the weights; now a rank reads the
weights file of its TP rank plus its own state file, nothing else. Restoring the moments matters: a weights-only
resume diverges after a few steps, a full one is bit-exact.

Layout under ``out_dir/checkpoints`` (rank r > 0 of a sharded layout: ``out_dir/ranks/rank_<r>/checkpoints``)::

    step_00000020.weights.ckpt   the model weights (this TP shard), plus step and layout; written by the ranks
                                 that hold a copy nobody else saves (data-parallel rank 0)
    step_00000020.ckpt           this rank's state: Adam moments / fp32 master blocks, global_step, adam_step,
                                 data position, loss scaler, RNG state, layout (every writing rank)
    <each>.sha256                "<hex>  <name>" (sha256sum -c format), hashed while the file was written
                                 (``ckpt_write``), never by reading it back; published before the file

Each file is written as ``.<name>.tmp.ckpt`` and renamed into place by ``fenced.publish`` (readers never see a
partial file; a fenced-off job leaves only temp files, which the next start removes). A step counts only once
``commit.py`` has written its commit marker listing every file with its digest; resume and stage chaining check
each file they read against the marker and fall back to the previous committed step on every rank when one is
torn, truncated or rotten. A load reads each file once: ``ckpt_write.read`` hashes the bytes it read, the digest
is checked against the marker (or the sidecar), and only then are the same bytes parsed. Each file records the
layout that wrote it (``tensor_parallel``, ``tp_rank``, ``data_parallel``, ``dp_rank``, ``zero_shards``), and a
load by a rank of another layout is refused (:func:`check_file_layout`), never silently taken.

Older checkpoints (one ``step_X.ckpt`` per rank, the weights inside data-parallel rank 0's) still load: a marker
entry without ``weights`` means the weights are in that entry's own file, and a plain path without a
``.weights.ckpt`` beside it is read whole, as before.

RNG state: MindSpore's default generator (``ms.get_rng_state``, used by generator-based random ops) and NumPy's
global Mersenne-Twister. Classic ops such as ``ops.randn`` or ``nn.Dropout`` draw from per-op counters that
MindSpore does not expose, which is one reason the model has no dropout (LLaMA-style pretraining uses none); the
data order needs no RNG state at all (a pure function of seed and position, data.py).
"""

from __future__ import annotations

import glob
import logging
import os
import re

import mindspore as ms

from ..jobs import fenced
from . import ckpt_write

log = logging.getLogger("mindloom.train")

_NAME = re.compile(r"^step_(\d{8})\.ckpt$")
META_INT = ("step", "samples_consumed", "world_size", "global_batch", "micro_batch", "grad_accum", "seq_len",
            "data_epoch", "data_sample", "data_consumed", "loss_scale_counter", "numpy_rng_pos", "seed",
            "tensor_parallel", "tp_rank", "dp_rank", "zero_shards", "data_parallel")
META_FLOAT = ("loss_scale_value",)
META_ARRAY = ("ms_rng_state", "numpy_rng_keys")
SKIP_ON_LOAD = ("learning_rate",)  # the LR schedule comes from the job, not the checkpoint


def ckpt_dir(out_dir: str) -> str:
    return os.path.join(out_dir, "checkpoints")


def ckpt_path(out_dir: str, step: int) -> str:
    return os.path.join(ckpt_dir(out_dir), f"step_{step:08d}.ckpt")


def weights_path(state_path: str) -> str:
    """The weights file beside a state file: ``step_X.ckpt`` -> ``step_X.weights.ckpt``."""
    return state_path.removesuffix(".ckpt") + ".weights.ckpt"


def save(opt, out_dir: str, step: int, meta: dict, fence=None, weights: bool = True) -> str:
    """Save this rank's state file (moments, optimizer scalars, ``meta``, RNG) and, with ``weights``, the weights
    file beside it; returns the state file. Pruning waits for the commit (commit.prune). ``fence()`` (raises when
    the job lost its lease) runs before anything is renamed into place (``fenced.publish``)."""
    os.makedirs(ckpt_dir(out_dir), exist_ok=True)
    final = ckpt_path(out_dir, step)
    extra = {**_encode_meta(meta), **rng_state()}
    files = [(final, [*ckpt_write.cell_entries(opt, lambda name: not is_weight(name)), *extra.items()])]
    if weights:
        ident = {k: v for k, v in extra.items() if k == "step" or k in LAYOUT_META}
        files.insert(0, (weights_path(final), [*ckpt_write.cell_entries(opt, is_weight), *ident.items()]))
    for dest, entries in files:
        _write_published(dest, entries, fence or fenced.no_fence)
    return final


def _write_published(dest: str, entries: list, fence) -> str:
    """Write ``entries`` to a temp name while hashing them, write the sidecar, publish sidecar then file."""
    d, name = os.path.split(dest)
    tmp = os.path.join(d, "." + name.removesuffix(".ckpt") + ".tmp.ckpt")
    side_tmp = dest + ".sha256.tmp"
    try:
        digest, _ = ckpt_write.write(tmp, entries)
        with open(side_tmp, "w", encoding="utf-8") as f:
            f.write(f"{digest}  {name}\n")
        os.chmod(tmp, 0o644)
        fenced.publish(side_tmp, dest + ".sha256", fence)
        fenced.publish(tmp, dest, fence)
    finally:
        for p in (tmp, side_tmp):
            if os.path.exists(p):
                os.remove(p)
    return digest


def list_checkpoints(out_dir: str) -> list[tuple[int, str]]:
    """``[(step, path)]`` newest first (by step number, not mtime)."""
    out = []
    for p in glob.glob(os.path.join(ckpt_dir(out_dir), "step_*.ckpt")):
        m = _NAME.match(os.path.basename(p))
        if m:
            out.append((int(m.group(1)), p))
    return sorted(out, reverse=True)


def remove_stale_tmp(out_dir: str) -> None:
    """Temp files left by a crash in the middle of a save (rank 0's and every rank's folder)."""
    for d in [ckpt_dir(out_dir), *glob.glob(os.path.join(out_dir, "ranks", "rank_*", "checkpoints"))]:
        for p in glob.glob(os.path.join(d, ".step_*.tmp.ckpt")) + glob.glob(os.path.join(d, "*.sha256.tmp")):
            os.remove(p)


def sidecar_digest(path: str) -> str | None:
    """The digest ``path``'s ``.sha256`` sidecar records ("" for an empty one), or None when it has none."""
    side = path + ".sha256"
    if not os.path.exists(side):
        return None
    with open(side, encoding="utf-8") as f:
        return (f.read().split() or [""])[0]


def _read_checked(path: str, want: str | None, refuse) -> dict:
    """``ms.load_checkpoint(path)``'s dict from one read of ``path``, whose bytes must hash to ``want`` (None: taken
    as it is); ``refuse(got)`` is the error raised when they do not."""
    def check(got: str) -> None:
        if want is not None and got != want:
            raise refuse(got)

    return ckpt_write.read(path, check)


def _encode_meta(meta: dict) -> dict:
    unknown = sorted(set(meta) - set(META_INT) - set(META_FLOAT))
    if unknown:
        raise ValueError(f"checkpoint metadata {unknown[0]!r} is not declared in META_INT/META_FLOAT")
    return {k: (float(v) if k in META_FLOAT else int(v)) for k, v in meta.items()}


def rng_state() -> dict:
    """RNG state as checkpoint entries (see the module docstring)."""
    import numpy as np

    _, keys, pos, _, _ = np.random.get_state()
    return {"ms_rng_state": ms.get_rng_state(), "numpy_rng_keys": ms.Tensor(keys.astype(np.int64)),
            "numpy_rng_pos": int(pos)}


def restore_rng(meta: dict) -> None:
    import numpy as np

    if "ms_rng_state" in meta:
        ms.set_rng_state(ms.Tensor(meta["ms_rng_state"]))
    if "numpy_rng_keys" in meta and "numpy_rng_pos" in meta:
        np.random.set_state(("MT19937", meta["numpy_rng_keys"].astype(np.uint32), meta["numpy_rng_pos"], 0, 0.0))


def _split_meta(pd: dict) -> tuple[dict, dict]:
    meta = {}
    for k in META_INT:
        if k in pd:
            meta[k] = int(pd.pop(k).asnumpy())
    for k in META_FLOAT:
        if k in pd:
            meta[k] = float(pd.pop(k).asnumpy())
    for k in META_ARRAY:
        if k in pd:
            meta[k] = pd.pop(k).asnumpy()
    return pd, meta


def load_file(path: str, need_sidecar: bool = True) -> tuple[dict, dict]:
    """``(param_dict, meta)`` of one checkpoint file given by path (``init_from``); it must match its sidecar
    (without ``need_sidecar`` a file that has none, e.g. a ``tp_merge`` output, is taken as it is). A state file
    (``step_X.ckpt``) comes with the weights of the ``step_X.weights.ckpt`` beside it, checked the same way."""
    pd, meta = _checked_file(path, need_sidecar)
    if os.path.isfile(wpath := weights_path(path)) and not weights_only(pd):  # a state file: its weights beside it
        pd.update(weights_only(_checked_file(wpath, need_sidecar)[0]))
    return pd, meta


def _checked_file(path: str, need_sidecar: bool) -> tuple[dict, dict]:
    if not os.path.isfile(path):
        raise FileNotFoundError(f"init_from checkpoint {path!r} not found")
    want = sidecar_digest(path)
    if want is None and need_sidecar:
        raise ValueError(f"init_from checkpoint {path!r} is not usable: no .sha256 sidecar")
    return _split_meta(_read_checked(path, want, lambda got: ValueError(
        f"init_from checkpoint {path!r} is not usable: sha256 mismatch (file {got[:12]}…, sidecar {want[:12]}…)")))


def restore_full(opt, pd: dict) -> None:
    """Load weights + optimizer state (moments, ``global_step``, ``adam_step``); every optimizer parameter except
    the LR table must be present. A file from before ``adam_step`` existed counted Adam's updates in
    ``global_step``, so that value is taken."""
    pd = {k: v for k, v in pd.items() if k not in SKIP_ON_LOAD}
    if "adam_step" not in pd and "global_step" in pd and hasattr(opt, "adam_step"):
        pd["adam_step"] = ms.Parameter(ms.Tensor(pd["global_step"].asnumpy()), name="adam_step")
    own = opt.parameters_dict()
    for name in SKIP_ON_LOAD:  # keep the job's own value (and avoid MindSpore's "... are not loaded" warning)
        if name in own:
            pd[name] = own[name]
    not_loaded, _ = ms.load_param_into_net(opt, pd)
    missing = [n for n in not_loaded if n not in SKIP_ON_LOAD]
    if missing:
        raise ValueError(f"checkpoint lacks {len(missing)} optimizer/model parameters, e.g. {missing[:3]}")


def load_verified(path: str, sha256: str) -> tuple[dict, dict]:
    """``(param_dict, meta)`` of ``path`` after checking it against the digest its commit marker recorded (one read:
    the bytes hashed are the bytes parsed)."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"checkpoint {path} is missing")
    return _split_meta(_read_checked(path, sha256, lambda got: ValueError(
        f"checkpoint {path}: sha256 {got[:12]}… does not match its commit marker ({sha256[:12]}…)")))


LAYOUT_META = ("tensor_parallel", "tp_rank", "data_parallel", "dp_rank", "zero_shards")
_LAYOUT_DEFAULT = {"tensor_parallel": 1, "tp_rank": 0, "data_parallel": None, "dp_rank": 0, "zero_shards": 1}


def check_file_layout(path: str, meta: dict, want: dict) -> None:
    """Refuse, in one line naming the file and the field, a file written by another rank layout than ``want``
    (the fields of ``LAYOUT_META`` that ``want`` gives; a file from before ``data_parallel`` was recorded passes
    that field)."""
    from .commit import LayoutMismatch

    for k in LAYOUT_META:
        if k not in want:
            continue
        have = meta.get(k, _LAYOUT_DEFAULT[k])
        if have is not None and int(have) != int(want[k]):
            raise LayoutMismatch(f"checkpoint {path}: written with {k}={have}, this rank expects {k}={want[k]}")


_NOT_WEIGHTS = ("adam_m.", "adam_v.", "accum.", "master.")
_OPT_SCALARS = ("global_step", "adam_step", "learning_rate", "beta1_power", "beta2_power", "master_synced")


def is_weight(name: str) -> bool:
    return not name.startswith(_NOT_WEIGHTS) and name not in _OPT_SCALARS and name not in META_ARRAY \
        and name not in META_INT and name not in META_FLOAT


def weights_only(pd: dict) -> dict:
    """The model weights of a loaded checkpoint dict (no moments, optimizer scalars or metadata)."""
    return {k: v for k, v in pd.items() if is_weight(k)}


def assign_weights(net, raw: dict, what: str) -> int:
    """Load the weights dict ``raw`` (Tensors or arrays) into ``net``. Accepts names with or without the
    ``model.`` prefix that wrapping in the loss cell adds; every model parameter must be found with the right
    shape. Returns the count."""
    params = {p.name: p for p in net.get_parameters()}
    pd = {}
    for name, p in params.items():
        for cand in (name, name.removeprefix("model."), "model." + name):
            if cand in raw:
                v = raw[cand]
                if tuple(v.shape) != tuple(p.shape):
                    raise ValueError(f"init_from {what}: {cand} has shape {tuple(v.shape)}, model expects "
                                     f"{tuple(p.shape)} (different model config?)")
                if not isinstance(v, ms.Tensor):  # a numpy slice (take_shard) may be a strided view
                    import numpy as np

                    v = ms.Parameter(ms.Tensor(np.ascontiguousarray(v)), name=name)
                if v.dtype != p.dtype:  # fp32 <-> 16-bit weights of the distributed optimizer
                    v = ms.Parameter(v.astype(p.dtype), name=name)
                pd[name] = v
                break
    missing = sorted(set(params) - set(pd))
    if missing:
        raise ValueError(f"init_from {what} lacks {len(missing)} model parameters, e.g. {missing[:3]}")
    ms.load_param_into_net(net, pd, strict_load=True)
    return len(pd)


def load_weights(net, path: str) -> int:
    """Weights only of one whole-model file (a TP=1 checkpoint or a ``tp_merge`` output) into ``net``; given a
    state file, only the weights file beside it is read."""
    if os.path.isfile(weights_path(path)):
        path = weights_path(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"init_from checkpoint {path!r} not found")
    want = sidecar_digest(path)  # a file without a sidecar (e.g. a tp_merge output) is taken as it is
    return assign_weights(net, _read_checked(path, want, lambda got: ValueError(
        f"init_from checkpoint {path!r} is corrupt: sha256 mismatch (file {got[:12]}…, sidecar {want[:12]}…)")),
        repr(path))
