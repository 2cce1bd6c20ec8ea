"""Domain mixture: how many times each tokenized document goes into training, decided by hashes, never an RNG.

Sits after tokenization, so budgets are exact token counts (or characters with ``unit: chars``).  One global
task, :func:`plan_mixture`, streams the small columns of every ``tokenize/<shard>.parquet`` three times:

1. held-out validation candidates per domain (:mod:`pipeline.sink.validation`);
2. decontamination of the candidates against the training documents (the same text), and per domain a histogram
   of training sizes over ``BUCKETS`` buckets of ``mix_key(seed, domain, doc_id)``; then the held-out documents'
   tokens and the index of their runs of ``heldout_ngram`` tokens (:mod:`pipeline.sink.heldout_overlap`: the
   scatter tasks drop training documents that overlap them);
3. the decisions: ``mixture/<shard>.parquet`` (doc_id, split, copies) aligned row by row with the tokenized
   shard, plus ``stats/mixture/<shard>.json`` (in = kept + removed by reason).

Budget: with target share ``w_d`` and ``A_d`` training tokens available, domain ``d`` gets ``T_d = w_d * T``
tokens, i.e. ``r_d = T_d / A_d`` epochs, capped at ``max_epochs`` (upsampling cap).  ``T`` is ``total_tokens``, or
when that is 0 the largest budget not above the corpus at which every domain meets its share within the cap
(so the shares are met exactly and nothing is repeated more than needed).  With an explicit ``T`` a domain
that hits the cap keeps ``A_d * max_epochs`` and its deficit goes to the others in proportion to their weights;
the report flags it as ``capped``.  A document is repeated ``floor(r_d)`` times, plus once more when its key lies
below the domain's threshold, chosen at a bucket boundary so the selected sizes come closest to the fractional
part of ``r_d``: downsampling (``r_d < 1``) and upsampling are the same rule, a document's fate depends only on
(doc id, seed, domain) and the domain's threshold, and the error is at most half a bucket (one document in small
corpora).  The report (``mixture/report.json``) shows target vs achieved shares in tokens and documents, epochs,
held-out counts and bytes per token per domain.

Memory: one shard's small columns at a time (about 150 bytes per document of the shard), the held-out heaps
(``2 * val_max_docs + 16`` entries of ~200 bytes per domain) and one ``BUCKETS``-float histogram per domain
(512 KiB): bounded by the configuration, not by the corpus.  Time is linear in documents (three passes).
"""

from __future__ import annotations

import math
from pathlib import Path

from pipeline.configkit import ConfigError
from pipeline.io import (
    completed,
    count_removed,
    new_stats,
    read_json,
    read_parquet,
    write_json,
    write_marker,
    write_parquet,
    write_stats,
)
from pipeline.sink import heldout_overlap
from pipeline.sink.config import MixtureConfig
from pipeline.sink.validation import HELDOUT_FILE, HeldoutSelector, resolve_heldout, unit_key

BUCKETS = 1 << 16
COLUMNS = ["doc_id", "domain", "n_tokens", "n_chars", "n_bytes", "text_hash"]


def mix_key(seed: int, domain: str, doc_id: str) -> float:
    return unit_key("mixture", seed, domain, doc_id)


def _bucket(seed: int, domain: str, doc_id: str) -> int:
    return min(int(mix_key(seed, domain, doc_id) * BUCKETS), BUCKETS - 1)


def _shard_rows(rdir: Path, shard: str):
    t = read_parquet(rdir / "tokenize" / f"{shard}.parquet", columns=COLUMNS)
    return t, zip(*(t.column(c).to_pylist() for c in COLUMNS), strict=True)


