"""The quality classifier's training examples: which documents, labelled how, corrupted how.

Within a domain (``training: within_domain``, the default): the positives are the domain's documents that pass
every rule of its quality chain, the negatives its documents failing two or more rules plus corrupted copies of
positives (:func:`corrupted`).  A document failing exactly one rule is left out: one rule is often a near miss of a
threshold, two are a pattern.  Across domains (``training: cross_domain``): ``positive_domains`` (and
``positive_paths``) against ``negative_domains``, as DCLM does it.

Documents are drawn by a hash of (seed, doc id), the smallest first; every document gets a fold by another hash
(:func:`fold_of`), and a corrupted copy takes its original's, so no model sees a copy of a document it scores.
"""

from __future__ import annotations

import heapq
import json
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from pipeline.configkit import ConfigError
from pipeline.quality.classifier_cut import unit
from pipeline.quality.config import CLASSIFIER_CORRUPTIONS

#: corruptions of a positive that make a negative (:mod:`pipeline.quality.corruptions`): lines repeated 4x, words
#: shuffled within each line, navigation / boilerplate blocks around the text.  Not its exact copy: the same text
#: labelled both ways teaches a per-document model nothing (exact dedup removes copies).
CORRUPTIONS = CLASSIFIER_CORRUPTIONS


def fold_of(seed: int, doc_id: str, folds: int) -> int:
    """The fold of a document: the one model of the ``folds`` that never trains on it scores it."""
    return min(int(unit(seed, "fold", doc_id) * folds), folds - 1)


def corrupted(text: str, kind: str, seed: int, doc_id: str) -> str:
    """A corrupted copy of ``text``, the same for the same (seed, doc id): lines repeated or words shuffled as the
    ablation's positive control plants them, or boilerplate lines around it."""
    from pipeline.quality.corruptions import boilerplate, corrupt

    rng = random.Random(f"{seed}/classifier/{doc_id}")
    return boilerplate(text, rng) if kind == "boilerplate" else corrupt(text, kind, rng)[0]


# --------------------------------------------------------------------------------------------------------------
# Reading the shards

def smallest(pool: dict[str, list], key: str, k: int, u: float, item: tuple) -> None:
    """Keep the ``k`` items of smallest ``u`` per key (a max-heap by -u)."""
    heap = pool.setdefault(key, [])
    if len(heap) < k:
        heapq.heappush(heap, (-u, item))
    elif -heap[0][0] > u:
        heapq.heapreplace(heap, (-u, item))


def scan_ids(rdir: Path, shards: list[str], input_stage: str, seed: int,
             k: Callable[[str], int]) -> tuple[dict[str, list[tuple]], dict[str, int]]:
    """One read of the doc id and domain columns of every shard: per domain the ``k(domain)`` documents with the
    smallest hash (none where it is 0), as (u, doc_id, shard index, row) sorted by u; and every domain's document
    count.  The training candidates and the cut's score sample are prefixes of the same pool."""
    import pyarrow.parquet as pq

    pool: dict[str, list] = {}
    counts: dict[str, int] = {}
    size: dict[str, int] = {}
    for s, shard in enumerate(shards):
        path = rdir / input_stage / f"{shard}.parquet"
        if not path.exists():
            raise FileNotFoundError(f"classifier: input {path} does not exist (input_stage={input_stage!r})")
        ids = pq.read_table(path, columns=["doc_id", "domain"])
        for i, (doc_id, domain) in enumerate(zip(ids.column("doc_id").to_pylist(),
                                                 ids.column("domain").to_pylist(), strict=True)):
            counts[domain] = counts.get(domain, 0) + 1
            if (n := size.get(domain)) is None:
                n = size[domain] = k(domain)
            if n:
                smallest(pool, domain, n, unit(seed, "sample", doc_id), (doc_id, s, i))
    return ({d: sorted((-nu, *item) for nu, item in heap) for d, heap in sorted(pool.items())},
            dict(sorted(counts.items())))


