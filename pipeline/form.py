"""The trigger-form mapping: which config fields the Airflow forms expose, and their JSON schema.

Each Param maps onto one dotted config field; :func:`param_specs` derives the schema (type, enum, bounds) from
that field's metadata, so the form refuses what the config would refuse.  This module never imports Airflow; the
DAGs wrap the specs in ``airflow.sdk.Param`` (``operators/params.py``).
"""

from __future__ import annotations

import copy
import dataclasses
import typing
from pathlib import Path
from typing import Any

from pipeline.config import MindloomConfig, load_config
from pipeline.configkit import _hints

#: Param name → dotted config field.  The DAG builds one ``Param`` per entry from :func:`param_specs`.
PARAM_FIELDS: dict[str, str] = {
    "run_name": "run_name",
    "domains": "domains",
    "seed": "seed",
    "approval": "approval",
    "docs_per_shard": "ingest.docs_per_shard",
    "strict_ingest": "ingest.strict",
    "exact_dedup": "dedup.exact",
    "near_dedup": "minhash.enabled",
    "near_dedup_threshold": "minhash.threshold",
    "incremental_dedup": "minhash.use_index",
    "mixture_weights": "mixture.weights",
    "quality_filter": "quality.enabled",
    "min_words": "quality.min_words",
    "quality_classifier": "quality.classifier.enabled",
    "classifier_keep_top_percent": "quality.classifier.keep_top_percent",
    "vocab_size": "tokenizer.vocab_size",
    "seq_len": "pack.seq_len",
    "mindrecord_shards": "pack.shard_num",
    "model_preset": "train.preset",
    "train_steps": "train.steps",
    "batch_size": "train.batch_size",
    "learning_rate": "train.lr",
    "train_mode": "train.mode",
    "train_workers": "train.workers",
    "train_precision": "train.precision",
    "train_grad_accum": "train.grad_accum",
    "train_recompute": "train.recompute",
    "train_tensor_parallel": "train.tensor_parallel",
    "train_zero": "train.zero",
    "train_from_release": "train.from_release",
    "train_replay_share": "train.replay_share",
}

#: Form fields whose upper bound is a deployment setting (not the field's own metadata): a run cannot ask for more
#: ranks than one launch of this deployment starts.  ``train.device_memory_gb`` is not on the form at all: the size
#: of a device is the deployment's, and 0 would switch the memory check off.
DEPLOYMENT_MAXIMUM = {"train_workers": lambda cfg: cfg.train.max_workers * cfg.train.nodes}  # per node x nodes

#: Which Params each DAG's form shows, grouped into the form's sections (in order).  A DAG shows only the fields
#: it uses: the corpus DAGs never offer training knobs and ``pretrain`` never offers corpus ones.
FORMS: dict[str, dict[str, tuple[str, ...]]] = {
    "corpus": {
        "Run": ("run_name", "domains", "seed", "approval"),
        "Ingest": ("docs_per_shard", "strict_ingest"),
        "Deduplication": ("exact_dedup", "near_dedup", "near_dedup_threshold", "incremental_dedup"),
        "Quality": ("quality_filter", "min_words", "quality_classifier", "classifier_keep_top_percent"),
        "Tokenizer and MindRecord": ("vocab_size", "seq_len", "mindrecord_shards", "mixture_weights"),
    },
    "train": {
        "Run": ("run_name", "seed"),
        "Model and optimisation": ("model_preset", "train_steps", "batch_size", "learning_rate",
                                   "train_grad_accum", "train_from_release",
                                   "train_replay_share"),
        "Execution": ("train_mode", "train_precision", "train_recompute"),
        "Parallelism and memory": ("train_workers", "train_tensor_parallel", "train_zero"),
    },
}

_JSON_TYPES = {int: "integer", float: "number", bool: "boolean", str: "string", dict: "object"}


def _field_of(dotted: str) -> tuple[dataclasses.Field, Any]:
    cls: Any = MindloomConfig
    f = None
    for part in dotted.split("."):
        f = {x.name: x for x in dataclasses.fields(cls)}[part]
        cls = _hints(cls)[part]
    return f, cls


def _get_dotted(cfg: MindloomConfig, dotted: str) -> Any:
    node: Any = cfg
    for part in dotted.split("."):
        node = getattr(node, part)
    return copy.deepcopy(node)


def _bounds_text(spec: dict) -> str:
    lo, hi = spec.get("minimum"), spec.get("maximum")
    if lo is not None and hi is not None:
        return f" Allowed: {lo} to {hi}."
    if lo is not None:
        return f" Allowed: at least {lo}."
    if hi is not None:
        return f" Allowed: at most {hi}."
    return ""


def param_specs(cfg: MindloomConfig | None = None, form: str | None = None) -> dict[str, dict]:
    """JSON-schema keyword dicts (default, type, title, description, enum, minimum, maximum, section) per Param.

    With ``form`` (``"corpus"`` or ``"train"``) only that DAG's fields, in form order, each with its ``section``.
    A field whose default is empty (``domains: []``, ``mixture.weights: {}``) also accepts null, so the form
    does not mark it required.
    """
    cfg = cfg or load_config()
    sections = {n: sec for sec, names in FORMS.get(form or "", {}).items() for n in names}
    names = list(sections) if form else list(PARAM_FIELDS)
    specs: dict[str, dict] = {}
    for name in names:
        dotted = PARAM_FIELDS[name]
        f, tp = _field_of(dotted)
        meta = f.metadata
        default = _get_dotted(cfg, dotted)
        spec: dict[str, Any] = {"default": default, "title": name.replace("_", " ").capitalize()}
        if typing.get_origin(tp) is list:
            spec["type"] = "array"
            spec["items"] = {"type": "string"}
            if name == "domains":
                spec["items"]["enum"] = sorted({s.domain for s in cfg.sources})
                spec["examples"] = spec["items"]["enum"]      # the trigger form renders a multi-select
                spec["uniqueItems"] = True
        else:
            spec["type"] = _JSON_TYPES[tp]
            if meta.get("choices"):
                spec["enum"] = list(meta["choices"])
            if meta.get("ge") is not None and tp in (int, float):
                spec["minimum"] = meta["ge"]
            if meta.get("le") is not None and tp in (int, float):
                spec["maximum"] = meta["le"]
            if name in DEPLOYMENT_MAXIMUM:
                spec["maximum"] = DEPLOYMENT_MAXIMUM[name](cfg)
        if default in ([], {}, "", None):
            spec["type"] = [spec["type"], "null"]
            spec["default"] = None
        spec["description"] = f"{meta.get('desc', '')}{_bounds_text(spec)} (config: {dotted})"
        if name in sections:
            spec["section"] = sections[name]
        specs[name] = spec
    return specs


def config_from_params(params: dict[str, Any], path: str | Path | None = None) -> MindloomConfig:
    """Config from the deployment's YAML file (``path``, else ``$MINDLOOM_CONFIG``) with the trigger-form Params
    applied on top.  Unknown params are ignored, and so are params left empty (null) in the form.  The YAML file
    is never chosen by a param: a run's conf cannot point the workers at another file."""
    overrides = {PARAM_FIELDS[k]: v for k, v in params.items() if k in PARAM_FIELDS and v is not None}
    return load_config(path or None, overrides)    # train.workers > train.max_workers fails there too
