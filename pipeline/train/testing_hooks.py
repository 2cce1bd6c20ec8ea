"""Test switches of the trainer, kept out of its main loop: ``TrainJob.fail_at_step`` and ``fail_mode``.

Why they exist: the resume path (checkpoint, retry, Airflow clear) can only be tested by a run that dies at a known
step.  With ``fail_at_step`` set, the run stops right after that step (and after its checkpoint, when one is due):
A job that resumed past ``fail_at_step`` stops after its first step at or past it, so a testing switch can
fail every try of a stage (the orchestrator decides which tries get the switch).  ``fail_mode="raise"`` raises :class:`SimulatedCrash` (the normal error path, FAILED status); ``"kill"`` SIGKILLs
the process (no cleanup at all, like an OOM kill or a lost node).  Production jobs leave ``fail_at_step`` null,
and then nothing here does anything.
"""

from __future__ import annotations

import os
import signal


class SimulatedCrash(RuntimeError):
    """Raised by ``fail_at_step`` (tests of the resume path)."""


def after_step(job, step: int) -> None:
    """Crash now when the job asks for a simulated failure at ``step``."""
    if job.fail_at_step is None or step < job.fail_at_step:
        return
    if job.fail_mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise SimulatedCrash(f"fail_at_step={job.fail_at_step}: simulated crash after step {step}")
