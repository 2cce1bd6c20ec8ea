"""Airflow Params and the corpus Asset, derived from the typed config so the form and YAML never disagree.

Every form field comes from :data:`pipeline.form.PARAM_FIELDS` with the title, description, type, enum and
bounds of the config field behind it; a value the config would reject is already refused by the form and by the
REST API (JSON-schema validation), and anything that slips through fails in the first task with the field name.
"""

from __future__ import annotations

import os
from pathlib import Path

from airflow.sdk import Asset, Param

from pipeline.config import DEFAULT_CONFIG, load_config
from pipeline.form import param_specs

TRAIN_PARAMS = ("run_name", "seed", "model_preset", "train_steps", "batch_size", "learning_rate", "train_mode",
                "train_workers", "train_tensor_parallel", "train_zero", "train_device_memory_gb")


def config_path() -> str:
    return os.environ.get("MINDLOOM_CONFIG") or str(DEFAULT_CONFIG)


def corpus_asset() -> Asset:
    """The published corpus: ``<data_root>/corpus/LATEST.json`` of the deployment's config."""
    data_root = Path(load_config(config_path()).data_root)
    return Asset(name="mindloom_corpus", uri=f"file://{data_root / 'corpus' / 'LATEST.json'}")


def build_params(kind: str) -> dict[str, Param]:
    """Params for the ``corpus`` or ``train`` DAG, defaults taken from the deployment's YAML config."""
    specs = param_specs(load_config(config_path()))
    names = [n for n in specs if (n in TRAIN_PARAMS) == (kind == "train") or n in ("run_name", "seed")]
    params = {n: Param(**specs[n]) for n in names}
    params["config_path"] = Param(config_path(), type="string", title="Config file",
                                  description="YAML configuration the form fields are applied on top of.")
    return params
