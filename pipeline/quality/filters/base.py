"""The filter interface: score first, decide later.

A filter turns a :class:`~pipeline.quality.filters.text.Doc` into named scores (``score``) and turns scores into a drop
reason (``decide``).  ``decide`` sees only the scores and the parameters, never the text: that is what lets a run
store the scores as Parquet columns and re-apply changed thresholds to them later without reading a document again.
Scores must therefore not depend on thresholds; parameters that do change scores are marked ``scoring`` in
:mod:`pipeline.quality.filters.params` and are fingerprinted next to the stored scores.
"""

from __future__ import annotations

import operator
from typing import Any, ClassVar

from pipeline.quality.filters.text import Doc

Scores = dict[str, Any]
Drop = tuple[str, str]          # (reason, human-readable detail such as "n_words=12 < min_words=50")

_OPS = {"<": operator.lt, ">": operator.gt}


class Filter:
    """Base class; subclasses set the class attributes and implement :meth:`score` and :meth:`decide`."""

    name: ClassVar[str]                         # key in the chain config and in PARAMS
    prefix: ClassVar[str]                       # score columns are q_<prefix>_<score>
    score_names: ClassVar[tuple[str, ...]]
    string_scores: ClassVar[frozenset[str]] = frozenset()
    modifies_text: ClassVar[bool] = False       # True: score() may replace doc.text (later filters see the result)

    def __init__(self, params: Any):
        self.p = params

    def score(self, doc: Doc) -> Scores:
        raise NotImplementedError

    def decide(self, s: Scores) -> Drop | None:
        raise NotImplementedError

    def transform(self, doc: Doc) -> None:
        """Apply only the text change of :meth:`score` (used when decisions come from stored scores)."""

    def column(self, score_name: str) -> str:
        return f"q_{self.prefix}_{score_name}"

    # -- helpers for decide() -------------------------------------------------------------------------------------

    def check(self, s: Scores, reason: str, score: str, op: str, param: str) -> Drop | None:
        """datatrove's convention: a threshold of 0 (or None) switches the rule off."""
        threshold = getattr(self.p, param)
        value = s[score]
        if threshold and value is not None and _OPS[op](value, threshold):
            return reason, f"{score}={_fmt(value)} {op} {param}={_fmt(threshold)}"
        return None

    @staticmethod
    def first(*drops: Drop | None) -> Drop | None:
        return next((d for d in drops if d), None)


def _fmt(v: Any) -> str:
    """Same text for 37 and 37.0 (live scores are ints, stored ones floats), 4 significant digits otherwise."""
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return f"{v:.4g}" if isinstance(v, float) else str(v)
