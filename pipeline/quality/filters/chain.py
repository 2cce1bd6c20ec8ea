"""A domain's filter chain: score a document with every filter, decide with the first failing rule.

Every filter of the chain scores every document, also after an earlier filter has already failed it: that costs
some time on dropped documents and buys the ability to re-tune any threshold afterwards from the stored columns
(:func:`reapply_decisions`) with exactly the result a full recompute would give.

Stored scores are only valid for the parameters that shaped them, so the scores table carries a *signature* per
domain: each filter with its ``scoring`` parameters and the text-changing filters that ran before it.
:func:`check_signature` refuses to re-apply a chain whose signature differs, naming the parameter.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from pipeline.quality.filters.base import Drop, Filter
from pipeline.quality.filters.basic import CodeQuality, Language, Length
from pipeline.quality.filters.c4 import C4Quality, FineWebQuality
from pipeline.quality.filters.gopher import GopherQuality, GopherRepetition
from pipeline.quality.filters.params import scoring_fields
from pipeline.quality.filters.text import Doc

FILTER_CLASSES: dict[str, type[Filter]] = {
    c.name: c for c in (Language, Length, GopherRepetition, GopherQuality, C4Quality, FineWebQuality, CodeQuality)}
SIGNATURE_KEY = b"mindloom.quality.signatures"


class QualityError(ValueError):
    """The quality stage cannot run as configured (missing chain, missing input columns, stale stored scores)."""


class Chain:
    def __init__(self, domain: str, filters: list[Filter]):
        self.domain = domain
        self.filters = filters

    @classmethod
    def build(cls, q: Any, domain: str) -> Chain:
        """The chain of ``domain`` from a :class:`pipeline.quality.config.QualityConfig`."""
        chain = q.chain(domain)
        if chain is None:
            raise QualityError(f"no quality chain for domain {domain!r}: add one to quality.chains, or a '*' chain")
        return cls(domain, [FILTER_CLASSES[name](q.params(domain, name)) for name in chain.filters])

    def names(self) -> list[str]:
        return [f.name for f in self.filters]

    def columns(self) -> list[tuple[str, bool]]:
        """(column name, is a string column) of every score of the chain."""
        return [(f.column(k), k in f.string_scores) for f in self.filters for k in f.score_names]

    def score(self, doc: Doc) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in self.filters:
            for k, v in f.score(doc).items():
                out[f.column(k)] = v
        return out

    def decide(self, row: dict[str, Any]) -> Drop | None:
        """The first failing rule of the chain, from a row of score columns; None keeps the document."""
        for f in self.filters:
            drop = f.decide({k: row[f.column(k)] for k in f.score_names})
            if drop:
                return drop
        return None

    def transform(self, doc: Doc) -> None:
        """The text changes of the chain alone (decisions taken from stored scores)."""
        for f in self.filters:
            if f.modifies_text:
                f.transform(doc)

    def signature(self) -> list[dict]:
        out, before = [], []
        for f in self.filters:
            out.append({"filter": f.name, "scoring": {k: getattr(f.p, k) for k in scoring_fields(type(f.p))},
                        "text_changed_by": list(before)})
            if f.modifies_text:
                before.append(f.name)
        return out


def check_signature(chain: Chain, stored: list[dict]) -> None:
    """Raise :class:`QualityError` unless every filter of ``chain`` was scored exactly as it would score now."""
    by_name = {s["filter"]: s for s in stored}
    for now in chain.signature():
        name = now["filter"]
        then = by_name.get(name)
        if then is None:
            raise QualityError(f"domain {chain.domain!r}: filter {name!r} was not scored in this run "
                               f"(scored: {sorted(by_name)}); recompute the scores")
        for key, value in now["scoring"].items():
            if json.dumps(then["scoring"].get(key)) != json.dumps(value):
                raise QualityError(f"domain {chain.domain!r}: {name}.{key} changes the scores (stored "
                                   f"{then['scoring'].get(key)!r}, now {value!r}); recompute the scores")
        if then["text_changed_by"] != now["text_changed_by"]:
            raise QualityError(f"domain {chain.domain!r}: {name} was scored after {then['text_changed_by']}, "
                               f"now after {now['text_changed_by']}; recompute the scores")


def signatures_of(table: Any) -> dict[str, list[dict]]:
    meta = table.schema.metadata or {}
    if SIGNATURE_KEY not in meta:
        raise QualityError("scores table has no stored signatures; it was not written by the quality stage")
    return json.loads(meta[SIGNATURE_KEY])


def reapply_decisions(q: Any, scores: Any) -> list[Drop | None]:
    """Decisions of config ``q`` for every row of a stored scores table (``quality/scores/<shard>.parquet``).

    Reads no text and computes no score; raises :class:`QualityError` when a filter's scores are stale.
    ``q.enabled`` false keeps everything, as the stage does.
    """
    stored = signatures_of(scores)
    chains: dict[str, Chain] = {}
    for domain in sorted(set(scores.column("domain").to_pylist())):
        chain = chains[domain] = Chain.build(q, domain)
        check_signature(chain, stored.get(domain, []))
    rows = scores.to_pylist()
    if not q.enabled:
        return [None] * len(rows)
    return [chains[r["domain"]].decide(r) for r in rows]


def params_dict(chain: Chain) -> dict[str, dict]:
    return {f.name: dataclasses.asdict(f.p) for f in chain.filters}
