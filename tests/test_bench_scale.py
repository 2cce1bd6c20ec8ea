"""The pure parts of ``benchmarks/bench_scale.py`` (issue 13): the recombined corpus is deterministic, keeps each
domain's text and has no duplicate documents; per-task attribution of sampled RSS/CPU (``scale_timeline.py``);
the targets block.

Fast and self-contained: a tiny source corpus in ``tmp_path`` made of real text (standard-library source and
docstrings, and a few lines of Tang poetry), never ``../shared``.
"""

from __future__ import annotations

import itertools
import json
import math
import sys
from pathlib import Path

import pytest
from conftest import prose_records, stdlib_records, write_jsonl

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import bench_scale  # noqa: E402
import scale_corpus  # noqa: E402
import scale_timeline  # noqa: E402

POEMS = ["床前明月光，疑是地上霜。\n举头望明月，低头思故乡。", "白日依山尽，黄河入海流。\n欲穷千里目，更上一层楼。",
         "春眠不觉晓，处处闻啼鸟。\n夜来风雨声，花落知多少。", "红豆生南国，春来发几枝。\n愿君多采撷，此物最相思。",
         "千山鸟飞绝，万径人踪灭。\n孤舟蓑笠翁，独钓寒江雪。",
         "独在异乡为异客，每逢佳节倍思亲。\n遥知兄弟登高处，遍插茱萸少一人。"]


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("src")
    write_jsonl(src / "code.jsonl", stdlib_records(10))
    write_jsonl(src / "web.jsonl", prose_records(30))
    write_jsonl(src / "zh.jsonl", [{"id": f"zh/{i}", "text": p} for i, p in enumerate(POEMS)])
    return src


def _docs(folder: Path, domain: str) -> list[dict]:
    return [json.loads(x) for f in sorted((folder / domain).glob("*.jsonl"))
            for x in f.read_text("utf-8").splitlines()]


