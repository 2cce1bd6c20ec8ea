"""Settings of how the Airflow DAGs schedule and retry this deployment's runs (the ``airflow:`` section).

The DAG files read them at parse time from the deployment's config (``$MINDLOOM_CONFIG``), so they are not on the
trigger form: a run cannot change its own schedule, retries or deferral.  The ``mindloom`` CLI ignores them, and
they are left out of the config digest (:meth:`pipeline.config.MindloomConfig.digest`): they change when and how
often work runs, never what it produces.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pipeline.configkit import ConfigError, _f

#: The presets Airflow's cron timetables accept besides five-field expressions (``airflow.utils.dates``).
CRON_PRESETS = ("@hourly", "@daily", "@weekly", "@monthly", "@quarterly", "@yearly")
_CRON_FIELD = re.compile(r"^[0-9A-Za-z*/,?#-]+$")


def check_cron(value: str, where: str) -> None:
    """A five-field cron expression (``0 3 * * 0``) or one of :data:`CRON_PRESETS`; else ConfigError naming
    ``where``.  Checked with croniter (Airflow's parser) where it is installed, by shape elsewhere."""
    if value in CRON_PRESETS:
        return
    fields = value.split()
    ok = len(fields) == 5 and all(_CRON_FIELD.match(f) for f in fields)
    if ok:
        try:
            from croniter import croniter
        except ImportError:     # a training image without Airflow: the DAG side parses it again anyway
            pass
        else:
            ok = croniter.is_valid(value)
    if not ok:
        raise ConfigError(f"{where}: not a cron expression (five fields, e.g. '0 3 * * 0', or one of "
                          f"{', '.join(CRON_PRESETS)}), got {value!r}")


@dataclass
class AirflowConfig:
    train_retries: int = _f(1, desc="Automatic retries of each training stage task (retry_delay 5 s); a retry "
                            "resumes the stage from its newest checkpoint.", ge=0, le=100)
    train_deferrable: bool = _f(False, desc="Training stages wait for their job in the triggerer instead of "
                                "holding a worker slot (TrainingStageOperator(deferrable=True)).")
    refresh_schedule: str = _f("0 3 * * 0", desc="Cron of corpus_refresh (UTC, no catch-up; default Sundays "
                               "03:00), or an Airflow preset such as @weekly.")
    pretrain_cron: str = _f("", desc="A cron (UTC) next to pretrain's schedule on the mindloom_corpus Asset, "
                            "which makes pretrain backfillable, e.g. '0 4 * * 0'; empty: the Asset alone.")

    def __post_init__(self):
        check_cron(self.refresh_schedule, "airflow.refresh_schedule")
        if self.pretrain_cron:
            check_cron(self.pretrain_cron, "airflow.pretrain_cron")
