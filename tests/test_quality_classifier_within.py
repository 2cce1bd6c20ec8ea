"""The quality classifier's default mode, within each domain (pipeline/quality/classifier.py): positives pass every
rule of the domain's chain, negatives fail two or more or are corrupted copies of positives; cross-fitted scores;
a keep_top_percent cut from each domain's cut sample that keeps that share of the domain's documents, measured by
the quality tasks, which score their own shards; byte-identical reruns; the probe.

Real text: 400 docstrings of the standard library's functions, classes and modules with 20+ words (domain docs:
the default '*' chain of Gopher rules fails many of them) and its source files of 2-60 KB (domain code, the code
chain)."""

from __future__ import annotations

import ast
import hashlib
import json
import shutil
import sysconfig
from pathlib import Path

import pyarrow as pa
import pytest
from conftest import stdlib_records

from pipeline.config import config_from_dict
from pipeline.io import read_parquet, write_parquet
from pipeline.quality import classifier, classifier_cut
from pipeline.quality.classifier_sample import corrupted, fold_of
from pipeline.quality.filters.audit import quality_report, render_quality_report
from pipeline.quality.run import run_quality_shard, scores_path

pytest.importorskip("floret")

SEED = 7
SHARDS = ["code-00000", "docs-00000", "docs-00001"]
SETTINGS = {"enabled": True, "keep_top_percent": {"docs": 30, "code": 30}, "dim": 8, "buckets": 4096,
            "max_chars": 4000}


def _docstrings(n: int) -> list[str]:
    """The first ``n`` docstrings (module, class, function) of 20+ words of the stdlib's modules, in file order."""
    out: list[str] = []
    for p in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        try:
            tree = ast.parse(p.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc.split()) >= 20:
                    out.append(doc)
        if len(out) >= n:
            return out[:n]
    raise AssertionError(f"only {len(out)} docstrings")


def _shard(rdir: Path, shard: str, domain: str, texts: list[str]) -> None:
    n = len(texts)
    write_parquet(pa.table({"doc_id": [f"{shard}/{i}" for i in range(n)], "domain": [domain] * n,
                            "source": ["test"] * n, "text": texts, "meta": ["{}"] * n}),
                  rdir / "minhash" / f"{shard}.parquet")


def _quality(**extra):
    return config_from_dict({"quality": {"workers": 1, "classifier": {**SETTINGS, **extra}}}).quality


def _digests(d: Path) -> dict[str, str]:
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.rglob("*"))
            if p.is_file()}


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[Path, dict]:
    rdir = tmp_path_factory.mktemp("within") / "run"
    docs = _docstrings(400)
    _shard(rdir, "docs-00000", "docs", docs[:200])
    _shard(rdir, "docs-00001", "docs", docs[200:])
    _shard(rdir, "code-00000", "code", [r["text"] for r in stdlib_records(200)])
    q = _quality()
    return rdir, classifier.train_classifier(q.classifier, rdir, SHARDS, SEED, quality=q)


def test_examples_come_from_the_domain_own_chain_and_corruptions(run):
    rdir, found = run
    assert found["training"] == "within_domain" and [g["domains"] for g in found["groups"]] == [["code"], ["docs"]]
    docs, code = found["domains"]["docs"], found["domains"]["code"]
    assert docs["docs"] == 400 and code["docs"] == 135
    # the docs chain (length, Gopher repetition and quality): 51 pass every rule, 182 fail one (left out), 167 two+
    assert docs["labels"] == {"candidates": 400, "pass": 51, "failed_one": 182, "failed_two_or_more": 167,
                              "prescored": 0}
    # balance: equal keeps 51 negatives, in hash order: failures and corrupted copies of positives
    assert docs["positives"] == 51 and sum(docs["negatives"].values()) == 51
    assert set(docs["negatives"]) == {"heuristics_failed", "corrupt:boilerplate", "corrupt:repeated_lines",
                                      "corrupt:scrambled_words"}
    # the code chain fails no source file on two rules: its negatives are corrupted copies only
    assert code["labels"]["failed_two_or_more"] == 0 and set(code["negatives"]) == {
        "corrupt:boilerplate", "corrupt:repeated_lines", "corrupt:scrambled_words"}
    sample = read_parquet(rdir / "classifier" / "sample.parquet").to_pylist()
    failed = [r for r in sample if r["source"] == "heuristics_failed"]
    assert failed and all(len(r["failed"].split(",")) >= 2 for r in failed)
    assert all(r["failed"] == "" for r in sample if r["class"] == "pos")
    # a corrupted copy is its original's text, corrupted the same way for the same (seed, doc id)
    text = "first line of a page\nsecond line here"
    assert corrupted(text, "repeated_lines", SEED, "x") == "\n".join(["first line of a page"] * 4
                                                                     + ["second line here"] * 4)
    assert corrupted(text, "boilerplate", SEED, "x") == corrupted(text, "boilerplate", SEED, "x") != text
    assert corrupted(text, "scrambled_words", SEED, "x") != corrupted(text, "scrambled_words", SEED + 1, "x")
    # the shared corruptions are the ablation's positive control's, output for output
    import random

    from pipeline.ablation.plan import corrupt as planted
    from pipeline.quality.corruptions import JUNK_KINDS, corrupt

    for kind in JUNK_KINDS:
        assert corrupt(text, kind, random.Random(kind)) == planted(text, kind, random.Random(kind))


