"""The quality classifier's arithmetic on scores: per-domain histograms, the cuts, the domain probe, held-out quality.

Scores are rounded to 6 decimals, so a domain's scores are counted exactly in a histogram of 1,000,001 bins (8 MB
per domain); a percentage cut and the domain probe are computed from the histograms of each domain's cut sample
(:func:`cut_of`).  Documents with the cut's score are split by a hash of (seed, doc id) (:func:`tie_unit`): when the
sample is the whole domain, a ``keep_top_percent`` cut keeps ``ceil(n * percent / 100)`` of the domain's ``n``
documents exactly, also when many share one score (a confident model gives many 1.000000); when it is a sample, the
documents at the cut are kept with the probability that keeps that share of the sample's, so the expected share is
the percentage.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

BINS = 1_000_001            # scores 0.000000 ... 1.000000
TIE_BINS = 1 << 16          # first level of the tie split (the second holds one such bin's documents)


def unit(*parts: Any) -> float:
    """A number in [0, 1) from a hash of ``parts`` (the same on every machine and in every order of reading)."""
    raw = hashlib.blake2b("\x1f".join(map(str, parts)).encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(raw, "big") / 2.0 ** 64


def tie_unit(seed: int, doc_id: str) -> float:
    """A document's place among the documents of its domain with the same score (smaller is kept first)."""
    return unit(seed, "tie", doc_id)


def bins_of(scores: Iterable[float]) -> np.ndarray:
    return np.rint(np.asarray(list(scores), dtype=np.float64) * 1e6).astype(np.int64)


class Histograms:
    """Per domain, the count of documents at every 6-decimal score."""

    def __init__(self) -> None:
        self.h: dict[str, np.ndarray] = {}

    def add(self, domain: str, scores: list[float]) -> None:
        if scores:
            counts = np.bincount(bins_of(scores), minlength=BINS)
            self.h[domain] = self.h[domain] + counts if domain in self.h else counts

    def add_counts(self, domain: str, bins: np.ndarray, counts: np.ndarray) -> None:
        if domain not in self.h:
            self.h[domain] = np.zeros(BINS, np.int64)
        self.h[domain][bins] += counts

    def docs(self, domain: str) -> int:
        return int(self.h[domain].sum()) if domain in self.h else 0

    def at_least(self, domain: str, cut: float) -> int:
        """Documents of ``domain`` scoring ``cut`` or more."""
        return int(self.h[domain][int(round(cut * 1e6)):].sum()) if domain in self.h else 0


def keep_count(n: int, percent: float) -> int:
    """How many of ``n`` documents a top-``percent`` cut keeps: ceil(n * percent / 100), at least one."""
    return 0 if not n else min(n, max(1, math.ceil(n * percent / 100.0 - 1e-9)))


def percent_cut(hist: np.ndarray, percent: float) -> dict:
    """The cut keeping :func:`keep_count` documents of a histogram: its score, the documents above it, at it, and
    how many of those at it are kept (``need``; all of them when ``need == at_cut``)."""
    n = int(hist.sum())
    k = keep_count(n, percent)
    above_or_at = np.cumsum(hist[::-1])[::-1]            # documents scoring >= each bin
    b = int(np.searchsorted(-above_or_at, -k, side="right")) - 1       # the highest bin with >= k at or above it
    at = int(hist[b])
    above = int(above_or_at[b]) - at
    return {"cut": round(b / 1e6, 6), "docs": n, "keep": k, "above": above, "at_cut": at, "need": k - above}


def tie_threshold(units: Callable[[], Iterable[float]], need: int) -> float:
    """The ``need``-th smallest tie unit of the documents at a cut, in two reads of ``units()`` (the documents' tie
    units, in any order) with bounded memory: a count per 1/65536 of [0, 1), then the units of the one bin the
    ``need``-th falls in (tie units are 64-bit hashes, so distinct)."""
    counts = np.zeros(TIE_BINS, np.int64)
    for u in units():
        counts[int(u * TIE_BINS)] += 1
    cum = np.cumsum(counts)
    b = int(np.searchsorted(cum, need))                  # the first bin with `need` units at or below it
    inside = sorted(u for u in units() if int(u * TIE_BINS) == b)
    return inside[need - int(cum[b] - counts[b]) - 1]


def cut_of(rows: list[tuple[str, float]], percent: float, seed: int, whole: bool) -> dict:
    """The cut of a top-``percent`` rule from a domain's scored (doc_id, score) rows: its score, the documents the
    rows put above and at it, and ``tie_max``, the largest :func:`tie_unit` kept at the cut (None: all of them).
    ``whole``: the rows are every document of the domain, so ``tie_max`` is the tie unit of the ``need``-th document
    at the cut and the cut keeps :func:`keep_count` documents exactly; else the rows are a uniform sample and
    ``tie_max`` is the share ``need / at_cut``: tie units are uniform, so that share of the domain's documents at
    the cut's score is kept in expectation."""
    hists = Histograms()
    hists.add("d", [s for _, s in rows])
    pc = percent_cut(hists.h["d"], percent)
    out = {"cut": pc["cut"], "tie_max": None, "sample_target": pc["keep"], "above": pc["above"],
           "at_cut": pc["at_cut"]}
    if pc["need"] < pc["at_cut"]:
        out["tie_max"] = (tie_threshold(lambda: (tie_unit(seed, i) for i, s in rows if s == pc["cut"]), pc["need"])
                          if whole else pc["need"] / pc["at_cut"])
    return out


