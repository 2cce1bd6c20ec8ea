"""Incremental dedup: a refresh removes exactly the documents that duplicate what earlier releases shipped."""

from __future__ import annotations

import json

import pyarrow.compute as pc
import pyarrow.parquet as pq
from test_minhash_pipeline import real_words, removed, write_shard

from pipeline.dedup.minhash import (
    REASON_NEAR_DUP,
    REASON_PREVIOUS,
    DedupIndex,
    MinhashConfig,
    add_release,
    run_minhash,
)
from pipeline.dedup.minhash.layout import output_path


def _win(w, start, n=900):
    return " ".join(w[start:start + n])


def test_refresh_removes_exactly_the_duplicates_of_earlier_releases(tmp_path):
    w = real_words()
    cfg = MinhashConfig(use_index=True)
    data_root = tmp_path / "data"
    # release r1: six distinct real documents in two shards (one of them shipped from a later stage)
    r1 = data_root / "runs" / "r1"
    old = {f"D{i}": _win(w, 2_000 + 4_000 * i) for i in range(6)}
    write_shard(r1, "web-00000", [{"id": k, "text": old[k]} for k in ("D0", "D1", "D2")])
    write_shard(r1, "books-00000", [{"id": k, "text": old[k]} for k in ("D3", "D4", "D5")])
    rep1 = run_minhash(r1, ["web-00000", "books-00000"], cfg, data_root, release="r1")
    assert rep1["removed"] == {REASON_NEAR_DUP: 0, REASON_PREVIOUS: 0}
    info = add_release(r1, cfg, data_root, "r1")
    assert info["docs"] == 6 and info["releases"] == 1

    # refresh r2: new docs, near/exact copies of r1 docs, a new near-duplicate pair, and a doc that is only
    # partly similar to an old one (Jaccard ≈ 0.5: may be an LSH candidate, must be kept)
    r2 = data_root / "runs" / "r2"
    new = {"N0": _win(w, 30_000), "N1": _win(w, 34_000),
           "E_near_D2": " ".join(w[2_000 + 8_000 + 30:2_000 + 8_000 + 930]),
           "E_copy_D4": old["D4"],
           "E_near_D5": " ".join(w[22_000 - 20:22_000 + 880]),
           "P0": _win(w, 40_000), "P1": " ".join(w[40_025:40_925]),
           "F_half_D0": " ".join(w[2_000:2_450] + w[50_000:50_450])}
    write_shard(r2, "web-00000", [{"id": k, "text": new[k]} for k in ("N0", "E_near_D2", "P0", "F_half_D0")])
    write_shard(r2, "books-00000", [{"id": k, "text": new[k]} for k in ("E_copy_D4", "N1", "P1", "E_near_D5")])
    rep2 = run_minhash(r2, ["web-00000", "books-00000"], cfg, data_root, release="r2")
    gone = removed(r2, ["web-00000", "books-00000"])
    prev = {k: v["kept_doc_id"] for k, v in gone.items() if v["reason"] == REASON_PREVIOUS}
    assert prev == {"E_near_D2": "r1:D2", "E_copy_D4": "r1:D4", "E_near_D5": "r1:D5"}
    pair = {k: v["kept_doc_id"] for k, v in gone.items() if v["reason"] == REASON_NEAR_DUP}
    assert len(pair) == 1 and set(pair) | set(pair.values()) == {"P0", "P1"}
    assert rep2["index"]["releases"] == ["r1"]
    assert rep2["per_domain"]["books"]["removed"][REASON_PREVIOUS]["docs"] == 2
    kept2 = {d for s in ("web-00000", "books-00000") for d in pq.read_table(output_path(r2, s)).column(0).to_pylist()}
    assert {"N0", "N1", "F_half_D0"} <= kept2
    add_release(r2, cfg, data_root, "r2")

    # a retry of r2 after its own publish compares with r1 only, so it decides exactly as before
    r2b = data_root / "runs" / "r2-retry"
    for s in ("web-00000", "books-00000"):
        write_shard(r2b, s, [{"id": d, "text": t} for d, t in zip(
            pq.read_table(r2 / "exact_dedup" / f"{s}.parquet").column("doc_id").to_pylist(),
            pq.read_table(r2 / "exact_dedup" / f"{s}.parquet").column("text").to_pylist(), strict=True)])
    rep2b = run_minhash(r2b, ["web-00000", "books-00000"], cfg, data_root, release="r2")
    assert rep2b["index"]["releases"] == ["r1"]
    assert {k: (v["reason"], v["kept_doc_id"]) for k, v in removed(r2b, ["web-00000", "books-00000"]).items()} == \
        {k: (v["reason"], v["kept_doc_id"]) for k, v in gone.items()}

    # refresh r3 sees both releases; old data is not read again (r1, r2 inputs are deleted first)
    for run in (r1, r2):
        for f in (run / "exact_dedup").glob("*.parquet"):
            f.unlink()
    survivor_p = ({"P0", "P1"} & kept2).pop()
    r3 = data_root / "runs" / "r3"
    write_shard(r3, "web-00000", [{"id": "G_near_D1", "text": " ".join(w[6_000 + 10:6_000 + 910])},
                                  {"id": "G_copy_P", "text": new[survivor_p]},
                                  {"id": "G_new", "text": _win(w, 60_000)}])
    run_minhash(r3, ["web-00000"], cfg, data_root, release="r3")
    assert {k: (v["reason"], v["kept_doc_id"]) for k, v in removed(r3, ["web-00000"]).items()} == {
        "G_near_D1": (REASON_PREVIOUS, "r1:D1"), "G_copy_P": (REASON_PREVIOUS, f"r2:{survivor_p}")}
    listing = json.loads((DedupIndex.open(data_root, cfg).root / "releases.json").read_text())
    assert [r["name"] for r in listing["releases"]] == ["r1", "r2"]


