"""Mixture and held-out split on real text: budgets, achieved proportions, determinism, decontamination."""

from __future__ import annotations

import hashlib
import shutil

import pytest
from conftest import prose_records, stdlib_records
from test_tokenizer import SMALL, shared_records, write_quality_shards

from pipeline.configkit import ConfigError
from pipeline.io import read_json, read_parquet
from pipeline.sink import mixture
from pipeline.sink.config import MixtureConfig
from pipeline.sink.validation import heldout_count, heldout_key
from pipeline.tokenizer import run as tokenizer
from pipeline.tokenizer.config import TokenizerConfig


def tokenized_run(rdir, records, tc=SMALL, seed=3, per_shard=25):
    shards = write_quality_shards(rdir, records, per_shard)
    tokenizer.train_tokenizer(tc, rdir, shards, seed)
    for s in shards:
        tokenizer.run_tokenize_shard(rdir, s)
    return shards


def _doc_tokens(rdir, shards) -> dict[str, tuple[str, int]]:
    out = {}
    for s in shards:
        t = read_parquet(rdir / "tokenize" / f"{s}.parquet", columns=["doc_id", "domain", "n_tokens"])
        out.update({d: (dom, n) for d, dom, n in zip(*(t.column(c).to_pylist() for c in t.column_names),
                                                     strict=True)})
    return out


def _decisions(rdir, shards) -> dict[str, tuple[str, int]]:
    out = {}
    for s in shards:
        t = read_parquet(rdir / "mixture" / f"{s}.parquet")
        out.update({d: (sp, c) for d, sp, c in zip(*(t.column(c).to_pylist() for c in ("doc_id", "split", "copies")),
                                                    strict=True)})
    return out


def test_budget_meets_every_weight_within_the_cap():
    avail = {"a": 1000, "b": 100}
    # b can give at most 4 x 100 tokens, so the largest budget meeting 50/50 is 800
    assert mixture.domain_targets(avail, {"a": 1, "b": 1}, 4.0, 0) == {"a": 400.0, "b": 400.0}
    assert mixture.domain_targets(avail, {}, 4.0, 0) == {"a": 1000.0, "b": 100.0}           # natural mixture
    assert mixture.domain_targets(avail, {"a": 1, "b": 0}, 4.0, 0) == {"a": 1100.0, "b": 0.0}
    # an explicit budget: b stops at its cap, a takes the rest
    assert mixture.domain_targets(avail, {"a": 1, "b": 1}, 4.0, 2000) == {"a": 1600.0, "b": 400.0}
    three = mixture.domain_targets({"a": 1000, "b": 100, "c": 10}, {"a": 2, "b": 1, "c": 1}, 2.0, 1000)
    assert three == {"a": 780.0, "b": 200.0, "c": 20.0}      # b and c at their caps


def test_a_matched_mixture_gives_every_domain_its_weight_or_fails_naming_it():
    """#51: ablation arms train on the same tokens per domain; a domain over the cap is an error, not a shift."""
    avail = {"a": 1000, "b": 100}
    assert mixture.domain_targets(avail, {"a": 3, "b": 1}, 4.0, 1600, matched=True) == {"a": 1200.0, "b": 400.0}
    with pytest.raises(ConfigError, match=r"mixture.matched: domain 'b' needs 500 of its 100 training tokens, "
                                          r"5.00 epochs, over mixture.max_epochs 4"):
        mixture.domain_targets(avail, {"a": 1, "b": 1}, 4.0, 1000, matched=True)
    assert mixture.domain_targets(avail, {"a": 1, "b": 1}, 4.0, 1000) == {"a": 600.0, "b": 400.0}  # unmatched: shift
    with pytest.raises(ConfigError, match=r"mixture.matched: needs mixture.weights and mixture.total_tokens > 0"):
        MixtureConfig(matched=True, weights={"a": 1})


