"""#51: the ablation's statistics on synthetic scores with a known truth.

Reference documents from several sources (a source effect shared by its documents), seeds that shift every
document alike, and a treatment that changes every document by a known number of bits per byte. The two-level
bootstrap interval must cover the known difference in most draws (not only in one lucky one), an A/A pair must
cover zero, and the verdict must say ``inconclusive`` when the positive control was not detected.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipeline.ablation.stats import (
    DocScore,
    Interval,
    bits_per_byte,
    control_detected,
    noise_floor,
    paired_difference,
    verdict,
)


def _arm(rng, base: np.ndarray, sizes: np.ndarray, sources: list[str], seeds: int, shift_bpb: float,
         seed_sd: float, doc_sd: float) -> dict[int, list[DocScore]]:
    """Scores per seed: nats = (base bpb + shift + seed noise + doc noise) * bytes * ln 2."""
    out = {}
    for s in range(seeds):
        seed_noise = rng.normal(0, seed_sd)
        bpb = base + shift_bpb + seed_noise + rng.normal(0, doc_sd, len(base))
        out[s] = [DocScore(f"d{i}", sources[i], "prose" if i % 2 else "code", float(b * n * math.log(2)), int(n))
                  for i, (b, n) in enumerate(zip(bpb, sizes, strict=True))]
    return out


def _refs(rng, n_sources=8, per_source=5):
    sources = [f"src{k}" for k in range(n_sources) for _ in range(per_source)]
    effect = {f"src{k}": rng.normal(0, 0.15) for k in range(n_sources)}
    base = np.asarray([1.2 + effect[s] for s in sources])
    sizes = rng.integers(500, 5000, len(sources))
    return base, sizes, sources


def test_bits_per_byte_pools_nats_over_bytes():
    docs = [DocScore("a", "s", "d", 1000 * math.log(2), 1000), DocScore("b", "s", "d", 3000 * math.log(2), 1000)]
    assert bits_per_byte(docs) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="no bytes"):
        bits_per_byte([])


def test_the_interval_covers_a_known_difference_and_an_aa_pair_covers_zero():
    truth, covered, aa_covered, cases = -0.05, 0, 0, 60
    for case in range(cases):
        rng = np.random.default_rng(case)
        base, sizes, sources = _refs(rng)
        a = _arm(rng, base, sizes, sources, 4, 0.0, 0.02, 0.03)
        b = _arm(rng, base, sizes, sources, 4, truth, 0.02, 0.03)
        again = _arm(rng, base, sizes, sources, 4, 0.0, 0.02, 0.03)
        diff = paired_difference(a, b, replicates=600, seed=case)
        covered += diff.lo <= truth <= diff.hi
        aa = paired_difference(a, again, replicates=600, seed=case)
        aa_covered += aa.lo <= 0 <= aa.hi
        assert diff.seeds == 4 and diff.docs == 40 and diff.sources == 8
    print(f"coverage of the truth {covered}/{cases}, of zero by A/A {aa_covered}/{cases}")
    assert covered >= 0.9 * cases and aa_covered >= 0.9 * cases, (covered, aa_covered)


def test_a_clear_difference_is_read_against_the_floor_and_the_control():
    rng = np.random.default_rng(3)
    base, sizes, sources = _refs(rng)
    raw = _arm(rng, base, sizes, sources, 4, 0.0, 0.005, 0.01)
    shipped = _arm(rng, base, sizes, sources, 4, -0.2, 0.005, 0.01)
    aa = paired_difference(raw, _arm(rng, base, sizes, sources, 4, 0.0, 0.005, 0.01), replicates=800)
    floor = noise_floor(aa)
    diff = paired_difference(raw, shipped, replicates=800)
    assert diff.mean == pytest.approx(-0.2, abs=0.02) and diff.excludes_zero() and abs(diff.mean) > floor
    control = paired_difference(raw, _arm(rng, base, sizes, sources, 4, -0.3, 0.005, 0.01), replicates=800)
    assert control_detected(control, floor)
    assert verdict(diff, floor, control) == "better"
    assert verdict(diff, floor, None) == "inconclusive"
    missed = Interval(-0.01, -0.05, 0.03, 4, 40, 8, 800)             # the control's interval crosses zero
    assert verdict(diff, floor, missed) == "inconclusive"
    same = paired_difference(raw, raw, replicates=200)
    assert same.mean == 0 and verdict(same, floor, control) == "no difference detected"
    worse = paired_difference(shipped, raw, replicates=800)
    assert verdict(worse, floor, control) == "worse"


def test_one_domain_and_mismatched_arms():
    rng = np.random.default_rng(5)
    base, sizes, sources = _refs(rng)
    a = _arm(rng, base, sizes, sources, 3, 0.0, 0.01, 0.01)
    b = _arm(rng, base, sizes, sources, 3, -0.1, 0.01, 0.01)
    assert paired_difference(a, b, domain="code", replicates=100).docs == 20
    with pytest.raises(ValueError, match="different seeds"):
        paired_difference(a, {0: b[0]}, replicates=10)
    with pytest.raises(ValueError, match="no reference documents of domain 'web'"):
        paired_difference(a, b, domain="web", replicates=10)
    short = {s: v[:-1] for s, v in b.items()}
    with pytest.raises(ValueError, match=r"seed 0: reference document 'd39' was not scored by both arms"):
        paired_difference(short, a, replicates=10)


def test_the_bootstrap_is_reproducible():
    rng = np.random.default_rng(9)
    base, sizes, sources = _refs(rng)
    a = _arm(rng, base, sizes, sources, 4, 0.0, 0.01, 0.01)
    b = _arm(rng, base, sizes, sources, 4, -0.1, 0.01, 0.01)
    assert paired_difference(a, b, seed=1) == paired_difference(a, b, seed=1)


def test_one_seed_of_one_source_has_no_interval():
    docs = {0: [DocScore("a", "s", "d", 100.0, 100), DocScore("b", "s", "d", 50.0, 100)]}
    better = {0: [DocScore("a", "s", "d", 90.0, 100), DocScore("b", "s", "d", 40.0, 100)]}
    iv = paired_difference(docs, better, replicates=50)
    assert iv.mean == pytest.approx(-20 / 200 / math.log(2)) and iv.lo is None and iv.hi is None
    assert not iv.excludes_zero() and noise_floor(iv) == math.inf
    assert verdict(iv, 0.0, iv) == "inconclusive"


def test_the_report_plot_draws_every_difference_the_floor_and_the_control():
    from pipeline.ablation.plot import svg

    iv = {"mean": -0.05, "lo": -0.09, "hi": -0.01}
    report = {"baseline": "raw", "noise_floor": 0.02, "control": {"mean": -0.2, "lo": -0.3, "hi": -0.1},
              "control_detected": True,
              "differences": {"shipped": {"all": iv, "books": {"mean": 0.01, "lo": None, "hi": None}}}}
    out = svg(report)
    assert out.startswith("<svg") and out.count("<circle") == 3 and out.count('stroke="#1f77b4"') == 2
    assert "control (detected)" in out and "shipped - raw: books" in out
    assert svg(report) == out                                     # the same bytes for the same report
