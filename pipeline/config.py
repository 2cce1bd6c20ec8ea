"""One typed configuration for every mindloom stage.

The same dataclasses back the YAML file, the ``mindloom`` CLI and the Airflow trigger form, so a value means the
same thing wherever it is set.  Loading is strict: an unknown key, a wrong type or a value outside its allowed
range raises :class:`ConfigError` naming the dotted field (``train.mode``) and what is allowed, before any work
starts.

Field metadata (``_f(...)``) carries the title, description, choices and bounds; :mod:`pipeline.form` turns
the fields the trigger forms expose into JSON-schema dictionaries.
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
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:
    from pipeline.minhash.config import MinhashConfig

from pipeline.filters.params import PARAMS, PiiConfig, QualityChainConfig, default_chains

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
    """One input of one domain: a reader, the files it reads and the reader's options."""

    domain: str = _f(desc="Domain name the documents belong to (web, code, zh, ...).")
    paths: list[str] = _f(factory=list, desc="Files, folders, globs or URIs (s3://, gs://, hdfs://, fsspec schemes); "
                                             "relative paths are taken from the config file.")
    reader: str = _f("jsonl", desc="Reader for these files.",
                     choices=("jsonl", "parquet", "text", "html", "warc", "code"))
    name: str = _f("", desc="Stable name of this source, hashed into every document id (default: the domain). "
                            "Give each source of one domain its own name.")
    text_field: str = _f("text", desc="JSONL field / Parquet column holding the document text.")
    id_field: str = _f("id", desc="JSONL field / Parquet column with the source's own id, kept in meta "
                                  "(empty: none).")
    options: dict = _f(factory=dict, desc="Reader options (pipeline/readers/<reader>.py: <Reader>Options), "
                                          "checked strictly.")
    fs_options: dict = _f(factory=dict, desc="Object-store filesystem options (e.g. endpoint_override, region for "
                                             "s3://); credentials come from the environment, never from here.")
    lang: str = _f("", desc="Language of every document instead of detecting it: 'code' for source code "
                            "(the code reader always sets it); empty: detect.")

    def __post_init__(self) -> None:
        from pipeline.readers import reader_options

        reader_options(self.reader, self.options, f"source {self.name or self.domain!r} ({self.reader}) options")


@dataclass
class IngestConfig:
    docs_per_shard: int = _f(2000, desc="Documents (JSONL lines, Parquet rows, files) per shard; shards map 1:1 "
                                        "onto Airflow mapped tasks. Compressed JSONL and WARC files are one shard "
                                        "each.", ge=1)
    shard_bytes: int = _f(256 << 20, desc="Input bytes per shard when many files are grouped into one.", ge=1)
    strict: bool = _f(False, desc="Fail on the first bad record instead of quarantining it in the rejects table.")
    max_doc_chars: int = _f(20_000_000, desc="Records with longer text are rejected (reason too_long).", ge=1)
    max_record_bytes: int = _f(64 << 20, desc="Raw records (lines, files, HTTP bodies) above this many bytes are "
                                              "streamed past, never held, and rejected (record_too_large).", ge=1)
    workers: int = _f(0, desc="Processes parsing and normalizing inside one shard task (0: every core).", ge=0)


@dataclass
class DedupConfig:
    exact: bool = _f(True, desc="Remove exact duplicates (hash of normalized text) across the whole corpus.")
    exact_partitions: int = _f(16, desc="Hash partitions of exact dedup; each is one mapped task.", ge=1, le=4096)


