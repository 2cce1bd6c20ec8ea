"""#53: which corpus runs wait for a person, and the headline that person reads (the live approve/reject over REST
is in ``test_airflow_live.py``)."""

from __future__ import annotations

import json

import pytest

from pipeline.tasks.approval import needs_approval, release_headline


def test_refresh_runs_wait_by_default_and_builds_do_not():
    assert needs_approval("refresh", "corpus_refresh") and not needs_approval("refresh", "corpus_build")
    assert needs_approval("always", "corpus_build") and needs_approval("always", "corpus_refresh")
    assert not needs_approval("never", "corpus_refresh")
    with pytest.raises(ValueError, match="approval: 'sometimes'"):
        needs_approval("sometimes", "corpus_build")


def _stat(rdir, stage, shard, domain, n_in, kept, removed):
    path = rdir / "stats" / stage / f"{shard}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"domain": domain, "in_docs": n_in, "kept_docs": kept, "in_bytes": 0, "kept_bytes": 0,
                                "removed": {r: {"docs": n} for r, n in removed.items()}}))


def test_the_headline_accounts_for_every_document_in_chain_order(tmp_path):
    rdir = tmp_path / "refresh_2"
    _stat(rdir, "ingest", "s0", "web", 10, 10, {})
    _stat(rdir, "ingest", "s1", "web", 5, 5, {})
    _stat(rdir, "ingest", "s2", "code", 4, 4, {})
    _stat(rdir, "minhash", "s0", "web", 15, 6, {"near_duplicate_of_previous_release": 9})
    _stat(rdir, "quality", "s0", "web", 6, 5, {"gopher_short_doc": 1})
    _stat(rdir, "exact_dedup", "s0", "code", 4, 3, {"exact_duplicate": 1})  # kept: the last stage in chain order
    (rdir / "mindrecord").mkdir()
    (rdir / "mindrecord" / "manifest.json").write_text(json.dumps(
        {"samples": 12, "tokens": 3084, "extends_release": {"name": "refresh_1", "tokenizer_sha256": "ab"}}))
    text = release_headline(rdir, "/mindloom/reports/corpus_refresh/refresh_2")
    assert text.splitlines() == [
        "Corpus run `refresh_2`: the delta of release `refresh_1`. MindRecord: 12 rows, 3,084 tokens.",
        "",
        "| domain | documents in | kept | removed (reason: documents) |",
        "|---|---|---|---|",
        "| code | 4 | 3 | exact_duplicate: 1 |",
        "| web | 15 | 5 | near_duplicate_of_previous_release: 9, gopher_short_doc: 1 |",
        "",
        "Report: /mindloom/reports/corpus_refresh/refresh_2"]
