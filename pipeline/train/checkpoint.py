"""Crash-safe training checkpoints: one file per step with weights, optimizer state, data position, RNG state.

Why one file from the optimizer: ``save_checkpoint(opt)`` holds the weights (the optimizer references the same
Parameters), Adam moments ``adam_m.*``/``adam_v.*`` and ``global_step``, so a step's state is one atomic unit with one
checksum. Restoring the moments matters: a weights-only resume diverges after a few steps, a full one is bit-exact.

Layout under ``out_dir/checkpoints``::

    step_00000020.ckpt          written as .step_00000020.tmp.ckpt, then os.replace'd (readers never see partial)
    step_00000020.ckpt.sha256   "<hex>  step_00000020.ckpt" (sha256sum -c format), written *before* the rename

A checkpoint is valid only when its sidecar exists and matches, so a torn write, a truncated copy or bit rot makes the
resume logic fall back to the previous one instead of crashing or silently loading garbage.

Besides the tensors, each file holds scalar metadata (``META_INT``/``META_FLOAT``: step, global batch split, data
position, loss-scaler state) and the RNG state: MindSpore's default generator (``ms.get_rng_state``, used by
generator-based random ops) and NumPy's global Mersenne-Twister. Classic ops such as ``ops.randn`` or ``nn.Dropout``
draw from per-op counters that MindSpore does not expose, which is one reason the model has no dropout (LLaMA-style
pretraining uses none); the data order needs no RNG state at all (a pure function of seed and position, data.py).
"""

from __future__ import annotations

import glob
import logging
import os
import re

import mindspore as ms

from pipeline.io import sha256_file

log = logging.getLogger("mindloom.train")

_NAME = re.compile(r"^step_(\d{8})\.ckpt$")
META_INT = ("step", "samples_consumed", "world_size", "global_batch", "micro_batch", "grad_accum", "seq_len",
            "data_epoch", "data_sample", "data_consumed", "loss_scale_counter", "numpy_rng_pos", "seed",
            "tensor_parallel", "tp_rank", "dp_rank", "zero_shards")
META_FLOAT = ("loss_scale_value",)
META_ARRAY = ("ms_rng_state", "numpy_rng_keys")
SKIP_ON_LOAD = ("learning_rate",)  # the LR schedule comes from the job, not the checkpoint


def ckpt_dir(out_dir: str) -> str:
    return os.path.join(out_dir, "checkpoints")


def ckpt_path(out_dir: str, step: int) -> str:
    return os.path.join(ckpt_dir(out_dir), f"step_{step:08d}.ckpt")


def save(opt, out_dir: str, step: int, meta: dict, keep: int) -> str:
    """Save ``opt`` (weights + moments + global_step) plus integer ``meta``; prune to the newest ``keep``."""
    d = ckpt_dir(out_dir)
    os.makedirs(d, exist_ok=True)
    final = ckpt_path(out_dir, step)
    tmp = os.path.join(d, f".step_{step:08d}.tmp.ckpt")
    ms.save_checkpoint(opt, tmp, append_dict={**_encode_meta(meta), **rng_state()})
    digest = sha256_file(tmp)
    side_tmp = final + ".sha256.tmp"
    with open(side_tmp, "w", encoding="utf-8") as f:
        f.write(f"{digest}  {os.path.basename(final)}\n")
    os.replace(side_tmp, final + ".sha256")
    os.chmod(tmp, 0o644)
    os.replace(tmp, final)
    prune(out_dir, keep)
    return final


def list_checkpoints(out_dir: str) -> list[tuple[int, str]]:
    """``[(step, path)]`` newest first (by step number, not mtime)."""
    out = []
    for p in glob.glob(os.path.join(ckpt_dir(out_dir), "step_*.ckpt")):
        m = _NAME.match(os.path.basename(p))
        if m:
            out.append((int(m.group(1)), p))
    return sorted(out, reverse=True)


def prune(out_dir: str, keep: int) -> None:
    for _, p in list_checkpoints(out_dir)[keep:]:
        for f in (p, p + ".sha256"):
            try:
                os.remove(f)
            except FileNotFoundError:
                pass


