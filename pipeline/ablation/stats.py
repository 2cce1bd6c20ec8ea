"""The statistics of a data ablation: bits per byte, paired differences between arms, and intervals that count
both sources of chance, the seed and which reference documents were drawn.

Why not a t interval over seeds: with 3 to 5 seeds it ignores that the reference documents are a sample too, and
documents of one source (one manual, one wiki) are not independent. So the spread comes from a two-level bootstrap:
each replicate redraws the seeds (the same seeds for both arms: the difference is paired) and redraws whole
sources (every document of a drawn source, as often as it was drawn), then recomputes the pooled bits per byte of
each arm. The point estimate is the difference on the data as measured.

The interval's width is set from the bootstrap's spread with a Student t quantile at (seeds - 1) degrees of
freedom (see :func:`paired_difference` for why not the percentiles).

A difference is read only against two yardsticks run in the same ablation: the **noise floor**, the largest
difference an A/A pair (one arm twice, other seeds) shows within its interval, and the **positive control**, an arm
with a known share of planted junk, which the design must be seen to detect. Without a detected control the verdict
is ``inconclusive``, never "no difference".

Scores are nats summed over a document's predicted tokens and the document's UTF-8 bytes, so bits per byte does
not depend on the tokenizer (arms may differ in it) and long documents weigh by their size.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

LN2 = math.log(2.0)


@dataclass(frozen=True)
class DocScore:
    """One reference document scored by one checkpoint: nats summed over its tokens, its bytes, and where it is
    from (the bootstrap resamples sources, the report splits by domain)."""

    doc: str
    source: str
    domain: str
    nats: float
    bytes: int


@dataclass(frozen=True)
class Interval:
    """A difference (treatment - baseline, bits per byte; negative: the treatment scores better) and its interval."""

    mean: float
    lo: float | None            # None: one seed of one source, nothing to draw an interval from
    hi: float | None
    seeds: int
    docs: int
    sources: int
    replicates: int

    def excludes_zero(self) -> bool:
        return self.lo is not None and (self.lo > 0 or self.hi < 0)

    def to_dict(self) -> dict:
        return asdict(self)


def bits_per_byte(scores: list[DocScore]) -> float:
    """Pooled bits per byte of a set of documents: total nats over total bytes, in bits."""
    total = sum(s.bytes for s in scores)
    if total <= 0:
        raise ValueError("bits_per_byte: no bytes to score")
    return sum(s.nats for s in scores) / total / LN2


def _matrix(arm: dict[int, list[DocScore]], docs: list[str], domains: set[str]) -> np.ndarray:
    """Nats per ``[seed, doc]``; every seed scores exactly ``docs`` (of the ``domains`` compared)."""
    rows, wanted = [], set(docs)
    for seed in sorted(arm):
        by_doc = {s.doc: s.nats for s in arm[seed] if s.doc in wanted or s.domain in domains}
        missing = [d for d in docs if d not in by_doc] or sorted(set(by_doc) - wanted)
        if missing:
            raise ValueError(f"seed {seed}: reference document {missing[0]!r} was not scored by both arms; every "
                             f"seed of both arms must score the same references")
        rows.append([by_doc[d] for d in docs])
    return np.asarray(rows, dtype=np.float64)


#: Two-sided 95 % Student t quantiles by degrees of freedom (beyond 30: the normal's 1.96).
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
       12: 2.179, 15: 2.131, 20: 2.086, 25: 2.060, 30: 2.042}


def t95(df: int) -> float:
    """The 95 % t quantile for ``df`` degrees of freedom (the next lower tabled df: never narrower)."""
    return T95[max(k for k in T95 if k <= df)] if df <= 30 else 1.96


def paired_difference(baseline: dict[int, list[DocScore]], treatment: dict[int, list[DocScore]], *,
                      domain: str | None = None, replicates: int = 2000, seed: int = 0) -> Interval:
    """Treatment minus baseline in bits per byte (mean over the paired seeds of each seed's pooled difference),
    with a 95 % interval: ``mean +- t * se``, where ``se`` is the standard deviation of ``replicates`` two-level
    bootstrap draws (seeds, then sources), widened by ``sqrt(n / (n - 1))`` for the n seeds, and ``t`` the
    Student quantile at ``n - 1`` degrees of freedom. A percentile interval over 3 to 5 seeds is too narrow (a
    synthetic A/A pair of tests/test_ablation_stats.py covered zero in 49 of 60 draws); this one keeps the bootstrap's
    source clustering and the small-sample width.

    ``baseline`` and ``treatment`` map a seed to its checkpoint's scores; both arms must have the same seeds and
    score the same documents. ``domain`` restricts to one domain's references.
    """
    if sorted(baseline) != sorted(treatment):
        raise ValueError(f"paired_difference: the arms have different seeds ({sorted(baseline)} and "
                         f"{sorted(treatment)}); a paired difference needs the same seeds")
    if not baseline:
        raise ValueError("paired_difference: no seeds")
    first = [s for s in baseline[min(baseline)] if domain is None or s.domain == domain]
    if not first:
        raise ValueError(f"paired_difference: no reference documents{f' of domain {domain!r}' if domain else ''}")
    docs = [s.doc for s in first]
    size = np.asarray([s.bytes for s in first], dtype=np.float64)
    sources = sorted({s.source for s in first})
    src_of = np.asarray([sources.index(s.source) for s in first])
    domains = {s.domain for s in first}
    delta = _matrix(treatment, docs, domains) - _matrix(baseline, docs, domains)      # [seeds, docs], nats
    n_seeds, n_src = delta.shape[0], len(sources)

    point = float(delta.sum(axis=1).mean() / size.sum() / LN2)
    rng = np.random.default_rng(seed)
    seed_w = rng.multinomial(n_seeds, [1.0 / n_seeds] * n_seeds, size=replicates) / n_seeds      # [B, seeds]
    src_w = rng.multinomial(n_src, [1.0 / n_src] * n_src, size=replicates)                      # [B, sources]
    doc_w = src_w[:, src_of].astype(np.float64)                                                   # [B, docs]
    stats = ((seed_w @ delta) * doc_w).sum(axis=1) / (doc_w @ size) / LN2
    n = n_seeds if n_seeds > 1 else n_src
    if n < 2:                           # one seed and one source: nothing varies, no interval can be drawn
        return Interval(point, None, None, n_seeds, len(docs), n_src, replicates)
    se = float(np.std(stats, ddof=1)) * math.sqrt(n / (n - 1))
    half = t95(n - 1) * se
    return Interval(point, point - half, point + half, n_seeds, len(docs), n_src, replicates)


def noise_floor(aa: Interval) -> float:
    """The largest difference, either sign, that an A/A pair (same arm, other seeds) shows within its interval
    (infinite when the pair has no interval)."""
    return math.inf if aa.lo is None else max(abs(aa.lo), abs(aa.hi))


def verdict(diff: Interval, floor: float, control: Interval | None) -> str:
    """``better`` / ``worse`` (lower / higher bits per byte, interval clear of zero and the difference beyond the
    noise floor), ``no difference detected``, or ``inconclusive`` when the positive control was not detected (the
    design could not have seen a difference of that size)."""
    if control is None or not control_detected(control, floor):
        return "inconclusive"
    if diff.excludes_zero() and abs(diff.mean) > floor:
        return "better" if diff.mean < 0 else "worse"
    return "no difference detected"


def control_detected(control: Interval, floor: float) -> bool:
    """The chain was seen to help on the junk-planted corpus: ``control`` (the chain's arm minus the raw arm, both
    on the planted corpus) is below zero with its whole interval, and beyond the noise floor."""
    return control.hi is not None and control.hi < 0 and abs(control.mean) > floor
