"""How a CPU training process dispatches MindSpore's launches: on the calling thread.

MindSpore's runtime hands every graph launch to a dispatch thread, and the Python thread that waits for it (each
fetch of a step's loss) spins in a loop without sleeping. On an accelerator that overlaps host work with the
device; on CPU host and device share the cores, so one core per rank burns in the loop while the kernels wait
for CPU. ``MS_DEV_HOST_BLOCKING_RUN=1`` runs the launch on the calling thread instead (same kernels, same
results). Read once, at a process's first launch; a value the user exported wins.

The trainer applies it to every CPU job, the tests' conftest to the in-process trainings, ``bench_train`` to its
process. No MindSpore import here.
"""

from __future__ import annotations

import os

CPU_DISPATCH_ENV = {"MS_DEV_HOST_BLOCKING_RUN": "1"}
THREADED_DISPATCH_ENV = {key: "0" for key in CPU_DISPATCH_ENV}  # MindSpore's own default: to compare against


def cpu_dispatch_inline() -> None:
    """Dispatch MindSpore's launches on the calling thread (CPU jobs): before this process's first launch."""
    for key, value in CPU_DISPATCH_ENV.items():
        os.environ.setdefault(key, value)


def host_dispatch() -> str:
    """``inline`` or ``threaded``: how this process's launches are dispatched (for the job summary)."""
    return "inline" if all(os.environ.get(k) == v for k, v in CPU_DISPATCH_ENV.items()) else "threaded"