def domain_targets(avail: dict[str, int], weights: dict, max_epochs: float, total: int,
                   matched: bool = False) -> dict[str, float]:
    """Target size per domain (see the module docstring); ``avail`` is the training size per domain.
    ``matched``: each domain's weight of ``total`` exactly, or a ConfigError naming the domain over the cap."""
    domains = sorted(avail)
    if weights:
        missing = [d for d in domains if d not in weights]
        if missing:
            raise ConfigError(f"mixture.weights: domain {missing[0]!r} has no weight (domains: {domains}); "
                              "give every domain a weight, 0 to drop it")
        unknown = sorted(set(weights) - set(domains))
        if unknown:
            raise ConfigError(f"mixture.weights.{unknown[0]}: no documents of this domain reach the mixture "
                              f"(domains with documents: {domains})")
        empty = [d for d in domains if weights[d] > 0 and avail[d] == 0]
        if empty:
            raise ConfigError(f"mixture.weights.{empty[0]}: weight > 0 but no training documents are left")
        w = {d: float(weights[d]) for d in domains}
    else:
        w = {d: float(avail[d]) for d in domains}
    norm = sum(w.values()) or 1.0
    w = {d: v / norm for d, v in w.items()}
    cap = {d: avail[d] * max_epochs for d in domains}
    if matched:
        over = [d for d in domains if w[d] * total > cap[d] + 1e-9]
        if over:
            d = over[0]
            raise ConfigError(f"mixture.matched: domain {d!r} needs {w[d] * total:,.0f} of its {avail[d]:,} training "
                              f"tokens, {w[d] * total / max(avail[d], 1):.2f} epochs, over mixture.max_epochs "
                              f"{max_epochs:g}; lower mixture.total_tokens or this domain's weight")
        return {d: w[d] * total for d in domains}
    if not total:
        feasible = [cap[d] / w[d] for d in domains if w[d] > 0]
        total = min([sum(avail.values())] + feasible)
        return {d: w[d] * total for d in domains}
    target, free, budget = {}, [d for d in domains if w[d] > 0], float(total)
    while free:   # water-filling: capped domains keep their cap, the rest share what is left by weight
        wsum = sum(w[d] for d in free)
        over = [d for d in free if w[d] / wsum * budget > cap[d]]
        if not over:
            target.update({d: w[d] / wsum * budget for d in free})
            break
        for d in over:
            target[d] = cap[d]
            budget -= cap[d]
            free.remove(d)
    return {d: target.get(d, 0.0) for d in domains}


def _threshold(hist, rest: float) -> int:
    """Bucket boundary b whose cumulative size (buckets < b) is closest to ``rest``."""
    import numpy as np

    cum = np.concatenate([[0.0], np.cumsum(hist)])
    b = int(np.searchsorted(cum, rest))
    if b > 0 and (b > len(hist) or abs(cum[b - 1] - rest) <= abs(cum[b] - rest)):
        b -= 1
    return min(b, len(hist))


def _check_matched(mc: MixtureConfig, hist: dict, rules: dict) -> None:
    """A matched mixture's selection (whole documents) must meet each domain's target within
    ``mixture.matched_tolerance``, or the run stops naming the domain: arms that silently train on different
    tokens per domain would measure the mixture, not the data."""
    for d, rule in sorted(rules.items()):
        if not rule["target"]:
            continue
        got = rule["full"] * float(hist[d].sum()) + float(hist[d][:rule["extra_below_bucket"]].sum())
        miss = abs(got - rule["target"]) / rule["target"]
        if miss > mc.matched_tolerance:
            raise ConfigError(f"mixture.matched: domain {d!r} can get {got:,.0f} of its {rule['target']:,.0f} "
                              f"target {mc.unit} ({miss:.1%} off, over mixture.matched_tolerance "
                              f"{mc.matched_tolerance:g}): the selection takes whole documents and this domain's "
                              f"are too large for its target; cut them into pieces (the ablation's "
                              f"ablation.piece_bytes) or raise mixture.total_tokens")


