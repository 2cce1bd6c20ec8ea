"""One typed configuration for every mindloom stage.

The same dataclasses back the YAML file, the ``mindloom`` CLI and the Airflow trigger form, so a value means the
same thing wherever it is set.  Loading is strict: an unknown key, a wrong type or a value outside its allowed
range raises :class:`ConfigError` naming the dotted field (``train.mode``) and what is allowed, before any work
starts.

Field metadata (``_f(...)``) carries the title, description, choices and bounds; :func:`param_specs` turns the
fields listed in :data:`PARAM_FIELDS` into JSON-schema dictionaries that the DAGs wrap in ``airflow.sdk.Param``
(this module never imports Airflow).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "default.yaml"


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the dotted field."""


def _f(default: Any = dataclasses.MISSING, *, desc: str = "", choices: tuple | None = None,
       ge: float | None = None, le: float | None = None, factory: Any = None) -> Any:
    meta = {"desc": desc, "choices": choices, "ge": ge, "le": le}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class SourceConfig:
    """One input of one domain: a reader and the files it reads."""

    domain: str = _f(desc="Domain name the documents belong to (web, code, zh, ...).")
    paths: list[str] = _f(factory=list, desc="Files or glob patterns; relative paths are taken from the config file.")
    reader: str = _f("jsonl", desc="Reader for these files.", choices=("jsonl",))
    text_field: str = _f("text", desc="JSON field holding the document text.")
    id_field: str = _f("id", desc="JSON field with the source's own id, kept in meta (empty: none).")


@dataclass
class IngestConfig:
    docs_per_shard: int = _f(2000, desc="Documents per Parquet shard; shards map 1:1 onto Airflow mapped tasks.", ge=1)
    strict: bool = _f(False, desc="Fail on the first bad record instead of quarantining it in the rejects table.")
    max_doc_chars: int = _f(20_000_000, desc="Records with longer text are rejected (reason too_long).", ge=1)


@dataclass
class DedupConfig:
    exact: bool = _f(True, desc="Remove exact duplicates (hash of normalized text) across the whole corpus.")


@dataclass
class QualityConfig:
    """Gopher quality rules (Rae et al. 2021, App. A; datatrove GopherQualityFilter defaults)."""

    enabled: bool = _f(True, desc="Apply the Gopher quality rules.")
    skip_domains: list[str] = _f(factory=lambda: ["code"], desc="Domains the prose rules do not apply to.")
    min_words: int = _f(50, desc="Gopher: minimum words (CJK characters count as words).", ge=0)
    max_words: int = _f(100_000, desc="Gopher: maximum words.", ge=1)
    min_mean_word_length: float = _f(3.0, desc="Gopher: minimum mean word length (non-CJK text).", ge=0)
    max_mean_word_length: float = _f(10.0, desc="Gopher: maximum mean word length (non-CJK text).", ge=0)
    max_symbol_word_ratio: float = _f(0.1, desc="Gopher: maximum '#' and ellipsis per word.", ge=0)
    max_bullet_lines_ratio: float = _f(0.9, desc="Gopher: maximum fraction of lines starting with a bullet.", ge=0, le=1)
    max_ellipsis_lines_ratio: float = _f(0.3, desc="Gopher: maximum fraction of lines ending in an ellipsis.", ge=0, le=1)
    min_alpha_words_ratio: float = _f(0.8, desc="Gopher: minimum fraction of words with a letter.", ge=0, le=1)
    min_stop_words: int = _f(2, desc="Gopher: minimum English stop words (not applied to CJK text).", ge=0)


@dataclass
class TokenizerConfig:
    vocab_size: int = _f(4000, desc="SentencePiece vocabulary size.", ge=300, le=262144)
    model_type: str = _f("bpe", desc="SentencePiece model type.", choices=("bpe", "unigram"))
    sample_chars: int = _f(3_000_000, desc="Characters of text sampled (stratified by domain) for training.", ge=10_000)
    character_coverage: float = _f(0.9995, desc="Share of characters covered; the rest fall back to bytes.",
                                   ge=0.9, le=1.0)


@dataclass
class PackConfig:
    seq_len: int = _f(128, desc="Training context; rows hold seq_len + 1 tokens (mindformers convention).",
                      ge=8, le=1_048_576)
    add_bos: bool = _f(False, desc="Put BOS before every document (EOS always follows every document).")
    shard_num: int = _f(2, desc="MindRecord shard files (a multiple of the data-parallel world size).", ge=1, le=1000)