def test_no_document_is_scored_by_a_model_that_trained_on_it(run):
    """Each model's training file is rebuilt from sample.parquet (the examples of every other fold): its sha256 is the
    one the manifest recorded, and every document (and every corrupted copy's original) is scored by the model of
    its own fold, which is not among them."""
    rdir, found = run
    sample = read_parquet(rdir / "classifier" / "sample.parquet").to_pylist()
    texts = {r["doc_id"]: r["text"] for s in SHARDS
             for r in read_parquet(rdir / "minhash" / f"{s}.parquet").to_pylist()}
    pos, neg = "__label__hq", "__label__not_hq"
    for g, group in enumerate(found["groups"]):
        examples = [r for r in sample if r["domain"] == group["domains"][0] and r["split"] == "train"]
        for m in group["models"]:
            k = m["fold"]
            trained = sorted((r for r in examples if r["fold"] != k),
                             key=lambda r: (classifier_cut.unit(SEED, "order", r["doc_id"]), r["doc_id"]))
            lines = []
            for r in trained:
                original, _, kind = r["doc_id"].partition("#")
                text = texts[original][:4000]
                if kind:
                    assert fold_of(SEED, original, 2) == r["fold"]          # a copy is in its original's fold
                    text = corrupted(text, kind, SEED, original)[:4000]
                lines.append(f"{pos if r['class'] == 'pos' else neg} {classifier.line_of(text, 4000)}\n")
            assert hashlib.sha256("".join(lines).encode()).hexdigest() == m["train_sha256"]
            assert m["file"] == f"models/g{g}-f{k}.bin" and m["train_docs"] == len(trained)
            assert not {r["doc_id"].partition("#")[0] for r in trained} & {
                r["doc_id"].partition("#")[0] for r in examples if r["fold"] == k}
    cut_sample = read_parquet(rdir / "classifier" / "cut_sample.parquet").to_pylist()
    assert len(cut_sample) == 535                                           # both domains have fewer than 20,000
    for r in cut_sample:
        assert r["fold"] == fold_of(SEED, r["doc_id"], 2)                  # scored by model g<domain>-f<fold>
    # the held-out figures are those cross-fitted scores: better than chance on docs
    assert found["domains"]["docs"]["held_out"]["auc"] > 0.7