def test_a_matched_selection_that_misses_a_domain_by_more_than_the_tolerance_fails_naming_it():
    """Whole documents: one large document against a small target is all or nothing; the matched run stops."""
    import numpy as np

    hist = {"a": np.zeros(mixture.BUCKETS), "b": np.zeros(mixture.BUCKETS)}
    hist["a"][[10, 20, 30, 40]] = 100                     # four documents of 100 tokens
    hist["b"][[5, 50]] = [1000, 1000]                       # two books of 1,000
    rules = {d: {"full": 0, "extra_below_bucket": mixture._threshold(hist[d], 200), "target": 200.0}
             for d in hist}
    mc = MixtureConfig(weights={"a": 1, "b": 1}, total_tokens=400, matched=True)
    assert rules["a"]["extra_below_bucket"] == 21 and rules["b"]["extra_below_bucket"] == 5
    with pytest.raises(ConfigError, match=r"mixture.matched: domain 'b' can get 0 of its 200 target tokens "
                                          r"\(100.0% off, over mixture.matched_tolerance 0.05\)"):
        mixture._check_matched(mc, hist, rules)
    mixture._check_matched(mc, {"a": hist["a"]}, {"a": rules["a"]})                  # 'a' meets it exactly


def test_weights_are_checked_against_the_domains_with_documents():
    with pytest.raises(ConfigError, match=r"mixture.weights: domain 'b' has no weight"):
        mixture.domain_targets({"a": 1, "b": 1}, {"a": 1}, 4.0, 0)
    with pytest.raises(ConfigError, match=r"mixture.weights.web: no documents of this domain"):
        mixture.domain_targets({"a": 1}, {"a": 1, "web": 1}, 4.0, 0)
    with pytest.raises(ConfigError, match=r"mixture.weights.b: weight > 0 but no training documents"):
        mixture.domain_targets({"a": 1, "b": 0}, {"a": 1, "b": 1}, 4.0, 0)
    with pytest.raises(ConfigError, match=r"mixture.weights.a: expected a number >= 0"):
        MixtureConfig(weights={"a": -1})


def _check_report_against_decisions(rdir, shards, report, mc):
    tokens, decisions = _doc_tokens(rdir, shards), _decisions(rdir, shards)
    for dom, r in report["domains"].items():
        sel = [(c, tokens[d][1]) for d, (sp, c) in decisions.items() if tokens[d][0] == dom and sp == "train"]
        assert r["selected_tokens"] == sum(c * n for c, n in sel)
        assert r["selected_docs"] == sum(c for c, _ in sel)
        assert max(c for c, _ in sel) <= mc.max_epochs
        # the threshold is a bucket boundary: the selection misses the target by at most half a document
        assert abs(r["selected_tokens"] - r["target"]) <= max(n for _, n in sel) / 2 + 1
    for s in shards:
        st = read_json(rdir / "stats" / "mixture" / f"{s}.json")
        assert st["in_docs"] == st["kept_docs"] + sum(v["docs"] for v in st["removed"].values())


def test_stdlib_mixture_upsamples_prose_to_the_cap_and_downsamples_code(tmp_path):
    shards = tokenized_run(tmp_path, {"code": stdlib_records(30), "prose": prose_records(50)})
    mc = MixtureConfig(weights={"code": 0.2, "prose": 0.8}, val_min_docs=2)
    report = mixture.plan_mixture(mc, tmp_path, shards, seed=3)
    prose, code = report["domains"]["prose"], report["domains"]["code"]
    # prose (42k tokens against 218k of code) limits the budget: exactly 4 copies of every training document
    assert prose["epochs"] == pytest.approx(4.0) and prose["capped"]
    assert prose["selected_docs"] == 4 * prose["unique_docs"] == 4 * 48           # 2 held out
    assert prose["selected_tokens"] == 4 * prose["available"]
    assert 0.1 < code["epochs"] < 0.3 and not code["capped"]
    # whole documents (the largest code file has 28k tokens) are the only source of error
    biggest = max(n for dom, n in _doc_tokens(tmp_path, shards).values() if dom == "code")
    assert abs(code["achieved_share"] - 0.2) <= biggest / 2 / report["total_selected_tokens"]
    _check_report_against_decisions(tmp_path, shards, report, mc)
    assert report == read_json(tmp_path / "mixture" / "report.json")


