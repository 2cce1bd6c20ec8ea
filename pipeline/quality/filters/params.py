"""Parameters of every quality filter, with their published defaults and where each default comes from.

Conventions (the same as datatrove's): a threshold of 0 switches its rule off.  Fields marked ``scoring`` change
the *scores* a filter computes (word lists, line-cleaning switches); every other field is a threshold applied to
stored scores, so changing it needs no recompute (:func:`pipeline.quality.filters.chain.reapply_decisions`).

The field metadata has the same keys as :mod:`pipeline.configkit` (``desc``, ``choices``, ``ge``, ``le``) so the
strict config loader validates these dataclasses too; :mod:`pipeline.quality.config` nests them into
``QualityConfig``.

Sources (versions read: datatrove 0.10.1; see ``/work/shared/notes/data-pipeline-anchors.md`` §3):
  GOPHER  Rae et al. 2021 (Gopher) App. A, Table A1 = datatrove GopherQualityFilter / GopherRepetitionFilter
  C4      Raffel et al. 2020 (T5) §2.2 = datatrove C4QualityFilter (TFDS c4_utils.py)
  FW      FineWeb (Penedo et al. 2024) = datatrove FineWebQualityFilter and examples/fineweb.py
  FW2     FineWeb-2 configs/cmn_Hani.yml and fineweb-2-pipeline.py (Mandarin thresholds and stop words)
  CODE    Codex (Chen et al. 2021) §3.1 / bigcode-dataset preprocessing (line length, alphanumeric share);
          CodeParrot preprocessing.py (auto-generated markers); StarCoder (bigcode) XML and JSON/YAML size rules
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


def _min_max_error(obj: Any, *pairs: tuple[str, str]) -> str | None:
    """'<field>: must be <= <other> (...)' for the first (min, max) pair whose maximum is on and below the minimum."""
    for lo, hi in pairs:
        if getattr(obj, hi) and getattr(obj, lo) > getattr(obj, hi):
            return f"{lo}: must be <= {hi} ({getattr(obj, hi)}), got {getattr(obj, lo)}"
    return None


def _p(default: Any = dataclasses.MISSING, desc: str = "", *, source: str = "", scoring: bool = False,
       ge: float | None = None, le: float | None = None, choices: tuple | None = None, factory: Any = None) -> Any:
    meta = {"desc": f"{desc} [{source}]" if source else desc, "choices": choices, "ge": ge, "le": le,
            "scoring": scoring}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


GOPHER_STOP_WORDS = ("the", "be", "to", "of", "and", "that", "have", "with")
# FineWeb-2 configs/cmn_Hani.yml `stopwords` (single characters except '·', so they work with per-character words).
CMN_STOP_WORDS = ("的", "年", "在", "月", "是", "和", "日", "了", "於", "·", "為", "有", "被", "人", "中", "为", "他",
                  "與", "後", "也", "而", "由")


@dataclass
class GopherQualityParams:
    min_words: int = _p(50, "Minimum non-symbol words (CJK characters count as words). Usually set through "
                        "quality.min_words.", source="GOPHER", ge=0)
    max_words: int = _p(100_000, "Maximum non-symbol words (0: no maximum, e.g. for the long domain).",
                        source="GOPHER", ge=0)
    min_avg_word_length: float = _p(3.0, "Minimum mean word length (not applied to CJK documents).",
                                    source="GOPHER", ge=0)
    max_avg_word_length: float = _p(10.0, "Maximum mean word length (not applied to CJK documents).",
                                    source="GOPHER", ge=0)
    max_symbol_word_ratio: float = _p(0.1, "Maximum '#' per word, and '...'/'…' per word.", source="GOPHER", ge=0)
    max_bullet_lines_ratio: float = _p(0.9, "Maximum share of lines starting with a bullet.", source="GOPHER",
                                       ge=0, le=1)
    max_ellipsis_lines_ratio: float = _p(0.3, "Maximum share of lines ending in an ellipsis.", source="GOPHER",
                                         ge=0, le=1)
    min_alpha_words_ratio: float = _p(0.8, "Minimum share of words containing a letter (datatrove: "
                                      "max_non_alpha_words_ratio).", source="GOPHER; FW2 cmn: 0.735", ge=0, le=1)
    min_stop_words: int = _p(2, "Minimum distinct stop words present.", source="GOPHER", ge=0)
    stop_words: list[str] = _p(desc="Stop words of non-CJK documents.", source="GOPHER", scoring=True,
                               factory=lambda: list(GOPHER_STOP_WORDS))
    cjk_stop_words: list[str] = _p(desc="Stop words of CJK documents.", source="FW2 cmn_Hani", scoring=True,
                                   factory=lambda: list(CMN_STOP_WORDS))
    cjk_min_ratio: float = _p(0.3, "Documents with at least this share of Han/kana characters are CJK documents: "
                              "cjk_stop_words apply and the mean-word-length rule does not.", ge=0, le=1)

    def check(self) -> str | None:
        return _min_max_error(self, ("min_words", "max_words"), ("min_avg_word_length", "max_avg_word_length"))


@dataclass
class GopherRepetitionParams:
    dup_line_frac: float = _p(0.3, "Maximum share of duplicate lines.", source="GOPHER; FW2 cmn: 0.287", ge=0, le=1)
    dup_para_frac: float = _p(0.3, "Maximum share of duplicate paragraphs.", source="GOPHER", ge=0, le=1)
    dup_line_char_frac: float = _p(0.2, "Maximum share of characters in duplicate lines.", source="GOPHER",
                                   ge=0, le=1)
    dup_para_char_frac: float = _p(0.2, "Maximum share of characters in duplicate paragraphs.", source="GOPHER",
                                   ge=0, le=1)
    top_2_gram: float = _p(0.20, "Maximum character share of the most frequent 2-gram.", source="GOPHER", ge=0, le=1)
    top_3_gram: float = _p(0.18, "Maximum character share of the most frequent 3-gram.", source="GOPHER", ge=0, le=1)
    top_4_gram: float = _p(0.16, "Maximum character share of the most frequent 4-gram.", source="GOPHER", ge=0, le=1)
    dup_5_gram: float = _p(0.15, "Maximum character share of duplicated 5-grams.", source="GOPHER", ge=0, le=1)
    dup_6_gram: float = _p(0.14, "Maximum character share of duplicated 6-grams.", source="GOPHER", ge=0, le=1)
    dup_7_gram: float = _p(0.13, "Maximum character share of duplicated 7-grams.", source="GOPHER", ge=0, le=1)
    dup_8_gram: float = _p(0.12, "Maximum character share of duplicated 8-grams.", source="GOPHER", ge=0, le=1)
    dup_9_gram: float = _p(0.11, "Maximum character share of duplicated 9-grams.", source="GOPHER", ge=0, le=1)
    dup_10_gram: float = _p(0.10, "Maximum character share of duplicated 10-grams.", source="GOPHER", ge=0, le=1)


@dataclass
class C4Params:
    filter_no_terminal_punct: bool = _p(False, "Drop lines not ending in . ? ! \" ' (C4: true; FineWeb turned it "
                                        "off because it removed ~30 % of tokens).", source="FW; C4", scoring=True)
    min_words_per_line: int = _p(3, "Drop lines with fewer words (CJK characters count as words).", source="C4",
                                 scoring=True, ge=0)
    max_word_length: int = _p(1000, "Drop lines with a longer word (0: off).", source="C4", scoring=True, ge=0)
    remove_citations: bool = _p(True, "Strip Wikipedia citation markers ([1], [edit], [citation needed]).",
                                source="C4", scoring=True)
    filter_javascript: bool = _p(True, "Drop lines mentioning 'javascript'.", source="C4", scoring=True)
    filter_policy: bool = _p(True, "Drop lines with terms-of-use / privacy / cookie phrases.", source="C4",
                             scoring=True)
    min_sentences: int = _p(5, "Drop documents with fewer sentences in the kept lines.", source="C4", ge=0)
    filter_lorem_ipsum: bool = _p(True, "Drop documents containing 'lorem ipsum'.", source="C4")
    filter_curly_bracket: bool = _p(True, "Drop documents containing '{'.", source="C4")


@dataclass
class FineWebParams:
    line_punct_thr: float = _p(0.12, "Minimum share of lines ending in terminal punctuation.",
                               source="FW; FW2 cmn: 0.106", ge=0, le=1)
    line_punct_exclude_zero: bool = _p(False, "Do not drop documents where no line ends in punctuation.",
                                       source="FW")
    short_line_thr: float = _p(0.67, "Maximum share of short lines (FineWeb-2 switches it off).", source="FW", ge=0)
    short_line_length: int = _p(30, "A line of at most this many characters is short.", source="FW",
                                scoring=True, ge=0)
    char_duplicates_ratio: float = _p(0.01, "Maximum share of characters in duplicated lines (FineWeb paper text "
                                      "says 0.1; its code and appendix 0.01; FineWeb-2 uses 0.1).", source="FW",
                                      ge=0, le=1)
    new_line_ratio: float = _p(0.3, "Maximum newlines per word.", source="FW; FW2 cmn: 0.178", ge=0)


@dataclass
class CodeParams:
    max_line_length: int = _p(1000, "Maximum line length.", source="CODE", ge=0)
    max_mean_line_length: float = _p(100.0, "Maximum mean line length.", source="CODE", ge=0)
    min_alnum_fraction: float = _p(0.25, "Minimum share of alphanumeric characters.", source="CODE", ge=0, le=1)
    autogen_markers: list[str] = _p(desc="Lower-case phrases marking generated files.", source="CODE (CodeParrot)",
                                    scoring=True,
                                    factory=lambda: ["auto-generated", "autogenerated", "automatically generated"])
    autogen_scan_lines: int = _p(5, "Lines at the top of the file searched for the markers.",
                                 source="CODE (CodeParrot)", scoring=True, ge=0)
    drop_autogenerated: bool = _p(True, "Drop files with an auto-generated marker.", source="CODE (CodeParrot)")
    drop_xml: bool = _p(True, "Drop XML files ('<?xml version=' in the first 100 characters).",
                        source="CODE (StarCoder)")
    data_extensions: list[str] = _p(desc="Extensions (from meta.path) of data/config files.",
                                    source="CODE (StarCoder json/yaml)", scoring=True,
                                    factory=lambda: ["json", "yaml", "yml", "toml", "csv", "tsv", "ini", "cfg"])
    min_data_chars: int = _p(100, "Data/config files shorter than this are dropped.", source="CODE (StarCoder)", ge=0)
    max_data_chars: int = _p(5000, "Data/config files longer than this are dropped (0: no maximum).",
                             source="CODE (StarCoder)", ge=0)

    def check(self) -> str | None:
        return _min_max_error(self, ("min_data_chars", "max_data_chars"))


@dataclass
class LengthParams:
    min_chars: int = _p(0, "Minimum characters (0: off).", ge=0)
    max_chars: int = _p(0, "Maximum characters (0: off; leave off in the long domain).", ge=0)
    min_tokens: int = _p(0, "Minimum tokens (0: off).", ge=0)
    max_tokens: int = _p(0, "Maximum tokens (0: off).", ge=0)
    chars_per_token: float = _p(4.0, "Token estimate: one per CJK character plus one per this many other "
                                "characters.", scoring=True, ge=0.5)
    tokenizer_model: str = _p("", "SentencePiece .model to count tokens exactly instead of estimating them.",
                              scoring=True)

    def check(self) -> str | None:
        return _min_max_error(self, ("min_chars", "max_chars"), ("min_tokens", "max_tokens"))


@dataclass
class LanguageParams:
    languages: list[str] = _p(desc="Allowed language codes as written by language ID ('zh' also allows 'zh-Hans', "
                              "'zh_Hani'); empty: any language.", factory=list)
    min_score: float = _p(0.65, "Minimum language-ID confidence (FineWeb-2 uses 0.692 for cmn_Hani with GlotLID).",
                          source="FW (fastText lid.176)", ge=0, le=1)
    on_missing: str = _p("error", "When the input has no lang/lang_score columns: 'error' stops the shard with a "
                         "message; 'keep' keeps every document and records a warning in the stats.",
                         choices=("error", "keep"))


PARAMS: dict[str, type] = {
    "language": LanguageParams, "length": LengthParams, "gopher_repetition": GopherRepetitionParams,
    "gopher_quality": GopherQualityParams, "c4": C4Params, "fineweb": FineWebParams, "code": CodeParams,
}


def scoring_fields(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls) if f.metadata.get("scoring")]


@dataclass
class QualityChainConfig:
    """The filters of one domain, in the order they run, and the parameters this domain changes."""

    domain: str = _p(desc="Domain name; '*' serves every domain without a chain of its own.")
    filters: list[str] = _p(desc=f"Filters in order, from: {', '.join(PARAMS)}.", factory=list)
    overrides: dict = _p(desc="Per filter, the parameters that differ from the published defaults, e.g. "
                         "{gopher_quality: {min_words: 20}}.", factory=dict)


@dataclass
class PiiConfig:
    enabled: bool = _p(False, "Mask e-mail addresses, public IP addresses and phone numbers in kept documents.")
    emails: bool = _p(True, "Mask e-mail addresses.", source="datatrove PIIFormatter")
    ips: bool = _p(True, "Mask IP addresses.", source="datatrove PIIFormatter")
    only_public_ips: bool = _p(True, "Leave private, loopback and reserved IP addresses alone.",
                               source="datatrove PIIFormatter")
    phones: bool = _p(True, "Mask phone numbers (10-15 digits in phone-number layout).")
    domains: list[str] = _p(desc="Domains to mask (empty: every domain).", factory=list)


def default_chains() -> list[QualityChainConfig]:
    """Used when the config has no ``quality.chains``: Gopher rules for prose, code rules for code."""
    return [QualityChainConfig("*", ["length", "gopher_repetition", "gopher_quality"]),
            QualityChainConfig("code", ["length", "code"])]