def plan_mixture(mc: MixtureConfig, rdir: Path, shards: list[str], seed: int) -> dict:
    """Decide held-out documents and copies per training document; write decisions, stats and the report.

    The three passes over the shards of the module docstring: :func:`_heldout_candidates`,
    :func:`_heldout_and_histogram`, then (after the rules and the held-out files) :func:`_write_decisions`."""
    import pyarrow as pa

    plan_path = rdir / "mixture" / "plan.json"
    if (done := completed(plan_path)) and (rdir / "mixture" / heldout_overlap.TOKENS_FILE).exists() and \
            heldout_overlap.index_written(rdir, heldout_overlap.plan_index(rdir)):
        return done["report"]
    shards = sorted(shards)
    sel = _heldout_candidates(mc, rdir, shards, seed)
    held, dropped, hist = _heldout_and_histogram(mc, rdir, shards, seed, sel)
    held_ids = {h[2] for h in held}
    dropped_ids = {d[2] for d in dropped}
    avail = {d: int(h.sum()) for d, h in hist.items()}
    targets = domain_targets(avail, mc.weights, mc.max_epochs, mc.total_tokens, mc.matched)
    rules = {}
    for d, target in targets.items():
        epochs = target / avail[d] if avail[d] else 0.0
        full = math.floor(epochs + 1e-12)
        rules[d] = {"full": full, "extra_below_bucket": _threshold(hist[d], target - full * avail[d]),
                    "epochs": epochs, "target": target}
    if mc.matched:
        _check_matched(mc, hist, rules)
    write_parquet(pa.table({"doc_id": pa.array([h[2] for h in held], pa.string()),
                            "domain": pa.array([h[0] for h in held], pa.string()),
                            "shard": pa.array([h[4] for h in held], pa.string()),
                            "heldout_key": pa.array([h[1] for h in held], pa.float64())}),
                  rdir / "mixture" / HELDOUT_FILE)
    overlap_index = heldout_overlap.write_heldout(rdir, held, mc.heldout_ngram, mc.heldout_overlap)
    acc = _write_decisions(rdir, shards, seed, targets, rules, held_ids, dropped_ids)
    report = _report(mc, seed, targets, rules, acc, avail, len(dropped))
    write_json(rdir / "mixture" / "report.json", report)
    write_json(plan_path, {"seed": seed, "unit": mc.unit, "buckets": BUCKETS, "rules": rules,
                           "heldout_index": overlap_index})
    write_marker(plan_path, {"report": report})
    return report


def _heldout_candidates(mc: MixtureConfig, rdir: Path, shards: list[str], seed: int) -> HeldoutSelector:
    """Pass 1: every document offered to the held-out selection of its domain."""
    sel = HeldoutSelector(seed, mc.val_fraction, mc.val_min_docs, mc.val_max_docs)
    for shard in shards:
        _, rows = _shard_rows(rdir, shard)
        for did, dom, _, _, _, th in rows:
            sel.add(dom, did, th, shard)
    return sel


def _heldout_and_histogram(mc: MixtureConfig, rdir: Path, shards: list[str], seed: int,
                           sel: HeldoutSelector) -> tuple[list, list, dict]:
    """Pass 2: the candidates whose text also occurs among the training documents are dropped (``resolve_heldout``),
    and per domain the training sizes are summed into ``BUCKETS`` buckets of the mixture key. Returns (held,
    dropped, histogram per domain)."""
    import numpy as np

    ranked = sel.ranked()
    heap_ids = {e[1] for _, entries in ranked.values() for e in entries}
    heap_hashes = {e[2] for _, entries in ranked.values() for e in entries}
    size_col = 2 if mc.unit == "tokens" else 3
    hist = {d: np.zeros(BUCKETS) for d in sel.n_docs}
    outside_hashes: set[str] = set()
    heap_size: dict[str, int] = {}
    for shard in shards:
        _, rows = _shard_rows(rdir, shard)
        for row in rows:
            if row[0] in heap_ids:
                heap_size[row[0]] = row[size_col]
                continue
            if row[5] in heap_hashes:
                outside_hashes.add(row[5])
            hist[row[1]][_bucket(seed, row[1], row[0])] += row[size_col]
    held, dropped = resolve_heldout(ranked, outside_hashes)
    held_ids = {h[2] for h in held}
    dropped_ids = {d[2] for d in dropped}
    for dom, (_, entries) in ranked.items():     # heap entries neither held out nor dropped train after all
        for _, did, _, _ in entries:
            if did not in held_ids and did not in dropped_ids:
                hist[dom][_bucket(seed, dom, did)] += heap_size[did]
    return held, dropped, hist