@pytest.mark.corpus
def test_four_domain_mixture_hits_its_weights_on_the_sample_corpus(tmp_path):
    recs = {d: shared_records(d, 200) for d in ("code", "encyclopedia", "books", "zh")}
    shards = tokenized_run(tmp_path, recs, TokenizerConfig(vocab_size=2000, sample_chars=300_000), per_shard=100)
    weights = {"code": 0.4, "encyclopedia": 0.3, "books": 0.2, "zh": 0.1}
    mc = MixtureConfig(weights=weights)
    report = mixture.plan_mixture(mc, tmp_path, shards, seed=11)
    for dom, w in weights.items():
        assert abs(report["domains"][dom]["achieved_share"] - w) < 0.01, (dom, report["domains"][dom])
        assert report["domains"][dom]["bytes_per_token"] > 1.5
    assert report["max_share_error"] < 0.01
    _check_report_against_decisions(tmp_path, shards, report, mc)


def test_decisions_are_a_function_of_doc_id_seed_and_domain(tmp_path):
    recs = {"code": stdlib_records(30), "prose": prose_records(50)}
    mc = MixtureConfig(weights={"code": 0.5, "prose": 0.5}, max_epochs=2.5)
    shards = tokenized_run(tmp_path / "a", recs)
    mixture.plan_mixture(mc, tmp_path / "a", shards, seed=3)
    shutil.copytree(tmp_path / "a" / "tokenize", tmp_path / "b" / "tokenize")
    mixture.plan_mixture(mc, tmp_path / "b", shards, seed=3)
    for s in shards:
        a, b = ((tmp_path / r / "mixture" / f"{s}.parquet").read_bytes() for r in ("a", "b"))
        assert hashlib.sha256(a).digest() == hashlib.sha256(b).digest()
    shutil.copytree(tmp_path / "a" / "tokenize", tmp_path / "c" / "tokenize")
    mixture.plan_mixture(mc, tmp_path / "c", shards, seed=4)
    assert _decisions(tmp_path / "a", shards) != _decisions(tmp_path / "c", shards)
    copies = {c for _, c in _decisions(tmp_path / "a", shards).values()}
    assert copies == {0, 1, 2, 3}           # 2.5 epochs: every doc twice, about half a third time (code: under 1)


def _fake_tokenized(rdir, records: dict[str, list[dict]], per_shard: int = 20) -> list[str]:
    """Tokenize-stage columns with words as tokens (each word's hash as its id): enough for the held-out
    logic."""
    import pyarrow as pa

    from pipeline.io import write_parquet

    shards = []
    for dom, recs in sorted(records.items()):
        for i in range(0, len(recs), per_shard):
            part, name = recs[i:i + per_shard], f"{dom}-{i // per_shard:05d}"
            write_parquet(pa.table({
                "doc_id": [r["id"] for r in part], "domain": [dom] * len(part),
                "n_tokens": pa.array([len(r["text"].split()) for r in part], pa.int64()),
                "n_chars": pa.array([len(r["text"]) for r in part], pa.int64()),
                "n_bytes": pa.array([len(r["text"].encode()) for r in part], pa.int64()),
                "text_hash": [hashlib.sha1(r["text"].encode()).hexdigest() for r in part],
                "tokens": pa.array([[int(hashlib.sha1(w.encode()).hexdigest()[:7], 16) for w in r["text"].split()]
                                    for r in part], pa.list_(pa.int32()))}),
                rdir / "tokenize" / f"{name}.parquet")
            shards.append(name)
    return shards


