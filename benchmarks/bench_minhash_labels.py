"""Labelled near-duplicate pairs for bench_minhash.py: precision / recall / F1 and the found share per band.

Labels are built by their own tokenization (:func:`label_shingles`), not the deduplicator's shingles, so
precision is not 1.0 by construction; pairs are planted equally across label-Jaccard bands 0.5–1.0.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


BANDS = ((0.5, 0.6), (0.6, 0.7), (0.7, 0.8), (0.8, 0.9), (0.9, 1.0))


def label_shingles(words: list[str]) -> set[tuple[str, ...]]:
    """The labels' own tokenization, unlike the deduplicator's: whitespace tokens kept as they are (case,
    punctuation and digits untouched, where the deduplicator lowercases, splits on punctuation and folds digits),
    in 4-grams (the deduplicator uses 5-grams)."""
    return {tuple(words[i:i + 4]) for i in range(max(1, len(words) - 3))}


def label_jaccard(a: set, b: set) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0


def _edit_to(words: list[str], target: float, vocab: list[str], rng) -> tuple[list[str], float]:
    """Random substitutions / deletions / insertions until the label Jaccard drops to ``target``."""
    base = label_shingles(words)
    cur = list(words)
    j = 1.0
    step = max(1, len(words) // 400)
    while j > target:
        for _ in range(step):
            i = rng.randrange(len(cur))
            op = rng.random()
            if op < 0.6:
                cur[i] = rng.choice(vocab)
            elif op < 0.8 and len(cur) > 50:
                del cur[i]
            else:
                cur.insert(i, rng.choice(vocab))
        j = label_jaccard(base, label_shingles(cur))
    return cur, j


def _band(j: float) -> str:
    lo = next((lo for lo, hi in BANDS if lo <= j < hi), BANDS[-1][0] if j >= BANDS[-1][0] else BANDS[0][0])
    return f"{lo:.1f}-{lo + 0.1:.1f}"


def bench_quality(records, pairs: int, tmp: Path) -> dict:
    """Planted pairs, equally many per label-Jaccard band of BANDS; labels from :func:`label_shingles`."""
    import random

    sys.path.insert(0, str(REPO))
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline.dedup.minhash import MinhashConfig, run_minhash
    from pipeline.io import write_marker, write_parquet

    rng = random.Random(1234)
    bases = []
    for dom in ("books", "web", "academic", "long", "encyclopedia"):
        for r in records.get(dom, []):
            if r["meta"].get("dup_group"):
                continue
            words = r["text"].split()
            for k in range(0, len(words), 1500):
                if len(words[k:k + 1500]) >= 300:
                    bases.append((f"{r['id']}@{k}", words[k:k + 1500]))
    rng.shuffle(bases)
    bases = bases[:pairs]
    vocab = sorted({w for _, ws in bases for w in ws})
    docs, truth = [], {}
    for i, (_, words) in enumerate(bases):
        lo, hi = BANDS[i % len(BANDS)]
        target = rng.uniform(lo, hi) if hi < 1.0 else rng.uniform(lo, 1.0)
        edited, j = _edit_to(words, target, vocab, rng) if target < 1.0 else (list(words), 1.0)
        docs += [{"id": f"b{i}", "text": " ".join(words)}, {"id": f"v{i}", "text": " ".join(edited)}]
        truth[i] = j
    results = {}
    for check in (True, False):
        rdir = tmp / f"quality-{check}" / "runs" / "q"
        shards = []
        for k in range(0, len(docs), 500):
            part = docs[k:k + 500]
            name = f"web-{k // 500:05d}"
            path = rdir / "exact_dedup" / f"{name}.parquet"
            write_parquet(pa.table({"doc_id": [d["id"] for d in part], "domain": ["web"] * len(part),
                                    "source": ["bench"] * len(part), "text": [d["text"] for d in part]}), path)
            write_marker(path)
            shards.append(name)
        cfg = MinhashConfig(jaccard_check=check)
        report = run_minhash(rdir, shards, cfg, rdir.parent.parent)
        cluster = {}
        for s in shards:
            for r in pq.read_table(rdir / "minhash" / "clusters" / f"{s}.parquet").to_pylist():
                cluster[r["doc_id"]] = r["cluster"]
                cluster[r["kept_doc_id"]] = r["cluster"]
        tp = fp = fn = tn = 0
        bins: dict[str, list[int]] = {}
        for i, j in truth.items():
            pred = f"b{i}" in cluster and cluster.get(f"b{i}") == cluster.get(f"v{i}")
            pos = j >= cfg.threshold
            tp += pred and pos
            fp += pred and not pos
            fn += pos and not pred
            tn += not pos and not pred
            bins.setdefault(_band(j), [0, 0])
            bins[_band(j)][0] += 1
            bins[_band(j)][1] += pred
        precision = tp / max(1, tp + fp)
        recall = tp / max(1, tp + fn)
        key = "check_on" if check else "check_off"
        results[key] = {
            "tp": tp, "fp": fp, "fn": fn, "tn": tn, "precision": round(precision, 4), "recall": round(recall, 4),
            "f1": round(2 * precision * recall / max(1e-9, precision + recall), 4),
            # share of planted pairs found per label-Jaccard band: recall in the bands >= the threshold, the
            # false-positive rate in those below it
            "found_share_by_band": {k: round(v[1] / v[0], 4) for k, v in sorted(bins.items())},
            "pairs_by_band": {k: v[0] for k, v in sorted(bins.items())},
            "member_pairs": report.get("member_pairs"), "member_pairs_passed": report.get("member_pairs_passed")}
        print(f"  quality check={check}: P={precision:.4f} R={recall:.4f} F1={results[key]['f1']} "
              f"per band {results[key]['found_share_by_band']}", flush=True)
    results["pairs"] = len(truth)
    results["positives"] = sum(j >= 0.8 for j in truth.values())
    results["labels"] = ("whitespace tokens as written (case, punctuation, digits kept), 4-grams; the deduplicator: "
                         "lowercased letter/digit runs, digits folded, 5-grams")
    return results
