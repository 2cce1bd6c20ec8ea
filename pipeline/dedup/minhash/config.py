"""MinHash near-duplicate settings, the band/row math behind them, and named presets.

Two documents whose shingle sets have Jaccard similarity ``s`` agree on one MinHash value with probability ``s``.
LSH groups the ``bands × rows`` values of a signature into ``bands`` bands of ``rows`` values; a pair becomes a
*candidate* when at least one band is identical, which happens with probability

    P(s) = 1 − (1 − s^rows)^bands          (steepest near t ≈ (1/bands)^(1/rows))

With the FineWeb setting (14 bands × 8 rows = 112 permutations, word 5-grams) P(0.7) = 0.56, P(0.8) = 0.92,
P(0.85) = 0.99.  Candidates are then (by default) checked with the *exact* Jaccard similarity of their shingle
sets against ``threshold``, so the curve decides what can be found and the threshold decides what is removed.
:func:`candidate_probability` and :func:`s_curve` compute the curve for any setting; ``PRESETS`` holds published
settings.

Shingle kinds are chosen per domain (``domain_shingles``; ``auto`` picks character n-grams for CJK documents), so
two documents shingled differently (a code file and a web page) can never match: by design, their shingles mean
different things.

:class:`MinhashConfig` uses the ``_f`` field metadata of :mod:`pipeline.configkit`, so it can be nested into
``MindloomConfig`` as ``minhash:`` and loaded by the same strict loader.  Rules the generic loader cannot express
(criteria lists, per-domain shingle rules, bands × rows) are checked by :func:`check_config`, which raises
:class:`~pipeline.configkit.ConfigError` naming the dotted field.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass

from pipeline.configkit import ConfigError, _f

SHINGLE_KINDS = ("auto", "word", "char", "code")
SCHEMES = ("affine32", "legacy", "affine64")
ENGINES = ("auto", "numba", "numpy")
SURVIVOR_CRITERIA = ("kept", "score", "longest", "shortest", "source_priority", "first", "doc_id")

REASON_NEAR_DUP = "near_duplicate"
REASON_PREVIOUS = "near_duplicate_of_previous_release"


@dataclass
class ShingleRule:
    """How the documents of one domain are cut into shingles (overrides ``shingle_kind`` and the n-gram sizes)."""

    domain: str = _f(desc="Domain the rule applies to.")
    kind: str = _f("auto", desc="word: n-grams of words; char: n-grams of characters (CJK); code: n-grams of "
                                "identifier/number/punctuation tokens; auto: char when the CJK share of the document "
                                "reaches cjk_share, else word.", choices=SHINGLE_KINDS)
    n: int = _f(0, desc="Tokens (word, code) or characters (char) per shingle; 0: the config-wide size for the kind.",
                ge=0, le=256)


@dataclass
class MinhashConfig:
    """Near-duplicate removal: signatures → band buckets → clusters → removal (see
    pipeline/dedup/minhash/__init__.py)."""

    enabled: bool = _f(True, desc="Run MinHash near-duplicate removal after exact dedup.")
    preset: str = _f("", desc="Named setting (PRESETS) whose values replace fields left at their defaults.",
                     choices=("", "fineweb", "nemo", "datasketch_0.8", "high_recall", "strict"))
    bands: int = _f(14, desc="LSH bands (b). num_perm = bands × rows.", ge=1, le=1024)
    rows: int = _f(8, desc="MinHash values per band (r).", ge=1, le=256)
    seed: int = _f(1, desc="Seed of the permutations (datasketch MinHash(seed=...)).", ge=0, le=2**32 - 1)
    scheme: str = _f("affine32", desc="datasketch permutation scheme: affine32 (datasketch >= 2.0 default), legacy "
                                      "(datasketch < 2.0, (a·h+b) mod (2^61−1)), affine64 (64-bit hashes).",
                     choices=SCHEMES)
    shingle_kind: str = _f("auto", desc="Shingle kind for domains without a rule in domain_shingles.",
                           choices=SHINGLE_KINDS)
    word_ngram: int = _f(5, desc="Words per shingle (FineWeb: 5).", ge=1, le=256)
    char_ngram: int = _f(5, desc="Characters per shingle for kind char.", ge=1, le=256)
    code_ngram: int = _f(8, desc="Tokens per shingle for kind code (tokens are shorter than words).", ge=1, le=256)
    domain_shingles: list[ShingleRule] = _f(factory=lambda: [ShingleRule(domain="code", kind="code")],
                                            desc="Per-domain shingle rules.")
    cjk_share: float = _f(0.3, desc="auto: documents with at least this share of CJK characters use char shingles "
                                    "(0: never).", ge=0, le=1)
    lowercase: bool = _f(True, desc="Lowercase before shingling.")
    normalize_numbers: bool = _f(True, desc="Every run of digits becomes '0' before shingling (datatrove default).")
    threshold: float = _f(0.8, desc="Jaccard similarity at or above which a candidate pair is a near duplicate.",
                          ge=0, le=1)
    jaccard_check: bool = _f(True, desc="Check candidate pairs by the exact Jaccard similarity of their shingle "
                                        "sets (false: every LSH candidate counts).")
    survivor_order: list[str] = _f(factory=lambda: ["kept", "score", "longest", "source_priority", "doc_id"],
                                   desc="Criteria choosing the document a cluster keeps, most important first: "
                                        f"{', '.join(SURVIVOR_CRITERIA)}. Ties end on the document's position.")
    score_column: str = _f("", desc="Numeric input column for criterion 'score' (higher wins); empty: the share "
                                    "of its quality chain's filters a document passes, computed in stage 1. "
                                    "Documents without a score rank last on that criterion.")
    source_priority: list[str] = _f(factory=list, desc="Sources in order of preference for 'source_priority'; "
                                                       "unlisted sources rank after listed ones.")
    use_index: bool = _f(False, desc="An incremental refresh: also remove documents that duplicate earlier "
                         "releases in the dedup index, and keep the tokenizer of the newest one (every published "
                         "run is added to the index).")
    index_dir: str = _f("", desc="Persistent index of shipped releases (empty: <data_root>/dedup_index).")
    engine: str = _f("auto", desc="Signature engine: numba (compiled), numpy (hashlib + numpy), auto: numba when "
                                  "installed. Both give identical signatures.", choices=ENGINES)
    batch_bytes: int = _f(8 << 20, desc="Text bytes per signature batch.", ge=1 << 10)
    memory_mb: int = _f(1024, desc="Memory budget of one band, clustering or release-index task: larger inputs "
                                   "are read in ranges of at most this much, spilled to disk. The clustering's "
                                   "residual after its rounds must fit it.", ge=16)
    report_examples: int = _f(5, desc="Example clusters (with differing spans) in the report.", ge=0, le=100)

    @property
    def num_perm(self) -> int:
        return self.bands * self.rows

    def effective(self) -> MinhashConfig:
        """This config with its preset applied to the fields still at their defaults (preset cleared)."""
        if not self.preset:
            return self
        defaults = MinhashConfig()
        values = {k: v for k, v in PRESETS[self.preset].items() if getattr(self, k) == getattr(defaults, k)}
        return dataclasses.replace(self, preset="", **values)

    def ngram_for(self, kind: str) -> int:
        return {"char": self.char_ngram, "code": self.code_ngram}.get(kind, self.word_ngram)

    def signature_fields(self) -> dict:
        """Everything that changes a signature or band key: equal dicts ⇒ comparable signatures."""
        keys = ("bands", "rows", "seed", "scheme", "shingle_kind", "word_ngram", "char_ngram", "code_ngram",
                "cjk_share", "lowercase", "normalize_numbers")
        out = {k: getattr(self, k) for k in keys}
        out["domain_shingles"] = sorted((dataclasses.asdict(r) for r in self.domain_shingles),
                                        key=lambda r: r["domain"])
        out["hash"] = "sha1"
        out["version"] = 1
        return out

    def fingerprint(self) -> str:
        """Short id of :meth:`signature_fields`; names the dedup-index folder that holds compatible releases."""
        blob = json.dumps(self.signature_fields(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def digest(self) -> str:
        """sha256 of the whole (effective) config: a later stage refuses a run whose config changed mid-way."""
        return hashlib.sha256(json.dumps(dataclasses.asdict(self), sort_keys=True).encode()).hexdigest()


#: Published settings (data-pipeline-anchors.md §2).  ``threshold`` is the exact-Jaccard cut of the check.
PRESETS: dict[str, dict] = {
    # FineWeb / datatrove: word 5-grams, 14 × 8; t ≈ 0.72.  Exact check at 0.8, where P(s) is already 0.92.
    "fineweb": {"bands": 14, "rows": 8, "word_ngram": 5, "threshold": 0.8},
    # NeMo Curator 1.x: character 24-grams, 20 × 13 (260 perms), t ≈ 0.79, no check in NeMo (kept here).
    "nemo": {"bands": 20, "rows": 13, "shingle_kind": "char", "char_ngram": 24, "domain_shingles": [],
             "threshold": 0.8},
    # datasketch MinHashLSH(threshold=0.8, num_perm=128) picks 9 × 13 (weights 0.5/0.5); t ≈ 0.84.
    "datasketch_0.8": {"bands": 9, "rows": 13, "threshold": 0.8},
    # More, shorter bands: P(0.7) = 0.96, P(0.8) ≈ 1.0 for 112 perms; many more candidates, so keep the check on.
    "high_recall": {"bands": 28, "rows": 4, "threshold": 0.7},
    # Only very close copies: 8 × 16, t ≈ 0.88, cut at 0.9.
    "strict": {"bands": 8, "rows": 16, "threshold": 0.9},
}


def candidate_probability(s: float, bands: int, rows: int) -> float:
    """P(pair with Jaccard s shares ≥ 1 band) = 1 − (1 − s^rows)^bands."""
    return 1.0 - (1.0 - s**rows) ** bands


def curve_threshold(bands: int, rows: int) -> float:
    """The similarity where the S-curve is steepest, ≈ (1/bands)^(1/rows)."""
    return (1.0 / bands) ** (1.0 / rows)


def s_curve(bands: int, rows: int, points: tuple[float, ...] = (0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95)) -> dict:
    return {f"{s:.2f}": round(candidate_probability(s, bands, rows), 4) for s in points}


def check_config(cfg: MinhashConfig, where: str = "minhash") -> MinhashConfig:
    """Validate what the field metadata cannot; return the effective config (preset applied)."""
    if cfg.preset and cfg.preset not in PRESETS:
        raise ConfigError(f"{where}.preset: must be one of {sorted(PRESETS)}, got {cfg.preset!r}")
    eff = cfg.effective()
    if eff.bands * eff.rows > 4096:
        raise ConfigError(f"{where}.bands: bands × rows must be <= 4096, got {eff.bands} × {eff.rows}")
    seen: set[str] = set()
    for i, crit in enumerate(eff.survivor_order):
        if crit not in SURVIVOR_CRITERIA:
            raise ConfigError(f"{where}.survivor_order[{i}]: must be one of {list(SURVIVOR_CRITERIA)}, got {crit!r}")
        if crit in seen:
            raise ConfigError(f"{where}.survivor_order[{i}]: {crit!r} is listed twice")
        seen.add(crit)
    domains: set[str] = set()
    for i, rule in enumerate(eff.domain_shingles):
        if not rule.domain:
            raise ConfigError(f"{where}.domain_shingles[{i}].domain: must not be empty")
        if rule.domain in domains:
            raise ConfigError(f"{where}.domain_shingles[{i}].domain: {rule.domain!r} has two rules")
        domains.add(rule.domain)
        if rule.kind not in SHINGLE_KINDS:
            raise ConfigError(f"{where}.domain_shingles[{i}].kind: must be one of {list(SHINGLE_KINDS)}, "
                              f"got {rule.kind!r}")
    if eff.use_index and eff.index_dir and "://" in eff.index_dir:
        raise ConfigError(f"{where}.index_dir: must be a local path, got {eff.index_dir!r}")
    return eff


def minhash_config_from_dict(data: dict | None) -> MinhashConfig:
    """Strictly build a MinhashConfig from plain data (the same loader as pipeline.configkit) and check it."""
    from pipeline.configkit import _build

    return check_config(_build(MinhashConfig, data or {}, "minhash"))
