"""``TrainingStageOperator``: run one training stage as a detached job and report its metrics to the DAG.

The job (``python -m pipeline.train`` or ``msrun``) is started in its own session with stdin closed, so it
outlives the task process and never holds the supervisor's socket.  Its launcher pid and folder are stored in
``task_state_store`` (Airflow's :class:`ResumableJobMixin`) *before* polling starts: a retry after a worker
crash reconnects to the running job instead of launching a second one, and a retry after a failed job launches
a new one that resumes from the stage's newest checkpoint (the trainer does that by itself).  While it runs,
new ``metrics.jsonl`` rows are copied into the task log; the stage summary becomes the task's XCom.

What a try does, by what the stage folder holds when it starts:

* a running job (a worker died, Airflow retried): reconnect, and say so as the first log line;
* checkpoints of a failed or lost job (automatic retry, or a Clear of the failed stage): launch a new job, which
  resumes from the newest valid checkpoint; the first log line reads ``resumed from checkpoint step N (try K
  stopped at step M)``;
* ``completed.json``, written when this task succeeded (a Clear of a succeeded stage): train the stage again from
  its start; the old folder is kept as ``<stage>.cleared-<n>``.

The log shows ``metrics.jsonl`` as it is now: only rows that the current job wrote after its resume point, never
the old values of steps that the resumed job recomputes.
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

COMPLETED = "completed.json"
CANCEL_WAIT_S = 20.0           # how long on_kill waits for a job it launched to honour the cancel request


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
        self._metrics_offset = 0
        self._metrics_inode: int | None = None
        self._job_id: str | None = None
        self._resume_step = 0
        self._stage_dir: Path | None = None
        self._ext: dict | None = None           # this try's job: submitted, or reconnected to

    def execute(self, context: Any) -> Any:
        self._prepare_try(context)
        if not self.deferrable:
            return self._completed(context, self.execute_resumable(context))
        # Deferrable: the same reconnect-or-submit decision, then hand the wait to the triggerer.
        store = context.get("task_state_store")
        ext = store.get(self.external_id_key) if store is not None else None
        status = self.get_job_status(ext, context) if ext else None
        if ext and self.is_job_succeeded(status):
            self.log.info("job already completed successfully, skipping resubmission")
            return self._completed(context, self.get_job_result(ext, context))
        if not (ext and self.is_job_active(status)):
            ext = self.submit_job(context)
            if store is not None:
                store.set(self.external_id_key, ext)
        from operators.triggers import TrainingJobTrigger

        self.defer(trigger=TrainingJobTrigger(ext["out_dir"], ext.get("pid"), self.poll_interval, ext.get("job_id")),
                   method_name="execute_complete", kwargs={"external_id": ext})

    def execute_complete(self, context: Any, event: dict, external_id: dict | None = None) -> dict:
        """Back from the triggerer: copy the stage's metrics into this log, then succeed or fail like the sync path."""

        ext = external_id or event
        self._stream_metrics(event["out_dir"], self._launch_time(event["out_dir"]), ext.get("job_id"))
        if event["state"] != "SUCCEEDED":
            self._release_lost(ext, event["state"])
            raise AirflowException(f"training stage {self.stage} {event['state']} at step {event.get('step')}: "
                                   f"{event.get('error') or 'process ended without a status'}")
        return self._completed(context, self.get_job_result(ext, context))

    # -- what this try does, told in its first log line ------------------------------------------------------

    def _prepare_try(self, context: Any) -> None:
        """Re-train a cleared succeeded stage from its start, or announce the resume or reconnect of this try."""
        from pipeline.tasks.pretrain import archive_stage, job_state, resume_point

        out_dir = self._out_dir(context)
        self._stage_dir = out_dir
        store = context.get("task_state_store")
        ext = store.get(self.external_id_key) if store is not None else None
        if (out_dir / COMPLETED).exists():
            kept = archive_stage(out_dir)
            self.log.info("stage %s had succeeded and was cleared: training it again from the stage start "
                          "(the previous output is kept in %s)", self.stage, kept)
            if store is not None and ext:
                store.delete(self.external_id_key)
            self._resume_step = 0
            return
        self._job_id = ext.get("job_id") if ext else None
        self._ext = ext
        state = job_state(out_dir, ext.get("pid") if ext else None, job_id=self._job_id)
        point = resume_point(out_dir)
        self._resume_step = point["checkpoint_step"] or 0
        if ext and state["state"] in ("PENDING", "RUNNING"):
            self.log.info("reconnecting to the running job of stage %s (launched by try %s, at step %s)",
                          self.stage, point.get("launched_by_try"), state.get("step"))
        elif point["checkpoint_step"]:
            self.log.info("resumed from checkpoint step %d (try %s stopped at step %s)", point["checkpoint_step"],
                          point.get("launched_by_try"), point.get("stopped_at_step"))
        elif point.get("launched_by_try"):
            self.log.info("restarting stage %s from its start: try %s stopped at step %s before its first "
                          "checkpoint", self.stage, point["launched_by_try"], point.get("stopped_at_step"))

    def _completed(self, context: Any, result: Any) -> Any:
        """Mark the stage folder as finished by this task (a later Clear then means: train the stage again)."""
        from pipeline.io import write_json

        write_json(self._out_dir(context) / COMPLETED, {"try_number": context["ti"].try_number,
                                                        "time": time.time()})
        return result

    def _launch_time(self, out_dir: str | Path) -> float:
        from pipeline.io import read_json

        path = Path(out_dir) / "launch.json"
        return float(read_json(path).get("time", 0.0)) if path.exists() else 0.0

    def _stream_metrics(self, out_dir: str | Path, since: float, job_id: str | None = None) -> None:
        """Log the rows the current job wrote (its job id; ``time >= since`` for rows without one) past the last step
        already logged, reading only the bytes appended since the last call."""
        from pipeline.tasks.pretrain import read_metrics

        path = Path(out_dir) / "metrics.jsonl"
        inode = path.stat().st_ino if path.exists() else None
        if inode != self._metrics_inode:          # the trainer rewrote the file (it drops rows past its resume)
            self._metrics_inode, self._metrics_offset = inode, 0
        rows, self._metrics_offset = read_metrics(out_dir, self._metrics_offset)
        for r in rows:
            ours = r.get("job_id") == job_id if job_id and r.get("job_id") else r.get("time", 0.0) >= since
            if r.get("step", 0) > self._resume_step and ours:
                self._log_metric(r)
                self._resume_step = r["step"]

    def _log_metric(self, r: dict) -> None:
        self.log.info("stage %s step %s loss %.4f lr %.2e grad_norm %.3f tokens/s %.0f", self.stage,
                      r.get("step"), r.get("loss", float("nan")), r.get("lr", float("nan")),
                      r.get("grad_norm", float("nan")), r.get("tokens_per_s", 0.0))

    # -- ResumableJobMixin -----------------------------------------------------------------------------------

    def _config(self, context: Any):
        """The config the stage's job is built from: the run's form over the deployment's YAML."""
        from pipeline.form import config_from_params

        return config_from_params(dict(context["params"]))

    def _out_dir(self, context: Any) -> Path:
        from pipeline.tasks.pretrain import stage_dir

        return stage_dir(self._config(context).data_root, context["run_id"], self.stage)

    def submit_job(self, context: Any) -> dict:
        from pipeline.tasks.pretrain import build_job
        from pipeline.tasks.submit import launched_slurm_job, start_stage_job
        from pipeline.train.jobs.lease import live_lease, new_job_id

        cfg = self._config(context)
        out_dir = self._out_dir(context)
        if cfg.train.backend == "slurm" and (ext := launched_slurm_job(out_dir)):
            self._ext, self._job_id = ext, ext["job_id"]
            self.log.info("reconnecting to Slurm job %s of stage %s, which try %s submitted before it could record "
                          "the job: not submitting a second one", ext["slurm_job_id"], self.stage,
                          ext.get("launched_by_try"))
            return ext
        held = live_lease(out_dir)             # alive here, or its heartbeat counter moves
        if held:
            raise AirflowException(f"stage folder {out_dir} is held by job {held.get('job_id')} on host "
                                   f"{held.get('host')} (heartbeat {held.get('beat')}): not launching a second "
                                   f"trainer there")
        fail_at = int(self.fail_at_step) if self.fail_at_step not in (None, "", "None") else None
        job_path = build_job(cfg, self.corpus, out_dir, stage=self.stage, init_from=self.init_from or None,
                             fail_at_step=fail_at)
        try_number = context["ti"].try_number
        self._job_id = job_id = new_job_id()   # status rows, metric rows and the lease carry it
        ext, self._proc = start_stage_job(cfg, job_path, out_dir, try_number=try_number,
                                          log_name=f"launcher.try{try_number}.log", job_id=job_id)
        self._ext = ext
        where = f"Slurm job {ext['slurm_job_id']}" if ext.get("slurm_job_id") else f"pid {ext.get('pid')}"
        self.log.info("launched stage %s (%s, backend %s): log %s", self.stage, where, cfg.train.backend,
                      ext.get("log"))
        return ext

    def get_job_status(self, external_id: Any, context: Any) -> str:
        from pipeline.tasks.pretrain import job_state

        return job_state(external_id["out_dir"], external_id.get("pid"), job_id=external_id.get("job_id"))["state"]

    def is_job_active(self, status: str) -> bool:
        return status in ("PENDING", "RUNNING")

    def is_job_succeeded(self, status: str) -> bool:
        return status == "SUCCEEDED"

    def poll_until_complete(self, external_id: Any, context: Any) -> dict:
        """Stream metrics into the log until the job ends; raise with the job's own error when it fails."""
        from pipeline.tasks.pretrain import job_state

        out_dir, job_id = external_id["out_dir"], external_id.get("job_id")
        self._job_id = job_id
        since = self._launch_time(out_dir)
        seen = None                                 # what this poll loop last saw of the lease (its own clock)
        while True:
            if self._proc is not None:
                self._proc.poll()  # reap our child so a dead launcher is not seen as a zombie
            status = job_state(out_dir, external_id.get("pid"), job_id=job_id, seen=seen)
            seen = status.get("observed")
            self._stream_metrics(out_dir, since, job_id)
            if status["state"] == "SUCCEEDED":
                return self.get_job_result(external_id, context)
            if status["state"] in ("FAILED", "LOST"):
                self._release_lost(external_id, status["state"])
                raise AirflowException(
                    f"training stage {self.stage} {status['state']} at step {status.get('step')}: "
                    f"{status.get('error') or 'process ended without a status'} (log: {external_id.get('log')})")
            time.sleep(self.poll_interval)

    def _release_lost(self, ext: dict, state: str) -> None:
        """A LOST Slurm job (no lease, or a heartbeat that stood still) may still hold its nodes: ``scancel`` it
        before the task fails, so a retry does not wait behind it and its allocation is not kept idle."""
        if state != "LOST" or not ext.get("slurm_job_id"):
            return
        from pipeline.tasks.submit import stop_stage_job

        for line in stop_stage_job(ext["out_dir"], ext, f"stage {self.stage} was LOST"):
            self.log.info("%s", line)

    def get_job_result(self, external_id: Any, context: Any) -> dict:
        from pipeline.tasks.pretrain import stage_result

        return stage_result(external_id["out_dir"])

    def on_kill(self) -> None:
        """The task is being stopped (marked failed, cleared, timed out): cancel the job through its stage folder,
        which works whichever host runs it, and ``scancel`` a Slurm job; a job this process launched is also
        signalled if it does not stop."""
        from pipeline.tasks.submit import stop_stage_job

        if self._stage_dir is not None:
            for line in stop_stage_job(self._stage_dir, self._ext, f"Airflow task {self.task_id} was stopped"):
                self.log.warning("%s", line)
        if self._proc is not None:
            deadline = time.time() + CANCEL_WAIT_S
            while self._proc.poll() is None and time.time() < deadline:
                time.sleep(0.5)
            if self._proc.poll() is None:
                self.log.warning("killing training job (process group %s)", self._proc.pid)
                try:
                    os.killpg(self._proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