def decide(score: float | None, cut: dict | None, seed: int, doc_id: str) -> bool:
    """True when a document with this score is kept by its domain's cut (None: no cut, or no score: kept)."""
    if cut is None or cut.get("cut") is None or score is None:
        return True
    if score != cut["cut"]:
        return score > cut["cut"]
    return cut.get("tie_max") is None or tie_unit(seed, doc_id) <= cut["tie_max"]


# --------------------------------------------------------------------------------------------------------------
# What the score says about the domain

def _pair(ha: np.ndarray, hb: np.ndarray) -> dict:
    """How well a score separates two domains: the AUC (the chance that a document of the first outscores one of
    the second, ties half), and the balanced accuracy of the best single threshold (either direction)."""
    na, nb = float(ha.sum()), float(hb.sum())
    below_b = np.cumsum(hb) - hb                          # documents of b scoring less than each bin
    auc = float(np.dot(ha.astype(np.float64), below_b + 0.5 * hb) / (na * nb))
    # "a when score >= t": t runs over every bin; share of a at or above t, share of b below t
    a_at_or_above = np.cumsum(ha[::-1])[::-1] / na
    b_below = below_b / nb
    balanced = (a_at_or_above + b_below) / 2
    best = int(np.argmax(np.maximum(balanced, 1 - balanced)))
    acc = float(max(balanced[best], 1 - balanced[best]))
    return {"auc": round(auc, 6), "separation": round(max(auc, 1 - auc), 6),
            "best_threshold_accuracy": round(acc, 6), "threshold": round(best / 1e6, 6)}


def domain_probe(hists: Histograms) -> dict:
    """The domain probe: for every pair of scored domains, how well ``q_classifier_score`` alone tells them apart
    (0.5: not at all; 1.0: the score names the domain).  A classifier that learned quality within each domain
    shows a weak probe; one trained on some domains against others shows a strong one."""
    domains = sorted(d for d in hists.h if hists.docs(d))
    pairs = []
    for i, a in enumerate(domains):
        for b in domains[i + 1:]:
            pairs.append({"domains": [a, b], **_pair(hists.h[a], hists.h[b])})
    seps = [p["separation"] for p in pairs]
    return {"pairs": pairs, "max_separation": max(seps) if seps else None,
            "mean_separation": round(sum(seps) / len(seps), 6) if seps else None,
            "mean_score": {d: round(float(np.dot(np.arange(BINS), hists.h[d])) / 1e6 / hists.docs(d), 6)
                           for d in domains},
            "note": "separation = max(AUC, 1 - AUC) of the score between two domains' documents: 0.5 says nothing "
                    "about the domain, 1.0 names it"}


# --------------------------------------------------------------------------------------------------------------
# Held-out (cross-fitted) quality of the training sample

def held_out_quality(held: list[dict]) -> dict:
    """Counts, accuracy at 0.5, balanced accuracy (the mean of the two classes' accuracies) and ROC AUC (the chance
    that a positive outscores a negative, ties half) of scored documents with a class.  The sample is not always
    balanced, so plain accuracy alone hides a model that ranks well but is centred badly, or one that only
    predicts the larger class; a percentile cut depends on the ranking, which the AUC measures."""
    pos = [d["score"] for d in held if d["class"] == "pos"]
    neg = sorted(d["score"] for d in held if d["class"] == "neg")
    out = {"docs": len(held), "positives": len(pos), "negatives": len(neg),
           "accuracy": round(sum((d["score"] >= 0.5) == (d["class"] == "pos") for d in held) / len(held), 6)
           if held else None, "balanced_accuracy": None, "auc": None}
    if pos and neg:
        out["balanced_accuracy"] = round((sum(p >= 0.5 for p in pos) / len(pos)
                                          + sum(n < 0.5 for n in neg) / len(neg)) / 2, 6)
        wins = sum(bisect.bisect_left(neg, p) + 0.5 * (bisect.bisect_right(neg, p) - bisect.bisect_left(neg, p))
                   for p in pos)
        out["auc"] = round(wins / (len(pos) * len(neg)), 6)
    return out


def by_source(docs: list[dict]) -> dict:
    """Per kind of training example (heuristics pass / fail, each corruption): documents, mean cross-fitted score
    and the share scored below 0.5 (for negatives: the share the model catches)."""
    out: dict[str, dict] = {}
    for d in docs:
        out.setdefault(d["source"], []).append(d["score"])
    return {k: {"docs": len(v), "mean_score": round(sum(v) / len(v), 6),
                "below_half": round(sum(s < 0.5 for s in v) / len(v), 6)} for k, v in sorted(out.items())}
