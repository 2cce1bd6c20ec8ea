"""The run's near-duplicate report (``minhash/report.json``): what was found, what was removed, and examples.

A reviewer should be able to see *why* documents went: per domain and reason the removed documents and bytes
(from the stage-4 stats), the cluster-size histogram, how many LSH candidates the Jaccard check rejected, the
S-curve of the configured bands × rows, and a few example clusters with the spans where a removed document
differs from the one that was kept (word-level diff, context included).
"""

from __future__ import annotations

import difflib
from pathlib import Path

import numpy as np

from pipeline.dedup.minhash.config import MinhashConfig, check_config, curve_threshold, s_curve
from pipeline.dedup.minhash.layout import clusters_summary_path, decisions_path, input_path, read_manifest, report_path
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


def _texts(rdir: Path, manifest: dict, doc_ids: set[str]) -> dict[str, str]:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    found: dict[str, str] = {}
    want = pa.array(sorted(doc_ids), pa.string())
    for entry in manifest["shards"]:
        path = input_path(rdir, manifest["input_stage"], entry["shard"])
        ids = pq.read_table(path, columns=["doc_id"]).column(0).cast(pa.string())
        rows = np.flatnonzero(pc.is_in(ids, value_set=want).to_numpy(zero_copy_only=False))
        if len(rows):
            t = pq.read_table(path, columns=["doc_id", "text"]).take(rows)
            found.update(zip(t.column(0).to_pylist(), t.column(1).to_pylist(), strict=True))
        if len(found) == len(doc_ids):
            break
    return found


def write_report(rdir: Path, cfg: MinhashConfig) -> dict:
    """Write ``minhash/report.json`` (after stage 4) and return it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    cfg = check_config(cfg)
    rdir = Path(rdir)
    if not cfg.enabled:
        report = {"enabled": False}
        write_json(report_path(rdir), report)
        return report
    manifest = read_manifest(rdir, cfg.digest())
    summary = read_json(clusters_summary_path(rdir))
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
    decided = pa.concat_tables([pq.read_table(decisions_path(rdir, e["shard"]))
                                for e in manifest["shards"]]) if manifest["shards"] else None
    examples = _examples(rdir, manifest, decided, cfg.report_examples) if decided is not None else []
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
    }
    write_json(report_path(rdir), report)
    return report


def _examples(rdir: Path, manifest: dict, decided, limit: int) -> list[dict]:
    """The ``limit`` largest clusters (ties: smallest cluster id) with one removed member diffed."""
    if limit == 0 or decided.num_rows == 0:
        return []
    cluster = decided.column("cluster").to_numpy()
    ids, counts = np.unique(cluster, return_counts=True)
    chosen = ids[np.lexsort((ids, -counts))][:limit]
    rows = {int(c): [] for c in chosen}
    for did, c, kept, reason, sim in zip(decided.column("doc_id").to_pylist(), cluster.tolist(),
                                         decided.column("kept_doc_id").to_pylist(),
                                         decided.column("reason").to_pylist(),
                                         decided.column("similarity").to_pylist(), strict=True):
        if c in rows:
            rows[c].append((did, kept, reason, sim))
    need = {r[0][0] for r in rows.values()} | {r[0][1] for r in rows.values()}
    texts = _texts(rdir, manifest, need)
    out = []
    for c in chosen:
        members = rows[int(c)]
        did, kept, reason, sim = members[0]
        ex = {"cluster": int(c), "kept": kept, "removed": [m[0] for m in members][:20],
              "removed_count": len(members), "reason": reason,
              "similarity": None if sim is None or np.isnan(sim) else round(float(sim), 4)}
        if kept in texts and did in texts:
            ex["compared"] = did
            ex["differing_spans"] = differing_spans(texts[kept], texts[did])
        else:
            ex["note"] = "kept document belongs to an earlier release; its text is not re-read"
        out.append(ex)
    return out
