"""The quality stage decides from the rows MinHash stage 1 already scored, with the output of scoring again."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
from conftest import prose_records
from test_minhash_pipeline import real_words, write_shard

from pipeline.config import config_from_dict
from pipeline.dedup.minhash import REASON_NEAR_DUP, MinhashConfig, run_minhash
from pipeline.dedup.minhash.layout import prescores_path
from pipeline.io import read_parquet
from pipeline.quality.filters.chain import Chain
from pipeline.quality.prescored import read_prescores, write_prescores
from pipeline.quality.run import run_quality_shard

SHARD = "web-00000"


def _quality(max_chars: int | None = None):
    """Length, Gopher repetition and C4 with PII masking on: C4's line cleaning and the masking change kept texts."""
    chain = {"domain": "*", "filters": ["length", "gopher_repetition", "c4"]}
    if max_chars:
        chain["overrides"] = {"length": {"max_chars": max_chars}}
    return config_from_dict({"quality": {"pii": {"enabled": True}, "chains": [chain]}}).quality


def _docs() -> list[dict]:
    w = real_words()
    prose = [r["text"] for r in prose_records(8)]
    near = " ".join(w[3_000:4_000])
    docs = [{"id": f"p{i}", "text": t} for i, t in enumerate(prose)]
    docs += [{"id": "near-a", "text": near}, {"id": "near-b", "text": near + " " + " ".join(w[9_000:9_004])},
             {"id": "mail", "text": prose[0] + "\nWrite to jane.doe@example.org or call 555-867-5309 today.\n"
                                               "click here\n" + prose[1]},
             {"id": "short", "text": "Too short to keep."}]
    return docs


def _stage1(rdir: Path, q) -> dict:
    write_shard(rdir, SHARD, _docs())
    return run_minhash(rdir, [SHARD], MinhashConfig(), rdir, quality=q)


def _outputs(rdir: Path) -> dict[str, str]:
    """sha256 of everything the quality stage wrote, but its stats and marker (which count the reused rows)."""
    return {str(p.relative_to(rdir)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted({*(rdir / "quality").rglob("*"), *(rdir / "removed" / "quality").rglob("*")})
            if p.is_file() and not p.name.endswith(".done")}


def test_quality_decides_from_stage_one_rows_with_identical_output(tmp_path, monkeypatch):
    q = _quality()
    a, b = tmp_path / "a", tmp_path / "b"
    report = _stage1(a, q)
    assert report["removed"][REASON_NEAR_DUP] == 1
    shutil.copytree(a, b)
    scored = read_parquet(prescores_path(a, SHARD))
    assert scored.num_rows == len(_docs()) and None not in scored.column("row").to_pylist()

    fresh = run_quality_shard(q, b, SHARD, input_stage="minhash")          # scores every document
    calls = []
    monkeypatch.setattr(Chain, "score", lambda self, doc: calls.append(doc.doc_id) or {})
    reused = run_quality_shard(q, a, SHARD, input_stage="minhash", prescored=prescores_path(a, SHARD))
    assert calls == []                                                      # nothing scored a second time
    n = len(_docs()) - 1
    assert (fresh["prescored_docs"], reused["prescored_docs"]) == (0, n)
    assert {k: v for k, v in reused.items() if k != "prescored_docs"} == \
           {k: v for k, v in fresh.items() if k != "prescored_docs"}
    assert reused["in_docs"] == n and reused["kept_docs"] == 8
    assert reused["pii"] == {"docs": 1, "email": 1, "phone": 1} and reused["transforms"]["c4_docs_changed"] == 8
    assert {k: v["docs"] for k, v in reused["removed"].items()} == {
        "gopher_rep_duplicated_5_n_grams": 1, "c4_curly_bracket": 1, "gopher_rep_top_2_gram": 1}
    assert _outputs(a) == _outputs(b)                                       # kept texts, scores, audit: same bytes


def test_rows_made_with_other_settings_are_not_used(tmp_path, monkeypatch):
    a = tmp_path / "a"
    _stage1(a, _quality())
    b = tmp_path / "b"
    shutil.copytree(a, b)
    capped = _quality(max_chars=5000)
    scored = []
    real_score = Chain.score
    monkeypatch.setattr(Chain, "score", lambda self, doc: scored.append(doc.doc_id) or real_score(self, doc))
    used = run_quality_shard(capped, a, SHARD, input_stage="minhash", prescored=prescores_path(a, SHARD))
    assert used["prescored_docs"] == 0 and len(scored) == used["in_docs"]
    assert used["removed"]["length_too_many_chars"]["docs"] == 2           # the new cap applied
    assert used == run_quality_shard(capped, b, SHARD, input_stage="minhash")
    assert _outputs(a) == _outputs(b)


def test_a_document_stage_one_could_not_score_is_scored_here(tmp_path):
    q = _quality()
    a = tmp_path / "a"
    _stage1(a, q)
    b = tmp_path / "b"
    shutil.copytree(a, b)
    table = read_parquet(a / "minhash" / f"{SHARD}.parquet")
    ids, domains = table.column("doc_id").to_pylist(), table.column("domain").to_pylist()
    chains = {"web": Chain.build(q, "web")}
    rows = read_prescores(prescores_path(a, SHARD), q, chains, ids, domains)
    assert all(r is not None for r in rows)
    rows[2] = None                                                          # as if its scoring had failed
    write_prescores(prescores_path(a, SHARD), q, chains, ids, domains, rows)
    assert read_prescores(prescores_path(a, SHARD), q, chains, ids, domains)[2] is None
    assert read_prescores(prescores_path(a, SHARD), q, chains, ids, ["code"] * len(ids)) == [None] * len(ids)
    part = run_quality_shard(q, a, SHARD, input_stage="minhash", prescored=prescores_path(a, SHARD))
    full = run_quality_shard(q, b, SHARD, input_stage="minhash")
    assert (part["prescored_docs"], full["prescored_docs"]) == (len(ids) - 1, 0)
    assert {k: v for k, v in part.items() if k != "prescored_docs"} == \
           {k: v for k, v in full.items() if k != "prescored_docs"}
    assert _outputs(a) == _outputs(b)


@pytest.mark.parametrize("missing", ["no table", "no quality config"])
def test_without_prescores_every_document_is_scored(tmp_path, missing):
    rdir = tmp_path / "r"
    _stage1(rdir, None if missing == "no quality config" else _quality())
    if missing == "no table":
        prescores_path(rdir, SHARD).unlink()
    assert not prescores_path(rdir, SHARD).exists()
    stats = run_quality_shard(_quality(), rdir, SHARD, input_stage="minhash", prescored=prescores_path(rdir, SHARD))
    assert stats["prescored_docs"] == 0 and stats["in_docs"] == len(_docs()) - 1