@dataclass
class QualityConfig:
    """Quality filtering: per-domain chains of published rule sets; scores kept as columns, removals audited.

    The filters, their parameters, published defaults and sources are in ``pipeline/filters/params.py``.  A
    domain's parameters are the published defaults, then ``min_words`` (gopher_quality), then its chain's
    ``overrides``.
    """

    enabled: bool = _f(True, desc="Remove documents failing their domain's filters (false: score and keep all).")
    min_words: int = _f(50, desc="Gopher minimum words (CJK characters count as words) in every chain that does "
                        "not override gopher_quality.min_words.", ge=0)
    chains: list[QualityChainConfig] = _f(factory=default_chains, desc="Filters per domain, in order; domain '*' "
                                          "serves every domain without a chain of its own.")
    pii: PiiConfig = _f(factory=PiiConfig)
    audit_samples: int = _f(20, desc="Removed documents kept per reason and shard under removed/quality/ (all "
                            "are counted).", ge=0)
    audit_max_chars: int = _f(20_000, desc="Characters kept of each sampled removed document.", ge=100)

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for i, chain in enumerate(self.chains):
            where = f"quality.chains[{i}]"
            if not chain.domain or chain.domain in seen:
                raise ConfigError(f"{where}.domain: must be non-empty and unique, got {chain.domain!r}")
            seen.add(chain.domain)
            for j, name in enumerate(chain.filters):
                if name not in PARAMS or name in chain.filters[:j]:
                    raise ConfigError(f"{where}.filters[{j}]: unknown or repeated filter {name!r} "
                                      f"(allowed: {', '.join(PARAMS)})")
            for name in chain.overrides:
                if name not in chain.filters:
                    raise ConfigError(f"{where}.overrides.{name}: not a filter of this chain {chain.filters}")
                self.params(chain.domain, name)

    def chain(self, domain: str) -> QualityChainConfig | None:
        """The domain's own chain, else the '*' chain, else None."""
        by_domain = {c.domain: c for c in self.chains}
        return by_domain.get(domain) or by_domain.get("*")

    def params(self, domain: str, name: str) -> Any:
        """Validated parameters of filter ``name`` for ``domain`` (a ConfigError names the bad override)."""
        chain = self.chain(domain)
        values = dataclasses.asdict(PARAMS[name]())
        if name == "gopher_quality":
            values["min_words"] = self.min_words
        where = f"quality.chains[{self.chains.index(chain)}].overrides.{name}" if chain else f"quality.{name}"
        extra = chain.overrides.get(name) if chain else None
        if extra is not None and not isinstance(extra, dict):
            raise ConfigError(f"{where}: expected a mapping of parameters, got {extra!r}")
        params = _build(PARAMS[name], {**values, **(extra or {})}, where)
        if problem := getattr(params, "check", lambda: None)():
            raise ConfigError(f"{where}.{problem}")
        return params

    @property
    def max_words(self) -> float:
        """The '*' chain's Gopher maximum (infinite when off); kept for the min/max check of _check_cross_fields."""
        return self.params("*", "gopher_quality").max_words or float("inf")


@dataclass
class TokenizerConfig:
    """SentencePiece: trained per run on a mixture-stratified sample, or an existing ``.model`` loaded as is."""

    model_path: str = _f("", desc="Existing SentencePiece .model to use instead of training one (empty: train).")
    vocab_size: int = _f(4000, desc="SentencePiece vocabulary size.", ge=300, le=262144)
    model_type: str = _f("bpe", desc="SentencePiece model type (byte fallback and split digits are always on).",
                         choices=("bpe", "unigram"))
    sample_chars: int = _f(3_000_000, desc="Characters of text sampled (stratified by domain) for training.", ge=10_000)
    min_domain_share: float = _f(0.05, desc="Floor on each domain's share of the training sample, so a small "
                                 "domain (e.g. zh) still gets its characters into the vocabulary.", ge=0, le=0.5)
    character_coverage: float = _f(0.9995, desc="Share of characters covered; the rest fall back to bytes.",
                                   ge=0.9, le=1.0)
    special_tokens: list[str] = _f(factory=list, desc="Extra control tokens (e.g. <|im_start|>) with fixed ids "
                                   "after unk/bos/eos/pad; never produced from raw text.")
    encode_workers: int = _f(1, desc="Processes that encode one shard in parallel.", ge=1, le=256)


