"""The quality stage on small real shards: outputs, accounting, audit, stored-score re-application, config errors."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pyarrow as pa
import pytest
from conftest import prose_records

from pipeline.config import DEFAULT_CONFIG, config_from_dict, load_config
from pipeline.configkit import ConfigError
from pipeline.ingest.normalize import text_hash
from pipeline.io import read_json, read_parquet, write_parquet
from pipeline.quality.config import QualityConfig
from pipeline.quality.filters.chain import QualityError
from pipeline.quality.run import (
    quality_report,
    reapply_decisions,
    render_quality_report,
    run_quality_shard,
    scores_path,
)

# Jane Austen, Emma (1815), ch. 1 (public domain): too short for Gopher's 50 words.
EMMA = ("Emma Woodhouse, handsome, clever, and rich, with a comfortable home and happy disposition, seemed to unite "
        "some of the best blessings of existence; and had lived nearly twenty-one years in the world with very "
        "little to distress or vex her.")
LOREM = "Lorem ipsum dolor sit amet, consectetur adipiscing elit. " * 12


def _shard(rdir: Path, shard: str, docs: list[tuple[str, str]], stage: str = "exact_dedup",
           lang: list[tuple[str, float]] | None = None) -> None:
    """Write an input shard with the ingest columns; docs are (domain, text)."""
    cols = {"doc_id": [f"{d}-{i:04d}" for i, (d, _) in enumerate(docs)], "domain": [d for d, _ in docs],
            "source": ["test"] * len(docs), "text": [t for _, t in docs], "n_chars": [len(t) for _, t in docs],
            "text_hash": [text_hash(t) for _, t in docs], "meta": ["{}"] * len(docs), "origin": ["t"] * len(docs)}
    if lang is not None:
        cols["lang"] = [x for x, _ in lang]
        cols["lang_score"] = [s for _, s in lang]
    write_parquet(pa.table(cols), rdir / stage / f"{shard}.parquet")


def _quality(**section) -> QualityConfig:
    return config_from_dict({"quality": section}).quality


def _prose_docs() -> list[tuple[str, str]]:
    good = [r["text"] for r in prose_records(6)]
    repeated = "\n".join([good[0].splitlines()[0]] * 30)
    return [("prose", t) for t in good] + [("prose", EMMA), ("prose", EMMA + " "), ("prose", repeated),
                                           ("prose", LOREM)]


def _tree(rdir: Path) -> dict[str, str]:
    return {str(p.relative_to(rdir)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(rdir.rglob("*")) if p.is_file() and "exact_dedup" not in p.parts}


def test_outputs_accounting_and_audit(tmp_path):
    _shard(tmp_path, "prose-00000", _prose_docs())
    q = _quality(audit_samples=1)
    stats = run_quality_shard(q, tmp_path, "prose-00000")
    assert stats["in_docs"] == 10 and stats["kept_docs"] + sum(v["docs"] for v in stats["removed"].values()) == 10
    assert stats["removed"]["gopher_short_doc"]["docs"] == 2          # both copies of the Emma sentence
    assert stats["removed"]["gopher_short_doc"]["chars"] == 2 * len(EMMA) + 1
    kept = read_parquet(tmp_path / "quality" / "prose-00000.parquet")
    assert kept.num_rows == stats["kept_docs"]
    assert {"q_gopher_n_words", "q_gopher_rep_dup_line_frac", "q_length_n_tokens"} <= set(kept.column_names)
    scores = read_parquet(scores_path(tmp_path, "prose-00000"))
    assert scores.num_rows == 10
    reasons = dict(zip(scores.column("doc_id").to_pylist(), scores.column("q_reason").to_pylist(), strict=True))
    assert reasons["prose-0006"] == reasons["prose-0007"] == "gopher_short_doc"
    assert scores.column("q_detail").to_pylist()[6] == "n_words=41 < min_words=50"
    # bounded sample per reason, full counts beside it
    sample = read_parquet(tmp_path / "removed" / "quality" / "gopher_short_doc" / "prose-00000.parquet")
    assert sample.num_rows == 1 and sample.column("reason").to_pylist() == ["gopher_short_doc"]
    counts = read_json(tmp_path / "removed" / "quality" / "prose-00000.counts.json")
    assert counts["gopher_short_doc"]["docs"] == 2 and counts["gopher_short_doc"]["sampled"] == 1
    assert read_json(tmp_path / "stats" / "quality" / "prose-00000.json")["kept_docs"] == stats["kept_docs"]


def test_rerun_is_skipped_and_a_changed_config_reruns(tmp_path):
    _shard(tmp_path, "prose-00000", _prose_docs())
    first = run_quality_shard(_quality(), tmp_path, "prose-00000")
    out = tmp_path / "quality" / "prose-00000.parquet"
    mtime = out.stat().st_mtime_ns
    assert run_quality_shard(_quality(), tmp_path, "prose-00000") == first
    assert out.stat().st_mtime_ns == mtime
    relaxed = run_quality_shard(_quality(min_words=10), tmp_path, "prose-00000")
    assert "gopher_short_doc" not in relaxed["removed"]


WEB_CHAIN = [{"domain": "*", "filters": ["length", "gopher_repetition", "gopher_quality", "c4", "fineweb"]}]


def test_reapplying_new_thresholds_equals_a_full_recompute(tmp_path):
    docs = _prose_docs()
    tuned = _quality(min_words=40, audit_samples=3, chains=[
        {**WEB_CHAIN[0], "overrides": {"gopher_repetition": {"dup_line_frac": 0.9, "dup_line_char_frac": 0.9},
                                       "gopher_quality": {"min_alpha_words_ratio": 0.6},
                                       "c4": {"min_sentences": 3, "filter_lorem_ipsum": False},
                                       "fineweb": {"char_duplicates_ratio": 0.2, "line_punct_thr": 0.05}}}])
    a, b = tmp_path / "a", tmp_path / "b"
    for rdir in (a, b):
        _shard(rdir, "prose-00000", docs)
    run_quality_shard(_quality(chains=WEB_CHAIN, audit_samples=3), a, "prose-00000")
    stored = read_parquet(scores_path(a, "prose-00000"))
    reapplied = run_quality_shard(tuned, a, "prose-00000", reuse_scores=True)
    recomputed = run_quality_shard(tuned, b, "prose-00000")
    assert reapplied == recomputed
    assert _tree(a) == _tree(b)                                 # every output byte-identical
    fresh = read_parquet(scores_path(b, "prose-00000"))
    decisions = [d[0] if d else "" for d in reapply_decisions(tuned, stored)]
    assert decisions == fresh.column("q_reason").to_pylist()
    assert decisions != stored.column("q_reason").to_pylist()   # the new thresholds did change decisions


def test_reuse_refuses_scores_made_with_other_scoring_parameters(tmp_path):
    _shard(tmp_path, "prose-00000", _prose_docs())
    run_quality_shard(_quality(chains=WEB_CHAIN), tmp_path, "prose-00000")
    punct = _quality(chains=[{**WEB_CHAIN[0], "overrides": {"c4": {"filter_no_terminal_punct": True}}}])
    with pytest.raises(QualityError, match=r"c4\.filter_no_terminal_punct changes the scores"):
        run_quality_shard(punct, tmp_path, "prose-00000", reuse_scores=True)
    more = _quality(chains=[{"domain": "*", "filters": ["length", "code"]}])
    with pytest.raises(QualityError, match="filter 'code' was not scored"):
        run_quality_shard(more, tmp_path, "prose-00000", reuse_scores=True)
    _shard(tmp_path / "fresh", "prose-00000", _prose_docs())
    with pytest.raises(QualityError, match=r"reuse_scores=True but .*scores/prose-00000.parquet does not exist"):
        run_quality_shard(_quality(), tmp_path / "fresh", "prose-00000", reuse_scores=True)
    with pytest.raises(QualityError, match=r"input .*minhash/prose-00000.parquet does not exist"):
        run_quality_shard(_quality(), tmp_path / "fresh", "prose-00000", input_stage="minhash")


def test_language_filter_reads_the_language_columns(tmp_path):
    docs = [("zh", "子曰：学而时习之，不亦说乎？" * 10), ("zh", EMMA * 3),
            ("zh", "子曰：温故而知新，可以为师矣。" * 10)]
    _shard(tmp_path, "zh-00000", docs, lang=[("zh", 0.99), ("en", 0.97), ("zh", 0.5)])
    q = _quality(chains=[{"domain": "zh", "filters": ["language"], "overrides": {"language": {"languages": ["zh"]}}}])
    stats = run_quality_shard(q, tmp_path, "zh-00000")
    assert {k: v["docs"] for k, v in stats["removed"].items()} == {"language_not_allowed": 1,
                                                                   "language_low_score": 1}
    assert read_parquet(tmp_path / "quality" / "zh-00000.parquet").column("q_lang_lang").to_pylist() == ["zh"]


def test_language_filter_without_language_columns_says_so(tmp_path):
    _shard(tmp_path, "zh-00000", [("zh", "子曰：学而时习之，不亦说乎？")])
    chain = {"domain": "zh", "filters": ["language"]}
    with pytest.raises(QualityError, match="has no lang/lang_score column: language ID has not run"):
        run_quality_shard(_quality(chains=[chain]), tmp_path, "zh-00000")
    keep = _quality(chains=[{**chain, "overrides": {"language": {"on_missing": "keep"}}}])
    stats = run_quality_shard(keep, tmp_path, "zh-00000")
    assert stats["kept_docs"] == 1 and "language filter NOT applied to 1 documents" in stats["warnings"][0]
    assert "WARNING" in render_quality_report(quality_report(tmp_path))


def test_pii_masking_is_counted(tmp_path):
    text = ("Write to the maintainers at jane.doe@example.net or call +1 (415) 555-2671; the mirror at 8.8.8.8 "
            "and the office router at 192.168.1.1 are up. " * 3)
    _shard(tmp_path, "web-00000", [("web", text)])
    q = _quality(chains=[{"domain": "*", "filters": ["length"]}], pii={"enabled": True})
    stats = run_quality_shard(q, tmp_path, "web-00000")
    assert stats["pii"] == {"docs": 1, "email": 3, "ip": 3, "phone": 3}
    out = read_parquet(tmp_path / "quality" / "web-00000.parquet").column("text")[0].as_py()
    assert "jane.doe" not in out and "8.8.8.8" not in out and "555-2671" not in out
    assert "192.168.1.1" in out                                 # private addresses are not personal data


def test_disabled_filtering_scores_but_keeps_text_unchanged(tmp_path):
    docs = _prose_docs()
    _shard(tmp_path, "prose-00000", docs)
    stats = run_quality_shard(_quality(enabled=False, chains=WEB_CHAIN), tmp_path, "prose-00000")
    assert stats["kept_docs"] == 10 and stats["removed"] == {}
    kept = read_parquet(tmp_path / "quality" / "prose-00000.parquet")
    assert kept.column("text").to_pylist() == [t for _, t in docs]
    assert kept.column("q_c4_n_sentences").null_count == 0


def test_c4_cleaning_reaches_the_output_and_input_stage_is_a_parameter(tmp_path):
    page = ("Menu\nThe committee met on Monday to discuss the budget. It approved the plan. The vote was close. "
            "Work starts in May. The park opens in June.\nShare page")
    _shard(tmp_path, "web-00000", [("web", page)], stage="minhash")
    q = _quality(chains=[{"domain": "*", "filters": ["c4"]}])
    stats = run_quality_shard(q, tmp_path, "web-00000", input_stage="minhash")
    assert stats["input_stage"] == "minhash" and stats["transforms"]["c4_docs_changed"] == 1
    kept = read_parquet(tmp_path / "quality" / "web-00000.parquet")
    assert kept.column("text")[0].as_py() == page.splitlines()[1]
    assert kept.column("n_chars")[0].as_py() == len(page.splitlines()[1])


def test_empty_shard_and_missing_chain(tmp_path):
    _shard(tmp_path, "prose-00000", [])
    stats = run_quality_shard(_quality(), tmp_path, "prose-00000")
    assert (stats["in_docs"], stats["kept_docs"], stats["domain"]) == (0, 0, "prose")
    _shard(tmp_path, "books-00000", [("books", EMMA)])
    with pytest.raises(QualityError, match="no quality chain for domain 'books'"):
        run_quality_shard(_quality(chains=[{"domain": "code", "filters": ["code"]}]), tmp_path, "books-00000")


def test_report_per_domain_and_rule(tmp_path):
    _shard(tmp_path, "prose-00000", _prose_docs())
    run_quality_shard(_quality(), tmp_path, "prose-00000")
    rep = quality_report(tmp_path)["prose"]
    rule = rep["rules"]["gopher_short_doc"]
    assert rule["docs"] == 2 and rule["docs_pct"] == 20.0 and rule["tokens"] > 0
    assert rule["examples"][0]["detail"] == "n_words=41 < min_words=50"
    assert rule["examples"][0]["snippet"].startswith("Emma Woodhouse, handsome")
    text = render_quality_report(quality_report(tmp_path))
    assert "gopher_short_doc" in text and "Emma Woodhouse" in text


# -- configuration --------------------------------------------------------------------------------------------------

def test_config_errors_name_the_field():
    with pytest.raises(ConfigError, match=r"quality\.chains\[0\]\.filters\[1\]: unknown or repeated filter 'gopher'"):
        _quality(chains=[{"domain": "*", "filters": ["length", "gopher"]}])
    with pytest.raises(ConfigError, match=r"quality\.chains\[0\]\.overrides\.gopher_quality\.min_wordz: unknown"):
        _quality(chains=[{"domain": "*", "filters": ["gopher_quality"],
                          "overrides": {"gopher_quality": {"min_wordz": 3}}}])
    with pytest.raises(ConfigError, match=r"overrides\.gopher_quality\.min_alpha_words_ratio: must be <= 1"):
        _quality(chains=[{"domain": "*", "filters": ["gopher_quality"],
                          "overrides": {"gopher_quality": {"min_alpha_words_ratio": 2}}}])
    with pytest.raises(ConfigError, match=r"overrides\.c4: not a filter of this chain"):
        _quality(chains=[{"domain": "*", "filters": ["gopher_quality"], "overrides": {"c4": {}}}])
    with pytest.raises(ConfigError, match=r"quality\.chains\[1\]\.domain: must be non-empty and unique"):
        _quality(chains=[{"domain": "zh", "filters": []}, {"domain": "zh", "filters": []}])
    with pytest.raises(ConfigError, match=r"overrides\.length\.min_chars: must be <= max_chars \(10\), got 20"):
        _quality(chains=[{"domain": "*", "filters": ["length"],
                          "overrides": {"length": {"min_chars": 20, "max_chars": 10}}}])
    with pytest.raises(ConfigError, match=r"overrides\.language\.on_missing: must be one of"):
        _quality(chains=[{"domain": "*", "filters": ["language"], "overrides": {"language": {"on_missing": "x"}}}])


def test_min_words_and_enabled_stay_meaningful_for_the_trigger_form():
    from pipeline.form import config_from_params

    cfg = config_from_params({"quality_filter": False, "min_words": 80})
    assert cfg.quality.enabled is False
    assert cfg.quality.params("encyclopedia", "gopher_quality").min_words == 80
    assert cfg.quality.params("zh", "gopher_quality").min_words == 80       # zh does not override it
    assert cfg.quality.max_words == 100_000


def test_default_yaml_chains_resolve_and_round_trip():
    cfg = load_config(DEFAULT_CONFIG)
    domains = {c.domain for c in cfg.quality.chains}
    assert {"*", "code", "encyclopedia", "docs", "zh"} <= domains
    assert cfg.quality.params("zh", "fineweb").line_punct_thr == 0.106            # FineWeb-2 cmn_Hani
    assert cfg.quality.params("long", "gopher_quality").max_words == 0            # long documents allowed
    assert cfg.quality.params("web", "c4").filter_no_terminal_punct is False      # FineWeb's relaxation
    again = config_from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert again.quality == cfg.quality


def test_report_snippets_of_removed_documents_are_pii_masked(tmp_path):
    short = "Write to jane.doe@corp-mail.com or call +44 20 7946 0958 about " + EMMA[:60]
    _shard(tmp_path, "prose-00000", [("prose", short)])
    run_quality_shard(_quality(), tmp_path, "prose-00000")
    rules = quality_report(tmp_path)["prose"]["rules"]
    assert sum(r["docs"] for r in rules.values()) == 1
    snippet = next(iter(rules.values()))["examples"][0]["snippet"]
    assert "jane.doe@corp-mail.com" not in snippet and "7946" not in snippet
    assert snippet.startswith("Write to email@example.com or") or snippet.startswith(
        "Write to firstname.lastname@example.org or")


def test_a_process_pool_writes_the_same_bytes_as_one_process(tmp_path, monkeypatch):
    import pipeline.quality.run as quality_run

    docs = _prose_docs() * 3 + [("web", LOREM), ("zh", "兰叶春葳蕤，桂华秋皎洁。欣欣此生意，自尔为佳节。" * 5)]
    monkeypatch.setattr(quality_run, "BATCH_DOCS", 4)             # several batches in flight
    trees = []
    for workers in (1, 2):
        rdir = tmp_path / f"w{workers}"
        _shard(rdir, "mixed-00000", docs)
        monkeypatch.setattr(quality_run, "PARALLEL_MIN_BYTES", 0 if workers > 1 else 1 << 40)
        q = _quality(chains=WEB_CHAIN, pii={"enabled": True}, workers=workers)
        run_quality_shard(q, rdir, "mixed-00000")
        trees.append(_tree(rdir))
    assert trees[0] == trees[1] and len(trees[0]) > 4


def test_the_worker_count_does_not_invalidate_a_finished_shard(tmp_path):
    _shard(tmp_path, "prose-00000", _prose_docs())
    first = run_quality_shard(_quality(workers=1), tmp_path, "prose-00000")
    out = tmp_path / "quality" / "prose-00000.parquet"
    mtime = out.stat().st_mtime_ns
    assert run_quality_shard(_quality(workers=3), tmp_path, "prose-00000") == first
    assert out.stat().st_mtime_ns == mtime