def _id_with_key(seed: int, domain: str, prefix: str, lo: float, hi: float) -> str:
    return next(f"{prefix}-{i}" for i in range(100_000) if lo < heldout_key(seed, domain, f"{prefix}-{i}") < hi)


def test_heldout_is_fixed_by_hash_and_never_shares_text_with_training(tmp_path):
    seed, prose = 9, prose_records(60)
    ranked = sorted(prose, key=lambda r: heldout_key(seed, "prose", r["id"]))
    key = [heldout_key(seed, "prose", r["id"]) for r in ranked]
    # r0's text also trains (a copy far outside the candidate heap); r1's text has a second copy that ranks
    # between r1 and r2, inside the heap
    planted = [{"id": _id_with_key(seed, "prose", "copy-of-r0", key[50], 1.0), "text": ranked[0]["text"]},
               {"id": _id_with_key(seed, "prose", "copy-of-r1", key[1], key[2]), "text": ranked[1]["text"]}]
    recs = {"prose": prose + planted, "code": stdlib_records(10)}
    mc = MixtureConfig(val_fraction=0.05, val_max_docs=4)
    assert heldout_count(62, 0.05, 2, 4) == 3
    shards = _fake_tokenized(tmp_path, recs)
    mixture.plan_mixture(mc, tmp_path, shards, seed)
    held = read_parquet(tmp_path / "mixture" / "heldout.parquet").to_pylist()
    held_prose = [h["doc_id"] for h in held if h["domain"] == "prose"]
    assert held_prose == [ranked[1]["id"], ranked[2]["id"], ranked[3]["id"]]   # r0 trains, r3 takes its place
    decisions = _decisions(tmp_path, shards)
    assert decisions[ranked[0]["id"]][0] == decisions[planted[0]["id"]][0] == "train"
    assert [d for d, (sp, _) in decisions.items() if sp == "dropped"] == [planted[1]["id"]]
    train_texts = {r["text"] for rs in recs.values() for r in rs if decisions[r["id"]][0] == "train"}
    assert not train_texts & {r["text"] for r in prose if r["id"] in held_prose}
    removed = [read_json(tmp_path / "stats" / "mixture" / f"{s}.json")["removed"] for s in shards if "prose" in s]
    assert sum(r.get("heldout_validation", {}).get("docs", 0) for r in removed) == 3
    assert sum(r.get("duplicate_of_heldout", {}).get("docs", 0) for r in removed) == 1
    # adding documents to another domain leaves this domain's held-out documents unchanged
    more = _fake_tokenized(tmp_path / "more", {**recs, "code": stdlib_records(20)})
    mixture.plan_mixture(mc, tmp_path / "more", more, seed)
    held2 = read_parquet(tmp_path / "more" / "mixture" / "heldout.parquet").to_pylist()
    assert [h["doc_id"] for h in held2 if h["domain"] == "prose"] == held_prose


def test_zero_weight_drops_a_domain_from_training_but_keeps_its_heldout_set(tmp_path):
    recs = {"code": stdlib_records(12), "prose": prose_records(30)}
    shards = _fake_tokenized(tmp_path, recs)
    report = mixture.plan_mixture(MixtureConfig(weights={"code": 0, "prose": 1}), tmp_path, shards, seed=1)
    assert report["domains"]["code"]["selected_docs"] == 0 and report["domains"]["code"]["val_docs"] == 2
    prose, avail = report["domains"]["prose"], sum(d["available"] for d in report["domains"].values())
    # the automatic budget keeps the corpus size: prose now fills it alone (within the 4-epoch cap)
    assert prose["achieved_share"] == 1.0 and prose["epochs"] == pytest.approx(avail / prose["available"])
    assert 1 < prose["epochs"] < 4
    code = read_json(tmp_path / "stats" / "mixture" / "code-00000.json")
    assert code["kept_docs"] == 0 and code["removed"]["mixture_zero_weight"]["docs"] == 10
    assert code["removed"]["heldout_validation"]["docs"] == 2
