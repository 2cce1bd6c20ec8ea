"""Which numeric precision runs on which device in which mode, as data (no MindSpore import).

Why a table instead of "try it and see": an unsupported combination does not always fail at start. On CPU,
bf16 dies at the first MatMul/Gather kernel lookup, but fp16 in PYNATIVE *runs* and produces inf/NaN gradients from
step 0 (most gradient tensors in the measurement of docs notes §7), so a month-long job would burn its first checkpoint
interval before anyone noticed. The job is therefore refused up front, naming ``TrainJob.precision``.

Rows marked ``measured`` were run on this project's CPU machines with mindspore 2.10 (tests/test_train_recipe.py
keeps them honest); rows marked ``documented`` follow MindSpore's own AMP documentation for that backend and cannot be
run here.

Precision semantics (all ``auto_mixed_precision(net, "O2", dtype)``: fp32 master weights and optimizer state,
matmuls in the low-precision dtype, RMSNorm/softmax/loss kept in fp32 by the model itself):

* ``fp32``: no casting, no loss scaling.
* ``fp16``: dynamic loss scaling (``DynamicLossScaler``); a step whose unscaled gradients are not all finite is
  skipped (no weight, moment or LR-schedule update) and the scale is halved; after ``loss_scale_window`` good steps
  it doubles.
* ``bf16``: same exponent range as fp32, so no loss scaling (scale reported as 1.0).
"""

from __future__ import annotations

PRECISIONS = ("fp32", "bf16", "fp16")

# device -> precision -> (modes that work, source, note shown in errors)
SUPPORT: dict[str, dict[str, tuple[tuple[str, ...], str, str]]] = {
    "CPU": {
        "fp32": (("graph", "pynative"), "measured", "identical losses in both modes"),
        "fp16": (("graph",), "measured",
                 "O2 in GRAPH trains (losses ~ fp32) but a step is 2.5-4x slower than fp32; in PYNATIVE the "
                 "gradients are inf/NaN from step 0"),
        "bf16": ((), "measured", "no bf16 CPU kernels for MatMul/Softmax/Gather ('Select CPU operator[Gather] "
                                 "fail! Unsupported data type!')"),
    },
    "GPU": {
        "fp32": (("graph", "pynative"), "documented", ""),
        "fp16": (("graph", "pynative"), "documented", "Tensor-Core fp16 with dynamic loss scaling"),
        "bf16": ((), "documented", "MindSpore's GPU backend lacks bf16 kernels for several ops of this model"),
    },
    "Ascend": {
        "fp32": (("graph", "pynative"), "documented", "slow on Ascend (cube units are fp16/bf16)"),
        "fp16": (("graph", "pynative"), "documented", ""),
        "bf16": (("graph", "pynative"), "documented", "the usual choice on Atlas 800T A2 (910B)"),
    },
}


def check_precision(device: str, mode: str, precision: str) -> None:
    """Raise ValueError naming ``TrainJob.precision`` when ``precision`` cannot run on ``device`` in ``mode``."""
    if precision not in PRECISIONS:
        raise ValueError(f"TrainJob.precision={precision!r}: must be one of {PRECISIONS}")
    modes, source, note = SUPPORT[device][precision]
    if mode in modes:
        return
    where = f"device={device!r}, mode={mode!r}"
    works = [f"{p} ({'/'.join(m)})" for p, (m, _, _) in SUPPORT[device].items() if m]
    hint = f"; supported on {device}: {', '.join(works)}"
    why = f" ({source}: {note})" if note else f" ({source})"
    raise ValueError(f"TrainJob.precision={precision!r}: not supported with {where}{why}{hint}")


def uses_loss_scaling(precision: str) -> bool:
    return precision == "fp16"


def capability_table() -> list[dict]:
    """Rows for reports/docs: device, precision, modes, source, note."""
    return [{"device": d, "precision": p, "modes": list(m), "source": s, "note": n}
            for d, row in SUPPORT.items() for p, (m, s, n) in row.items()]