def test_the_cut_keeps_30_percent_of_each_domain(run):
    """keep_top_percent 30: both domains have fewer documents than cut_sample_docs (20,000), so the cut sample is
    the whole domain and the cut is its exact quantile: it keeps ceil(0.3 n) of n (docs 120 of 400, code 41 of
    135), in the manifest's sample and again in the quality tasks, which score their own shards and count what
    the cut keeps (the quality report's classifier_cut).  The chain removes first: of docs the quality stage keeps
    those that pass both."""
    rdir, found = run
    cuts = found["cuts"]
    assert (cuts["docs"]["sample_kept"], cuts["docs"]["sample_docs"], cuts["code"]["sample_kept"],
            cuts["code"]["sample_docs"]) == (120, 400, 41, 135)
    assert cuts["docs"]["cut_from"] == "all 400 documents" and found["cut_sample"]["docs"]["whole_domain"]
    q = _quality()
    stats = {s: run_quality_shard(q, rdir, s, input_stage="minhash") for s in SHARDS}
    measured = quality_report(rdir)
    assert {d: (measured[d]["classifier_cut"]["kept"], measured[d]["classifier_cut"]["scored"])
            for d in ("docs", "code")} == {"docs": (120, 400), "code": (41, 135)}
    assert measured["docs"]["classifier_cut"]["share"] == 0.3
    sample = {r["doc_id"]: r[classifier.COLUMN] for r in
              read_parquet(rdir / "classifier" / "cut_sample.parquet").to_pylist()}
    for domain in ("docs", "code"):
        shards = [s for s in SHARDS if s.startswith(domain)]
        tables = [read_parquet(scores_path(rdir, s)) for s in shards]
        for t in tables:        # the quality task scored each document as the train step scored its sample
            assert dict(zip(t.column("doc_id").to_pylist(), t.column(classifier.COLUMN).to_pylist(),
                            strict=True)) == {i: sample[i] for i in t.column("doc_id").to_pylist()}
        passes = sum(d is None for t in tables for d in classifier.reapply(found, t))
        assert passes == cuts[domain]["sample_kept"]                      # the classifier's own decisions
        st = [stats[s] for s in shards]
        n = sum(s["in_docs"] for s in st)
        assert n == sum(s["kept_docs"] + sum(r["docs"] for r in s["removed"].values()) for s in st)  # all counted
        reasons = [r for t in tables for r in t.column("q_reason").to_pylist()]
        assert sum(s["kept_docs"] for s in st) == reasons.count("")
        assert sum(s["removed"].get("classifier_low_score", {"docs": 0})["docs"] for s in st) == \
            reasons.count("classifier_low_score") > 0
    # code: the chain fails one source file, so the task keeps 30 % of the domain, +-2 points
    assert abs(stats["code-00000"]["kept_docs"] / 135 - 0.30) <= 0.02
    detail = next(r for r in read_parquet(scores_path(rdir, "code-00000")).to_pylist()
                  if r["q_reason"] == "classifier_low_score")["q_detail"]
    assert detail.startswith("q_classifier_score=") and "(keep top 30 %)" in detail


def test_the_probe_says_how_much_the_score_tells_the_domain(run, tmp_path):
    """Within domains the score tells docs from code much less than a classifier trained on docs against code."""
    rdir, found = run
    within = found["probe"]
    assert [p["domains"] for p in within["pairs"]] == [["code", "docs"]]
    other = tmp_path / "run"
    shutil.copytree(rdir / "minhash", other / "minhash")
    q = _quality(training="cross_domain", positive_domains=["docs"], negative_domains=["code"])
    cross = classifier.train_classifier(q.classifier, other, SHARDS, SEED, quality=q)["probe"]
    assert within["max_separation"] < 0.8 < 0.95 < cross["max_separation"]
    pair = within["pairs"][0]
    assert 0.5 <= pair["separation"] == max(pair["auc"], 1 - pair["auc"]) and 0.5 <= pair["best_threshold_accuracy"]


def test_rerun_is_byte_identical_with_prescores_and_two_workers(run, tmp_path, monkeypatch):
    """A fresh run with the same seed writes the same bytes, also when the chain's verdicts come from MinHash stage
    1's prescores (written here for one shard); the quality tasks write the same bytes when two processes score
    the documents as when the task's own process does."""
    from pipeline.quality import run as quality_run
    from pipeline.quality.filters.chain import Chain
    from pipeline.quality.filters.text import Doc
    from pipeline.quality.prescored import write_prescores

    rdir, found = run
    first = _digests(rdir / "classifier")
    assert {f for f in first if f.startswith("models/")} == {"models/g0-f0.bin", "models/g0-f1.bin",
                                                            "models/g1-f0.bin", "models/g1-f1.bin"}
    other = tmp_path / "run"
    shutil.copytree(rdir / "minhash", other / "minhash")
    q = _quality()
    rows = read_parquet(other / "minhash" / "docs-00000.parquet").to_pylist()
    chain = Chain.build(q, "docs")
    prescores = other / "minhash" / "prescores" / "docs-00000.parquet"
    write_prescores(prescores, q, {"docs": chain}, [r["doc_id"] for r in rows], ["docs"] * len(rows),
                    [chain.score(Doc(r["text"], r["doc_id"], "docs", r["meta"])) for r in rows])
    again = classifier.train_classifier(q.classifier, other, SHARDS, SEED, quality=q,
                                        prescored=lambda shard: other / "minhash" / "prescores" / f"{shard}.parquet")
    assert again["domains"]["docs"]["labels"]["prescored"] == 200
    assert _digests(other / "classifier") == {**first,
                                              "manifest.json": _digests(other / "classifier")["manifest.json"]}
    assert {**again, "domains": None} == {**found, "domains": None}
    assert {**again["domains"]["docs"]["labels"], "prescored": 0} == found["domains"]["docs"]["labels"]
    for s in SHARDS:
        run_quality_shard(q, rdir, s, input_stage="minhash")                   # in the task's own process
    monkeypatch.setattr(quality_run, "PARALLEL_MIN_BYTES", 0)                   # every shard: a pool of two
    two = config_from_dict({"quality": {"workers": 2, "classifier": SETTINGS}}).quality
    for s in SHARDS:
        run_quality_shard(two, other, s, input_stage="minhash")
    for part in ("quality", "stats/quality"):
        assert _digests(other / part) == _digests(rdir / part)