@dataclass
class PackConfig:
    seq_len: int = _f(128, desc="Training context; rows hold seq_len + 1 tokens (mindformers convention).",
                      ge=8, le=1_048_576)
    add_bos: bool = _f(False, desc="Put BOS before every document (EOS always follows every document).")
    shard_num: int = _f(2, desc="MindRecord shard files (a multiple of the data-parallel world size).", ge=1, le=1000)
    remainder: str = _f("drop", desc="Tail shorter than a row: drop it (mindformers) or pad it with pad_id.",
                        choices=("drop", "pad"))
    domain_field: bool = _f(True, desc="Write a domain_id column (domain of each row's first token, indexed).")
    boundaries: bool = _f(False, desc="Write a segment_starts column (positions where a document starts in the "
                          "row, 0 always listed) so attention can be reset at document boundaries.")
    write_workers: int = _f(1, desc="Processes writing MindRecord shard files in parallel.", ge=1, le=256)


@dataclass
class MixtureConfig:
    """Domain mixture and the held-out validation split, both decided by hashes of (doc id, seed, domain)."""

    weights: dict = _f(factory=dict, desc="Target share per domain ({code: 0.3, zh: 0.1, ...}, normalised); "
                       "empty: the natural proportions. Every domain needs a weight; 0 drops it.")
    unit: str = _f("tokens", desc="What the weights measure.", choices=("tokens", "chars"))
    max_epochs: float = _f(4.0, desc="Upsampling cap: no domain is repeated more often than this.", ge=1, le=100)
    total_tokens: int = _f(0, desc="Training budget in `unit`; 0: the largest budget <= the corpus that meets "
                           "every weight within max_epochs.", ge=0)
    val_fraction: float = _f(0.01, desc="Share of each domain's documents held out for validation.", ge=0, le=0.5)
    val_min_docs: int = _f(2, desc="At least this many held-out documents per domain (never over half of it).",
                           ge=0)
    val_max_docs: int = _f(1000, desc="At most this many held-out documents per domain.", ge=0)

    def __post_init__(self):
        for name, w in self.weights.items():
            if not isinstance(name, str) or isinstance(w, bool) or not isinstance(w, int | float) or w < 0:
                raise ConfigError(f"mixture.weights.{name}: expected a number >= 0, got {w!r}")
        if self.weights and not any(self.weights.values()):
            raise ConfigError("mixture.weights: at least one weight must be > 0")
        if self.val_min_docs > self.val_max_docs:
            raise ConfigError(f"mixture.val_min_docs: must be <= mixture.val_max_docs ({self.val_max_docs})")


@dataclass
class StageConfig:
    """One named training stage (``mindloom train --stage NAME``); unset values inherit ``train.*``."""

    name: str = _f(desc="Stage name: its folder <data_root>/train/<run id>/<name> and its DAG task.")
    seq_len: int = _f(0, desc="Context length of this stage; 0: the corpus rows. Otherwise a multiple or divisor of "
                      "the corpus seq_len: rows are re-packed from consecutive corpus rows.", ge=0)
    init: str = _f("previous", desc="previous: weights of the preceding stage's final checkpoint (the first stage "
                   "starts fresh); continue: also its Adam moments and data position (same global batch and "
                   "seq_len); scratch: fresh weights.", choices=("previous", "continue", "scratch"))
    overrides: dict = _f(factory=dict, desc="train.* fields for this stage only, e.g. {steps: 200, lr: 3e-4}.")
    model_overrides: dict = _f(factory=dict, desc="ModelConfig fields for this stage only, e.g. "
                               "{rope_scaling_type: ntk, rope_scaling_factor: 4.0}; shapes must not change.")


