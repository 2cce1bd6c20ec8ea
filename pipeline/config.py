"""The composite mindloom configuration: every stage's settings under one root, loaded strictly from YAML.

Each stage's dataclass lives beside its stage (``pipeline/<stage>/config.py``; the coercion and error machinery in
:mod:`pipeline.configkit`); this module sits above them and only composes them.  The same dataclasses back the YAML
file, the ``mindloom`` CLI and the Airflow trigger form (:mod:`pipeline.form`), so a value means the same thing
wherever it is set.  Loading is strict: an unknown key, a wrong type or a value outside its allowed range raises
:class:`~pipeline.configkit.ConfigError` naming the dotted field (``train.mode``) and what is allowed, before any
work starts.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from pipeline.ablation.config import AblationConfig
from pipeline.configkit import ConfigError, _build, _f
from pipeline.dedup.config import DedupConfig
from pipeline.dedup.minhash.config import MinhashConfig
from pipeline.dedup.minhash.config import check_config as check_minhash
from pipeline.export.config import ExportConfig
from pipeline.ingest.config import IngestConfig, SourceConfig
from pipeline.quality.config import QualityConfig
from pipeline.sink.config import MixtureConfig, PackConfig
from pipeline.tasks.config import AirflowConfig
from pipeline.tokenizer.config import TokenizerConfig
from pipeline.train.config import TrainConfig

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "default.yaml"

#: Dotted fields that say when, how often and with how much memory a deployment runs the work, never what it
#: produces: left out of :meth:`MindloomConfig.digest`, so changing them renames no output and invalidates no
#: finished step (and digests of configs written before these fields existed still match).
NOT_DIGESTED = ("airflow", "ablation", "pack.verify_mem_mb")


@dataclass
class MindloomConfig:
    run_name: str = _f("demo", desc="Label of this corpus/training run.")
    seed: int = _f(1234, desc="Seed for every sampling and shuffling decision.", ge=0)
    data_root: str = _f("data", desc="Root folder for all outputs; relative paths are taken from the config file.")
    parallelism: int = _f(64, desc="Airflow mapped tasks per per-shard stage; each works through its share of the "
                                   "shards in order, so the task count stays fixed (and within Airflow's "
                                   "max_map_length) whatever the corpus size. Size it to the deployment's worker "
                                   "slots.", ge=1, le=1024)
    task_workers: int = _f(0, desc="Processes inside one per-shard task for the stages that handle a shard in one "
                                   "process (exact dedup, MinHash signatures and removal); 0: every "
                                   "core of the worker. Memory of such a task is this many times one shard's.",
                           ge=0, le=256)
    approval: str = _f("refresh", desc="Who must approve a corpus before it is published (and pretrain starts): "
                       "refresh: a person approves each corpus_refresh run in the UI or over REST, corpus_build "
                       "publishes at once; always: both DAGs wait; never: neither. mindloom corpus never waits.",
                       choices=("refresh", "always", "never"))
    domains: list[str] = _f(factory=list, desc="Domains to include (empty: every configured source).")
    sources: list[SourceConfig] = _f(factory=list, desc="Inputs per domain.")
    ingest: IngestConfig = _f(factory=IngestConfig)
    dedup: DedupConfig = _f(factory=DedupConfig)
    quality: QualityConfig = _f(factory=QualityConfig)
    tokenizer: TokenizerConfig = _f(factory=TokenizerConfig)
    pack: PackConfig = _f(factory=PackConfig)
    mixture: MixtureConfig = _f(factory=MixtureConfig)
    minhash: MinhashConfig = _f(factory=MinhashConfig)
    train: TrainConfig = _f(factory=TrainConfig)
    export: ExportConfig = _f(factory=ExportConfig)
    airflow: AirflowConfig = _f(factory=AirflowConfig, desc="How the Airflow DAGs schedule, retry and defer this "
                                "deployment's runs: read when the DAG files are parsed (so not on the trigger "
                                "form), ignored by the mindloom CLI, left out of the config digest.")
    ablation: AblationConfig = _f(factory=AblationConfig, desc="Data ablations (the ablation DAG, mindloom ablation): "
                                  "the arms, seeds and references; left out of the config digest.")

    def active_sources(self) -> list[SourceConfig]:
        """Sources of the selected domains (all of them when ``domains`` is empty)."""
        return [s for s in self.sources if not self.domains or s.domain in self.domains]

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def digest(self) -> str:
        """sha256 of the canonical JSON of the config (less :data:`NOT_DIGESTED`): names outputs and goes into the
        manifest."""
        data = self.to_dict()
        for dotted in NOT_DIGESTED:
            *parents, leaf = dotted.split(".")
            node = data
            for p in parents:
                node = node[p]
            del node[leaf]
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def _check_cross_fields(cfg: MindloomConfig) -> None:
    check_minhash(cfg.minhash)
    names = {s.domain for s in cfg.sources}
    for d in cfg.mixture.weights:
        if d not in names:
            raise ConfigError(f"mixture.weights.{d}: unknown domain (configured: {sorted(names)})")
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
    """Make data_root, source, tokenizer model and eval-file paths absolute, relative to the config file's folder."""
    out = copy.deepcopy(data)
    if "data_root" in out and isinstance(out["data_root"], str) and not Path(out["data_root"]).is_absolute():
        out["data_root"] = str((base_dir / out["data_root"]).resolve())
    tok = out.get("tokenizer")
    if isinstance(tok, dict) and isinstance(tok.get("model_path"), str) and tok["model_path"] \
            and not Path(tok["model_path"]).is_absolute():
        tok["model_path"] = str((base_dir / tok["model_path"]).resolve())
    quality = out.get("quality")
    dec = quality.get("decontamination") if isinstance(quality, dict) else None
    if isinstance(dec, dict) and isinstance(dec.get("paths"), list):
        dec["paths"] = [p if (not isinstance(p, str) or "://" in p or Path(p).is_absolute())
                        else str((base_dir / p).resolve()) for p in dec["paths"]]
    clf = quality.get("classifier") if isinstance(quality, dict) else None
    if isinstance(clf, dict) and isinstance(clf.get("positive_paths"), list):
        clf["positive_paths"] = [p if (not isinstance(p, str) or "://" in p or Path(p).is_absolute())
                                 else str((base_dir / p).resolve()) for p in clf["positive_paths"]]
    if isinstance(clf, dict) and isinstance(clf.get("model_path"), str) and clf["model_path"] \
            and not Path(clf["model_path"]).is_absolute():
        clf["model_path"] = str((base_dir / clf["model_path"]).resolve())
    for src in out.get("sources") or []:
        if isinstance(src, dict) and isinstance(src.get("paths"), list):
            src["paths"] = [p if (not isinstance(p, str) or "://" in p or Path(p).is_absolute())
                            else str((base_dir / p).resolve()) for p in src["paths"]]
    return out


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> MindloomConfig:
    """Load YAML (default ``configs/default.yaml``) and apply dotted ``overrides`` ({"train.steps": 50})."""
    path = Path(path or os.environ.get("MINDLOOM_CONFIG") or DEFAULT_CONFIG)
    return config_from_dict(_read_yaml(path, ()), overrides)


