"""Which Celery queue and which executor a task goes to, chosen by the deployment's environment, not by DAG code.

Why: the same DAG files are parsed by a laptop's ``airflow standalone`` (LocalExecutor), by pytest, and by a
cluster whose training hosts sit behind another executor (Celery ``train`` queue, EdgeExecutor, Kubernetes).  A
task that names an executor the parsing process does not have is an import error there
(``UnknownExecutorException``), so DAGs never hard-code one.  Instead::

    @task(**data_task_kwargs())          # {"queue": "data"} on the cluster, {} on a laptop
    TrainingStageOperator(..., **train_task_kwargs())

Variables (empty or unset: the key is omitted and Airflow's default applies):

``MINDLOOM_DATA_QUEUE`` / ``MINDLOOM_TRAIN_QUEUE``
    Celery (or Edge) queue of the data stages / the training stages.  LocalExecutor ignores queues.
``MINDLOOM_DATA_EXECUTOR`` / ``MINDLOOM_TRAIN_EXECUTOR``
    Executor alias, class name or module path, as listed in ``[core] executor``.  Kept only when this process has
    that executor configured; otherwise dropped with a warning, so the DAG still imports.
``MINDLOOM_ROUTING_STRICT``
    ``true`` on a real deployment: a named executor that is not configured becomes an import error that names the
    variable (visible in the UI), instead of silently running training on the default executor.
"""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Mapping

ROLES = ("data", "train")
STRICT_VAR = "MINDLOOM_ROUTING_STRICT"
# Celery queue names: a worker subscribes with `-q a,b`, so commas and spaces cannot be part of one name.
_QUEUE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,199}$")
_CORE_EXECUTORS = {
    "LocalExecutor": "airflow.executors.local_executor.LocalExecutor",
    "CeleryExecutor": "airflow.providers.celery.executors.celery_executor.CeleryExecutor",
    "KubernetesExecutor": "airflow.providers.cncf.kubernetes.executors.kubernetes_executor.KubernetesExecutor",
}


class RoutingError(ValueError):
    """A routing variable is invalid; the message names the variable."""


def queue_var(role: str) -> str:
    return f"MINDLOOM_{role.upper()}_QUEUE"


def executor_var(role: str) -> str:
    return f"MINDLOOM_{role.upper()}_EXECUTOR"


def _truthy(var: str, raw: str) -> bool:
    low = raw.strip().lower()
    if low in ("", "0", "false", "no", "off"):
        return False
    if low in ("1", "true", "yes", "on"):
        return True
    raise RoutingError(f"{var}: must be true or false (got {raw!r})")


def executor_names(executor_config: str) -> set[str]:
    """Every name a task's ``executor=`` may use for the executors in a ``[core] executor`` value.

    Airflow accepts the alias, the module path and the class name of each entry (entries are comma-separated,
    ``alias:module.path`` or a core name; ``team=...`` sections are separated by ``;``).
    """
    names: set[str] = set()
    for section in executor_config.split(";"):
        section = section.split("=", 1)[1] if "=" in section else section
        for entry in filter(None, (e.strip() for e in section.split(","))):
            alias, _, target = entry.rpartition(":")
            module_path = _CORE_EXECUTORS.get(target, target)
            names.update(filter(None, (alias, target, module_path, module_path.rsplit(".", 1)[-1])))
            if target in _CORE_EXECUTORS:
                names.add(target)
    return names


def _configured_executors() -> str:
    from airflow.configuration import conf

    return conf.get("core", "executor", fallback="") or ""


def task_kwargs(role: str, env: Mapping[str, str] | None = None, executor_config: str | None = None) -> dict:
    """``{"queue": ..., "executor": ...}`` for tasks of ``role`` (``data`` or ``train``), empty values omitted.

    ``executor_config`` defaults to this process's ``[core] executor`` (read only when an executor is named).
    """
    if role not in ROLES:
        raise RoutingError(f"role: must be one of {ROLES} (got {role!r})")
    env = os.environ if env is None else env
    out: dict = {}
    qvar, evar = queue_var(role), executor_var(role)
    queue = (env.get(qvar) or "").strip()
    if queue:
        if not _QUEUE.match(queue):
            raise RoutingError(f"{qvar}: {queue!r} is not a valid queue name (letters, digits, '_', '.', ':', '-'; "
                               "one queue per task — workers list several with -q a,b)")
        out["queue"] = queue
    executor = (env.get(evar) or "").strip()
    if executor:
        configured = _configured_executors() if executor_config is None else executor_config
        if executor in executor_names(configured):
            out["executor"] = executor
        else:
            msg = (f"{evar}={executor!r} is not among this process's executors ([core] executor = "
                   f"{configured!r}); set it only where that executor is configured")
            if _truthy(STRICT_VAR, env.get(STRICT_VAR, "")):
                raise RoutingError(msg)
            warnings.warn(msg + "; the task uses the default executor", RuntimeWarning, stacklevel=2)
    return out


def data_task_kwargs(env: Mapping[str, str] | None = None, executor_config: str | None = None) -> dict:
    """Routing for ingest, dedup, filters, tokenization and MindRecord tasks (CPU fan-out)."""
    return task_kwargs("data", env, executor_config)


def train_task_kwargs(env: Mapping[str, str] | None = None, executor_config: str | None = None) -> dict:
    """Routing for training stages (hosts with MindSpore and the accelerators)."""
    return task_kwargs("train", env, executor_config)