def read_rows(rdir: Path, shards: list[str], input_stage: str, picks: list[tuple],
              columns: tuple[str, ...] = ("text",)) -> Iterator[tuple[str, dict]]:
    """(doc_id, {column: value}) of the picked (u, doc_id, shard index, row) documents, one shard at a time, reading
    only the row groups (1,024 rows) that hold picked rows, so only those rows of one shard are held."""
    import numpy as np
    import pyarrow.parquet as pq

    by_shard: dict[int, list[tuple]] = {}
    for p in picks:
        by_shard.setdefault(p[2], []).append(p)
    for s in sorted(by_shard):
        pf = pq.ParquetFile(rdir / input_stage / f"{shards[s]}.parquet", pre_buffer=False)
        names = [c for c in columns if c in pf.schema_arrow.names]
        rows = np.array(sorted(p[3] for p in by_shard[s]), dtype=np.int64)
        md = pf.metadata
        starts = np.cumsum([0] + [md.row_group(g).num_rows for g in range(md.num_row_groups)])
        group_of = np.searchsorted(starts, rows, side="right") - 1
        groups = np.unique(group_of)
        table = pf.read_row_groups(groups.tolist(), columns=names, use_threads=False)
        base = np.concatenate([[0], np.cumsum(starts[groups + 1] - starts[groups])])
        table = table.take(base[np.searchsorted(groups, group_of)] + rows - starts[group_of])
        values = {c: table.column(c).to_pylist() for c in names}
        del table
        at = {int(r): j for j, r in enumerate(rows)}
        for _, doc_id, _, r in by_shard[s]:
            yield doc_id, {c: values[c][at[r]] for c in names}


def read_positive_paths(cc: Any) -> list[tuple[str, str, str]]:
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


# --------------------------------------------------------------------------------------------------------------
# Heuristic labels

def failed_rules(chain: Any, row: dict) -> list[str]:
    """Every rule of the chain that a score row fails (not only the first, which is all ``Chain.decide`` says).
    Filters decide through ``Filter.first`` over all their rules' checks, already evaluated; an instance attribute
    on this private chain's filters collects them.  A filter that returns before it checks every rule (C4's
    lorem ipsum and curly bracket, code's auto-generated and XML tests) counts the rule it names."""
    out: list[str] = []
    for f in chain.filters:
        seen: list = []

        def first(*drops, _seen=seen):
            hits = [d for d in drops if d]
            _seen.extend(hits)
            return hits[0] if hits else None

        f.first = first
        try:
            drop = f.decide({k: row[f.column(k)] for k in f.score_names})
        finally:
            del f.first
        names = {r for r, _ in seen} | ({drop[0]} if drop else set())
        out.extend(sorted(names))
    return out


