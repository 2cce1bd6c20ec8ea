"""A near-duplicate graph at the shape of a 1-10 TB corpus, written as MinHash stages 1 and 2 would leave it.

What ``bench_cluster_graph.py`` runs the real clustering tasks on, where no text of that size fits this machine:

* ``docs`` documents in shards of ``DOCS_PER_SHARD`` (the 10^9-document model's ``ingest.docs_per_shard``); a
  hash of the global id puts 30 % of them in near-duplicate clusters, in random order over the whole corpus (a
  cluster's members are scattered over all shards, as mirrors and boilerplate are).
* Cluster sizes are heavy-tailed: P(size >= s) = (2 / s)^2.2 for s >= 2 (a Pareto tail of index 2.2, mean about
  3.25, so 10^8 clustered documents form about 3 × 10^7 clusters, a few dozen of them over 1,000 documents).
* Band files as stage 2 writes them (:mod:`pipeline.dedup.minhash.buckets`): per band, each cluster's members
  that agree with the cluster's template on all ``rows`` values of the band share a bucket, which becomes a star
  from its smallest id.  A member's similarity to the template is uniform in [0.75, 1], so it agrees on a band with
  probability s^rows (0.41 on average at 8 rows): the same pair is found by several bands, different bands pick
  different anchors.  A member that shares no band with another member of its cluster is put in the band most of
  its cluster shares, so every document drawn into a cluster has a candidate pair (the clustered documents are
  the graph's nodes).  One run per band and chunk of clusters,
  addressed by the anchor's slot, like stage 2's one run per key partition.
* Stage 1's signature files hold the survivor fields (doc id, quality verdict and score, length, source) of every
  document, in row groups of 1024 rows as stage 1 writes them, but no signature column: the clustering reads
  signatures only for pairs with an earlier release, and there are none here.  Nor is there text: the run has the
  Jaccard check off (its cost is measured on real text by ``make bench-scale``).

Everything is drawn from one seed in chunks of ``CHUNK`` clustered documents, so memory stays at a few GB and the
same size gives the same files.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DOCS_PER_SHARD = 20_000
CLUSTERED_SHARE = 0.3
CHUNK = 4_000_000
SIM_LOW = 0.75
DOMAINS = ("web", "books", "academic", "code", "encyclopedia")
TAIL = 2.2                 # P(size >= s) = (2 / s)^TAIL


def cluster_sizes(members: int, rng: np.random.Generator) -> np.ndarray:
    """Sizes >= 2 with P(size >= s) = (2 / s)^TAIL, summing to ``members``."""
    parts, total = [], 0
    while total < members:
        s = np.floor(2.0 / (1.0 - rng.random(1 << 20)) ** (1.0 / TAIL)).astype(np.int64)
        parts.append(s)
        total += int(s.sum())
    sizes = np.concatenate(parts)
    cut = int(np.searchsorted(np.cumsum(sizes), members))
    sizes = sizes[:cut + 1].copy()
    sizes[-1] -= int(sizes.sum()) - members
    return sizes[sizes >= 2] if sizes[-1] < 2 else sizes


def clustered_gids(docs: int, seed: int) -> np.ndarray:
    """The global ids in clusters (a hash of the id below 30 %), in a random order (another hash)."""
    from pipeline.dedup.minhash.clusters.runs import mix64

    chosen, keys = [], []
    limit = np.uint64(int(CLUSTERED_SHARE * (1 << 63)) << 1)
    for lo in range(0, docs, 1 << 24):
        g = np.arange(lo, min(docs, lo + (1 << 24)), dtype=np.uint64)
        h = mix64(g ^ np.uint64(seed))
        sel = h < limit
        chosen.append(g[sel])
        keys.append(mix64(g[sel] ^ np.uint64(seed * 7919 + 1)))
    g, k = np.concatenate(chosen), np.concatenate(keys)
    return g[np.argsort(k, kind="stable")]


def band_stars(members: np.ndarray, comp: np.ndarray, sims: np.ndarray, bands: int, rows: int,
               rng: np.random.Generator) -> list[tuple[np.ndarray, np.ndarray, dict]]:
    """Per band: the star edges (anchor, member) of the buckets of ``members`` and the band's bucket counts."""
    match = rng.random((bands, len(members))) < (sims ** rows)
    local = comp - comp[0]
    counts = np.stack([np.bincount(local[match[b]], minlength=int(local[-1]) + 1) for b in range(bands)])
    shared = np.zeros(len(members), bool)
    for b in range(bands):
        shared |= match[b] & (counts[b][local] >= 2)
    alone = np.flatnonzero(~shared)                      # in the band most of its cluster shares
    match[np.argmax(counts, axis=0)[local[alone]], alone] = True
    out = []
    for b in range(bands):
        sel = np.flatnonzero(match[b])
        c, g = comp[sel], members[sel]
        order = np.lexsort((g, c))
        c, g = c[order], g[order]
        first = np.r_[True, c[1:] != c[:-1]] if len(c) else np.zeros(0, bool)
        starts = np.flatnonzero(first)
        anchor = g[starts][np.cumsum(first) - 1]
        size = np.diff(np.r_[starts, len(c)])
        out.append((anchor[~first], g[~first], {"buckets": int((size > 1).sum()),
                                                "largest": int(size.max()) if len(size) else 0}))
    return out