def _write_decisions(rdir: Path, shards: list[str], seed: int, targets: dict, rules: dict, held_ids: set,
                     dropped_ids: set) -> dict:
    """Pass 3: per shard, each document's split and copies (``mixture/<shard>.parquet``) and the shard's stats;
    returns the per-domain totals the report is made of."""
    import pyarrow as pa

    acc = {d: {"docs": 0, "unique_docs": 0, "tokens": 0, "chars": 0, "val_docs": 0, "val_tokens": 0,
               "bytes": 0, "all_tokens": 0} for d in targets}
    for shard in shards:
        t, rows = _shard_rows(rdir, shard)
        split, copies = [], []
        stats = None
        for did, dom, n_tok, n_chars, n_bytes, _ in rows:
            a = acc[dom]
            stats = stats or new_stats(dom)
            stats["in_docs"] += 1
            stats["in_bytes"] += n_bytes
            a["bytes"] += n_bytes
            a["all_tokens"] += n_tok
            c = 0
            if did in held_ids:
                split.append("validation")
                a["val_docs"] += 1
                a["val_tokens"] += n_tok
                count_removed(stats, "heldout_validation", n_bytes)
            elif did in dropped_ids:
                split.append("dropped")
                count_removed(stats, "duplicate_of_heldout", n_bytes)
            else:
                split.append("train")
                rule = rules[dom]
                c = rule["full"] + (_bucket(seed, dom, did) < rule["extra_below_bucket"])
                if c:
                    stats["kept_docs"] += 1
                    stats["kept_bytes"] += n_bytes
                    a["unique_docs"] += 1
                    a["docs"] += c
                    a["tokens"] += c * n_tok
                    a["chars"] += c * n_chars
                else:
                    count_removed(stats, "mixture_zero_weight" if rule["target"] == 0 else "mixture_downsampled",
                                  n_bytes)
            copies.append(c)
        stats = stats or new_stats(shard.rsplit("-", 1)[0])
        stats["copies"] = int(sum(copies))
        write_parquet(pa.table({"doc_id": t.column("doc_id"), "split": pa.array(split, pa.string()),
                                "copies": pa.array(copies, pa.int32())}), rdir / "mixture" / f"{shard}.parquet")
        write_stats(rdir, "mixture", shard, stats)
    return acc


def _report(mc, seed, targets, rules, acc, avail, n_dropped) -> dict:
    total_target = sum(targets.values()) or 1.0
    key = "tokens" if mc.unit == "tokens" else "chars"
    tot = {k: sum(a[k] for a in acc.values()) or 1 for k in ("docs", "tokens", "chars")}
    domains = {}
    for d, a in sorted(acc.items()):
        domains[d] = {
            "target_share": targets[d] / total_target, "achieved_share": a[key] / tot[key],
            "achieved_token_share": a["tokens"] / tot["tokens"], "achieved_doc_share": a["docs"] / tot["docs"],
            "target": round(targets[d]), "available": avail[d], "epochs": rules[d]["epochs"],
            "capped": rules[d]["epochs"] >= mc.max_epochs - 1e-9 and targets[d] > 0,
            "selected_docs": a["docs"], "unique_docs": a["unique_docs"], "selected_tokens": a["tokens"],
            "selected_chars": a["chars"], "val_docs": a["val_docs"], "val_tokens": a["val_tokens"],
            "bytes_per_token": a["bytes"] / a["all_tokens"] if a["all_tokens"] else None}
    worst = max((abs(v["achieved_share"] - v["target_share"]) for v in domains.values()), default=0.0)
    return {"unit": mc.unit, "seed": seed, "max_epochs": mc.max_epochs, "total_target": round(total_target),
            "total_selected_tokens": sum(a["tokens"] for a in acc.values()),
            "total_selected_docs": sum(a["docs"] for a in acc.values()), "max_share_error": worst,
            "dropped_duplicates_of_heldout": n_dropped, "domains": domains}


def load_report(rdir: Path) -> dict:
    return read_json(rdir / "mixture" / "report.json")
