"""The run's near-duplicate report (``minhash/report.json``): what was found, what was removed, and examples.

A reviewer should be able to see *why* documents went: per domain and reason the removed documents and bytes
(from the stage-4 stats), the cluster-size histogram, how many LSH candidates the Jaccard check rejected, the
S-curve of the configured bands × rows, and a few example clusters with the spans where a removed document
differs from the one that was kept (word-level diff, context included).

Cost: one small stats JSON per shard, plus two rows per example.  Stage 3 chooses the example clusters while its
decisions are in memory (:func:`pipeline.dedup.minhash.clusters.decide.select_examples`, stored in the clusters summary
with the global ids of the rows to compare), so this task opens no decisions file and reads no doc-id column.
"""

from __future__ import annotations

import difflib
from pathlib import Path

import numpy as np

from pipeline.dedup.minhash.config import MinhashConfig, check_config, curve_threshold, s_curve
from pipeline.dedup.minhash.layout import (
    gid_to_shard,
    input_path,
    read_manifest,
    read_rows,
    report_path,
)
from pipeline.dedup.minhash.verify import is_index
from pipeline.io import read_json, write_json

_MAX_WORDS = 4000
_CONTEXT = 6


def differing_spans(kept: str, removed: str, limit: int = 5) -> list[dict]:
    """Word-level spans where ``removed`` differs from ``kept`` (first _MAX_WORDS words of each)."""
    a, b = kept.split()[:_MAX_WORDS], removed.split()[:_MAX_WORDS]
    spans = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        spans.append({"op": tag, "kept": " ".join(a[i1:i2]), "removed": " ".join(b[j1:j2]),
                      "context": " ".join(a[max(0, i1 - _CONTEXT):i1]), "kept_word": i1, "removed_word": j1})
        if len(spans) >= limit:
            break
    return spans


def _texts(rdir: Path, manifest: dict, gids: list[int]) -> dict[int, str]:
    """Texts of current-run global ids: only the row groups that hold them, one file open per shard."""
    shard_idx, rows = gid_to_shard(manifest, np.asarray(gids, np.uint64))
    found: dict[int, str] = {}
    for s in np.unique(shard_idx):
        sel = np.flatnonzero(shard_idx == s)
        path = input_path(rdir, manifest["input_stage"], manifest["shards"][int(s)]["shard"])
        texts = read_rows(path, rows[sel], ["text"]).column(0).to_pylist()
        found.update({int(gids[i]): t for i, t in zip(sel, texts, strict=True)})
    return found


def write_report(rdir: Path, cfg: MinhashConfig) -> dict:
    """Write ``minhash/report.json`` (after stage 4) and return it."""
    cfg = check_config(cfg)
    rdir = Path(rdir)
    if not cfg.enabled:
        report = {"enabled": False}
        write_json(report_path(rdir), report)
        return report
    manifest = read_manifest(rdir, cfg.digest())
    from pipeline.dedup.minhash.clusters import write_summary

    summary = write_summary(rdir, cfg)
    per_domain: dict[str, dict] = {}
    for entry in manifest["shards"]:
        stats_file = rdir / "stats" / "minhash" / f"{entry['shard']}.json"
        if not stats_file.exists():
            continue
        s = read_json(stats_file)
        d = per_domain.setdefault(s["domain"], {"in_docs": 0, "kept_docs": 0, "in_bytes": 0, "kept_bytes": 0,
                                                "removed": {}})
        for k in ("in_docs", "kept_docs", "in_bytes", "kept_bytes"):
            d[k] += s[k]
        for reason, v in s["removed"].items():
            r = d["removed"].setdefault(reason, {"docs": 0, "bytes": 0})
            r["docs"] += v["docs"]
            r["bytes"] += v["bytes"]
    examples = _examples(rdir, manifest, summary["examples"])
    report = {
        "config": {"bands": cfg.bands, "rows": cfg.rows, "num_perm": cfg.num_perm, "seed": cfg.seed,
                   "scheme": cfg.scheme, "threshold": cfg.threshold, "jaccard_check": cfg.jaccard_check,
                   "curve_threshold": round(curve_threshold(cfg.bands, cfg.rows), 4),
                   "candidate_probability": s_curve(cfg.bands, cfg.rows), "survivor_order": cfg.survivor_order,
                   "fingerprint": cfg.fingerprint()},
        "docs": manifest["docs"], "shards": len(manifest["shards"]),
        "clusters": summary["clusters"], "docs_in_clusters": summary["docs_in_clusters"],
        "largest_cluster": summary["largest_cluster"], "cluster_sizes": summary["cluster_sizes"],
        "candidate_edges": summary["candidate_edges"], "distinct_pairs": summary["distinct_pairs"],
        "false_positives_rejected": summary["false_positives"],
        "member_pairs": summary.get("member_pairs", 0), "member_pairs_passed": summary.get("member_pairs_passed", 0),
        "index": {"releases": summary["index_releases"], "pairs": summary["index_pairs"],
                  "rejected": summary["index_false_positives"]},
        "removed": summary["removed"], "per_domain": per_domain, "examples": examples,
        "clustering": {k: summary[k] for k in ("tasks", "rounds", "residual_edges")},
    }
    write_json(report_path(rdir), report)
    return report


def _examples(rdir: Path, manifest: dict, chosen: list[dict]) -> list[dict]:
    """Stage 3's chosen clusters, each with its first removed member diffed against the survivor."""
    gids = np.unique(np.array([g for ex in chosen for g in (ex["kept_gid"], ex["removed_gid"])], np.uint64))
    texts = _texts(rdir, manifest, gids[~is_index(gids)].tolist())
    out = []
    for ex in chosen:
        item = {k: ex[k] for k in ("cluster", "kept", "removed", "removed_count", "reason", "similarity")}
        kept, did = texts.get(ex["kept_gid"]), texts.get(ex["removed_gid"])
        if kept is not None and did is not None:
            item["compared"] = ex["removed"][0]
            item["differing_spans"] = differing_spans(kept, did)
        else:
            item["note"] = "kept document belongs to an earlier release; its text is not re-read"
        out.append(item)
    return out
