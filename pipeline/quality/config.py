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
    max_items_per_ngram: int = _f(0, desc="Leave out of the index every n-gram found in more than this many "
                                  "items (0: keep all). Long reference texts share boilerplate (licence headers, "
                                  "navigation bars, runs of numbers) that would remove every document carrying it; "
                                  "short benchmark items rarely do.", ge=0)
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


#: corruptions of a positive that make within-domain negatives (:func:`pipeline.quality.classifier_sample.corrupted`)
CLASSIFIER_CORRUPTIONS = ("repeated_lines", "scrambled_words", "boilerplate")


@dataclass
class ClassifierConfig:
    """A fastText quality classifier trained inside the run (:mod:`pipeline.quality.classifier`): by default within
    each domain (documents passing every heuristic against documents failing two or more and corrupted copies),
    cross-fitted, a ``q_classifier_score`` column for every document, a per-domain cut.  Off by default."""

    enabled: bool = _f(False, desc="Train (or load) the classifier before the quality stage; the quality tasks "
                       "score every document of their shards, store the score and remove documents below their "
                       "domain's cut (reason classifier_low_score).")
    training: str = _f("within_domain", desc="within_domain: per domain, its documents passing every rule of its "
                       "quality chain against its documents failing two or more rules plus corrupted copies of "
                       "positives (a score that ranks documents inside a domain); cross_domain: positive_domains "
                       "against negative_domains, one model set for all (DCLM's setting: it learns the domain).",
                       choices=("within_domain", "cross_domain"))
    folds: int = _f(2, desc="Cross-fitting: documents fall into this many folds by a hash of (seed, doc id); each "
                    "fold's documents are scored by a model trained on the other folds only.", ge=2, le=10)
    corruptions: list[str] = _f(factory=lambda: list(CLASSIFIER_CORRUPTIONS), desc="within_domain: kinds of "
                                "corrupted copies of positives added as negatives, one kind per copy by hash: "
                                "repeated_lines (every line 4x), scrambled_words (words shuffled within each line), "
                                "boilerplate (navigation and footer lines around the text).")
    corrupt_share: float = _f(0.5, desc="within_domain: share of the positives (by hash) that also give a corrupted "
                              "copy as a negative.", ge=0.0, le=1.0)
    model_path: str = _f("", desc="A supplied model file that replaces training (empty: train in the run); relative "
                         "paths are taken from the config file.")
    model_format: str = _f("fasttext", desc="Format of `model_path`: fasttext (a fastText .bin, e.g. DCLM's; read "
                           "with fasttext-predict) or floret (a model this stage trained).",
                           choices=("fasttext", "floret"))
    label: str = _f("hq", desc="The positive label (`__label__<label>`); the score is its probability.")
    positive_domains: list[str] = _f(factory=lambda: ["encyclopedia", "books", "academic"],
                                     desc="cross_domain: domains whose documents are the positive (reference) "
                                     "examples.")
    positive_paths: list[str] = _f(factory=list, desc="cross_domain: curated positive examples besides those "
                                   "domains: .jsonl files with a `text` key per line; relative paths are taken from "
                                   "the config file.")
    negative_domains: list[str] = _f(factory=lambda: ["web"], desc="cross_domain: domains whose documents are the "
                                     "negative examples (raw web).")
    keep_top_percent: dict = _f(factory=lambda: {"web": 30.0}, desc="Per domain, the percentage of its documents "
                                "that the classifier keeps, the best-scored: the cut is the quantile of the "
                                "cross-fitted scores of a uniform sample of the domain (`cut_sample_docs`; the whole "
                                "domain when it has no more, then the share is exact), ties split by hash; the "
                                "quality tasks count the share kept over the whole run (quality report, "
                                "classifier_cut). The chain's own removals come out of that share. Domains in neither "
                                "this nor `min_score` are scored, never removed.")
    cut_sample_docs: int = _f(20_000, desc="Per domain, documents (by a hash of seed and doc id, from all its "
                              "documents) that the train step scores to set the `keep_top_percent` cut and the "
                              "domain probe; bounds that step's scoring and memory. A domain with no more documents "
                              "is scored whole and cut exactly; a larger one's kept share is off by about "
                              "sqrt(p(1-p)/n) (0.32 points at 30 % of 20,000).", ge=100)
    min_score: dict = _f(factory=dict, desc="Per domain, a fixed score threshold in [0, 1] instead of a percentage.")
    max_docs_per_class: int = _f(10_000, desc="Training examples per class (per domain with within_domain, which "
                                 "reads the chain's verdicts of twice as many candidates), sampled by a hash of doc "
                                 "id and seed; bounds the stage's memory.", ge=10)
    balance: str = _f("equal", desc="equal: the larger class is cut to the smaller one's size; natural: as sampled.",
                      choices=("equal", "natural"))
    held_out_fraction: float = _f(0.1, desc="Not used since cross-fitting scores every example with a model that did "
                                  "not train on it (kept so that configs setting it still load).", ge=0.01, le=0.5)
    max_chars: int = _f(20_000, desc="Characters of a document's start that are trained on and scored.", ge=100)
    word_ngrams: int = _f(2, desc="fastText wordNgrams (DCLM: 2).", ge=1, le=5)
    epochs: int = _f(20, desc="fastText epochs. fastText's own default (5, with lr 0.1) underfits a sample of a few "
                     "hundred documents: every score near 0.5 (docs/corpus.md).", ge=1, le=100)
    lr: float = _f(0.5, desc="fastText learning rate (fastText's default: 0.1; see `epochs`).", ge=0.001, le=2.0)
    dim: int = _f(16, desc="fastText vector size; the model file is about 4 x dim x buckets bytes.", ge=2, le=300)
    buckets: int = _f(262_144, desc="fastText hash buckets for word n-grams (fastText's default: 2,000,000).",
                      ge=1024)
    min_count: int = _f(1, desc="fastText minCount: words seen fewer times are left out.", ge=1)

    def __post_init__(self) -> None:
        where = "quality.classifier"
        if not self.label or any(c.isspace() for c in self.label):
            raise ConfigError(f"{where}.label: must be a non-empty word, got {self.label!r}")
        for name in ("positive_domains", "negative_domains"):
            values = getattr(self, name)
            if any(not d for d in values) or len(set(values)) != len(values):
                raise ConfigError(f"{where}.{name}: must list distinct non-empty domains, got {values!r}")
        if both := sorted(set(self.positive_domains) & set(self.negative_domains)):
            raise ConfigError(f"{where}.negative_domains: {both} are also positive_domains")
        bad = [c for c in self.corruptions if c not in CLASSIFIER_CORRUPTIONS]
        if bad or len(set(self.corruptions)) != len(self.corruptions):
            raise ConfigError(f"{where}.corruptions: expected distinct kinds of {list(CLASSIFIER_CORRUPTIONS)}, "
                              f"got {self.corruptions!r}")
        if not self.model_path and self.enabled and self.training == "cross_domain":
            if not (self.positive_domains or self.positive_paths):
                raise ConfigError(f"{where}.positive_domains: training needs positives (or positive_paths)")
            if not self.negative_domains:
                raise ConfigError(f"{where}.negative_domains: training needs negatives")
        for i, path in enumerate(self.positive_paths):
            if not path.endswith(".jsonl") or "://" in path:
                raise ConfigError(f"{where}.positive_paths[{i}]: expected a local .jsonl file, got {path!r}")
        for name, lo, hi in (("keep_top_percent", 0.0, 100.0), ("min_score", 0.0, 1.0)):
            for domain, value in getattr(self, name).items():
                ok = isinstance(value, (int, float)) and not isinstance(value, bool) and lo <= value <= hi
                if not domain or not ok or (name == "keep_top_percent" and value == 0):
                    raise ConfigError(f"{where}.{name}.{domain}: expected a number in "
                                      f"{'(0, 100]' if name == 'keep_top_percent' else '[0, 1]'}, got {value!r}")
        if both := sorted(set(self.keep_top_percent) & set(self.min_score)):
            raise ConfigError(f"{where}.min_score: {both} also have keep_top_percent; one rule per domain")


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
    classifier: ClassifierConfig = _f(factory=ClassifierConfig)
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
