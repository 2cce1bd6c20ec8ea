"""Benchmark decontamination (pipeline/quality/decontaminate.py): the index, the removal, the audit, the errors."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
from pathlib import Path

import pyarrow as pa
import pytest
from conftest import prose_records, tiny_config, write_jsonl

from pipeline.config import config_from_dict, load_config
from pipeline.configkit import ConfigError
from pipeline.ingest.normalize import text_hash
from pipeline.io import read_json, read_parquet, write_parquet
from pipeline.quality import run as quality_run
from pipeline.quality.decontaminate import Decontaminator, build_index, index_dir, words
from pipeline.quality.run import quality_report, render_quality_report, run_quality_shard, scores_path

QUESTION = "Which gas do green plants absorb from the atmosphere during photosynthesis in order to build sugars?"
ITEMS = [
    {"id": "sci-001", "question": QUESTION, "choices": ["Oxygen", "Carbon dioxide", "Nitrogen", "Hydrogen"],
     "answer": "Carbon dioxide"},
    {"id": "sci-002", "question": "What is the name of the boundary between the Earth's crust and the mantle, first "
     "described by a Croatian seismologist in 1909?", "answer": "The Mohorovicic discontinuity"},
    {"id": "sci-003", "question": "Which planet?", "answer": "Mars"},            # 3 words: too short to match
]
# The planted copy differs in case, punctuation and spacing, and continues with the first choices: 15+ words.
PLANTED = "WHICH gas do green plants absorb from the atmosphere -- during photosynthesis, in order to build  sugars?"
# 12 words of the question, one short of a 13-gram: a neighbour that must stay.
NEAR_MISS = "which gas do green plants absorb from the atmosphere during photosynthesis in"

# Gopher quality without the alpha-words rule (docstrings are full of `names()` and fail it): the 50-word minimum
# stays, so a planted paragraph alone would fail it.
CHAINS = [{"domain": "*", "filters": ["gopher_quality"],
           "overrides": {"gopher_quality": {"min_alpha_words_ratio": 0}}}]


def _shard(rdir: Path, shard: str, docs: list[tuple[str, str]]) -> None:
    cols = {"doc_id": [f"{shard}-{i}" for i in range(len(docs))], "domain": [d for d, _ in docs],
            "source": ["test"] * len(docs), "text": [t for _, t in docs], "n_chars": [len(t) for _, t in docs],
            "text_hash": [text_hash(t) for _, t in docs], "meta": ["{}"] * len(docs), "origin": ["t"] * len(docs)}
    write_parquet(pa.table(cols), rdir / "exact_dedup" / f"{shard}.parquet")


def _insert(text: str, extra: str) -> str:
    """``extra`` as a paragraph of its own in the middle of ``text``."""
    paras = text.split("\n\n")
    mid = max(1, len(paras) // 2)
    return "\n\n".join([*paras[:mid], extra, *paras[mid:]])


def _setup(tmp: Path, items: list[dict] = ITEMS, **dc) -> tuple:
    """(quality config, run folder, eval file, the planted document): a prose shard of 5 (document 1 planted,
    document 3 the near miss) and a books shard of 3 (document 1 planted in a long text, document 2 planted alone)."""
    evals = write_jsonl(tmp / "evals" / "science_qa.jsonl", items)
    q = config_from_dict({"quality": {"decontamination": {"paths": [str(evals)], **dc}, "chains": CHAINS}}).quality
    prose = [r["text"] for r in prose_records(5)]
    planted = _insert(prose[1], PLANTED)
    docs = [("prose", prose[0]), ("prose", planted), ("prose", prose[2]),
            ("prose", _insert(prose[3], NEAR_MISS + " and a new ending of this sentence.")), ("prose", prose[4])]
    rdir = tmp / "run"
    _shard(rdir, "prose-00000", docs)
    _shard(rdir, "books-00000", [("books", prose[2] + "\n\n" + prose[4]),
                                 ("books", _insert(prose[0], "the Mohorovicic discontinuity. What is the name of the "
                                                   "boundary between the Earth's crust and the mantle")),
                                 ("books", PLANTED)])
    return q, rdir, evals, planted


def test_words_normalisation_and_cjk_characters():
    assert words("Hello, World!  Café  3.14 and 1,000_000") == ["hello", "world", "cafe", "0", "0", "and", "0", "0",
                                                               "0"]
    ascii_text = "X-ray: 3.14, don't_stop 42abc a1b2 -- [see](http://x.org/a_b)"
    assert words(ascii_text) == ["x", "ray", "0", "0", "don", "t", "stop", "0abc", "a0b0", "see", "http", "x", "org",
                                 "a", "b"]
    assert words(ascii_text + " é") == [*words(ascii_text), "e"]          # the byte path = the Unicode path
    assert words("東京は日本の首都です。Tokyo") == ["東", "京", "は", "日", "本", "の", "首", "都", "で", "す",
                                                  "tokyo"]


def test_planted_item_is_removed_neighbours_kept_and_audit_names_it(tmp_path):
    q, rdir, _, planted = _setup(tmp_path)
    manifest = build_index(q.decontamination, rdir)
    assert manifest["items"] == 2 and manifest["files"][0]["too_short"] == 1 and manifest["files"][0]["items"] == 3
    stats = run_quality_shard(q, rdir, "prose-00000")
    assert stats["in_docs"] == 5 and stats["kept_docs"] == 4
    assert stats["removed"] == {"decontaminated": {"docs": 1, "bytes": len(planted.encode()), "chars": len(planted),
                                                   "tokens": stats["removed"]["decontaminated"]["tokens"]}}
    kept = read_parquet(rdir / "quality" / "prose-00000.parquet").column("doc_id").to_pylist()
    assert kept == ["prose-00000-0", "prose-00000-2", "prose-00000-3", "prose-00000-4"]   # the near miss stays
    audit = read_parquet(rdir / "removed" / "quality" / "decontaminated" / "prose-00000.parquet").to_pylist()
    assert len(audit) == 1
    row = audit[0]
    assert (row["doc_id"], row["reason"], row["decont_set"], row["decont_item"]) == \
        ("prose-00000-1", "decontaminated", "science_qa.jsonl", "sci-001")
    assert row["decont_ngram"] == "which gas do green plants absorb from the atmosphere during photosynthesis in order"
    assert row["detail"] == f"eval item science_qa.jsonl:sci-001 shares '{row['decont_ngram']}'"
    scores = read_parquet(scores_path(rdir, "prose-00000"))
    assert scores.column("q_reason").to_pylist() == ["", "decontaminated", "", "", ""]
    # the books shard: the planted paragraph alone (16 words) would fail Gopher's 50 words; eval text outranks it
    books = run_quality_shard(q, rdir, "books-00000")
    assert books["removed"] == {"decontaminated": books["removed"]["decontaminated"]}
    assert books["removed"]["decontaminated"]["docs"] == 2 and books["kept_docs"] == 1
    audit = read_parquet(rdir / "removed" / "quality" / "decontaminated" / "books-00000.parquet").to_pylist()
    assert sorted((r["doc_id"], r["decont_item"]) for r in audit) == [("books-00000-1", "sci-002"),
                                                                      ("books-00000-2", "sci-001")]
    report = quality_report(rdir)
    assert {d: r["rules"]["decontaminated"]["docs"] for d, r in report.items()} == {"prose": 1, "books": 2}
    assert "decontaminated" in render_quality_report(report)
    assert stats["decontamination"]["items"] == 2 and stats["decontamination"]["n"] == 13


def test_reruns_are_byte_identical_and_a_changed_eval_file_reruns(tmp_path, monkeypatch):
    q, rdir, evals, _ = _setup(tmp_path)
    trees = []
    for _ in range(2):              # the second time from scratch: every output deleted
        for out in ("decontamination", "quality", "removed", "stats"):
            shutil.rmtree(rdir / out, ignore_errors=True)
        build_index(q.decontamination, rdir)
        run_quality_shard(q, rdir, "prose-00000")
        trees.append({str(p.relative_to(rdir)): hashlib.sha256(p.read_bytes()).hexdigest()
                      for p in sorted(rdir.rglob("*")) if p.is_file() and "exact_dedup" not in p.parts})
    assert trees[0] == trees[1] and "decontamination/ngrams.npy" in trees[0]
    # a pool of 2 workers, each mapping the index, writes the same files
    monkeypatch.setattr(quality_run, "PARALLEL_MIN_BYTES", 0)
    for out in ("quality", "removed", "stats"):
        shutil.rmtree(rdir / out)
    run_quality_shard(dataclasses.replace(q, workers=2), rdir, "prose-00000")
    assert {str(p.relative_to(rdir)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(rdir.rglob("*")) if p.is_file() and "exact_dedup" not in p.parts} == trees[0]
    mtime = (index_dir(rdir) / "ngrams.npy").stat().st_mtime_ns
    assert build_index(q.decontamination, rdir)["items"] == 2                 # same files: kept as is
    assert (index_dir(rdir) / "ngrams.npy").stat().st_mtime_ns == mtime
    write_jsonl(evals, ITEMS[1:])                                             # sci-001 withdrawn
    build_index(q.decontamination, rdir)
    stats = run_quality_shard(q, rdir, "prose-00000")                        # new index digest: recomputed
    assert stats["kept_docs"] == 5 and stats["removed"] == {}


def test_text_files_and_chinese_items(tmp_path):
    (tmp_path / "zh.txt").write_text("\n床前明月光，疑是地上霜。举头望明月，低头思故乡。\n", encoding="utf-8")
    q = config_from_dict({"quality": {"decontamination": {"paths": [str(tmp_path / "zh.txt")], "n": 8}}}).quality
    build_index(q.decontamination, tmp_path)
    dec = Decontaminator(index_dir(tmp_path), 8)
    hit = dec.first_hit("李白的《静夜思》写道：“床前明月光，疑是地上霜”，人人会背。")
    assert hit == {"decont_set": "zh.txt", "decont_item": "2", "decont_ngram": "床前明月光疑是地"}
    assert dec.first_hit("床前明月光，疑是") is None                             # 7 characters: one short
    assert dec.first_hit("明月光，疑是地上霜")["decont_ngram"] == "明月光疑是地上霜"             # 8: enough


def test_config_errors_name_the_field_or_file(tmp_path):
    with pytest.raises(ConfigError, match=r"quality\.decontamination\.n: must be >= 5"):
        config_from_dict({"quality": {"decontamination": {"n": 2}}})
    with pytest.raises(ConfigError, match=r"quality\.decontamination\.paths\[0\]: expected a local \.jsonl"):
        config_from_dict({"quality": {"decontamination": {"paths": ["evals.csv"]}}})
    q = config_from_dict({"quality": {"decontamination": {"paths": [str(tmp_path / "missing.jsonl")]}}}).quality
    with pytest.raises(ConfigError, match=r"paths\[0\]: evaluation file .*missing\.jsonl does not exist"):
        build_index(q.decontamination, tmp_path)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"id": "x1", "question": QUESTION}) + "\n" + json.dumps({"question": "no id"}) + "\n")
    q = config_from_dict({"quality": {"decontamination": {"paths": [str(bad)]}}}).quality
    with pytest.raises(ConfigError, match=r"bad\.jsonl:2: item has no 'id'"):
        build_index(q.decontamination, tmp_path)
    q, rdir, _, _ = _setup(tmp_path / "noindex")
    with pytest.raises(ConfigError, match="no index at .*decontamination; the plan step builds it"):
        run_quality_shard(q, rdir, "prose-00000")


def test_plan_step_builds_the_index_from_paths_relative_to_the_config(tmp_path):
    from pipeline.tasks.corpus import prepare_run

    write_jsonl(tmp_path / "evals" / "science_qa.jsonl", ITEMS)
    cfg_path = tiny_config(tmp_path, quality={"decontamination": {"paths": ["evals/science_qa.jsonl"]}})
    cfg = load_config(cfg_path)
    assert cfg.quality.decontamination.paths == [str(tmp_path / "evals" / "science_qa.jsonl")]
    specs = prepare_run(cfg, "decont")
    manifest = read_json(Path(specs[0]["run_dir"]) / "decontamination" / "manifest.json")
    assert manifest["items"] == 2 and manifest["settings"]["n"] == 13


def test_boilerplate_shared_by_items_can_be_left_out(tmp_path):
    """With max_items_per_ngram 1, a 13-gram two items share (a licence line) is left out of the index: a document
    that only carries that line stays, while one quoting an item's own text is still caught."""
    licence = "Licensed under the Apache License Version 2.0 you may not use this file except in compliance"
    items = [{"id": "a", "text": f"{licence}. {QUESTION}"},
             {"id": "b", "text": f"{licence}. The mantle lies between the crust and the outer core of the Earth."}]
    evals = write_jsonl(tmp_path / "evals" / "refs.jsonl", items)
    for limit, licence_hit in ((0, True), (1, False)):
        dc = config_from_dict({"quality": {"decontamination": {"paths": [str(evals)],
                                                               "max_items_per_ngram": limit}}}).quality.decontamination
        rdir = tmp_path / f"run{limit}"
        manifest = build_index(dc, rdir)
        index = Decontaminator(index_dir(rdir), dc.n)
        assert (index.first_hit(f"Header. {licence}. Other words follow here.") is not None) is licence_hit
        assert index.first_hit(f"Quoted: {PLANTED}")["decont_item"] == "a"
        assert ("common_ngrams_left_out" in manifest) is bool(limit)
    assert manifest["common_ngrams_left_out"] == len(words(licence)) - 13 + 1
