"""``TrainingJobTrigger``: wait for a detached training job in the triggerer instead of a worker slot.

The trigger only reads the job's ``status.json`` (and checks that its process lives), so it works wherever the
triggerer can see the job folder: the same host, or shared storage.  For a job on a remote worker with a local
folder, use the operator's synchronous mode.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent


class TrainingJobTrigger(BaseTrigger):
    def __init__(self, out_dir: str, pid: int | None = None, poll_interval: float = 5.0):
        super().__init__()
        self.out_dir, self.pid, self.poll_interval = out_dir, pid, poll_interval

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return ("operators.triggers.TrainingJobTrigger",
                {"out_dir": self.out_dir, "pid": self.pid, "poll_interval": self.poll_interval})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from pipeline.tasks.pretrain import TERMINAL, job_state

        while True:
            status = await asyncio.to_thread(job_state, self.out_dir, self.pid)   # file I/O off the event loop
            if status["state"] in TERMINAL:
                yield TriggerEvent({"state": status["state"], "out_dir": self.out_dir, "step": status.get("step"),
                                    "error": status.get("error")})
                return
            await asyncio.sleep(self.poll_interval)
