"""Settings of quality filtering: which chain of filters each domain gets, and their validated parameters."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from pipeline.configkit import ConfigError, _build, _f
from pipeline.quality.filters.params import PARAMS, PiiConfig, QualityChainConfig, default_chains

#: Item fields indexed by default, in this order (n-grams spanning two fields count too).
DEFAULT_TEXT_FIELDS = ("context", "question", "choices", "answer", "text")


@dataclass
class DecontaminationConfig:
    """Benchmark decontamination: drop documents sharing a word n-gram with an evaluation item
    (:mod:`pipeline.quality.decontaminate`; GPT-3 and DCLM use 13-grams, datatrove 12)."""

    enabled: bool = _f(True, desc="Remove documents that share an n-gram with an item of `paths` (reason "
                       "decontaminated), whatever quality.enabled says; nothing runs while `paths` is empty.")
    n: int = _f(13, desc="Words per n-gram (after lowercasing, stripping punctuation and diacritics, numbers -> 0; "
                "every Han/kana character is one word). Items with fewer words are never matched.", ge=5, le=50)
    paths: list[str] = _f(factory=list, desc="Evaluation item files: .jsonl (one object per line with `id_field` "
                          "and `text_fields`) or .txt (one item per non-empty line, id = line number); relative "
                          "paths are taken from the config file.")
    id_field: str = _f("id", desc="Key of a JSONL item's id (required in every line).")
    text_fields: list[str] = _f(factory=lambda: list(DEFAULT_TEXT_FIELDS),
                                desc="Keys of a JSONL item whose text is indexed, joined in this order; a list "
                                "value (answer choices) is joined with spaces; at least one must be present.")

    def __post_init__(self) -> None:
        where = "quality.decontamination"
        if not self.id_field:
            raise ConfigError(f"{where}.id_field: must be non-empty")
        if not self.text_fields or any(not f for f in self.text_fields):
            raise ConfigError(f"{where}.text_fields: must be a non-empty list of non-empty keys, "
                              f"got {self.text_fields!r}")
        for i, path in enumerate(self.paths):
            if not path.endswith((".jsonl", ".txt")) or "://" in path:
                raise ConfigError(f"{where}.paths[{i}]: expected a local .jsonl or .txt file, got {path!r}")
        if len(set(self.paths)) != len(self.paths):
            raise ConfigError(f"{where}.paths: lists a file twice {self.paths}")

    @property
    def active(self) -> bool:
        return self.enabled and bool(self.paths)


@dataclass
class QualityConfig:
    """Quality filtering: per-domain chains of published rule sets; scores kept as columns, removals audited.

    The filters, their parameters, published defaults and sources are in ``pipeline/quality/filters/params.py``.  A
    domain's parameters are the published defaults, then ``min_words`` (gopher_quality), then its chain's
    ``overrides``.
    """

    enabled: bool = _f(True, desc="Remove documents failing their domain's filters (false: score and keep all).")
    min_words: int = _f(50, desc="Gopher minimum words (CJK characters count as words) in every chain that does "
                        "not override gopher_quality.min_words.", ge=0)
    chains: list[QualityChainConfig] = _f(factory=default_chains, desc="Filters per domain, in order; domain '*' "
                                          "serves every domain without a chain of its own.")
    pii: PiiConfig = _f(factory=PiiConfig)
    decontamination: DecontaminationConfig = _f(factory=DecontaminationConfig)
    audit_samples: int = _f(20, desc="Removed documents kept per reason and shard under removed/quality/ (all "
                            "are counted).", ge=0)
    audit_max_chars: int = _f(20_000, desc="Characters kept of each sampled removed document.", ge=100)
    workers: int = _f(0, desc="Processes scoring documents inside one shard task (0: every core); the output "
                      "does not depend on it.", ge=0)

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