def test_corpus_is_deterministic_by_seed(source, tmp_path):
    a = scale_corpus.build(source, tmp_path / "a", 0.3, seed=7, file_mb=0.05, log=lambda *_: None)
    b = scale_corpus.build(source, tmp_path / "b", 0.3, seed=7, file_mb=0.05, log=lambda *_: None)
    c = scale_corpus.build(source, tmp_path / "c", 0.3, seed=8, file_mb=0.05, log=lambda *_: None)
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").glob("*/*.jsonl"))
    assert files and files == sorted(p.relative_to(tmp_path / "b") for p in (tmp_path / "b").glob("*/*.jsonl"))
    assert all((tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes() for f in files)
    assert a["domains"] == b["domains"] and a["text_bytes"] >= 0.29e6
    assert _docs(tmp_path / "a", "web") != _docs(tmp_path / "c", "web")
    assert c["params"]["seed"] == 8
    assert all(d["files"] >= 2 for d in a["domains"].values())        # several files per domain
    # same parameters: reused, not rebuilt
    stamp = (tmp_path / "a" / "corpus.json").stat().st_mtime_ns
    scale_corpus.build(source, tmp_path / "a", 0.3, seed=7, file_mb=0.05, log=lambda *_: None)
    assert (tmp_path / "a" / "corpus.json").stat().st_mtime_ns == stamp


def test_documents_are_distinct_and_stay_in_their_domain(source, tmp_path):
    """Without shuffles every unit is verbatim (with them, test_each_use_of_a_unit_is_a_variant...)."""
    scale_corpus.build(source, tmp_path, 0.3, seed=3, file_mb=0.05, dup_exact=0.0, dup_near=0.0, shuffle=0,
                       log=lambda *_: None)
    src_units = {}
    for f in source.glob("*.jsonl"):
        units = set()
        for x in f.read_text("utf-8").splitlines():
            units.update(scale_corpus._units(json.loads(x)["text"])[0])
        src_units[f.stem] = units
    for dom in ("code", "web", "zh"):
        docs = _docs(tmp_path, dom)
        texts = [d["text"] for d in docs]
        assert len(docs) > 5 and len(set(texts)) == len(texts)               # no exact copies
        assert len({d["id"] for d in docs}) == len(docs) and all(d["domain"] == dom for d in docs)
        for t in texts:                           # every paragraph/line is one of this domain's own
            pieces = [u for run in t.split("\n\n") for u in scale_corpus._units(run)[0] or [run]]
            assert all(p in src_units[dom] or any(p in u for u in src_units[dom]) for p in pieces)
        if dom != "zh":                           # far below MinHash's 0.8 threshold
            worst = max(scale_corpus.shingle_jaccard(x, y) for x, y in itertools.combinations(texts[:40], 2))
            assert worst < 0.5
    assert all("\u4e00" <= c <= "\u9fff" or not c.isalpha() for d in _docs(tmp_path, "zh") for c in d["text"])


def test_each_use_of_a_unit_is_a_variant_so_documents_share_few_long_runs(source, tmp_path):
    """Why variants (scale_corpus's docstring): a verbatim unit recurs in about a hundred documents at 4 GB.  Word
    10-grams already seen in an earlier web document: with shuffles, a small share of those without."""
    def shared(folder):                   # share of word 10-grams already seen in an earlier document
        seen, hits, total = set(), 0, 0
        for d in _docs(folder, "web"):
            w = d["text"].split()
            grams = [tuple(w[i:i + 10]) for i in range(len(w) - 9)]
            hits, total = hits + sum(g in seen for g in grams), total + len(grams)
            seen.update(grams)
        return hits / total

    scale_corpus.build(source, tmp_path / "v", 2, seed=3, file_mb=1, dup_exact=0.0, dup_near=0.0,
                       log=lambda *_: None)
    scale_corpus.build(source, tmp_path / "s", 2, seed=3, file_mb=1, dup_exact=0.0, dup_near=0.0, shuffle=0,
                       log=lambda *_: None)
    assert shared(tmp_path / "v") < 0.02 * shared(tmp_path / "s")         # 0.002 against 0.82
    for dom in ("code", "web", "zh"):     # the same documents, each a variant of its verbatim twin: same characters
        v, s = _docs(tmp_path / "v", dom), _docs(tmp_path / "s", dom)
        assert [d["id"] for d in v] == [d["id"] for d in s]
        assert all(sorted(a["text"]) == sorted(b["text"]) for a, b in zip(v, s, strict=True))
        assert sum(a["text"] != b["text"] for a, b in zip(v, s, strict=True)) > 0.9 * len(v)
    assert scale_corpus.variant("a b c d", None, 0) == "a b c d"


def test_planted_copies_are_in_the_truth_with_their_true_jaccard(source, tmp_path):
    rec = scale_corpus.build(source, tmp_path, 0.3, seed=3, file_mb=0.05, log=lambda *_: None)
    truth = [json.loads(x) for x in (tmp_path / "truth.jsonl").read_text("utf-8").splitlines()]
    docs = {d["id"]: d for dom in ("code", "web", "zh") for d in _docs(tmp_path, dom)}
    assert len(truth) == rec["planted"]["exact"] + rec["planted"]["near"] and len(docs) == rec["docs"]
    share = len(truth) / len(docs)
    assert 0.2 < share < 0.4                                    # 15 % exact + 15 % near, drawn per document
    copies = {t["copy"] for t in truth}
    for t in truth:
        a, b = docs[t["of"]], docs[t["copy"]]
        assert t["of"] not in copies and a["domain"] == b["domain"] == t["domain"]     # originals are distinct docs
        if t["kind"] == "exact":
            assert a["text"] == b["text"] and t["jaccard"] == 1.0
        else:
            assert a["text"] != b["text"]
            assert t["jaccard"] == round(scale_corpus.pair_jaccard(t["domain"], a["text"], b["text"]), 4)
            assert 0.6 < t["jaccard"] < 1.0
    originals = [d["text"] for i, d in docs.items() if i not in copies]
    assert len(set(originals)) == len(originals)                # only the planted copies repeat


def test_truth_evaluation_counts_found_pairs_and_false_removals(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    import scale_truth

    def stage(name, ids):
        (tmp_path / name).mkdir()
        pq.write_table(pa.table({"meta": [json.dumps({"source_id": i}) for i in ids]}), tmp_path / name / "s.parquet")

    stage("ingest", ["a", "a2", "b", "b2", "c", "c2", "x", "y"])
    stage("exact_dedup", ["a", "b", "b2", "c", "c2", "x"])              # a2 found; y removed though distinct
    stage("minhash", ["a", "b", "c", "c2", "x"])                        # b~b2 found (J .9), c~c2 (J .82) missed
    truth = [{"copy": "a2", "of": "a", "kind": "exact", "jaccard": 1.0},
             {"copy": "b2", "of": "b", "kind": "near", "jaccard": 0.9},
             {"copy": "c2", "of": "c", "kind": "near", "jaccard": 0.82}]
    (tmp_path / "truth.jsonl").write_text("".join(json.dumps(t) + "\n" for t in truth))
    r = scale_truth.evaluate(tmp_path, tmp_path / "truth.jsonl")
    assert r["exact"] == {"pairs": 1, "found": 1, "recall": 1.0, "removed": 2, "removed_planted": 1, "precision": 0.5}
    m = r["minhash"]
    assert (m["pairs_at_or_above_threshold"], m["found_at_or_above"], m["removed"], m["precision"]) == (2, 1, 1, 1.0)
    p82, p90 = (1 - (1 - 0.82 ** 8) ** 14), (1 - (1 - 0.9 ** 8) ** 14)
    assert m["predicted_at_or_above"] == round((p82 + p90) / 2, 4)
    assert m["by_jaccard"]["0.80-0.85"] == {"pairs": 1, "found": 0, "recall": 0.0, "predicted": round(p82, 4)}


def test_repeats_give_median_and_spread_and_per_stage_exponents():
    import scale_stats

    def run(mb, cpu, stage_cpu):
        return {"rc": 0, "corpus_mb": mb, "cpu_s": cpu, "stages": [{"stage": "ingest", "cpu_s": stage_cpu}]}

    small = scale_stats.combine([run(1000, 120, 10), run(1000, 100, 12), run(1000, 110, 11)])
    large = scale_stats.combine([run(4000, 400, 40), run(4000, 420, 64), run(4000, 450, 44)])
    assert small["cpu_s"] == 110 and small["spread"]["cpu_s"] == {"median": 110, "min": 100, "max": 120, "n": 3,
                                                              "values": [120, 100, 110]}
    rows = scale_stats.stage_exponents(small, large)
    # the exponent of the medians, and each interleaved pair's own (10 → 40, 12 → 64, 11 → 44)
    assert rows == [{"stage": "ingest", "cpu_small": 11, "cpu_large": 44, "growth": 4.0, "exponent": 1.0,
                     "values": [1.0, 1.208, 1.0]}]


def test_exponents_per_yardstick_take_out_the_machine_drift():
    """A machine 1.5x as slow during the large run: raw exponent 1.292, per yardstick 1.0 (same work per MB)."""
    import scale_stats

    def run(mb, cpu, stick):
        return {"rc": 0, "size_gb": mb / 1000, "corpus_mb": mb, "cpu_s": cpu, "yardstick_cpu_s": stick,
                "peak_task_rss_mb": 900, "mb_per_cpu_s": mb / cpu, "stages": [{"stage": "ingest", "cpu_s": cpu}]}

    small = scale_stats.combine([run(1000, 100, 3.0), run(1000, 100, 3.2)])
    large = scale_stats.combine([run(4000, 600, 4.65), run(4000, 600, 4.65)])
    assert scale_stats.yardstick_ratio(small, large) == pytest.approx(4.65 / 3.1)
    (row,) = scale_stats.stage_exponents(small, large)
    assert row["exponent"] == 1.292 and row["exponent_per_yardstick"] == 1.0
    stick = scale_stats.yardstick(rounds=1)
    assert 0 < stick < 5
    (cost,) = [t for t in bench_scale.targets([small, large], None, None) if t["name"] == "cost_exponent"]
    assert cost["value"] == 1.292 and "per yardstick 1.000 (the machine was 1.50x as slow" in cost["note"]


def test_missing_source_fails_clearly(tmp_path, capsys):
    with pytest.raises(scale_corpus.SourceMissing, match="source corpora"):
        scale_corpus.load_pools(tmp_path / "absent")
    assert bench_scale.main(["--quick", "--source", str(tmp_path / "absent"), "--work", str(tmp_path / "w")]) == 2
    assert "shared corpora are absent" in capsys.readouterr().err


def test_attribution_takes_the_peak_and_cpu_growth_inside_a_task():
    samples = [(0.0, 300, 1.0), (1.0, 310, 1.5), (2.0, 900, 3.0), (3.0, 320, 4.0), (4.0, 330, 4.2)]
    a = scale_timeline.attribute(samples, 0.9, 3.1)
    assert a["peak_rss_mb"] == 900 and a["rss_start_mb"] == 300 and a["cpu_s"] == pytest.approx(4.02 - 1.45)
    halves = [scale_timeline.attribute(samples, x, y)["cpu_s"] for x, y in ((0.5, 2.5), (2.5, 3.7))]
    assert sum(halves) == pytest.approx(scale_timeline.attribute(samples, 0.5, 3.7)["cpu_s"], abs=0.02)
    tis = [{"task_id": "ingest.ingest_shard", "start": 0.5, "end": 1.5}, {"task_id": "ingest.ingest_shard",
                                                                           "start": 1.5, "end": 2.5},
           {"task_id": "publish", "start": 3.5, "end": None}]
    rows = scale_timeline.stage_rows(tis, samples, corpus_mb=10.0)
    assert [r["stage"] for r in rows] == ["ingest.ingest_shard"] and rows[0]["tasks"] == 2
    assert rows[0]["peak_rss_mb"] == 900 and rows[0]["wall_s"] == 2.0 and rows[0]["growth_mb"] == 590


def _run(size, rc=0, cpu=100.0, peak=1000.0):
    mb = size * 1000
    return {"size_gb": size, "rc": rc, "corpus_mb": mb, "cpu_s": cpu, "mb_per_cpu_s": mb / cpu,
            "peak_task_rss_mb": peak}


def test_targets_are_computed_from_the_figures():
    side = {"tokenize": {"speedup": 1.9}, "mindrecord": {"ratio_vs_filewriter": 0.7}}
    peer = {"mb_per_cpu_s": 2.0, "mindloom": {"mb_per_cpu_s": 2.5}}      # the same steps on both sides
    t = {x["name"]: x for x in bench_scale.targets([_run(1, cpu=400, peak=1000), _run(4, cpu=1700, peak=1300)],
                                                   side, peer)}
    assert t["run_4gb_completes"]["met"] is True
    assert t["peak_task_rss_mb"]["value"] == 1300 and t["peak_task_rss_mb"]["met"] is True
    assert t["peak_rss_move"]["value"] == 0.3 and t["peak_rss_move"]["met"] is False
    assert t["cost_exponent"]["value"] == pytest.approx(1.044, abs=1e-3) and t["cost_exponent"]["met"] is True
    assert t["chain_mb_per_cpu_s"]["value"] == pytest.approx(4000 / 1700) and t["chain_mb_per_cpu_s"]["met"] is True
    assert t["tokenize_1_to_2_processes"]["met"] is True and t["mindrecord_vs_filewriter"]["met"] is False
    assert t["vs_datatrove_mb_per_cpu_s"]["value"] == 1.25 and t["vs_datatrove_mb_per_cpu_s"]["met"] is False
    assert t["exact_dedup_recall"]["value"] is None and t["dag_cpu_over_cli"]["met"] is None    # not measured
    # dedup truth, DAG vs CLI and per-stage exponents
    small, large = _run(1, cpu=400), _run(4, cpu=1700)
    small["stage_cpu_spread"] = {"ingest": {"median": 100}, "exact_partition": {"median": 10},
                                 "bands": {"median": 0.01}}
    large["stage_cpu_spread"] = {"ingest": {"median": 400}, "exact_partition": {"median": 62},
                                 "bands": {"median": 0.08}}     # exponent 1.5, but under the 1 CPU-s floor
    large["dag_over_cli"] = 1.2
    for r, rec, gap in ((small, 1.0, 0.01), (large, 0.999, 0.03)):
        r["dedup_truth"] = {"exact": {"recall": rec, "precision": 1.0},
                            "minhash": {"recall_at_or_above": 0.9, "predicted_at_or_above": 0.9 + gap,
                                        "precision": 0.99}}
    d = {x["name"]: x for x in bench_scale.targets([small, large], None, None)}
    assert d["worst_stage_exponent"]["value"] == pytest.approx(1.316, abs=1e-3)
    assert d["worst_stage_exponent"]["met"] is False and "exact_partition" in d["worst_stage_exponent"]["note"]
    assert "bands 0.01 → 0.08 CPU-s (exponent 1.5) is under the 1 CPU-s floor" in d["worst_stage_exponent"]["note"]
    assert d["exact_dedup_recall"]["value"] == 0.999 and d["exact_dedup_recall"]["met"] is False
    assert d["minhash_recall_below_banding"]["value"] == 0.03 and d["minhash_recall_below_banding"]["met"] is False
    assert d["dag_cpu_over_cli"]["value"] == 1.2 and d["dag_cpu_over_cli"]["met"] is False
    # one quick size: what needs two sizes or a 4 GB run is not measured (None), never guessed
    q = {x["name"]: x for x in bench_scale.targets([_run(0.03)], None, None)}
    assert q["run_4gb_completes"]["met"] is None and q["cost_exponent"]["value"] is None
    assert q["peak_rss_move"]["met"] is None and q["vs_datatrove_mb_per_cpu_s"]["met"] is None
    # a failed 4 GB run is a miss
    f = {x["name"]: x for x in bench_scale.targets([_run(1), _run(4, rc=1)], None, None)}
    assert f["run_4gb_completes"]["met"] is False and f["cost_exponent"]["value"] is None


def test_profile_files_are_summed_per_stage(tmp_path):
    for unit, (wall, cpu, peak) in {"shard-0": (2.0, 1.5, 500.0), "shard-1": (3.0, 2.5, 700.0)}.items():
        f = tmp_path / "profile" / "ingest" / f"{unit}.json"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(json.dumps({"stage": "ingest", "unit": unit, "wall_s": wall, "cpu_s": cpu, "peak_rss_mb": peak,
                                 "input_bytes": 4_000_000}))
    (row,) = scale_timeline.profile_rows(tmp_path, corpus_mb=8.0)
    assert row == {"stage": "ingest", "tasks": 2, "wall_s": 5.0, "cpu_s": 4.0, "peak_rss_mb": 700.0, "input_mb": 8.0,
                   "mb_per_cpu_s": 2.0, "source": "profile/"}
    assert scale_timeline.profile_rows(tmp_path / "none", corpus_mb=8.0) == []


def test_scale_topic_merges_into_results_and_renders(tmp_path, monkeypatch):
    import common
    import report
    import run_all

    res = {"command": "benchmarks/bench_scale.py --sizes 1", "runs": [], "targets": bench_scale.targets(
        [_run(1, cpu=400, peak=1000)], {"tokenize": {"speedup": 1.9}, "mindrecord": {"ratio_vs_filewriter": 0.9}},
        {"mb_per_cpu_s": 1.0, "mindloom": {"mb_per_cpu_s": 2.5}})}
    (tmp_path / "scale.json").write_text(json.dumps(res))
    monkeypatch.setattr(common, "RESULTS_DIR", tmp_path)
    merged = run_all.refresh_topic({"topics": {}, "metrics": []}, "scale")
    by_name = {m["name"]: m for m in merged["metrics"]}
    assert by_name["scale.vs_datatrove_mb_per_cpu_s"]["median"] == 2.5 and by_name[
        "scale.vs_datatrove_mb_per_cpu_s"]["met"] is True
    assert by_name["scale.peak_task_rss_mb"]["issue"] == 13 and "scale.cost_exponent" not in by_name   # not measured
    assert merged["topics"]["scale"]["commands"] == ["benchmarks/bench_scale.py --sizes 1"]
    md = report.render(merged)
    assert "## The corpus DAG at scale" in md and "| cost_exponent | – | <= 1.05 | – | needs two sizes |" in md


def test_shared_chain_config_is_a_valid_config_with_the_same_steps_for_every_domain(source, tmp_path):
    import scale_peer

    from pipeline.config import config_from_dict

    scale_corpus.build(source, tmp_path / "c", 0.1, seed=3, file_mb=0.05, log=lambda *_: None)
    base = bench_scale.chain_config(tmp_path / "c", tmp_path / "d", 256, 2, "x")
    cfg = config_from_dict(scale_peer.shared_chain_config(base))
    assert [(c.domain, c.filters) for c in cfg.quality.chains] == [("*", ["gopher_repetition", "gopher_quality"])]
    assert cfg.minhash.shingle_kind == "word" and cfg.minhash.domain_shingles == []
    assert base["quality"]["chains"] != [c for c in cfg.to_dict()["quality"]["chains"]]       # base left as it was


def test_earlier_runs_join_this_invocations_repeats():
    """--add-runs: single runs (raw, or a results file of one repeat per size) join the combine; a combined entry
    of several repeats is refused, naming the file."""
    import scale_stats

    def run(size, cpu):
        return {"size_gb": size, "rc": 0, "cpu_s": cpu, "stages": [{"stage": "ingest", "cpu_s": cpu / 2}]}

    one = scale_stats.combine([run(1.0, 100)])                  # what a --runs 1 results file holds per size
    docs = [("old.json", {"runs": [one, scale_stats.combine([run(4.0, 400)])]}), ("raw.json", run(1.0, 90))]
    got = scale_stats.earlier_runs(docs, [1.0, 4.0])
    assert [r["cpu_s"] for r in got[1.0]] == [100, 90] and [r["cpu_s"] for r in got[4.0]] == [400]
    assert not any(k in r for r in got[1.0] for k in scale_stats.COMBINED_KEYS)
    merged = scale_stats.combine(got[1.0] + [run(1.0, 120)])
    assert merged["repeats"] == 3 and merged["cpu_s"] == 100
    assert merged["spread"]["cpu_s"] == {"median": 100, "min": 90, "max": 120, "n": 3, "values": [100, 90, 120]}
    assert merged["stage_cpu_spread"]["ingest"] == {"median": 50, "min": 45, "max": 60, "n": 3, "values": [50, 45, 60]}
    two = scale_stats.combine([run(1.0, 100), run(1.0, 110)])
    with pytest.raises(ValueError, match="new.json: the 1.0 GB entry combines 2 runs"):
        scale_stats.earlier_runs([("new.json", {"runs": [two]})], [1.0])


def test_dag_over_cli_target_is_the_worst_sizes_median():
    """DAG ÷ CLI is judged on each size's median over its runs (not the median-CPU run's own ratio), worst size."""
    import scale_stats
    from scale_targets import targets

    def run(size, cpu, over):
        return {"size_gb": size, "corpus_mb": size * 1000, "rc": 0, "cpu_s": cpu, "mb_per_cpu_s": size * 1000 / cpu,
                "peak_task_rss_mb": 1000.0, "dag_over_cli": over, "stages": [{"stage": "ingest", "cpu_s": cpu}]}

    small = scale_stats.combine([run(1.0, 300, 1.04), run(1.0, 310, 1.15), run(1.0, 320, 1.03)])
    large = scale_stats.combine([run(4.0, 1100, 0.99), run(4.0, 1150, 1.02), run(4.0, 1200, 1.01)])
    assert small["dag_over_cli"] == 1.15 and large["dag_over_cli"] == 1.02       # the median-CPU runs' own
    (row,) = [t for t in targets([small, large], None, None) if t["name"] == "dag_cpu_over_cli"]
    assert row["value"] == 1.04 and row["met"] is True
    assert "1 GB 1.04 (1.03-1.15, 3 runs), 4 GB 1.01 (0.99-1.02, 3 runs)" in row["note"]


def test_every_target_of_repeated_runs_carries_its_repeats():
    """With three runs per size, each target keeps the three figures behind it: exponents per interleaved pair,
    the largest task and the dedup scores per pair (the worst size of each), so the README shows their spread."""
    import scale_stats
    from scale_targets import targets

    def run(size, cpu, peak, recall, gap):
        return {"size_gb": size, "corpus_mb": size * 1000, "rc": 0, "cpu_s": cpu, "mb_per_cpu_s": size * 1000 / cpu,
                "peak_task_rss_mb": peak, "stages": [{"stage": "ingest", "cpu_s": cpu / 2}],
                "dedup_truth": {"exact": {"recall": recall, "precision": 1.0},
                                "minhash": {"recall_at_or_above": 0.95, "predicted_at_or_above": 0.95 + gap,
                                            "precision": 1.0}}}

    small = scale_stats.combine([run(1.0, 300, 1700, 1.0, 0.01), run(1.0, 320, 2040, 1.0, 0.012),
                                 run(1.0, 310, 1750, 0.999, 0.01)])
    large = scale_stats.combine([run(4.0, 1200, 1800, 1.0, 0.0135), run(4.0, 1280, 1760, 1.0, 0.0135),
                                 run(4.0, 1300, 1755, 1.0, 0.0135)])
    t = {x["name"]: x for x in targets([small, large], None, None)}
    assert t["peak_task_rss_mb"]["value"] == 2040 and t["peak_task_rss_mb"]["values"] == [1800, 2040, 1755]
    assert t["cost_exponent"]["values"] == [1.0, 1.0, 1.034]
    assert t["worst_stage_exponent"]["values"] == [1.0, 1.0, 1.034]
    assert t["exact_dedup_recall"]["value"] == 0.999 and t["exact_dedup_recall"]["values"] == [1.0, 1.0, 0.999]
    assert t["minhash_recall_below_banding"]["values"] == [0.0135, 0.0135, 0.0135]
    assert "each interleaved pair of runs: 1.0, 1.0, 1.034" in t["cost_exponent"]["note"]
    assert "the highest in any one pair: ingest 1.034" in t["worst_stage_exponent"]["note"]
    assert t["peak_task_rss_mb"]["judge"] == "worst" and "judge" not in t["cost_exponent"]
    import topics
    m = {x["name"]: x for x in topics.scale_metrics([{"scale.json": {"runs": [small, large],
                                                                      "targets": list(t.values())}}])}
    # the median run is under a 1,800 MB ceiling, one run is not: a ceiling every run must meet is missed
    from common import metric
    assert metric("scale", "x", "MB", [1800, 2040, 1755], target=1800, op="<=")["met"] is True
    assert metric("scale", "x", "MB", [1800, 2040, 1755], target=1800, op="<=", worst=True)["met"] is False
    assert m["scale.peak_task_rss_mb"]["judged"] == "worst run" and m["scale.peak_task_rss_mb"]["max"] == 2040
    assert m["scale.exact_dedup_recall"]["met"] is False and m["scale.exact_dedup_recall"]["min"] == 0.999
    # a single run per size has no repeats to show
    one = {x["name"]: x for x in targets([scale_stats.combine([run(1.0, 300, 1700, 1.0, 0.01)]),
                                           scale_stats.combine([run(4.0, 1200, 1800, 1.0, 0.01)])], None, None)}
    assert all("values" not in x for x in one.values())


def test_parallelism_sweep_judges_the_shipped_parallelism_against_8_on_the_same_outputs():
    import scale_targets

    def run(p, cpu, instances, digest="abc"):
        return scale_targets.sweep_point({"parallelism": p, "size_gb": 1.0, "corpus_mb": 1000.0, "rc": 0,
                                          "cpu_s": cpu, "wall_s": cpu, "mb_per_cpu_s": 1000.0 / cpu,
                                          "task_states": {"success": instances}, "outputs_sha256": digest})

    points = [run(8, 400.0, 90), run(64, 440.0, 350), run(256, 500.0, 1150)]
    ratio, same = scale_targets.sweep_targets(points, 64)
    assert ratio["name"] == "parallelism_64_over_8_cpu" and ratio["value"] == 1.1 and ratio["met"] is True
    assert "0.154, 0.094 CPU-s per extra task instance" in ratio["note"]
    assert same["met"] is True
    ratio, same = scale_targets.sweep_targets([run(8, 400.0, 90), run(64, 480.0, 350, digest="other")], 64)
    assert ratio["met"] is False and same["met"] is False and same["value"] == 0.0
    assert scale_targets.sweep_targets([run(64, 440.0, 350)], 64) == []         # no parallelism 8: nothing judged
    # the shipped point of repeated main runs: the median of its runs is judged, not the run its figures come from
    repeated = scale_targets.sweep_point({"parallelism": 64, "size_gb": 1.0, "corpus_mb": 1000.0, "rc": 0,
                                          "cpu_s": 420.0, "wall_s": 1.0, "task_states": {"success": 350},
                                          "outputs_sha256": "abc",
                                          "spread": {"cpu_s": {"median": 450.0, "values": [420.0, 480.0]}}})
    ratio, same = scale_targets.sweep_targets([run(8, 400.0, 90), repeated], 64)
    assert (ratio["value"], ratio["values"], ratio["met"]) == (1.125, [1.05, 1.2], True)
    assert "median of 2 runs: 420, 480, each over 8: 1.050, 1.200" in ratio["note"]


def test_add_sweep_keeps_an_earlier_invocations_sweep_points_and_this_runs_own_parallelism(tmp_path):
    import argparse

    import scale_sweep
    import scale_targets

    def run(p, cpu):
        return {"parallelism": p, "size_gb": 1.0, "corpus_mb": 1000.0, "rc": 0, "cpu_s": cpu, "wall_s": cpu,
                "task_states": {"success": p}, "outputs_sha256": "abc"}

    earlier = tmp_path / "earlier.json"
    earlier.write_text(json.dumps({"runs": [run(64, 470.0), {**run(4, 1.0), "size_gb": 4.0}],
                                   "sweep": [scale_targets.sweep_point(run(p, c)) for p, c in
                                             ((8, 460.0), (64, 470.0), (256, 710.0))]}))
    a = argparse.Namespace(parallelism=64, cli=True, sweep="8,256", add_sweep=[earlier])
    points = scale_sweep.sweep(run(64, 490.0), a, lambda size, a: pytest.fail("nothing is re-run"))
    assert [(p["parallelism"], p["cpu_s"]) for p in points] == [(8, 460.0), (64, 490.0), (256, 710.0)]
    assert [p.get("from") for p in points] == [str(earlier), None, str(earlier)]


def test_stage_repeats_give_each_sink_steps_exponent_as_a_metric_and_a_table(tmp_path, monkeypatch):
    """``--stage-repeats``: the sink's steps re-run alone at two sizes; each step's exponent of the median CPU is a
    metric judged against 1.05, with every pair's exponent in its note and the table."""
    import common
    import run_all
    import scale_report
    import scale_stage
    import scale_stats

    monkeypatch.setattr(scale_stage, "mirror", lambda run, dest: dest)
    monkeypatch.setattr(scale_stage, "prepare", lambda rdir: {"shards": 2, "n_files": 1, "heldout_runs": 9})
    cpu = {("1gb", "sink_scatter"): iter([10.0, 12.0, 11.0]), ("4gb", "sink_scatter"): iter([44.0, 40.0, 42.0]),
           ("1gb", "sink_write"): iter([30.0, 33.0, 36.0]), ("4gb", "sink_write"): iter([150.0, 100.0, 160.0]),
           ("1gb", "sink_scatter_no_check"): iter([5.0] * 3), ("4gb", "sink_scatter_no_check"): iter([20.0] * 3)}
    monkeypatch.setattr(scale_stage, "run_step", lambda rdir, step: {"cpu_s": next(cpu[(rdir.name[6:], step)])})
    monkeypatch.setattr(scale_stats, "yardstick", lambda rounds=10: 1.0)
    monkeypatch.setattr(scale_stage, "dropped", lambda rdir: {"in_docs": 10, "dropped": 1})
    sr = scale_stage.stage_repeats(tmp_path, [1.0, 4.0], 64, 3, {1.0: 1000.0, 4.0: 4000.0})
    assert sr["steps"]["sink_scatter"]["cpu_s"]["4"]["median"] == 42.0
    assert sr["steps"]["sink_scatter_no_check"]["exponent"] == 1.0
    assert sr["overlaps_heldout"]["4"] == {"in_docs": 10, "dropped": 1}
    assert sr["steps"]["sink_scatter"]["exponent"] == round(math.log(42 / 11) / math.log(4), 3)
    assert sr["steps"]["sink_write"]["exponent"] == round(math.log(150 / 33) / math.log(4), 3)       # 1.092
    assert sr["steps"]["sink_write"]["pair_exponents"] == [round(math.log(b / a) / math.log(4), 3) for a, b in
                                                           ((30, 150), (33, 100), (36, 160))]
    res = {"command": "benchmarks/bench_scale.py --stage-repeats 3", "runs": [], "targets": [], "stage_repeats": sr}
    (tmp_path / "scale.json").write_text(json.dumps(res))
    monkeypatch.setattr(common, "RESULTS_DIR", tmp_path)
    by_name = {m["name"]: m for m in run_all.refresh_topic({"topics": {}, "metrics": []}, "scale")["metrics"]}
    assert by_name["scale.sink_scatter_exponent_stage_repeats"]["met"] is True
    assert by_name["scale.sink_write_exponent_stage_repeats"]["met"] is False
    assert by_name["scale.sink_write_exponent_stage_repeats"]["note"].endswith("each pair's: 1.161, 0.8, 1.076")
    md = "\n".join(scale_report.markdown(res))
    assert "| sink_write | 4 GB | 4000.0 | 2 | 1 | 9 | 150.0 | 100.0 | 160.0 | 1.092 |" in md


def test_carried_checks_name_the_invocation_that_measured_them(tmp_path):
    """A results file that carried its side checks passes their own origin on, not its whole history; one that
    measured them itself is named by its command."""
    measured = tmp_path / "a.json"
    measured.write_text(json.dumps({"command": "bench_scale.py --sizes 0.25,1", "side": {"x": 1},
                                    "datatrove": {"y": 2}}))
    res: dict = {}
    side, peer = bench_scale.carry(res, measured, None, None)
    assert (side, peer) == ({"x": 1}, {"y": 2})
    assert res["carried"] == {"side": "bench_scale.py --sizes 0.25,1", "datatrove": "bench_scale.py --sizes 0.25,1"}
    again = tmp_path / "b.json"
    again.write_text(json.dumps({**res, "command": "bench_scale.py --sizes 1,4 --skip peer,side"}))
    later: dict = {}
    bench_scale.carry(later, again, None, {"own": 3})                  # this invocation ran its own comparison
    assert later["carried"] == {"side": "bench_scale.py --sizes 0.25,1"} and "datatrove" not in later
    assert later["merged_from"] == ("the side checks (tokenizer scaling, MindRecord writers) carried over from "
                                    "b.json, measured by bench_scale.py --sizes 0.25,1")
