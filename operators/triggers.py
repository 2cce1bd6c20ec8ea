"""``TrainingJobTrigger``: wait for a detached training job in the triggerer instead of a worker slot.

The trigger only reads the job's ``status.json`` and ``lease.json`` (and checks that its process lives, on the
launching host), so it works wherever the triggerer can see the job folder: the same host, or shared storage.  It
keeps what it last saw of the lease's heartbeat counter between polls, so freshness is measured on the triggerer's
own clock.  For a job on a remote worker with a local folder, use the operator's synchronous mode.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent


class TrainingJobTrigger(BaseTrigger):
    def __init__(self, out_dir: str, pid: int | None = None, poll_interval: float = 5.0, job_id: str | None = None):
        super().__init__()
        self.out_dir, self.pid, self.poll_interval, self.job_id = out_dir, pid, poll_interval, job_id

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return ("operators.triggers.TrainingJobTrigger",
                {"out_dir": self.out_dir, "pid": self.pid, "poll_interval": self.poll_interval, "job_id": self.job_id})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from pipeline.tasks.pretrain import TERMINAL, job_state

        seen = None                 # the lease counter as last seen, on this triggerer's clock
        while True:
            status = await asyncio.to_thread(job_state, self.out_dir, self.pid, job_id=self.job_id,
                                             seen=seen)   # file I/O off the event loop
            seen = status.get("observed")
            if status["state"] in TERMINAL:
                yield TriggerEvent({"state": status["state"], "out_dir": self.out_dir, "step": status.get("step"),
                                    "error": status.get("error"), "job_id": self.job_id})
                return
            await asyncio.sleep(self.poll_interval)
