"""Test switches of the trainer, kept out of its main loop: ``TrainJob.fail_at_step`` and ``fail_mode``.

Why they exist: the resume path (checkpoint, retry, Airflow clear) can only be tested by a run that dies at a known
step.  With ``fail_at_step`` set, the run stops right after that step (and after its checkpoint, when one is due):
A job that resumed past ``fail_at_step`` stops after its first step at or past it, so a testing switch can
fail every try of a stage (the orchestrator decides which tries get the switch).  ``fail_mode="raise"`` raises
:class:`SimulatedCrash` (the normal error path, FAILED status); ``"kill"`` SIGKILLs the process (no cleanup at all,
like an OOM kill or a lost node).  ``"kill_between_saves"`` dies in the middle of the step-``fail_at_step`` checkpoint
instead: the last rank that writes a file waits until rank 0's file of that step exists and SIGKILLs itself before
writing its own (with one writing rank: rank 0 dies after its file, before the commit marker), so the step is half
written and never committed.  Production jobs leave ``fail_at_step`` null, and then nothing here does anything.
"""

from __future__ import annotations

import os
import signal
import time


class SimulatedCrash(RuntimeError):
    """Raised by ``fail_at_step`` (tests of the resume path)."""


PAUSED, RESUME = "paused_after_fence", "resume_after_pause"


def fence_of(job, step: int, lease):
    """The fence of the step-``step`` checkpoint. ``pause_after_fence`` at ``fail_at_step``: the first fence passes,
    then the process writes ``PAUSED`` into its folder and waits for ``RESUME`` (at most 300 s) before it goes on
    to the rename: the stall between a fence and a write that fencing must survive."""
    if job.fail_mode != "pause_after_fence" or step != job.fail_at_step:
        return lease.fence
    calls = []

    def fence():
        lease.fence()
        if not calls:
            calls.append(1)
            open(os.path.join(job.out_dir, PAUSED), "w").close()
            deadline = time.time() + 300
            while not os.path.exists(os.path.join(job.out_dir, RESUME)) and time.time() < deadline:
                time.sleep(0.05)

    return fence


def after_step(job, step: int) -> None:
    """Crash now when the job asks for a simulated failure at ``step``."""
    if job.fail_at_step is None or step < job.fail_at_step or job.fail_mode in ("kill_between_saves",
                                                                                "pause_after_fence"):
        return
    if job.fail_mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise SimulatedCrash(f"fail_at_step={job.fail_at_step}: simulated crash after step {step}")


def before_save(job, step: int, rank: int, writers: int) -> None:
    """``kill_between_saves``: the last writing rank dies once rank 0's file of this step is on disk."""
    if job.fail_mode != "kill_between_saves" or step != job.fail_at_step or writers == 1 or rank != writers - 1:
        return
    from .checkpoint.commit import rank_file

    rank0 = rank_file(job.out_dir, 0, step)
    deadline = time.time() + 300
    while not os.path.exists(rank0) and time.time() < deadline:
        time.sleep(0.05)
    os.kill(os.getpid(), signal.SIGKILL)


def before_commit(job, step: int, writers: int) -> None:
    """``kill_between_saves`` with one writing rank: rank 0 dies after its file, before the commit marker."""
    if job.fail_mode == "kill_between_saves" and step == job.fail_at_step and writers == 1:
        os.kill(os.getpid(), signal.SIGKILL)
