"""Survivors the quality filters will keep, real chain scores, and buckets rescued after a false anchor."""

from __future__ import annotations

import pyarrow.parquet as pq
from test_minhash_pipeline import real_words, write_shard

from pipeline.config import config_from_dict
from pipeline.dedup.minhash import REASON_NEAR_DUP, MinhashConfig, run_minhash
from pipeline.dedup.minhash.clusters import checked_pairs
from pipeline.dedup.minhash.layout import output_path, signature_path


def quality(max_chars: int):
    """A chain of two filters: a length cap, and Gopher repetition with its 5-gram rule set between the members."""
    return config_from_dict({"quality": {"chains": [
        {"domain": "*", "filters": ["length", "gopher_repetition"],
         "overrides": {"length": {"max_chars": max_chars}, "gopher_repetition": {"dup_5_gram": 0.153}}}]}}).quality


def cluster_docs() -> dict[str, str]:
    w = real_words()
    base = w[5_000:6_000]
    return {"long": " ".join(base + w[9_000:9_030]), "mid": " ".join(base + w[9_000:9_010]), "lo": " ".join(base)}


def test_default_survivor_is_one_the_filters_keep(tmp_path):
    """Duplicated 5-gram shares: long 0.1534, mid 0.1524, lo 0.1531 (the rule drops > 0.153)."""
    docs = cluster_docs()
    kept, verdicts = {}, {}
    for name, q in (("blind", None), ("mid_passes", quality(len(docs["mid"]))),
                    ("none_pass", quality(len(docs["lo"])))):
        rdir = tmp_path / name
        write_shard(rdir, "web-00000", [{"id": n, "text": t} for n, t in docs.items()])
        rep = run_minhash(rdir, ["web-00000"], MinhashConfig(), tmp_path, quality=q)
        assert rep["removed"][REASON_NEAR_DUP] == 2
        kept[name] = pq.read_table(output_path(rdir, "web-00000")).column("doc_id").to_pylist()
        sig = pq.read_table(signature_path(rdir, "web-00000"), columns=["doc_id", "keep", "score"]).to_pylist()
        verdicts[name] = [(r["doc_id"], r["keep"], None if r["score"] != r["score"] else r["score"]) for r in sig]
    assert verdicts == {"blind": [("long", -1, None), ("mid", -1, None), ("lo", -1, None)],
                        "mid_passes": [("long", 0, 0.0), ("mid", 1, 1.0), ("lo", 0, 0.5)],
                        "none_pass": [("long", 0, 0.0), ("mid", 0, 0.5), ("lo", 0, 0.5)]}
    # blind: the longest; else the one the filters keep; when none passes, the best score, then the longest
    assert kept == {"blind": ["long"], "mid_passes": ["mid"], "none_pass": ["mid"]}


def test_members_are_checked_when_the_anchor_is_a_false_candidate(tmp_path):
    """x (smallest gid) shares ~45 % with y and z, which are near copies of each other.  With one band of one
    row, a seed that puts all three in one bucket gives only the star edges x–y and x–z: both fail the exact
    check, and y–z is found only by checking the members against each other."""
    w = real_words()
    core = w[20_000:21_000]
    x = core[:600] + w[40_000:40_400]
    y = core
    z = core[:990] + w[50_000:50_010]
    docs = [{"id": "x", "text": " ".join(x)}, {"id": "y", "text": " ".join(y)}, {"id": "z", "text": " ".join(z)}]
    for seed in range(1, 200):
        rdir = tmp_path / f"seed{seed}"
        write_shard(rdir, "web-00000", docs)
        rep = run_minhash(rdir, ["web-00000"], MinhashConfig(bands=1, rows=1, seed=seed), tmp_path)
        edges = sorted(checked_pairs(rdir, MinhashConfig(bands=1, rows=1, seed=seed)).to_pylist(),
                       key=lambda e: (e["a"], e["b"]))
        if [e["method"] for e in edges if e["method"] == "exact"] == ["exact", "exact"]:
            break
    else:
        raise AssertionError("no seed in 1..199 put x, y and z in one bucket")
    assert [(e["a"], e["b"], e["method"], e["passed"]) for e in edges] == [
        (0, 1, "exact", False), (0, 2, "exact", False), (1, 2, "exact_member", True)]
    assert rep["removed"][REASON_NEAR_DUP] == 1
    assert pq.read_table(output_path(rdir, "web-00000")).column("doc_id").to_pylist() == ["x", "z"]   # z: longer