def _merge(base: dict, over: dict) -> dict:
    """``over`` on top of ``base``: maps merge key by key, anything else (lists included) is replaced."""
    out = dict(base)
    for key, value in over.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _read_yaml(path: Path, chain: tuple) -> dict:
    """One config file's mapping, paths resolved against its folder; a top-level ``base: other.yaml`` (relative to
    the file) is read first and this file's keys are merged over it, so a site config names only what it changes."""
    if path.resolve() in chain:
        raise ConfigError(f"config file {path}: base: files include each other "
                          f"({' -> '.join(str(p) for p in (*chain, path.resolve()))})")
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
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: expected a mapping of sections, got {type(data).__name__}")
    data = _resolve_paths(data, path.resolve().parent)
    base = data.pop("base", None)
    if base is None:
        return data
    if not isinstance(base, str) or not base:
        raise ConfigError(f"config file {path}: base: expected the path of another config file, got {base!r}")
    return _merge(_read_yaml(path.resolve().parent / base, (*chain, path.resolve())), data)


def config_from_dict(data: dict, overrides: dict[str, Any] | None = None) -> MindloomConfig:
    if overrides:
        data = _apply_dotted(data, overrides)
    cfg = _build(MindloomConfig, data, "")
    _check_cross_fields(cfg)
    return cfg