def within_domain_sample(cc: Any, quality: Any, rdir: Path, shards: list[str], input_stage: str, seed: int,
                         domain: str, picks: list[tuple],
                         prescored: Callable[[str], Path] | None) -> tuple[list, dict]:
    """The labelled training examples of one domain from its candidates ``picks`` (smallest hashes first), and
    counts of what the chain said.  Each example: {doc_id, domain, u, text (first max_chars), class pos/neg,
    source heuristics_pass / heuristics_failed / corrupt:<kind>, failed (rules), fold}.  The chain's score rows
    come from MinHash stage 1's prescores where valid (:mod:`pipeline.quality.prescored`), else are computed
    here, on the whole text."""
    from pipeline.quality.filters.basic import LANG_COLUMNS
    from pipeline.quality.filters.chain import Chain
    from pipeline.quality.filters.text import Doc
    from pipeline.quality.prescored import read_prescores

    chain = Chain.build(quality, domain)             # private: failed_rules sets attributes on its filters
    stored: dict[str, dict | None] = {}
    if prescored is not None:
        by_shard: dict[int, list[str]] = {}
        for p in picks:
            by_shard.setdefault(p[2], []).append(p[1])
        for s, ids in sorted(by_shard.items()):
            got = read_prescores(prescored(shards[s]), quality, {domain: chain}, ids, [domain] * len(ids))
            stored.update((i, r) for i, r in zip(ids, got, strict=True) if r is not None)
    u_of = {p[1]: p[0] for p in picks}
    counts = {"candidates": len(picks), "pass": 0, "failed_one": 0, "failed_two_or_more": 0, "prescored": len(stored)}
    labelled = []
    for doc_id, r in read_rows(rdir, shards, input_stage, picks, ("text", "meta", *LANG_COLUMNS)):
        score_row = stored.pop(doc_id, None)
        if score_row is None:
            doc = Doc(r["text"], doc_id, domain, r.get("meta"), {c: r[c] for c in LANG_COLUMNS if c in r})
            try:
                score_row = chain.score(doc)
            except Exception as exc:
                raise ValueError(f"classifier: scoring document {doc_id} of domain {domain} with chain "
                                 f"{chain.names()} failed: {type(exc).__name__}: {exc}") from exc
        failed = failed_rules(chain, score_row)
        key = "pass" if not failed else "failed_one" if len(failed) == 1 else "failed_two_or_more"
        counts[key] += 1
        if key != "failed_one":             # only the first max_chars are kept
            labelled.append({"doc_id": doc_id, "domain": domain, "u": u_of[doc_id], "text": r["text"][:cc.max_chars],
                             "failed": failed, "fold": fold_of(seed, doc_id, cc.folds),
                             "class": "pos" if not failed else "neg",
                             "source": "heuristics_pass" if not failed else "heuristics_failed"})
    labelled.sort(key=lambda d: (d["u"], d["doc_id"]))
    pos = [d for d in labelled if d["class"] == "pos"]
    neg = [d for d in labelled if d["class"] == "neg"]
    pos, neg = pos[:cc.max_docs_per_class], neg[:cc.max_docs_per_class]
    kinds = list(cc.corruptions)
    for p in pos:
        if kinds and unit(seed, "corrupt", p["doc_id"]) < cc.corrupt_share:
            kind = kinds[min(int(unit(seed, "corrupt_kind", p["doc_id"]) * len(kinds)), len(kinds) - 1)]
            cid = f"{p['doc_id']}#{kind}"
            neg.append({**p, "doc_id": cid, "u": unit(seed, "sample", cid), "class": "neg",
                        "source": f"corrupt:{kind}", "failed": [],
                        "text": corrupted(p["text"], kind, seed, p["doc_id"])[:cc.max_chars]})
    neg.sort(key=lambda d: (d["u"], d["doc_id"]))
    return [*pos, *neg[:cc.max_docs_per_class]], counts


def cross_domain_sample(cc: Any, rdir: Path, shards: list[str], input_stage: str, seed: int,
                        pools: dict[str, list[tuple]]) -> list[dict]:
    """Positive domains and files against negative domains: per class the ``max_docs_per_class`` smallest hashes
    over its domains (and files)."""
    k = cc.max_docs_per_class
    out = []
    files = read_positive_paths(cc)
    for cls, domains in (("pos", cc.positive_domains), ("neg", cc.negative_domains)):
        members = [(u, doc_id, s, r, dom) for dom in domains for u, doc_id, s, r in pools.get(dom, [])]
        if cls == "pos":
            members += [(unit(seed, "sample", doc_id), doc_id, -1, i, key) for i, (key, doc_id, _) in enumerate(files)]
        members = sorted(members, key=lambda m: (m[0], m[1]))[:k]
        texts = {doc_id: r["text"][:cc.max_chars] for doc_id, r in
                 read_rows(rdir, shards, input_stage, [m[:4] for m in members if m[2] >= 0])}
        for u, doc_id, s, i, dom in members:
            text = texts[doc_id] if s >= 0 else files[i][2]
            out.append({"doc_id": doc_id, "domain": dom, "u": u, "text": text[:cc.max_chars], "class": cls,
                        "source": f"domain:{dom}" if s >= 0 else dom, "failed": [],
                        "fold": fold_of(seed, doc_id, cc.folds)})
    return out


def balance(cc: Any, docs: list[dict]) -> None:
    """Mark each example train, or unused when ``balance: equal`` cuts the larger class to the smaller's size
    (docs are in hash order, so the surplus is a uniform sample)."""
    for d in docs:
        d["split"] = "train"
    if cc.balance == "equal":
        by_class = {c: sorted((d for d in docs if d["class"] == c), key=lambda d: (d["u"], d["doc_id"]))
                    for c in ("pos", "neg")}
        n = min(len(v) for v in by_class.values())
        for members in by_class.values():
            for d in members[n:]:
                d["split"] = "unused"
