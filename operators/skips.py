"""A corpus step that finds an incremental refresh with nothing new ends *skipped*, not failed.

The library raises :class:`pipeline.tasks.run_state.NothingToShip` (it never imports Airflow); here it becomes
Airflow's skip, with the library's one line as the reason.  The tasks after it are skipped by their trigger rule, so
``publish`` emits no corpus Asset event and ``pretrain`` does not start; the DAG run itself ends successful.
"""

from __future__ import annotations


def skip_when_nothing_new(fn, *args, **kwargs):
    """``fn(*args, **kwargs)``, with :class:`NothingToShip` raised as Airflow's skip."""
    from pipeline.tasks.run_state import NothingToShip

    try:
        return fn(*args, **kwargs)
    except NothingToShip as exc:
        from airflow.sdk.exceptions import AirflowSkipException

        raise AirflowSkipException(str(exc)) from None
