"""Every ``MINDLOOM_*`` environment variable, declared once: its name, default, who reads it and why.

The typed configuration (:mod:`pipeline.config`) holds what a run does; these say where and how a deployment, a
training image or the test harness runs it.  What a team chooses per deployment about how runs behave (schedules,
retries, deferral, the verify reader's memory) is configuration, not a variable here: the ``airflow:`` section and
``pack.verify_mem_mb``, read by the DAG files from the loaded config.  ``docs/configuration.md`` renders this table
(:mod:`pipeline.config_reference`), and ``tests/test_switches.py`` fails when code, scripts, the Makefile or the
container files name a variable that is not declared here, or when a declared one is read nowhere.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Switch:
    name: str
    default: str        # "" when unset means off or "derive it"
    scope: str          # deployment (Airflow side), job (set for the training ranks), image, tests
    purpose: str


SWITCHES: tuple[Switch, ...] = (
    # -- the Airflow deployment ------------------------------------------------------------------------------------
    Switch("MINDLOOM_CONFIG", "", "deployment",
           "Path of the YAML config the DAGs load (their defaults and form); the CLI takes `--config`."),
    Switch("MINDLOOM_ALLOWED_ROOTS", "", "deployment",
           "Comma-separated folders (and `s3://bucket/prefix` URIs) a triggered run may read and write; unset: the "
           "config's own data root and sources (`pipeline/confine.py`)."),
    Switch("MINDLOOM_DATA_QUEUE", "", "deployment", "Celery queue of the data tasks (`operators/routing.py`)."),
    Switch("MINDLOOM_TRAIN_QUEUE", "", "deployment", "Celery queue of the training stages."),
    Switch("MINDLOOM_DATA_EXECUTOR", "", "deployment", "Executor of the data tasks under a multi-executor setup."),
    Switch("MINDLOOM_TRAIN_EXECUTOR", "", "deployment", "Executor of the training stages."),
    Switch("MINDLOOM_ROUTING_STRICT", "", "deployment",
           "`1`: a queue or executor that this Airflow cannot route to fails the DAG's import instead of a warning."),
    Switch("MINDLOOM_TESTING_SWITCHES", "", "deployment",
           "`1`: the form shows and runs honour the test-only switches (fail at a step); never in production."),
    Switch("MINDLOOM_AIRFLOW_HOME", ".airflow", "deployment", "`make airflow`'s AIRFLOW_HOME."),
    Switch("MINDLOOM_AIRFLOW_PORT", "8080", "deployment", "`make airflow`'s API server port."),
    Switch("MINDLOOM_DATA_WORKER_CONCURRENCY", "4", "deployment", "Task slots of the compose stack's data worker."),
    Switch("MINDLOOM_AIRFLOW_IMAGE", "mindloom-airflow:0.1.0", "deployment", "The compose stack's Airflow image."),
    Switch("MINDLOOM_AIRFLOW_TRAIN_IMAGE", "mindloom-airflow-train:0.1.0", "deployment",
           "The compose stack's training worker image (Airflow and MindSpore)."),
    Switch("MINDLOOM_HOME", "/opt/mindloom", "image", "Where the images install the repository."),
    # -- set for the training ranks ------------------------------------------------------------------------------
    Switch("MINDLOOM_JOB_ID", "", "job",
           "The launch's job id, set by the launcher for every rank: status rows, metric rows and the lease "
           "carry it."),
    Switch("MINDLOOM_MASTER_ADDR", "", "job",
           "The scheduler's host: the training image's entrypoint (required there) and, on Slurm, instead of "
           "the batch node's address."),
    Switch("MINDLOOM_NODES", "", "job", "The training image's entrypoint: number of nodes (required)."),
    Switch("MINDLOOM_DEVICES_PER_NODE", "", "job", "The training image's entrypoint: ranks per node (required)."),
    Switch("MINDLOOM_NODE_RANK", "", "job",
           "The training image's entrypoint: this node's rank (else `JOB_COMPLETION_INDEX` or `VC_TASK_INDEX`)."),
    Switch("MINDLOOM_MASTER_PORT", "8118", "job", "The training image's entrypoint: the scheduler's port."),
    Switch("MINDLOOM_MSRUN_LOG_DIR", "", "job", "The training image's entrypoint: msrun's log folder."),
    Switch("MINDLOOM_CLUSTER_TIME_OUT", "600", "job",
           "The training image's entrypoint: msrun's cluster time-out (s)."),
    Switch("MINDLOOM_BIND_CORE", "", "job",
           "The training image's entrypoint: msrun's `--bind_core` (true, false, JSON)."),
    Switch("MINDLOOM_DEVICE", "", "job", "The training image's entrypoint: the device target (e.g. `Ascend`)."),
    # -- the test harness -----------------------------------------------------------------------------------------
    Switch("MINDLOOM_STRICT", "", "tests", "`1`: a skipped test fails (CI), except the allowed skips."),
    Switch("MINDLOOM_REQUIRE_PROOFS", "", "tests", "Proof groups (celery, slurm, ...) that must have passed tests."),
    Switch("MINDLOOM_SCREENSHOTS", "", "tests", "Where the UI walkthrough writes its screenshots."),
    Switch("MINDLOOM_SLURM_ROOT", "/tmp/mindloom-slurm", "tests", "State folder of `make slurm`'s local cluster."),
    Switch("MINDLOOM_WORKER_HOSTNAME", "", "tests", "The Celery test worker's node name."),
    Switch("MINDLOOM_DEMO_CACHE", ".cache/demo-sources", "tests", "Cache of the demo corpus's downloads."),
    Switch("MINDLOOM_DOCKER_FRESH", "", "tests", "`1`: `make test-docker` drops its cached state first."),
    Switch("MINDLOOM_DOCKER_DATA", "", "tests", "`make test-docker`'s private dockerd data folder."),
    Switch("MINDLOOM_BASE_IMAGE", "", "tests", "The Debian base image `make test-docker` builds on."),
    Switch("MINDLOOM_SETUP_MARK", "", "tests", "Set by the Slurm test's `slurm_setup` line, read in each rank."),
    Switch("MINDLOOM_ENV_MARK", "", "tests", "Set by the Slurm test's `train.env`, read in each rank."),
)

BY_NAME = {s.name: s for s in SWITCHES}


def markdown_table() -> str:
    """The table ``docs/configuration.md`` shows."""
    rows = ["| Variable | Default | Scope | Purpose |", "|---|---|---|---|"]
    rows += [f"| `{s.name}` | {f'`{s.default}`' if s.default else ''} | {s.scope} | {s.purpose} |" for s in SWITCHES]
    return "\n".join(rows) + "\n"
