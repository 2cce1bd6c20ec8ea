"""One try of ``TrainingStageOperator`` in its own process, as an Airflow task process runs it (tests).

``python tests/operator_try.py STATE.json RUN_ID STAGE TRY CORPUS.json``: the task state store persists to
``STATE.json`` (Airflow keeps it in its metadata DB), so a later try of the same task finds the job the earlier one
launched. SIGTERM calls ``on_kill`` as Airflow's task runner does when a task is stopped. The stage result is printed
as one JSON line.
"""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


class FileStore:
    def __init__(self, path: Path):
        self.path = path

    def _all(self) -> dict:
        return json.loads(self.path.read_text()) if self.path.exists() else {}

    def get(self, key, default=None):
        return self._all().get(key, default)

    def set(self, key, value, **_):
        self.path.write_text(json.dumps({**self._all(), key: value}))

    def delete(self, key):
        kv = self._all()
        kv.pop(key, None)
        self.path.write_text(json.dumps(kv))


class TI:
    def __init__(self, try_number: int):
        self.try_number, self.stats_tags = try_number, {}


def main(state: str, run_id: str, stage: str, try_number: str, corpus: str) -> int:
    from operators.training import TrainingStageOperator

    op = TrainingStageOperator(task_id=f"train_{stage}", corpus=json.loads(Path(corpus).read_text()), stage=stage,
                               poll_interval=0.5)

    def stopped(*_):
        op.on_kill()
        sys.exit(143)

    signal.signal(signal.SIGTERM, stopped)
    context = {"params": {}, "run_id": run_id, "ti": TI(int(try_number)), "task_state_store": FileStore(Path(state))}
    print(json.dumps(op.execute(context), default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
