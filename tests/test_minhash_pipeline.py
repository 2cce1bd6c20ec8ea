"""The four MinHash stages on real text: exact clusters, survivors, accounting, manifest checks, partitions."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import pipeline.dedup.minhash as minhash
from pipeline.dedup.minhash import (
    REASON_NEAR_DUP,
    MinhashConfig,
    MinhashError,
    buckets,
    build_manifest,
    clusters,
    run_band,
    run_clusters,
    run_minhash,
    run_removal_shard,
    run_signatures_shard,
)
from pipeline.dedup.minhash.clusters import band_edges, checked_pairs, components
from pipeline.dedup.minhash.layout import decisions_path, output_path, report_path
from pipeline.io import read_json, sha256_file, write_marker, write_parquet


def real_words() -> list[str]:
    """The Python documentation topics shipped with CPython (pydoc_data): ~100k words of real English."""
    from pydoc_data.topics import topics

    return " ".join(topics[k] for k in sorted(topics)).split()


def write_shard(rdir: Path, shard: str, docs: list[dict], stage: str = "exact_dedup", extra: dict | None = None):
    """An input shard with the ingest schema (docs: id, text, optional source/domain)."""
    domain = shard.rsplit("-", 1)[0]
    cols = {"doc_id": [d["id"] for d in docs], "domain": [d.get("domain", domain) for d in docs],
            "source": [d.get("source", "test") for d in docs],
            "text": pa.array([d["text"] for d in docs], pa.large_string()),
            "n_chars": [len(d["text"]) for d in docs],
            "text_hash": [hashlib.sha256(d["text"].encode()).hexdigest() for d in docs],
            "meta": ["{}"] * len(docs), "origin": [f"test:{i}" for i in range(len(docs))]}
    schema = pa.schema([("doc_id", pa.string()), ("domain", pa.string()), ("source", pa.string()),
                        ("text", pa.large_string()), ("n_chars", pa.int64()), ("text_hash", pa.string()),
                        ("meta", pa.string()), ("origin", pa.string())])
    table = pa.table(cols, schema=schema)
    for name, values in (extra or {}).items():
        table = table.append_column(name, pa.array(values))
    path = rdir / stage / f"{shard}.parquet"
    write_parquet(table, path)
    write_marker(path)
    return shard


def slices_run(rdir: Path) -> tuple[list[str], dict]:
    """Overlapping slices of one real text: two near-duplicate families and unrelated slices, in two shards.

    Family A: 1000-word windows starting 40 words apart (adjacent pairs share 960/1000 words, Jaccard ≈ 0.92).
    Family B: windows of another region, 30 apart.  Singletons: windows far from everything else.
    """
    w = real_words()
    win = lambda start, n=1000: " ".join(w[start:start + n])  # noqa: E731
    a = [{"id": f"A{i}", "text": win(10_000 + 40 * i)} for i in range(3)]
    b = [{"id": f"B{i}", "text": win(30_000 + 30 * i, 800 + 5 * i)} for i in range(2)]
    singles = [{"id": f"S{i}", "text": win(50_000 + 3_000 * i)} for i in range(5)]
    s1 = write_shard(rdir, "web-00000", [a[0], singles[0], b[0], singles[1], a[2]])
    s2 = write_shard(rdir, "web-00001", [singles[2], a[1], singles[3], b[1], singles[4]])
    texts = {d["id"]: d["text"] for d in a + b + singles}
    return [s1, s2], texts


def stage1_run(rdir: Path, work: Path) -> tuple[list[str], dict, MinhashConfig, list[dict]]:
    """:func:`slices_run` with MinHash stage 1 done (signatures of every shard, the manifest): shards, texts,
    config and the band specs."""
    shards, texts = slices_run(rdir)
    cfg = MinhashConfig()
    for s in shards:
        run_signatures_shard(rdir, s, cfg)
    return shards, texts, cfg, build_manifest(rdir, shards, cfg, work)


def removed(rdir: Path, shards: list[str]) -> dict[str, dict]:
    out = {}
    for s in shards:
        for r in pq.read_table(decisions_path(rdir, s)).to_pylist():
            out[r["doc_id"]] = r
    return out


def test_overlapping_slices_give_exact_clusters(tmp_path):
    rdir = tmp_path / "runs" / "r1"
    shards, texts = slices_run(rdir)
    report = run_minhash(rdir, shards, MinhashConfig(), tmp_path)
    gone = removed(rdir, shards)
    longest_a = max(["A0", "A1", "A2"], key=lambda i: (len(texts[i]), [-ord(c) for c in i]))
    longest_b = max(["B0", "B1"], key=lambda i: len(texts[i]))
    assert set(gone) == ({"A0", "A1", "A2"} - {longest_a}) | ({"B0", "B1"} - {longest_b})
    assert {r["kept_doc_id"] for k, r in gone.items() if k.startswith("A")} == {longest_a}
    assert {r["reason"] for r in gone.values()} == {REASON_NEAR_DUP}
    assert all(r["similarity"] >= 0.8 for r in gone.values())
    assert report["clusters"] == 2 and report["cluster_sizes"] == {"2": 1, "3": 1}
    assert report["per_domain"]["web"]["in_docs"] == 10 and report["per_domain"]["web"]["kept_docs"] == 7
    # stage-4 output: input columns and order, minus the removed rows; stats account for every document
    for s in shards:
        src = pq.read_table(rdir / "exact_dedup" / f"{s}.parquet")
        out = pq.read_table(output_path(rdir, s))
        assert out.schema == src.schema
        assert out.column("doc_id").to_pylist() == [d for d in src.column("doc_id").to_pylist() if d not in gone]
        st = read_json(rdir / "stats" / "minhash" / f"{s}.json")
        assert st["in_docs"] == src.num_rows == st["kept_docs"] + sum(v["docs"] for v in st["removed"].values())
    ex = report["examples"]
    assert len(ex) == 2 and ex[0]["removed_count"] == 2 and ex[0]["differing_spans"]
    assert json.loads(report_path(rdir).read_text())["clusters"] == 2


def test_report_reads_only_the_example_rows(tmp_path, monkeypatch):
    """The report's examples come from stage 3's selection: it opens no decisions file and reads two rows per
    example, so its cost is one small JSON per shard whatever the number of removed documents."""
    import pipeline.dedup.minhash.report as report_mod

    rdir = tmp_path / "runs" / "r1"
    shards, texts = slices_run(rdir)
    report = run_minhash(rdir, shards, MinhashConfig(), tmp_path)
    chosen = read_json(rdir / "minhash" / "clusters" / "summary.json")["examples"]
    assert [(c["removed_count"], len(c["removed"])) for c in chosen] == [(2, 2), (1, 1)]
    for s in shards:
        decisions_path(rdir, s).unlink()
    calls = []
    real = report_mod.read_rows
    monkeypatch.setattr(report_mod, "read_rows", lambda path, rows, cols: calls.append(len(rows)) or
                        real(path, rows, cols))
    again = minhash.write_report(rdir, MinhashConfig())
    assert again == report and sum(calls) == 4 and len(calls) <= len(shards)
    ex = again["examples"][0]
    assert ex["differing_spans"] and texts[ex["kept"]] and ex["compared"] == ex["removed"][0]


def test_rerun_is_byte_identical_and_skips(tmp_path):
    outs = []
    for name in ("r1", "r2"):
        rdir = tmp_path / "runs" / name
        shards, _ = slices_run(rdir)
        run_minhash(rdir, shards, MinhashConfig(), tmp_path)
        files = sorted(p for p in (rdir / "minhash").rglob("*") if p.is_file() and p.suffix in (".parquet", ".arrow"))
        outs.append({str(p.relative_to(rdir)): sha256_file(p) for p in files})
    assert outs[0] == outs[1] and len(outs[0]) >= 2 + 2 + 14 + 1
    rdir = tmp_path / "runs" / "r1"
    before = (rdir / "minhash" / "web-00000.parquet").stat().st_mtime_ns
    run_minhash(rdir, ["web-00000", "web-00001"], MinhashConfig(), tmp_path)
    assert (rdir / "minhash" / "web-00000.parquet").stat().st_mtime_ns == before


@pytest.mark.parametrize("order,expect", [
    (["score", "longest"], "lo"),            # highest score wins although shorter
    (["longest"], "long"),
    (["shortest"], "lo"),
    (["source_priority", "longest"], "mid"),
    (["first"], "long"),
    (["doc_id"], "lo"),
])
def test_survivor_rule_is_configurable_and_deterministic(tmp_path, order, expect):
    w = real_words()
    base = w[5_000:6_000]
    docs = {"long": " ".join(base + w[9_000:9_030]), "mid": " ".join(base + w[9_000:9_010]), "lo": " ".join(base)}
    kept = set()
    for attempt in range(2):                 # row order inside the shard must not matter (except for "first")
        names = ["long", "mid", "lo"] if attempt == 0 or order == ["first"] else ["lo", "long", "mid"]
        rdir = tmp_path / f"{'-'.join(order)}-{attempt}"
        write_shard(rdir, "web-00000", [{"id": n, "text": docs[n], "source": {"mid": "wiki"}.get(n, "crawl")}
                                        for n in names],
                    extra={"quality_score": [{"lo": 0.9, "mid": 0.5, "long": 0.1}[n] for n in names]})
        cfg = MinhashConfig(survivor_order=order, source_priority=["wiki"], score_column="quality_score")
        run_minhash(rdir, ["web-00000"], cfg, tmp_path)
        kept.update(pq.read_table(output_path(rdir, "web-00000")).column("doc_id").to_pylist())
    assert kept == {expect}


def test_jaccard_check_rejects_lsh_false_positives(tmp_path):
    w = real_words()
    base = w[20_000:21_000]
    other = base[:600] + w[40_000:40_400]    # shares 600 of 1000 words: Jaccard ≈ 0.42
    docs = [{"id": "x", "text": " ".join(base)}, {"id": "y", "text": " ".join(other)}]
    cfg = MinhashConfig(bands=56, rows=2)    # P(0.42) = 1 − (1 − 0.42²)^56 ≈ 1: surely a candidate
    rdir = tmp_path / "checked"
    write_shard(rdir, "web-00000", docs)
    rep = run_minhash(rdir, ["web-00000"], cfg, tmp_path)
    assert rep["false_positives_rejected"] == 1 and rep["removed"][REASON_NEAR_DUP] == 0
    edge = checked_pairs(rdir, cfg).to_pylist()
    assert len(edge) == 1 and edge[0]["method"] == "exact" and not edge[0]["passed"]
    assert 0.35 < edge[0]["similarity"] < 0.5
    rdir = tmp_path / "unchecked"
    write_shard(rdir, "web-00000", docs)
    rep = run_minhash(rdir, ["web-00000"], MinhashConfig(bands=56, rows=2, jaccard_check=False), tmp_path)
    assert rep["removed"][REASON_NEAR_DUP] == 1


def decisions_of(rdir: Path, shards: list[str]) -> dict:
    return {s: pq.read_table(decisions_path(rdir, s)).to_pylist() for s in shards} | \
        {f"kept:{s}": sha256_file(output_path(rdir, s)) for s in shards}


def test_tasks_and_memory_change_no_decision(tmp_path, monkeypatch):
    """Stage 3 cut into 3 tasks per step, each holding one slot of pairs and sets at a time, with the components
    left to the rounds: the same decisions, outputs and report as one task holding everything."""
    from pipeline.dedup.minhash.clusters import check, gather, runs

    one = tmp_path / "one"
    shards, _ = slices_run(one)
    report = run_minhash(one, shards, MinhashConfig(), tmp_path)
    assert read_json(clusters.plan_path(one))["tasks"] == 1
    many = tmp_path / "many"
    slices_run(many)
    monkeypatch.setattr(clusters, "EDGES_PER_TASK", 1)
    monkeypatch.setattr(check, "BYTES_PER_PAIR", 1 << 40)            # every slot a range of its own
    monkeypatch.setattr(gather, "BYTES_PER_REQUEST", 1 << 40)        # and every slot of requests
    monkeypatch.setattr(components, "BYTES_PER_RESIDUAL", 1 << 40)   # only an empty residual fits: rounds run
    again = run_minhash(many, shards, MinhashConfig(memory_mb=16), tmp_path, parallelism=3)
    summary = read_json(many / "minhash" / "clusters" / "summary.json")
    assert (summary["tasks"], summary["residual_edges"]) == (3, 0) and summary["rounds"] >= 1
    checked = [read_json(runs.marker_file(many, "check", t, 3))["stats"] for t in range(3)]
    assert sum(c["ranges"] for c in checked) >= sum(c["distinct_pairs"] for c in checked) > 3
    gathered = [read_json(runs.marker_file(many, "gather", t, 3))["stats"] for t in range(3)]
    assert sum(g["ranges"] for g in gathered) > 3 and sum(g["docs"] for g in gathered) == 10 - 5
    assert decisions_of(one, shards) == decisions_of(many, shards)
    assert {k: v for k, v in again.items() if k not in ("member_pairs", "clustering")} == \
        {k: v for k, v in report.items() if k not in ("member_pairs", "clustering")}


def test_stage4_refuses_changed_input(tmp_path):
    rdir = tmp_path / "runs" / "r1"
    shards, texts = slices_run(rdir)
    cfg = MinhashConfig()
    for s in shards:
        run_signatures_shard(rdir, s, cfg)
    for spec in build_manifest(rdir, shards, cfg, tmp_path):
        run_band(rdir, spec["band"], cfg)
    run_clusters(rdir, cfg)
    t = pq.read_table(rdir / "exact_dedup" / "web-00001.parquet")
    write_parquet(t.slice(1), rdir / "exact_dedup" / "web-00001.parquet")      # one row fewer
    run_removal_shard(rdir, "web-00000", cfg)
    with pytest.raises(MinhashError, match=r"web-00001.parquet: sha256 .* differs from the stage-1 manifest"):
        run_removal_shard(rdir, "web-00001", cfg)
    with pytest.raises(MinhashError, match="not in the stage-1 manifest"):
        run_removal_shard(rdir, "web-00002", cfg)
    with pytest.raises(MinhashError, match="config changed after stage 1"):
        run_removal_shard(rdir, "web-00000", MinhashConfig(threshold=0.9))


def test_partitioned_bands_and_clusters_equal_in_memory(tmp_path, monkeypatch):
    rdir = tmp_path / "runs" / "r1"
    shards, _, cfg, _ = stage1_run(rdir, tmp_path)
    whole = {}
    for b in range(cfg.bands):
        run_band(rdir, b, cfg)
        whole[b] = band_edges(rdir, cfg, b)
    monkeypatch.setattr(buckets, "_BYTES_PER_DOC", 1 << 30)       # 10 docs "need" 10 GB of 1 GB: 16 partitions
    reads: list[tuple[str, int]] = []
    read_keys = buckets._read_keys
    monkeypatch.setattr(buckets, "_read_keys", lambda r, e, b: reads.append((e["shard"], b)) or read_keys(r, e, b))
    from pipeline.dedup.minhash.clusters import runs

    for b in range(cfg.bands):
        runs.marker_file(rdir, "bands", b, cfg.bands).unlink()
        stats = run_band(rdir, b, cfg)
        assert stats["partitions"] == 16
        assert sorted(reads) == sorted((s, b) for s in shards)     # each key file read once, not once per partition
        assert not (runs.step_dir(rdir, "bands") / f".work-{b:03d}").exists()    # spill files removed
        reads.clear()
        assert sorted(band_edges(rdir, cfg, b).to_pylist(), key=str) == sorted(whole[b].to_pylist(), key=str)


def test_union_find_matches_reference_components():
    rng = random.Random(3)
    for n in (1, 10, 200):
        edges = [(rng.randrange(n), rng.randrange(n)) for _ in range(n)]
        parent = components.union(np.arange(n), np.array([e[0] for e in edges], np.int64),
                                np.array([e[1] for e in edges], np.int64))
        ref = list(range(n))

        def find(x, ref=ref):
            while ref[x] != x:
                x = ref[x]
            return x

        for u, v in edges:
            ru, rv = find(u), find(v)
            ref[max(ru, rv)] = min(ru, rv)
        assert parent.tolist() == [find(x) for x in range(n)]       # root = smallest member, fully compressed


def test_missing_stage_outputs_fail_clearly(tmp_path):
    rdir = tmp_path / "runs" / "r1"
    with pytest.raises(MinhashError, match="input shard of minhash stage 1 is missing"):
        run_signatures_shard(rdir, "web-00000", MinhashConfig())
    shards, _ = slices_run(rdir)
    with pytest.raises(MinhashError, match="missing or incomplete"):
        build_manifest(rdir, shards, MinhashConfig(), tmp_path)
    run_signatures_shard(rdir, shards[0], MinhashConfig())
    run_signatures_shard(rdir, shards[1], MinhashConfig())
    build_manifest(rdir, shards, MinhashConfig(), tmp_path)
    with pytest.raises(MinhashError, match="clustering step 'bands' has not finished"):
        run_clusters(rdir, MinhashConfig())


def test_read_rows_reads_only_needed_row_groups_in_order(tmp_path):
    from pipeline.dedup.minhash.layout import read_rows

    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"x": np.arange(5000), "y": [str(i) for i in range(5000)]}), path, row_group_size=700)
    rows = np.array([4999, 3, 701, 700, 3, 2100])
    t = read_rows(path, rows, ["y"])
    assert t.column("y").to_pylist() == [str(r) for r in rows]
    with pytest.raises(MinhashError, match="rows up to 5000"):
        read_rows(path, np.array([5000]), ["y"])


def test_empty_shard_and_unshingleable_docs_are_accounted(tmp_path):
    rdir = tmp_path / "runs" / "r1"
    w = real_words()
    text = " ".join(w[:600])
    write_shard(rdir, "web-00000", [])
    write_shard(rdir, "web-00001", [{"id": "p1", "text": "!!! ..."}, {"id": "p2", "text": "--- ???"},
                                    {"id": "a", "text": text}, {"id": "b", "text": text + " one more"}])
    rep = run_minhash(rdir, ["web-00000", "web-00001"], MinhashConfig(), tmp_path)
    assert rep["removed"][REASON_NEAR_DUP] == 1                   # a/b; p1, p2 have no shingles: never candidates
    assert read_json(rdir / "stats" / "minhash" / "web-00000.json")["in_docs"] == 0
    st = read_json(rdir / "stats" / "minhash" / "web-00001.json")
    assert (st["in_docs"], st["kept_docs"], st["removed"][REASON_NEAR_DUP]["docs"]) == (4, 3, 1)
    assert pq.read_table(output_path(rdir, "web-00001")).column("doc_id").to_pylist() == ["p1", "p2", "b"]


def test_char_class_table_is_pythons_re():
    import re

    from pipeline.dedup.minhash.shingles import char_classes

    table = char_classes()
    rng = random.Random(0)
    for cp in [0, 9, 32, 48, 95, 0xA0, 0x3000, 0x4E00, 0x0663, 0xFF10, 0x1F600, 0xD800, 0x10FFFF] + \
            [rng.randrange(0x110000) for _ in range(3000)]:
        ch = chr(cp)
        want = (bool(re.match(r"[^\W_]", ch)) * 1) | (bool(re.match(r"\d", ch)) * 2) | (bool(re.match(r"\s", ch)) * 4)
        assert table[cp] == want, hex(cp)


def test_disabled_stages_pass_documents_through(tmp_path):
    rdir = tmp_path / "runs" / "r1"
    shards, texts = slices_run(rdir)
    cfg = MinhashConfig(enabled=False)
    report = run_minhash(rdir, shards, cfg, tmp_path)
    assert report == {"enabled": False} and not (rdir / "minhash" / "signatures").exists()
    # the task path (corpus DAG, mindloom corpus) asks the plan for its task count before the finish step: none
    # was planned, so it is the one no-op task (this raised "plan.json is missing" and stopped the chain)
    from pipeline.dedup.minhash import clusters

    assert clusters.planned_tasks(rdir, cfg) == 1
    assert clusters.run_step("finish", {"run_dir": str(rdir), "task": 0, "of": 1}, cfg)["skipped"]
    for s in shards:
        assert pq.read_table(output_path(rdir, s)).equals(pq.read_table(rdir / "exact_dedup" / f"{s}.parquet"))
        st = read_json(rdir / "stats" / "minhash" / f"{s}.json")
        assert st["in_docs"] == st["kept_docs"] == 5 and st["removed"] == {}


def test_a_band_task_names_a_signature_file_that_lost_its_band_or_rows(tmp_path):
    """The band reader goes through ``ParquetFile``, which leaves out a missing column without a word: a signature
    file rewritten without the band's key column, or with a row fewer, fails the band task naming the file."""
    from pipeline.dedup.minhash.layout import band_column, signature_path

    rdir = tmp_path / "runs" / "r1"
    shards, _, cfg, specs = stage1_run(rdir, tmp_path)
    path = signature_path(rdir, shards[1])
    full = pq.read_table(path)
    pq.write_table(full.drop_columns([band_column(0)]), path)
    with pytest.raises(MinhashError, match=rf"{path.name}: no column \['{band_column(0)}'\]"):
        run_band(rdir, 0, cfg)
    pq.write_table(full.slice(1), path)
    with pytest.raises(MinhashError, match=rf"{path.name}: 4 rows, manifest says 5"):
        run_band(rdir, 0, cfg)