@dataclass
class TrainConfig:
    """Recipe of the pretraining job; ``stages`` run in order, each overriding what it needs."""

    preset: str = _f("debug", desc="Model preset.", choices=("debug", "125m", "1b", "7b", "13b", "70b"))
    model_overrides: dict = _f(factory=dict, desc="ModelConfig fields overriding the preset (e.g. dim, n_layers).")
    steps: int = _f(30, desc="Optimizer steps of a stage (stages may override).", ge=1)
    batch_size: int = _f(8, desc="Rows per optimizer step (global: split over workers and grad_accum).", ge=1)
    grad_accum: int = _f(1, desc="Micro-batches accumulated per optimizer step.", ge=1)
    lr: float = _f(3e-3, desc="Peak learning rate.", ge=0)
    min_lr: float = _f(3e-4, desc="Learning rate at the end of the cosine decay.", ge=0)
    warmup_steps: int = _f(5, desc="Linear warmup steps.", ge=0)
    weight_decay: float = _f(0.1, desc="AdamW weight decay (not applied to norms and embeddings).", ge=0)
    grad_clip: float = _f(1.0, desc="Global gradient-norm clip.", ge=0)
    device: str = _f("CPU", desc="MindSpore device target.", choices=("CPU", "Ascend", "GPU"))
    precision: str = _f("fp32", desc="fp32, bf16, or fp16 with dynamic loss scaling (CPU: fp32, fp16 in graph "
                        "mode only; Ascend: bf16 recommended).", choices=("fp32", "bf16", "fp16"))
    loss_scale: float = _f(65536.0, desc="Initial dynamic loss scale (fp16 only).", ge=1)
    loss_scale_window: int = _f(1000, desc="Overflow-free steps before the loss scale doubles (fp16 only).", ge=1)
    recompute: bool = _f(False, desc="Recompute each decoder block in the backward pass (less activation memory).")
    mode: str = _f("graph", desc="MindSpore execution mode.", choices=("graph", "pynative"))
    threads: int = _f(2, desc="CPU threads per worker.", ge=1)
    workers: int = _f(1, desc="Ranks launched (msrun when > 1): tensor_parallel x data-parallel ranks.", ge=1)
    tensor_parallel: int = _f(1, desc="Ranks per tensor-parallel group (inside one node); must divide workers.",
                              ge=1)
    zero: bool = _f(False, desc="ZeRO-1: shard the Adam moments over the data-parallel ranks.")
    device_memory_gb: float = _f(0.0, desc="Memory of one device in GB; > 0: refuse a layout whose memory plan "
                                 "exceeds it (0: no check).", ge=0)
    metrics_every: int = _f(10, desc="Fetch loss and metrics from the device every N steps (fewer host syncs).",
                            ge=1)
    checkpoint_every: int = _f(10, desc="Checkpoint every N steps.", ge=1)
    keep_checkpoints: int = _f(3, desc="Checkpoints kept per stage.", ge=1)
    peak_tflops: float = _f(0.0, desc="Peak TFLOP/s of one device at this precision, for MFU (0: no MFU).", ge=0)
    eval_tokens: int = _f(65536, desc="Validation tokens per domain scored after each stage (0: no evaluation).",
                          ge=0)
    stages: list[StageConfig] = _f(factory=list, desc="Named stages run in order (empty: one stage 'main').")

    def __post_init__(self) -> None:
        import re

        from pipeline.train.config import ModelConfig

        try:
            ModelConfig.from_preset(self.preset, **self.model_overrides)
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"train.model_overrides: {exc}") from None
        from pipeline.train.precision import check_precision

        try:
            check_precision(self.device, self.mode, self.precision)
        except ValueError as exc:
            raise ConfigError(f"train.precision: {str(exc).split(': ', 1)[1]}") from None
        if self.workers % self.tensor_parallel:
            raise ConfigError(f"train.tensor_parallel: must divide train.workers ({self.workers}), "
                              f"got {self.tensor_parallel}")
        from pipeline.train.memory_plan import check_layout

        try:
            check_layout(ModelConfig.from_preset(self.preset, **self.model_overrides), self.tensor_parallel,
                         where="train.tensor_parallel")
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if self.min_lr > self.lr:  # the pair checks of _check_cross_fields, before the stages inherit them
            raise ConfigError(f"train.min_lr: must be <= train.lr ({self.lr}), got {self.min_lr}")
        if self.warmup_steps >= self.steps:
            raise ConfigError(f"train.warmup_steps: must be < train.steps ({self.steps}), got {self.warmup_steps}")
        hints = typing.get_type_hints(TrainConfig)
        known = {f.name: f for f in dataclasses.fields(TrainConfig) if f.name not in _NOT_PER_STAGE}
        seen: set[str] = set()
        for i, st in enumerate(self.stages):
            where = f"train.stages[{i}]"
            if not re.fullmatch(r"[a-z0-9][a-z0-9_-]{0,63}", st.name or ""):
                raise ConfigError(f"{where}.name: must be 1-64 of a-z 0-9 _ - (starting alphanumeric), got {st.name!r}")
            if st.name in seen:
                raise ConfigError(f"{where}.name: duplicate stage name {st.name!r}")
            seen.add(st.name)
            for key, value in list(st.overrides.items()):
                if key not in known:
                    raise ConfigError(f"{where}.overrides.{key}: not a per-stage train field "
                                      f"(allowed: {', '.join(sorted(known))})")
                st.overrides[key] = _convert(value, hints[key], f"{where}.overrides.{key}", dict(known[key].metadata))
            eff = self.stage_settings(st.name)

            def blame(a: str, b: str, _st=st, _where=where) -> str:  # the override that broke the pair
                return f"{_where}.overrides.{a if a in _st.overrides or b not in _st.overrides else b}"

            if eff["min_lr"] > eff["lr"]:
                raise ConfigError(f"{blame('min_lr', 'lr')}: min_lr must be <= lr ({eff['lr']}), "
                                  f"got {eff['min_lr']}")
            if eff["warmup_steps"] > eff["steps"]:
                raise ConfigError(f"{blame('warmup_steps', 'steps')}: warmup_steps must be <= steps "
                                  f"({eff['steps']}), got {eff['warmup_steps']}")
            try:
                check_precision(eff["device"], eff["mode"], eff["precision"])
            except ValueError as exc:
                raise ConfigError(f"{where}.overrides.precision: {str(exc).split(': ', 1)[1]}") from None
            if i == 0 and st.init == "continue":
                raise ConfigError(f"{where}.init: 'continue' needs a preceding stage")
            if i > 0 and st.init == "continue" and st.seq_len != self.stages[i - 1].seq_len:
                raise ConfigError(f"{where}.init: 'continue' keeps the data position, so seq_len must equal the "
                                  f"preceding stage's ({self.stages[i - 1].seq_len})")
            try:
                ModelConfig.from_preset(self.preset, **{**self.model_overrides, **st.model_overrides})
            except (ValueError, TypeError) as exc:
                raise ConfigError(f"{where}.model_overrides: {exc}") from None

    def stage_list(self) -> list[StageConfig]:
        """The stages in order (one implicit stage ``main`` when none are configured)."""
        return list(self.stages) or [StageConfig(name="main")]

    def stage_settings(self, name: str) -> dict:
        """Effective train.* values of stage ``name`` plus ``name``, ``index``, ``seq_len``, ``init``,
        ``previous`` (name or None) and ``model_overrides`` (train's, then the stage's)."""
        stages = self.stage_list()
        idx = next((i for i, s in enumerate(stages) if s.name == name), None)
        if idx is None:
            raise ConfigError(f"train.stages: no stage named {name!r} (configured: {[s.name for s in stages]})")
        st = stages[idx]
        eff = {f.name: copy.deepcopy(getattr(self, f.name)) for f in dataclasses.fields(self)
               if f.name not in _NOT_PER_STAGE}
        eff.update(copy.deepcopy(st.overrides))
        eff.update(name=st.name, index=idx, seq_len=st.seq_len, init=st.init, preset=self.preset,
                   previous=stages[idx - 1].name if idx else None,
                   model_overrides={**self.model_overrides, **st.model_overrides})
        return eff


_NOT_PER_STAGE = ("preset", "model_overrides", "stages")


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
    mixture: MixtureConfig = _f(factory=MixtureConfig)
    minhash: MinhashConfig = _f(factory=lambda: _late_types()["MinhashConfig"]())
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


def _late_types() -> dict[str, type]:
    """Config classes that live beside their stage and import this module (so cannot be imported at its top)."""
    from pipeline.minhash.config import MinhashConfig

    return {"MinhashConfig": MinhashConfig}


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls, localns=_late_types())


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
    hints = _hints(cls)
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
    from pipeline.minhash.config import check_config as check_minhash

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
    tok = out.get("tokenizer")
    if isinstance(tok, dict) and isinstance(tok.get("model_path"), str) and tok["model_path"] \
            and not Path(tok["model_path"]).is_absolute():
        tok["model_path"] = str((base_dir / tok["model_path"]).resolve())
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
