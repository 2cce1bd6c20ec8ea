"""Training documents that share runs of tokens with a held-out document (pipeline.sink.heldout_overlap).

Synthetic token ids with planted overlaps, through the real mixture plan and scatter step: a copy and a longer
document holding most of the held-out one are dropped with reason ``overlaps_heldout`` and named in the audit; a
document that shares one run (boilerplate) and an unrelated one keep their copies; the counts are exact.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pyarrow as pa
import pytest

from pipeline.io import read_json, read_parquet, write_marker, write_parquet
from pipeline.sink import heldout_overlap, mixture, scatter
from pipeline.sink.config import MixtureConfig
from pipeline.sink.validation import heldout_key

N = 13
SEED = 5


def test_runs_across_a_document_boundary_are_left_out_and_equal_runs_hash_equal():
    a = np.arange(100, 120)                                   # 20 tokens: 8 runs of 13
    b = np.concatenate([[7, 8, 9], a[:13]])                   # 16 tokens: 4 runs, the last equals a's first
    hashes, doc, start = heldout_overlap.run_hashes(np.concatenate([a, b]), [20, 16], N)
    assert doc.tolist() == [0] * 8 + [1] * 4
    assert start.tolist() == list(range(8)) + [20, 21, 22, 23]
    assert hashes[-1] == hashes[0] and len(set(hashes[:8].tolist())) == 8
    assert heldout_overlap.run_hashes(a[:12], [12], N)[0].size == 0        # shorter than n: no run


def test_run_hashes_match_each_document_hashed_alone():
    """The runs marked from the documents' bounds are those of each document hashed on its own, with empty and
    short documents among them, and for n = 1 (a document's runs end where the next one's begin)."""
    rng = np.random.default_rng(SEED)
    lengths = [0, 5, 12, 13, 14, 0, 40, 1, 27]
    tokens = rng.integers(0, 500, sum(lengths))
    for n in (1, 13):
        hashes, doc, start = heldout_overlap.run_hashes(tokens, lengths, n)
        want_h, want_d, want_s, at = [], [], [], 0
        for d, ln in enumerate(lengths):
            runs = heldout_overlap._all_runs(tokens[at:at + ln], n)
            want_h += runs.tolist()
            want_d += [d] * len(runs)
            want_s += list(range(at, at + len(runs)))
            at += ln
        assert (hashes.tolist(), doc.tolist(), start.tolist()) == (want_h, want_d, want_s), n
    assert len(want_h) == 0 + 0 + 0 + 1 + 2 + 0 + 28 + 0 + 15


def _ids(n: int) -> list[str]:
    return [f"web-{i:03d}" for i in range(n)]


def _corpus(rng) -> tuple[list[str], dict[str, np.ndarray], str]:
    """Eight documents of domain web; the one the plan will hold out (val_fraction 0, val_min_docs 1: the
    smallest held-out key) is 200 random ids, and the others are planted around it."""
    ids = _ids(8)
    held = min(ids, key=lambda d: heldout_key(SEED, "web", d))
    h = rng.integers(1000, 30000, 200)
    rest = [d for d in ids if d != held]
    docs = {held: h,
            rest[0]: np.concatenate([rng.integers(1000, 30000, 20), h]),            # a copy with a new header
            rest[1]: np.concatenate([rng.integers(1000, 30000, 1000), h[:120]]),    # holds 60 % of it
            rest[2]: np.concatenate([h[50:63], rng.integers(1000, 30000, 87)]),     # one shared run: boilerplate
            rest[3]: rng.integers(1000, 30000, 300)}                                 # unrelated
    for d in rest[4:]:
        docs[d] = rng.integers(1000, 30000, 150)
    return ids, docs, held


def _write_tokenized(rdir, ids, docs) -> str:
    shard = "web-00000"
    toks = [docs[d] for d in ids]
    offsets = np.concatenate([[0], np.cumsum([len(t) for t in toks])]).astype(np.int32)
    path = rdir / "tokenize" / f"{shard}.parquet"
    sha = write_parquet(pa.table({
        "doc_id": ids, "domain": ["web"] * len(ids), "n_tokens": pa.array([len(t) for t in toks], pa.int64()),
        "n_chars": pa.array([4 * len(t) for t in toks], pa.int64()),
        "n_bytes": pa.array([4 * len(t) for t in toks], pa.int64()),
        "text_hash": [f"h{i}" for i in range(len(ids))],
        "tokens": pa.ListArray.from_arrays(pa.array(offsets), pa.array(np.concatenate(toks).astype(np.int32)))}),
        path)
    write_marker(path, config="test", sha256=sha)
    return shard


@pytest.fixture
def planted(tmp_path):
    ids, docs, held = _corpus(np.random.default_rng(0))
    shard = _write_tokenized(tmp_path, ids, docs)
    return tmp_path, shard, ids, docs, held


def _plan_and_scatter(rdir, shard, **mc):
    mixture.plan_mixture(MixtureConfig(**{"val_fraction": 0, "val_min_docs": 1, **mc}), rdir, [shard], SEED)
    part = scatter.run_scatter_part(rdir, scatter.part_name(0, 1), [shard], seed=SEED, n_files=1, domains=["web"])
    return {**part["shards"][0], "copies": part["copies"]}          # one shard: the part's counts are its own


def test_a_copy_and_a_document_holding_most_of_a_heldout_one_are_dropped_and_named(planted):
    rdir, shard, ids, docs, held = planted
    rest = [d for d in ids if d != held]
    marker = _plan_and_scatter(rdir, shard)
    assert marker["overlaps_heldout"] == 2
    assert marker["copies"] == [len(ids) - 1 - 2] and marker["unique_docs"] == len(ids) - 1 - 2
    stats = read_json(rdir / "stats" / "overlaps_heldout" / f"{shard}.json")
    assert (stats["in_docs"], stats["kept_docs"]) == (7, 5)
    assert stats["removed"] == {"overlaps_heldout": {"docs": 2, "bytes": 4 * (220 + 1120)}}
    audit = read_parquet(rdir / "removed" / "overlaps_heldout" / f"{shard}.parquet").to_pylist()
    by = {r["doc_id"]: r for r in audit}
    assert sorted(by) == sorted([rest[0], rest[1]])
    assert {r["heldout_doc_id"] for r in audit} == {held}
    # the copy: its 208 runs include the held-out document's 188, all of them
    assert by[rest[0]]["train_share"] == round(188 / 208, 4) and by[rest[0]]["heldout_share"] == 1.0
    assert by[rest[0]]["first_run"] == docs[held][:N].tolist()
    # the long document: 108 of the held-out document's 188 runs, 108 of its own 1,108
    assert by[rest[1]]["heldout_share"] == round(108 / 188, 4) and by[rest[1]]["train_share"] == round(108 / 1108, 4)
    index = read_json(rdir / "mixture" / "plan.json")["heldout_index"]
    assert (index["n"], index["runs"], index["heldout_docs"], index["overlap"]) == (N, 188, 1, 0.5)


def test_one_shared_run_keeps_the_document_and_a_lower_share_drops_it(planted, tmp_path_factory):
    rdir, shard, ids, docs, held = planted
    rest = [d for d in ids if d != held]
    idx = heldout_overlap.OverlapIndex(_index_of(rdir, shard), N)
    hit = idx.matches(docs[rest[2]], [len(docs[rest[2]])])
    assert hit == {0: {"train_share": round(1 / 88, 4), "heldout_row": 0, "heldout_share": round(1 / 188, 4),
                       "offset": 0}}
    assert idx.matches(docs[rest[3]], [300]) == {}
    other = tmp_path_factory.mktemp("low")
    _write_tokenized(other, ids, docs)
    assert _plan_and_scatter(other, shard, heldout_overlap=0.01)["overlaps_heldout"] == 3


def _index_of(rdir, shard):
    mixture.plan_mixture(MixtureConfig(val_fraction=0, val_min_docs=1), rdir, [shard], SEED)
    return rdir / "mixture" / heldout_overlap.INDEX_DIR


def test_heldout_ngram_0_keeps_only_the_exact_text_check(planted):
    rdir, shard, ids, _, _ = planted
    marker = _plan_and_scatter(rdir, shard, heldout_ngram=0)
    assert marker["overlaps_heldout"] == 0 and marker["unique_docs"] == len(ids) - 1
    assert not (rdir / "mixture" / heldout_overlap.INDEX_DIR).exists()
    assert not (rdir / "stats" / "overlaps_heldout").exists()


def test_the_check_is_byte_identical_on_a_rerun(planted, tmp_path_factory):
    rdir, shard, ids, docs, _ = planted
    _plan_and_scatter(rdir, shard)
    again = tmp_path_factory.mktemp("again")
    _write_tokenized(again, ids, docs)
    _plan_and_scatter(again, shard)
    for rel in (*(f"mixture/{heldout_overlap.INDEX_DIR}/{a}.npy" for a in heldout_overlap.ARRAYS),
                f"mixture/{heldout_overlap.TOKENS_FILE}",
                f"removed/overlaps_heldout/{shard}.parquet", f"sink/scatter/{scatter.part_name(0, 1)}.arrow"):
        assert (rdir / rel).read_bytes() == (again / rel).read_bytes(), rel


def test_no_heldout_documents_write_an_empty_index_and_drop_nothing(planted):
    rdir, shard, ids, _, _ = planted
    marker = _plan_and_scatter(rdir, shard, val_min_docs=0)
    assert marker["overlaps_heldout"] == 0 and marker["unique_docs"] == len(ids)
    assert read_parquet(rdir / "mixture" / heldout_overlap.TOKENS_FILE).num_rows == 0
    assert read_json(rdir / "mixture" / "plan.json")["heldout_index"]["runs"] == 0


def test_a_process_maps_the_index_once_for_all_shards_of_a_plan(planted, monkeypatch):
    """A scatter task checks many shards: it maps the index once per process and plan, not once per shard."""
    rdir, shard, _, _, _ = planted
    built = []

    class Counted(heldout_overlap.OverlapIndex):
        def __init__(self, path, n):
            built.append(str(path))
            super().__init__(path, n)

    monkeypatch.setattr(heldout_overlap, "OverlapIndex", Counted)
    monkeypatch.setattr(heldout_overlap, "_LOADED", [])
    path = _index_of(rdir, shard)
    index = read_json(rdir / "mixture" / "plan.json")["heldout_index"]
    first = heldout_overlap.loaded_index(path, index)
    assert heldout_overlap.loaded_index(path, dict(index)) is first and len(built) == 1
    other = heldout_overlap.loaded_index(path, {**index, "sha256": "another plan"})
    assert other is not first and len(built) == 2
    assert scatter.scatter_shard(rdir, shard, seed=SEED, n_files=1, domains=["web"]).marker["overlaps_heldout"] == 2
    assert len(built) == 3                                  # the plan's own sha256 again: one more load, then kept
    assert scatter.scatter_shard(rdir, shard, seed=SEED, n_files=1, domains=["web"]).marker["overlaps_heldout"] == 2
    assert len(built) == 3


def test_a_document_names_the_heldout_one_it_covers_most_counting_each_run_once(tmp_path):
    """Three held-out documents A (ids 0-99), B (1000-1049) and C (2000-2099): a training document that quotes A's
    first 40 tokens twice around all of B names B (every one of its 38 runs) and counts A's 28 runs once; one that
    quotes as much of A as of C names A, the first; one with 20 tokens of B after 20 others starts its match at 20."""
    a, b, c = np.arange(100), np.arange(1000, 1050), np.arange(2000, 2100)
    held = [a, b, c]
    path = tmp_path / heldout_overlap.INDEX_DIR
    counts = heldout_overlap.build_index(path, np.concatenate(held), [len(x) for x in held], N)
    assert counts["runs"] == 88 + 38 + 88
    docs = [np.concatenate([a[:40], b, a[:40]]), np.concatenate([a[:30], c[:30], np.arange(5000, 5100)]),
            np.arange(6000, 6300), np.concatenate([np.arange(7000, 7020), b[:20]])]
    hit = heldout_overlap.OverlapIndex(path, N).matches(np.concatenate(docs), [len(d) for d in docs])
    assert hit == {0: {"train_share": round(66 / 118, 4), "heldout_row": 1, "heldout_share": 1.0, "offset": 0},
                   1: {"train_share": round(36 / 148, 4), "heldout_row": 0, "heldout_share": round(18 / 88, 4),
                       "offset": 0},
                   3: {"train_share": round(8 / 28, 4), "heldout_row": 1, "heldout_share": round(8 / 38, 4),
                       "offset": 20}}


def test_a_scatter_task_maps_the_plans_arrays_and_computes_none(planted, monkeypatch):
    """The plan computes every array a lookup reads (7.3 M runs at bench-scale's 4 GB took 2.8 CPU-s to load and
    prepare in each scatter task, a task per worker process under Celery); a task maps them read-only."""
    rdir, shard, _, _, _ = planted
    path = _index_of(rdir, shard)
    assert sorted(p.name for p in path.iterdir()) == sorted(f"{a}.npy" for a in heldout_overlap.ARRAYS)

    def no_sort(*a, **k):
        raise AssertionError("a scatter task sorted")

    monkeypatch.setattr(np, "argsort", no_sort)
    monkeypatch.setattr(np, "lexsort", no_sort)
    idx = heldout_overlap.OverlapIndex(path, N)
    for name in ("ngrams", "rank", "doc_by_rank", "doc_unique", "bitmap"):
        arr = getattr(idx, name)
        assert isinstance(arr.base, np.memmap) and not arr.flags.writeable, name
    assert len(idx.ngrams) == 188 and idx.doc_unique.tolist() == [188] and len(idx.bitmap) == (1 << 16) // 8


def test_a_plan_of_the_earlier_index_layout_is_planned_again(planted):
    """A run planned by an earlier version (one parquet file of n-grams, named by ``file``) resumes: the plan step
    writes the index folder again rather than leave the scatter tasks without one."""
    rdir, shard, _, _, _ = planted
    plan = rdir / "mixture" / "plan.json"
    _index_of(rdir, shard)
    body = read_json(plan)
    body["heldout_index"] = {k: v for k, v in body["heldout_index"].items() if k != "dir"} | {"file": "x.parquet"}
    report = read_json(plan.with_name("report.json"))
    plan.write_text(json.dumps(body))
    write_marker(plan, {"report": report})                     # a complete plan, as the earlier version left it
    shutil.rmtree(rdir / "mixture" / heldout_overlap.INDEX_DIR)
    marker = _plan_and_scatter(rdir, shard)
    assert marker["overlaps_heldout"] == 2 and (rdir / "mixture" / heldout_overlap.INDEX_DIR).is_dir()
    assert read_json(plan)["heldout_index"]["dir"] == heldout_overlap.INDEX_DIR