@dataclass
class TrainConfig:
    preset: str = _f("debug", desc="Model preset.", choices=("debug", "125m", "1b", "7b", "13b", "70b"))
    model_overrides: dict = _f(factory=dict, desc="ModelConfig fields overriding the preset (e.g. dim, n_layers).")
    steps: int = _f(30, desc="Optimizer steps of the stage.", ge=1)
    batch_size: int = _f(8, desc="Rows per step (global).", ge=1)
    lr: float = _f(3e-3, desc="Peak learning rate.", ge=0)
    min_lr: float = _f(3e-4, desc="Learning rate at the end of the cosine decay.", ge=0)
    warmup_steps: int = _f(5, desc="Linear warmup steps.", ge=0)
    weight_decay: float = _f(0.1, desc="AdamW weight decay (not applied to norms and embeddings).", ge=0)
    grad_clip: float = _f(1.0, desc="Global gradient-norm clip.", ge=0)
    mode: str = _f("graph", desc="MindSpore execution mode.", choices=("graph", "pynative"))
    threads: int = _f(2, desc="CPU threads per worker.", ge=1)
    workers: int = _f(1, desc="Data-parallel ranks (msrun when > 1).", ge=1)
    checkpoint_every: int = _f(10, desc="Checkpoint every N steps.", ge=1)
    keep_checkpoints: int = _f(3, desc="Checkpoints kept per stage.", ge=1)


@dataclass
class MindloomConfig:
    run_name: str = _f("demo", desc="Label of this corpus/training run.")
    seed: int = _f(1234, desc="Seed for every sampling and shuffling decision.", ge=0)
    data_root: str = _f("data", desc="Root folder for all outputs; relative paths are taken from the config file.")
    domains: list[str] = _f(factory=list, desc="Domains to include (empty: every configured source).")
    sources: list[SourceConfig] = _f(factory=list, desc="Inputs per domain.")
    ingest: IngestConfig = _f(factory=IngestConfig)
    dedup: DedupConfig = _f(factory=DedupConfig)
    quality: QualityConfig = _f(factory=QualityConfig)
    tokenizer: TokenizerConfig = _f(factory=TokenizerConfig)
    pack: PackConfig = _f(factory=PackConfig)
    train: TrainConfig = _f(factory=TrainConfig)

    def active_sources(self) -> list[SourceConfig]:
        """Sources of the selected domains (all of them when ``domains`` is empty)."""
        return [s for s in self.sources if not self.domains or s.domain in self.domains]

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def digest(self) -> str:
        """sha256 of the canonical JSON of the config: names outputs and goes into the manifest."""
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()


# --------------------------------------------------------------------------------------------------------------
# Strict conversion from plain data


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def _convert(value: Any, tp: Any, where: str, meta: dict) -> Any:
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, where)
    if origin in (list,):
        (item_tp,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list, got {type(value).__name__} {value!r}")
        return [_convert(v, item_tp, f"{where}[{i}]", {}) for i, v in enumerate(value)]
    if origin in (types.UnionType, typing.Union):
        raise ConfigError(f"{where}: union types are not supported")  # pragma: no cover - schema bug
    if tp is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {type(value).__name__} {value!r}")
        return copy.deepcopy(value)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
    elif tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        value = float(value)
    elif tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
    else:  # pragma: no cover - schema bug
        raise ConfigError(f"{where}: unsupported type {_type_name(tp)}")
    choices, ge, le = meta.get("choices"), meta.get("ge"), meta.get("le")
    if choices and value not in choices:
        raise ConfigError(f"{where}: must be one of {list(choices)}, got {value!r}")
    if ge is not None and value < ge:
        raise ConfigError(f"{where}: must be >= {ge}, got {value!r}")
    if le is not None and value > le:
        raise ConfigError(f"{where}: must be <= {le}, got {value!r}")
    return value


def _build(cls: type, data: Any, where: str) -> Any:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'config'}: expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        prefix = f"{where}." if where else ""
        raise ConfigError(f"{prefix}{unknown[0]}: unknown field (allowed: {', '.join(sorted(fields))})")
    kwargs = {}
    for name, f in fields.items():
        path = f"{where}.{name}" if where else name
        if name in data:
            kwargs[name] = _convert(data[name], hints[name], path, dict(f.metadata))
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(f"{path}: required field is missing")
    return cls(**kwargs)


def _check_cross_fields(cfg: MindloomConfig) -> None:
    names = {s.domain for s in cfg.sources}
    for i, d in enumerate(cfg.domains):
        if d not in names:
            raise ConfigError(f"domains[{i}]: unknown domain {d!r} (configured: {sorted(names)})")
    for i, s in enumerate(cfg.sources):
        if not s.domain:
            raise ConfigError(f"sources[{i}].domain: must not be empty")
        if not s.paths:
            raise ConfigError(f"sources[{i}].paths: at least one path is required")
    if cfg.train.min_lr > cfg.train.lr:
        raise ConfigError(f"train.min_lr: must be <= train.lr ({cfg.train.lr}), got {cfg.train.min_lr}")
    if cfg.train.warmup_steps >= cfg.train.steps:
        raise ConfigError(f"train.warmup_steps: must be < train.steps ({cfg.train.steps}), "
                          f"got {cfg.train.warmup_steps}")
    if cfg.quality.min_words > cfg.quality.max_words:
        raise ConfigError("quality.min_words: must be <= quality.max_words")