def remove_stale_tmp(out_dir: str) -> None:
    """Temp files left by a crash in the middle of a save."""
    for p in glob.glob(os.path.join(ckpt_dir(out_dir), ".step_*.tmp.ckpt")) + glob.glob(
        os.path.join(ckpt_dir(out_dir), "*.sha256.tmp")
    ):
        os.remove(p)


def verify(path: str) -> str | None:
    """None when ``path`` matches its sidecar, else the reason it is not usable."""
    side = path + ".sha256"
    if not os.path.exists(side):
        return "no .sha256 sidecar"
    with open(side, encoding="utf-8") as f:
        want = f.read().split()[0] if os.path.getsize(side) else ""
    got = sha256_file(path)
    return None if got == want else f"sha256 mismatch (file {got[:12]}…, sidecar {want[:12]}…)"


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


def load_file(path: str) -> tuple[dict, dict]:
    """``(param_dict, meta)`` of one verified checkpoint (``init_mode="continue"`` of a new stage)."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"init_from checkpoint {path!r} not found")
    why = verify(path)
    if why:
        raise ValueError(f"init_from checkpoint {path!r} is not usable: {why}")
    return _split_meta(ms.load_checkpoint(path))


def load_latest(out_dir: str) -> tuple[str, dict, dict] | None:
    """Newest checkpoint that verifies and loads: ``(path, param_dict, meta)``; corrupt ones are skipped, logged."""
    for _, path in list_checkpoints(out_dir):
        why = verify(path)
        if why is None:
            try:
                pd, meta = _split_meta(ms.load_checkpoint(path))
            except Exception as e:  # noqa: BLE001 - any unreadable file means "try the previous one"
                why = f"unreadable: {e}"
            else:
                if "step" in meta:
                    return path, pd, meta
                why = "no step metadata"
        log.warning("skipping checkpoint %s: %s", path, why)
    return None


def restore_full(opt, pd: dict) -> None:
    """Load weights + optimizer state (moments, ``global_step``); every optimizer parameter except the LR table
    must be present."""
    pd = {k: v for k, v in pd.items() if k not in SKIP_ON_LOAD}
    own = opt.parameters_dict()
    for name in SKIP_ON_LOAD:  # keep the job's own value (and avoid MindSpore's "... are not loaded" warning)
        if name in own:
            pd[name] = own[name]
    not_loaded, _ = ms.load_param_into_net(opt, pd)
    missing = [n for n in not_loaded if n not in SKIP_ON_LOAD]
    if missing:
        raise ValueError(f"checkpoint lacks {len(missing)} optimizer/model parameters, e.g. {missing[:3]}")


def load_weights(net, path: str) -> int:
    """Weights only (``init_from`` of a previous stage). Accepts names with or without the ``model.`` prefix that
    wrapping in the loss cell adds; every model parameter must be found with the right shape. Returns the count."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"init_from checkpoint {path!r} not found")
    if os.path.exists(path + ".sha256") and (why := verify(path)):
        raise ValueError(f"init_from checkpoint {path!r} is corrupt: {why}")
    raw = ms.load_checkpoint(path)
    params = {p.name: p for p in net.get_parameters()}
    pd = {}
    for name, p in params.items():
        for cand in (name, name.removeprefix("model."), "model." + name):
            if cand in raw:
                if tuple(raw[cand].shape) != tuple(p.shape):
                    raise ValueError(f"init_from {path!r}: {cand} has shape {tuple(raw[cand].shape)}, "
                                     f"model expects {tuple(p.shape)} (different model config?)")
                pd[name] = raw[cand]
                if raw[cand].dtype != p.dtype:  # fp32 <-> 16-bit weights of the distributed optimizer
                    pd[name] = ms.Parameter(raw[cand].astype(p.dtype), name=name)
                break
    missing = sorted(set(params) - set(pd))
    if missing:
        raise ValueError(f"init_from {path!r} lacks {len(missing)} model parameters, e.g. {missing[:3]}")
    ms.load_param_into_net(net, pd, strict_load=True)
    return len(pd)