def test_index_only_holds_shipped_documents_and_matching_parameters(tmp_path):
    w = real_words()
    data_root = tmp_path / "data"
    cfg = MinhashConfig(use_index=True)
    r1 = data_root / "runs" / "r1"
    write_shard(r1, "web-00000", [{"id": "a", "text": _win(w, 1_000)}, {"id": "b", "text": _win(w, 5_000)}])
    run_minhash(r1, ["web-00000"], cfg, data_root)
    # a later stage dropped "b": only "a" shipped, so only "a" is indexed
    t = pq.read_table(output_path(r1, "web-00000"))
    (r1 / "quality").mkdir()
    pq.write_table(t.filter(pc.equal(t.column("doc_id"), "a")), r1 / "quality" / "web-00000.parquet")
    assert add_release(r1, cfg, data_root, "r1", kept_stage="quality")["docs"] == 1

    r2 = data_root / "runs" / "r2"
    write_shard(r2, "web-00000", [{"id": "a2", "text": _win(w, 1_000)}, {"id": "b2", "text": _win(w, 5_000)}])
    run_minhash(r2, ["web-00000"], cfg, data_root)
    assert {k: v["kept_doc_id"] for k, v in removed(r2, ["web-00000"]).items()} == {"a2": "r1:a"}

    # other signature parameters: the r1 index is invisible (not silently mismatched)
    r3 = data_root / "runs" / "r3"
    write_shard(r3, "web-00000", [{"id": "a3", "text": _win(w, 1_000)}])
    other = MinhashConfig(bands=16, rows=7)
    rep = run_minhash(r3, ["web-00000"], other, data_root)
    assert rep["index"]["releases"] == [] and removed(r3, ["web-00000"]) == {}
    # and use_index: false ignores a compatible index
    r4 = data_root / "runs" / "r4"
    write_shard(r4, "web-00000", [{"id": "a4", "text": _win(w, 1_000)}])
    rep = run_minhash(r4, ["web-00000"], MinhashConfig(use_index=False), data_root)
    assert rep["index"]["releases"] == [] and removed(r4, ["web-00000"]) == {}


def test_a_release_in_parts_and_key_ranges_equals_one_built_whole(tmp_path, monkeypatch):
    """The release index built as the DAG builds it, one part per batch (here one per shard) and each band's keys
    sorted in key ranges of one key each (runs of one key), holds the same band files, byte for byte, as one part
    sorted at once; its signatures and doc ids read the same through DedupIndex."""
    import numpy as np

    from pipeline.dedup.minhash import release
    from pipeline.dedup.minhash.index import index_root
    from pipeline.dedup.minhash.layout import band_column

    w = real_words()
    cfg = MinhashConfig()
    r1 = tmp_path / "runs" / "r1"
    shards = [write_shard(r1, f"web-{s:05d}", [{"id": f"D{s}{i}", "text": _win(w, 1_000 + 3_000 * (3 * s + i))}
                                              for i in range(3)]) for s in range(3)]
    run_minhash(r1, shards, cfg, tmp_path / "whole")
    whole = add_release(r1, cfg, tmp_path / "whole", "r1")
    parts = tmp_path / "parts"
    for k, s in enumerate(shards):
        release.write_release_part(r1, cfg, parts, "r1", k, len(shards), [s], kept_stage="minhash")
    monkeypatch.setattr(release, "BYTES_PER_KEY", cfg.memory_mb << 20)      # one key per run and per range
    for band in range(cfg.bands):
        got = release.merge_release_band(cfg, parts, "r1", band, len(shards))
        assert got["runs"] == got["keys"] == 9
    assert release.register_release(cfg, parts, "r1", len(shards))["docs"] == whole["docs"] == 9
    a, b = index_root(tmp_path / "whole", cfg) / "releases" / "r1", index_root(parts, cfg) / "releases" / "r1"
    for band in range(cfg.bands):
        for kind in ("keys", "ords"):
            name = f"{band_column(band)}.{kind}.npy"
            assert (a / name).read_bytes() == (b / name).read_bytes(), name
    one, many = DedupIndex(a.parent.parent, ["r1"]), DedupIndex(b.parent.parent, ["r1"])
    ords = np.array([8, 0, 4, 3, 7])
    assert np.array_equal(one.signatures(0, ords), many.signatures(0, ords))
    assert one.doc_ids(0, ords) == many.doc_ids(0, ords) == ["D22", "D00", "D11", "D10", "D21"]