def _deep_merge(base: dict, extra: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict) and k != "model_overrides":
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def _apply_dotted(data: dict, overrides: dict[str, Any]) -> dict:
    out = copy.deepcopy(data)
    for key, value in overrides.items():
        node = out
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"{key}: {p} is not a section")
        node[parts[-1]] = value
    return out


def _resolve_paths(data: dict, base_dir: Path) -> dict:
    """Make data_root and source paths absolute, relative to the config file's folder."""
    out = copy.deepcopy(data)
    if "data_root" in out and isinstance(out["data_root"], str) and not Path(out["data_root"]).is_absolute():
        out["data_root"] = str((base_dir / out["data_root"]).resolve())
    for src in out.get("sources") or []:
        if isinstance(src, dict) and isinstance(src.get("paths"), list):
            src["paths"] = [p if (not isinstance(p, str) or "://" in p or Path(p).is_absolute())
                            else str((base_dir / p).resolve()) for p in src["paths"]]
    return out


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> MindloomConfig:
    """Load YAML (default ``configs/default.yaml``) and apply dotted ``overrides`` ({"train.steps": 50})."""
    path = Path(path or os.environ.get("MINDLOOM_CONFIG") or DEFAULT_CONFIG)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"config file {path}: cannot be read ({exc.strerror or exc})") from None
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"config file {path}{line}: invalid YAML ({getattr(exc, 'problem', exc)})") from None
    data = _resolve_paths(data, path.resolve().parent)
    return config_from_dict(data, overrides)


def config_from_dict(data: dict, overrides: dict[str, Any] | None = None) -> MindloomConfig:
    if overrides:
        data = _apply_dotted(data, overrides)
    cfg = _build(MindloomConfig, data, "")
    _check_cross_fields(cfg)
    return cfg


# --------------------------------------------------------------------------------------------------------------
# Airflow Params: which config fields the trigger form exposes, and their JSON schema.

#: Param name → dotted config field.  The DAG builds one ``Param`` per entry from :func:`param_specs`.
PARAM_FIELDS: dict[str, str] = {
    "run_name": "run_name",
    "domains": "domains",
    "seed": "seed",
    "docs_per_shard": "ingest.docs_per_shard",
    "strict_ingest": "ingest.strict",
    "exact_dedup": "dedup.exact",
    "quality_filter": "quality.enabled",
    "min_words": "quality.min_words",
    "vocab_size": "tokenizer.vocab_size",
    "seq_len": "pack.seq_len",
    "mindrecord_shards": "pack.shard_num",
    "model_preset": "train.preset",
    "train_steps": "train.steps",
    "batch_size": "train.batch_size",
    "learning_rate": "train.lr",
    "train_mode": "train.mode",
    "train_workers": "train.workers",
}

_JSON_TYPES = {int: "integer", float: "number", bool: "boolean", str: "string", dict: "object"}


def _field_of(dotted: str) -> tuple[dataclasses.Field, Any]:
    cls: Any = MindloomConfig
    f = None
    for part in dotted.split("."):
        f = {x.name: x for x in dataclasses.fields(cls)}[part]
        cls = typing.get_type_hints(cls)[part]
    return f, cls


def _get_dotted(cfg: MindloomConfig, dotted: str) -> Any:
    node: Any = cfg
    for part in dotted.split("."):
        node = getattr(node, part)
    return copy.deepcopy(node)


def param_specs(cfg: MindloomConfig | None = None) -> dict[str, dict]:
    """JSON-schema keyword dicts (default, type, title, description, enum, minimum, maximum) per Param."""
    cfg = cfg or load_config()
    specs: dict[str, dict] = {}
    for name, dotted in PARAM_FIELDS.items():
        f, tp = _field_of(dotted)
        meta = f.metadata
        spec: dict[str, Any] = {"default": _get_dotted(cfg, dotted), "title": name.replace("_", " ").capitalize(),
                                "description": f"{meta.get('desc', '')} (config: {dotted})"}
        if typing.get_origin(tp) is list:
            spec["type"] = "array"
            spec["items"] = {"type": "string"}
            if name == "domains":
                spec["items"]["enum"] = sorted({s.domain for s in cfg.sources})
                spec["uniqueItems"] = True
        else:
            spec["type"] = _JSON_TYPES[tp]
            if meta.get("choices"):
                spec["enum"] = list(meta["choices"])
            if meta.get("ge") is not None and tp in (int, float):
                spec["minimum"] = meta["ge"]
            if meta.get("le") is not None and tp in (int, float):
                spec["maximum"] = meta["le"]
        specs[name] = spec
    return specs


def config_from_params(params: dict[str, Any], path: str | Path | None = None) -> MindloomConfig:
    """Config from the YAML file with the trigger-form Params applied on top (unknown params are ignored)."""
    overrides = {PARAM_FIELDS[k]: v for k, v in params.items() if k in PARAM_FIELDS}
    base_path = params.get("config_path") or path
    return load_config(base_path or None, overrides)