def write_graph(rdir: Path, clustered: int, seed: int = 1, bands: int = 14, rows: int = 8) -> dict:
    """Stages 1 and 2 of a run with about ``clustered`` documents in clusters: the manifest, the signature files
    (survivor fields only), the band runs and their markers, and the frozen config.  Returns what was made."""
    import pyarrow as pa

    from pipeline.dedup.minhash import MinhashConfig, check_config
    from pipeline.dedup.minhash.clusters import runs
    from pipeline.dedup.minhash.layout import manifest_path
    from pipeline.io import config_digest, write_json

    cfg = check_config(MinhashConfig(jaccard_check=False, bands=bands, rows=rows))
    docs = int(round(clustered / CLUSTERED_SHARE))
    rng = np.random.default_rng(seed)
    gids = clustered_gids(docs, seed)
    sizes = cluster_sizes(len(gids), rng)
    gids = gids[:int(sizes.sum())]
    manifest = _write_shards(rdir, docs, cfg, rng)
    write_json(manifest_path(rdir), manifest)
    stats = [{"band": b, "partitions": 1, "docs": 0, "buckets": 0, "largest_bucket": 0, "edges": 0,
              "index_matches": 0} for b in range(bands)]
    writers = [runs.RunWriter(rdir, "bands", b, bands, "edges") for b in range(bands)]
    schema = pa.schema([("a", pa.uint64()), ("b", pa.uint64())])
    ends = np.cumsum(sizes)
    first_comp = 0
    while first_comp < len(sizes):          # chunks of whole clusters
        last = int(np.searchsorted(ends, (ends[first_comp - 1] if first_comp else 0) + CHUNK, side="right"))
        last = max(last, first_comp + 1)
        lo, hi = (int(ends[first_comp - 1]) if first_comp else 0), int(ends[last - 1])
        comp = np.repeat(np.arange(first_comp, last), sizes[first_comp:last])
        sims = rng.uniform(SIM_LOW, 1.0, hi - lo)
        for b, (a, m, info) in enumerate(band_stars(gids[lo:hi], comp, sims, bands, rows, rng)):
            writers[b].write(pa.table({"a": a, "b": m}, schema=schema), runs.slot_of(a))
            st = stats[b]
            st["edges"] += len(a)
            st["buckets"] += info["buckets"]
            st["largest_bucket"] = max(st["largest_bucket"], info["largest"])
        first_comp = last
    digest_base = (cfg.digest(), config_digest(manifest))
    for b in range(bands):
        stats[b]["docs"] = docs
        runs.commit(rdir, "bands", b, bands, runs.digest_of("minhash_band", *digest_base, b),
                    {"edges": writers[b].written}, stats[b])
    return {"docs": docs, "shards": len(manifest["shards"]), "clustered": int(sizes.sum()),
            "clusters": int(len(sizes)), "largest_cluster": int(sizes.max()),
            "candidate_edges": sum(s["edges"] for s in stats), "mean_size": round(float(sizes.mean()), 3)}


def _write_shards(rdir: Path, docs: int, cfg, rng: np.random.Generator) -> dict:
    """Signature files with the survivor fields of every document; the stage-1 manifest that lists them."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from pipeline.dedup.minhash.layout import signature_path
    from pipeline.io import write_parquet

    entries, offset, k = [], 0, 0
    while offset < docs:
        n = min(DOCS_PER_SHARD, docs - offset)
        domain = DOMAINS[k % len(DOMAINS)]
        shard = f"{domain}-{k:06d}"
        ids = pc.binary_join_element_wise(f"{shard}-", pc.cast(pa.array(np.arange(n)), pa.string()), "")
        keep = rng.choice(np.array([1, 0, -1], np.int8), n, p=[0.7, 0.2, 0.1])
        table = pa.table({"doc_id": ids, "domain": pa.array([domain] * n, pa.string()),
                          "source": pa.array(np.array(["crawl", "mirror", "archive"])[rng.integers(0, 3, n)]),
                          "n_chars": rng.integers(200, 20_000, n), "score": rng.random(n), "keep": keep})
        sha = write_parquet(table, signature_path(rdir, shard))
        entries.append({"shard": shard, "docs": n, "offset": offset, "domain": domain, "input_sha256": sha,
                        "signatures_sha256": sha})
        offset += n
        k += 1
    return {"version": 1, "config": cfg.digest(), "fingerprint": cfg.fingerprint(), "input_stage": "exact_dedup",
            "shards": entries, "docs": docs, "index": {"root": "", "releases": []}}