def test_a_cut_from_a_sample_keeps_the_share_within_two_points(tmp_path):
    """A domain larger than its cut sample: 1,600 docstrings (four shards), cut_sample_docs 1,200 (the smallest
    hashes of seed and doc id), max_docs_per_class 100 (the training candidates are the first 200 of the same
    order).  The quality tasks score every document and count what the cut keeps: over the whole run 30 % +- 2
    points, the share the quality report (classifier_cut) and the corpus summary give.  The sampling error of a
    1,200-of-1,600 quantile is sqrt(0.3 x 0.7 / 1200 x 400 / 1599) = 0.66 points: over 200 other sample seeds on
    these scores the share was 30.04 % on average, SD 0.67, all within 2 points (1,000 of 1,600: SD 0.99, 93.5 %
    within; 200 of 1,600: SD 3.1)."""
    rdir = tmp_path / "run"
    texts = _docstrings(1600)
    shards = [f"docs-{i:05d}" for i in range(4)]
    for i, shard in enumerate(shards):
        _shard(rdir, shard, "docs", texts[400 * i:400 * (i + 1)])
    q = _quality(cut_sample_docs=1200, max_docs_per_class=100, keep_top_percent={"docs": 30})
    found = classifier.train_classifier(q.classifier, rdir, shards, SEED, quality=q)
    cut = found["cuts"]["docs"]
    assert (cut["sample_docs"], cut["domain_docs"], cut["cut_from"]) == (1200, 1600,
                                                                         "a sample of 1200 of 1600 documents")
    assert (cut["sample_kept"], found["domains"]["docs"]["labels"]["candidates"]) == (360, 200)
    sample = {r["doc_id"]: r[classifier.COLUMN] for r in
              read_parquet(rdir / "classifier" / "cut_sample.parquet").to_pylist()}
    stats = [run_quality_shard(q, rdir, s, input_stage="minhash") for s in shards]
    assert all(s["in_docs"] == s["kept_docs"] + sum(r["docs"] for r in s["removed"].values()) for s in stats)
    for s in shards:            # the quality tasks score a sampled document as the train step did
        t = read_parquet(scores_path(rdir, s))
        assert all(sample.get(i, v) == v for i, v in zip(t.column("doc_id").to_pylist(),
                                                          t.column(classifier.COLUMN).to_pylist(), strict=True))
    report = quality_report(rdir)
    measured = report["docs"]["classifier_cut"]
    assert measured["scored"] == 1600 and measured["share"] == round(measured["kept"] / 1600, 6)
    assert abs(measured["share"] - 0.30) <= 0.02, measured
    assert (f"classifier cut (keep top 30 %, from a sample of 1200 of 1600 documents): kept {measured['kept']} of "
            "1600 scored") in render_quality_report(report)
    assert classifier.measured_cut([json.loads(f.read_text()) for f in sorted(
        (rdir / "stats" / "quality").glob("*.json"))]) == {"docs": measured}


def test_ties_at_the_cut_are_split_by_hash_to_the_exact_share():
    """300 documents, 200 of them at one score: top 30 % keeps the 50 above it and 40 of the 200 chosen by hash."""
    hists = classifier_cut.Histograms()
    scores = [0.9] * 50 + [0.5] * 200 + [0.1] * 50
    ids = [f"d{i}" for i in range(300)]
    hists.add("web", scores)
    pc = classifier_cut.percent_cut(hists.h["web"], 30)
    assert pc == {"cut": 0.5, "docs": 300, "keep": 90, "above": 50, "at_cut": 200, "need": 40}
    tied = [i for i, s in zip(ids, scores, strict=True) if s == 0.5]
    tie_max = classifier_cut.tie_threshold(lambda: (classifier_cut.tie_unit(SEED, i) for i in tied), 40)
    cut = {"cut": 0.5, "tie_max": tie_max}
    assert sum(classifier_cut.decide(s, cut, SEED, i) for s, i in zip(scores, ids, strict=True)) == 90
    assert classifier_cut.keep_count(135, 30) == 41 and classifier_cut.keep_count(1, 30) == 1
