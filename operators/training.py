"""``TrainingStageOperator``: run one training stage as a detached job and report its metrics to the DAG.

The job (``python -m pipeline.train`` or ``msrun``) is started in its own session with stdin closed, so it
outlives the task process and never holds the supervisor's socket.  Its launcher pid and folder are stored in
``task_state_store`` (Airflow's :class:`ResumableJobMixin`) *before* polling starts: a retry after a worker
crash reconnects to the running job instead of launching a second one, and a retry after a failed job launches
a new one that resumes from the stage's newest checkpoint (the trainer does that by itself).  While it runs,
new ``metrics.jsonl`` rows are copied into the task log; the stage summary becomes the task's XCom.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.bases.resumablejobmixin import ResumableJobMixin
from airflow.sdk.exceptions import AirflowException


class TrainingStageOperator(ResumableJobMixin, BaseOperator):
    """Train one stage over the corpus described by ``corpus`` (the summary the corpus DAG published)."""

    template_fields = ("stage", "corpus", "init_from", "fail_at_step")
    template_fields_renderers = {"corpus": "json"}
    external_id_key = "training_job"
    ui_color = "#f2d7c9"

    def __init__(self, *, corpus: Any, stage: str = "main", init_from: str | None = None,
                 fail_at_step: int | None = None, poll_interval: float = 2.0, deferrable: bool = False,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.deferrable = deferrable
        self.corpus = corpus
        self.stage = stage
        self.init_from = init_from
        self.fail_at_step = fail_at_step
        self.poll_interval = poll_interval
        self._proc: subprocess.Popen | None = None
        self._metrics_line = 0

    def execute(self, context: Any) -> Any:
        if not self.deferrable:
            return self.execute_resumable(context)
        # Deferrable: the same reconnect-or-submit decision, then hand the wait to the triggerer.
        store = context.get("task_state_store")
        ext = store.get(self.external_id_key) if store is not None else None
        status = self.get_job_status(ext, context) if ext else None
        if ext and self.is_job_succeeded(status):
            self.log.info("job already completed successfully, skipping resubmission")
            return self.get_job_result(ext, context)
        if ext and self.is_job_active(status):
            self.log.info("reconnecting to running job %s", ext)
        else:
            ext = self.submit_job(context)
            if store is not None:
                store.set(self.external_id_key, ext)
        from operators.triggers import TrainingJobTrigger

        self.defer(trigger=TrainingJobTrigger(ext["out_dir"], ext.get("pid"), self.poll_interval),
                   method_name="execute_complete", kwargs={"external_id": ext})

    def execute_complete(self, context: Any, event: dict, external_id: dict | None = None) -> dict:
        """Back from the triggerer: copy the stage's metrics into this log, then succeed or fail like the sync path."""
        from pipeline.tasks.pretrain import read_metrics

        rows, _ = read_metrics(event["out_dir"])
        for r in rows:
            self._log_metric(r)
        if event["state"] != "SUCCEEDED":
            raise AirflowException(f"training stage {self.stage} {event['state']} at step {event.get('step')}: "
                                   f"{event.get('error') or 'process ended without a status'}")
        return self.get_job_result(external_id or event, context)

    def _log_metric(self, r: dict) -> None:
        self.log.info("stage %s step %s loss %.4f lr %.2e grad_norm %.3f tokens/s %.0f", self.stage,
                      r.get("step"), r.get("loss", float("nan")), r.get("lr", float("nan")),
                      r.get("grad_norm", float("nan")), r.get("tokens_per_s", 0.0))

    # -- ResumableJobMixin -----------------------------------------------------------------------------------

    def _out_dir(self, context: Any) -> Path:
        from pipeline.form import config_from_params
        from pipeline.tasks.pretrain import stage_dir

        cfg = config_from_params(dict(context["params"]))
        return stage_dir(cfg.data_root, context["run_id"], self.stage)

    def submit_job(self, context: Any) -> dict:
        from pipeline.form import config_from_params
        from pipeline.io import write_json
        from pipeline.tasks.pretrain import build_job, launch_argv, launch_env, record_launch

        cfg = config_from_params(dict(context["params"]))
        out_dir = self._out_dir(context)
        fail_at = int(self.fail_at_step) if self.fail_at_step not in (None, "", "None") else None
        job_path = build_job(cfg, self.corpus, out_dir, stage=self.stage, init_from=self.init_from or None,
                             fail_at_step=fail_at)
        argv = launch_argv(job_path)          # the stage's own worker count, from its job
        try_number = context["ti"].try_number
        log_path = out_dir / f"launcher.try{try_number}.log"
        self.log.info("launching stage %s: %s", self.stage, " ".join(argv))
        with open(log_path, "ab") as log_fh:
            self._proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log_fh, stderr=subprocess.STDOUT,
                                          env=launch_env(), start_new_session=True, close_fds=True,
                                          cwd=str(out_dir))
        write_json(out_dir / "status.json", {"state": "PENDING", "step": 0, "pid": self._proc.pid})
        record_launch(out_dir, argv, self._proc.pid)
        return {"out_dir": str(out_dir), "pid": self._proc.pid, "log": str(log_path)}

    def get_job_status(self, external_id: Any, context: Any) -> str:
        from pipeline.tasks.pretrain import job_state

        return job_state(external_id["out_dir"], external_id.get("pid"))["state"]

    def is_job_active(self, status: str) -> bool:
        return status in ("PENDING", "RUNNING")

    def is_job_succeeded(self, status: str) -> bool:
        return status == "SUCCEEDED"

    def poll_until_complete(self, external_id: Any, context: Any) -> dict:
        """Stream metrics into the log until the job ends; raise with the job's own error when it fails."""
        from pipeline.tasks.pretrain import job_state, read_metrics

        out_dir = external_id["out_dir"]
        while True:
            if self._proc is not None:
                self._proc.poll()  # reap our child so a dead launcher is not seen as a zombie
            rows, self._metrics_line = read_metrics(out_dir, self._metrics_line)
            for r in rows:
                self._log_metric(r)
            status = job_state(out_dir, external_id.get("pid"))
            if status["state"] == "SUCCEEDED":
                return self.get_job_result(external_id, context)
            if status["state"] in ("FAILED", "LOST"):
                raise AirflowException(
                    f"training stage {self.stage} {status['state']} at step {status.get('step')}: "
                    f"{status.get('error') or 'process ended without a status'} (log: {external_id.get('log')})")
            time.sleep(self.poll_interval)

    def get_job_result(self, external_id: Any, context: Any) -> dict:
        from pipeline.tasks.pretrain import stage_result

        return stage_result(external_id["out_dir"])

    def on_kill(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self.log.warning("killing training job (process group %s)", self._proc.pid)
            try:
                os.killpg(self._proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
