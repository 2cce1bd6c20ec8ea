"""Airflow Params and the corpus Asset, derived from the typed config so the form and YAML never disagree.

Each DAG's form shows only the fields that DAG uses (:data:`pipeline.form.FORMS`), grouped into sections, each with
the title, description, type, enum and bounds of the config field behind it.  Fields that may be empty accept
null, so the form does not mark them required.  No form field is a server path: the YAML file is the deployment's
(``$MINDLOOM_CONFIG``), and ``pretrain`` picks its corpus by ``corpus_build`` run id, resolved under ``data_root``.

Switches that exist for testing (making a training stage fail) appear only when the deployment sets
``MINDLOOM_TESTING_SWITCHES=1``; otherwise they are neither in the form nor honoured from a run's conf.
"""

from __future__ import annotations

import os
from pathlib import Path

from airflow.sdk import Asset, Param

from pipeline.config import DEFAULT_CONFIG, load_config
from pipeline.form import param_specs

TESTING_ENV = "MINDLOOM_TESTING_SWITCHES"
RUN_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:+-]{0,249}$"
#: The JSON-schema dialect of every Param.  Airflow validates each Param with ``jsonschema.validate``, which first
#: checks the schema itself against its dialect's meta-schema; with no ``$schema`` that is draft 2020-12, whose
#: meta-schema (vocabularies, dynamic refs) costs about 3.5x draft 7's.  Airflow resolves the whole form several
#: times per task instance (context, serialization), so at the shipped parallelism this is about 0.02 CPU-s per
#: task.  The form uses only keywords that mean the same in both (type, enum, minimum, maximum, pattern, items).
SCHEMA_DIALECT = "http://json-schema.org/draft-07/schema#"
RUN_ID_RULE = ("a run id is 1 to 250 characters: letters, digits and _ . : + - (no spaces or slashes), starting "
               "with a letter or digit, e.g. manual__2026-11-29T10:00:00+00:00")


def config_path() -> str:
    return os.environ.get("MINDLOOM_CONFIG") or str(DEFAULT_CONFIG)


def testing_switches_enabled() -> bool:
    return os.environ.get(TESTING_ENV, "").strip().lower() in ("1", "true", "yes")


def corpus_asset() -> Asset:
    """The published corpus: ``<data_root>/corpus/LATEST.json`` of the deployment's config."""
    data_root = Path(load_config(config_path()).data_root)
    return Asset(name="mindloom_corpus", uri=f"file://{data_root / 'corpus' / 'LATEST.json'}")


def model_asset() -> Asset:
    """The exported model (pretrain's ``export`` task): ``<data_root>/models/LATEST.json`` of the deployment."""
    data_root = Path(load_config(config_path()).data_root)
    return Asset(name="mindloom_model", uri=f"file://{data_root / 'models' / 'LATEST.json'}")


def build_params(kind: str) -> dict[str, Param]:
    """Params of the ``corpus`` or ``train`` form, defaults taken from the deployment's YAML config."""
    specs = param_specs(load_config(config_path()), form=kind)
    return {n: _param(**spec) for n, spec in specs.items()}


def _param(default=None, description: str | None = None, **schema) -> Param:
    return Param(default, description, **{"$schema": SCHEMA_DIALECT}, **schema)


def pretrain_params(stages: list[str], retries: int) -> dict[str, Param]:
    """The ``pretrain`` form: the training fields, which corpus to train on, and (when enabled) the test switches."""
    params = build_params("train")
    params["corpus_run"] = _param(
        None, type=["null", "string"], pattern=RUN_ID_PATTERN, title="Corpus run", section="Corpus",
        description="Run id of the corpus_build (or corpus_refresh) run to train on, as shown on that run's page. "
                    "Leave empty to train on the corpus whose Asset event triggered this run, else on the latest "
                    f"published corpus. Allowed: {RUN_ID_RULE}.")
    if testing_switches_enabled():
        params.update({
            "fail_at_step": _param(None, type=["null", "integer"], minimum=1, title="Fail at step", section="Testing",
                                  description=fail_at_step_description(load_config(config_path()).train
                                                                       .checkpoint_every)),
            "fail_stage": _param("main" if "main" in stages else stages[-1], type="string", enum=stages,
                                title="Stage that fails", section="Testing",
                                description="The stage fail_at_step applies to."),
            "fail_for_good": _param(False, type="boolean", title="Fail every automatic try", section="Testing",
                                   description=f"Off: only the first try crashes and the automatic retry resumes. "
                                               f"On: all {retries + 1} automatic tries crash (each after its first "
                                               f"step at or past fail_at_step), so the run fails and a Clear of "
                                               f"the stage resumes it."),
        })
    return params


def fail_at_step_description(every: int) -> str:
    """What the switch does at this deployment's ``train.checkpoint_every``: a retry resumes only from a step that
    wrote a checkpoint, so the example crash points are one that resumes and one that restarts."""
    early = f" A crash at step {every - 2} restarts the stage from step 0 (no checkpoint yet)." if every > 2 else ""
    return (f"Simulate a crash of the training job right after this step. Checkpoints are written every {every} "
            f"steps (train.checkpoint_every), and a retry resumes from the newest one: a crash at step {2 * every} "
            f"resumes from step {2 * every}.{early} Empty: no crash.")


def fail_step_template(stage: str) -> str:
    """Jinja for ``TrainingStageOperator.fail_at_step``: the test switch of this stage and try, else empty.

    Empty unless the deployment enables testing switches, so a run's conf cannot crash a production stage.
    """
    if not testing_switches_enabled():
        return ""
    return ("{{ params.fail_at_step if params.get('fail_at_step') and params.get('fail_stage') == '" + stage +
            "' and (ti.try_number == 1 or (params.get('fail_for_good') and ti.try_number <= task.retries + 1)) "
            "else '' }}")
