"""``python -m pipeline.train --job job.json``: run one training stage in this process (or one msrun worker).

Exit codes: 0 success, 1 training/job error (status.json says FAILED with the message), 2 bad command line, 3 the
stage folder belongs to another job (refused second trainer, or a lost lease): nothing is written there.
Errors end in one clear ``mindloom.train: error: ...`` line on stderr; the traceback goes to the log only at
``--verbose`` (DEBUG), because the Airflow operator surfaces the last stderr line as the task's failure reason.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time


class Terminated(Exception):
    """SIGTERM (Airflow task kill, msrun teardown) turned into an exception so status.json ends up FAILED."""


def _on_sigterm(signum, _frame):
    raise Terminated(f"terminated by signal {signum}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipeline.train", description=__doc__.splitlines()[0])
    ap.add_argument("--job", required=True, help="TrainJob JSON file")
    ap.add_argument("--verbose", action="store_true", help="debug logging, tracebacks on error")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log = logging.getLogger("mindloom.train")
    signal.signal(signal.SIGTERM, _on_sigterm)

    from pipeline.io import write_json  # no MindSpore import yet: job errors are reported fast

    from .job import TrainJob
    from .jobs.lease import LeaseLost, StageBusy, env_job_id, may_write

    job = None
    try:
        job = TrainJob.from_json(args.job)
        from .trainer import run_training  # imports MindSpore (slow: only after the job parsed)

        summary = run_training(job)
    except (StageBusy, LeaseLost) as e:  # the folder is another job's: its status is not ours to touch
        print(f"mindloom.train: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        print("mindloom.train: error: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - top-level: one line, status FAILED, exit 1
        msg = f"{type(e).__name__}: {e}"
        log.debug("training failed", exc_info=True)
        if job is None:
            _status_without_job(args.job, msg, write_json)
        # run_training already wrote FAILED for errors inside it; this covers errors before it started, unless a
        # live job of another id holds the folder (fenced like every other status write)
        elif _may_record(job.out_dir) and may_write(job.out_dir, env_job_id()):
            write_json(os.path.join(job.out_dir, "status.json"), {
                "state": "FAILED", "step": 0, "pid": os.getpid(), "loss": None, "error": msg, "stage": job.stage,
                "job_id": env_job_id(), "updated_at": time.time()})
        print(f"mindloom.train: error: {msg}", file=sys.stderr)
        return 1
    print(json.dumps(summary, default=str))
    return 0


def _may_record(out_dir: str) -> bool:
    """Whether this process's error is news: not msrun's scheduler (its errors echo a worker's), not after this
    process or another rank of the same job already wrote a final row (the first failure of a job is its reason)."""
    if os.environ.get("MS_ROLE") == "MS_SCHED":
        return False
    from .jobs.lease import env_job_id

    try:
        with open(os.path.join(out_dir, "status.json"), encoding="utf-8") as f:
            st = json.load(f)
    except (OSError, ValueError):
        return True
    if st.get("state") == "FAILED" and st.get("pid") == os.getpid():
        return False
    job_id = env_job_id()
    return not (job_id and st.get("job_id") == job_id and st.get("state") in ("FAILED", "SUCCEEDED"))


def _status_without_job(job_path: str, msg: str, write_json) -> None:
    """The job file itself is bad: still record FAILED when its out_dir can be read from the raw JSON."""
    try:
        with open(job_path, encoding="utf-8") as f:
            out_dir = json.load(f)["out_dir"]
        from .jobs.lease import env_job_id, may_write

        if isinstance(out_dir, str) and out_dir and may_write(out_dir, env_job_id()):
            write_json(os.path.join(out_dir, "status.json"), {
                "state": "FAILED", "step": 0, "pid": os.getpid(), "loss": None, "error": msg,
                "job_id": env_job_id(), "updated_at": time.time()})
    except Exception:  # noqa: BLE001 - nothing more we can record
        pass


if __name__ == "__main__":
    sys.exit(main())
