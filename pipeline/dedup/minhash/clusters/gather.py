"""Clustering step 2 (per task): the task's own documents read once, sent to the slots that asked for them.

The task owns a contiguous range of shards (its *document range*).  It reads the requests addressed to that range
(:mod:`.pairs`), then its shards in order, each once, and only the rows that were asked for:

* ``fields`` (by the slot of the document): the survivor fields (doc id, quality verdict and score, length,
  source), for every document in a candidate pair;
* ``sets`` (by the slot that asked): the sorted distinct 64-bit hashes of the document's shingles, when a pair of
  this run needs its exact Jaccard similarity; a document asked for by several slots is sent to each;
* ``sigs`` (by the slot that asked): its MinHash signature, when it pairs with an earlier release.

The shingle sets of every clustered document are therefore written once per asking slot, spread over the
tasks' runs, and read back by the one task that checks those pairs, sequentially: no store holds them all and
nothing is read at random.  Most documents are asked for by one slot (their bucket's anchor's).

Memory: the requests of one range of the task's documents (``BYTES_PER_REQUEST`` each, within half of
``memory_mb``), one shard's requested texts and their sets, plus what was gathered since the last run was written
(a run is written whenever that passes an eighth of ``memory_mb``; writing it holds it about three times).
"""

from __future__ import annotations

import numpy as np

import pipeline.dedup.minhash.clusters.runs as runs
from pipeline.dedup.minhash.clusters.pairs import NEED_SET, NEED_SIGNATURE, doc_slot, request_schema
from pipeline.dedup.minhash.layout import MinhashError, input_path, read_rows, signature_path

FIELDS = ("doc_id", "keep", "score", "n_chars", "source")
BYTES_PER_REQUEST = 64       # a request held while its range is sorted and gathered (ids, slots, flags, the sort)
#: gathered rows are written as a run once they pass ``memory_mb / OUTBOX_SHARE``: writing one holds it about
#: three times at its peak (combined, in slot order, and the allocator's pages in between), so the outbox stays
#: within half of ``memory_mb`` and the requests the other half
OUTBOX_SHARE = 8


def fields_schema():
    import pyarrow as pa

    return pa.schema([("gid", pa.uint64()), ("doc_id", pa.large_string()), ("keep", pa.int8()),
                      ("score", pa.float64()), ("n_chars", pa.int64()), ("source", pa.large_string())])


def sets_schema():
    import pyarrow as pa

    return pa.schema([("gid", pa.uint64()), ("values", pa.large_list(pa.uint64()))])


class _Outbox:
    """Rows gathered for one output, written as a run when the task's gathered bytes pass the budget."""

    def __init__(self, writer: runs.RunWriter, schema):
        self.writer, self.schema, self.parts, self.slots, self.bytes = writer, schema, [], [], 0

    def add(self, table, slots: np.ndarray) -> None:
        if table.num_rows:
            self.parts.append(table)
            self.slots.append(slots)
            self.bytes += table.nbytes

    def flush(self) -> None:
        import pyarrow as pa

        if not self.parts:
            return
        table, slots = pa.concat_tables(self.parts).combine_chunks(), np.concatenate(self.slots)
        self.parts, self.slots, self.bytes = [], [], 0          # the parts go before the run is sorted: 2x, not 3x
        self.writer.write(table, slots)
        del table
        pa.default_memory_pool().release_unused()     # the run's two copies, not kept by the allocator


def run_gather(ctx, item: dict) -> tuple[dict, dict]:
    """Read the item's requested rows; write runs ``fields``, ``sets`` and ``sigs``.

    Requests are addressed by :func:`doc_slot` (a linear cut of the global ids), so the task reads those of its
    document range in slot ranges within half of ``memory_mb`` (a slot at the range's edge may hold another task's
    documents too: they are left to it)."""
    task, tasks = item["task"], item["of"]
    g0 = int(ctx.starts[task])
    g1 = int(ctx.starts[task + 1]) if task + 1 < tasks else ctx.docs
    req_runs = ctx.inputs("pairs", "requests")
    outs = {name: _Outbox(runs.RunWriter(ctx.rdir, "gather", task, tasks, name), schema)
            for name, schema in (("fields", fields_schema()), ("sets", sets_schema()), ("sigs", sets_schema()))}
    engine = ctx.engine() if ctx.cfg.jaccard_check else None
    stats = {"requests": 0, "docs": 0, "texts": 0, "set_values": 0, "signatures": 0, "ranges": 0}
    if g1 > g0:
        lo, hi = int(doc_slot(np.array([g0]), ctx.docs)[0]), int(doc_slot(np.array([g1 - 1]), ctx.docs)[0]) + 1
        counts = runs.slot_counts(req_runs, lo, hi)
        for r0, r1 in runs.plan_ranges(counts, lo, BYTES_PER_REQUEST, ctx.budget // 2):
            req = runs.read_range(req_runs, r0, r1, request_schema())
            gid, slot, need = (req.column(c).to_numpy() for c in ("gid", "slot", "need"))
            del req
            mine = (gid >= g0) & (gid < g1)
            order = np.lexsort((slot[mine], gid[mine]))   # requests of several pair tasks: by document, then slot
            gid, slot, need = gid[mine][order], slot[mine][order], need[mine][order]
            stats["requests"] += len(gid)
            stats["ranges"] += 1
            _gather_range(ctx, item, engine, gid, slot, need, outs, stats)
    for o in outs.values():
        o.flush()
    stats["engine"] = engine.engine if engine is not None else None
    return {name: o.writer.written for name, o in outs.items()}, stats


def _gather_range(ctx, item: dict, engine, gid, slot, need, outs: dict, stats: dict) -> None:
    """The requested rows of ``gid`` (sorted), shard by shard in manifest order."""
    import pyarrow as pa
    import pyarrow.compute as pc

    shards = ctx.manifest["shards"]
    bounds = np.searchsorted(gid.astype(np.int64), [e["offset"] for e in shards] + [ctx.manifest["docs"]])
    for s in range(item["shards"][0], item["shards"][1]):
        lo, hi = int(bounds[s]), int(bounds[s + 1])
        if lo == hi:
            continue
        entry = shards[s]
        g, sl, nd = gid[lo:hi], slot[lo:hi], need[lo:hi]
        docs = np.unique(g)
        rows = (docs - np.uint64(entry["offset"])).astype(np.int64)
        stats["docs"] += len(docs)
        f = read_rows(signature_path(ctx.rdir, entry["shard"]), rows, list(FIELDS))
        outs["fields"].add(pa.table({"gid": docs, "doc_id": f.column("doc_id").cast(pa.large_string()),
                                     "keep": f.column("keep").cast(pa.int8()),
                                     "score": f.column("score").cast(pa.float64()),
                                     "n_chars": f.column("n_chars").cast(pa.int64()),
                                     "source": f.column("source").cast(pa.large_string())}, schema=fields_schema()),
                           runs.slot_of(docs))
        del f
        doc_of = np.searchsorted(docs, g)           # request -> its document's position in ``docs``
        wants_set = (nd & NEED_SET) != 0
        if wants_set.any():
            set_docs = np.unique(doc_of[wants_set])
            values, offs = _shingle_sets(ctx, engine, entry, rows[set_docs])
            stats["texts"] += len(set_docs)
            stats["set_values"] += len(values)
            pick = np.searchsorted(set_docs, doc_of[wants_set])
            sets = pa.LargeListArray.from_arrays(pa.array(offs, pa.int64()), pa.array(values, pa.uint64()))
            outs["sets"].add(pa.table({"gid": g[wants_set], "values": sets.take(pa.array(pick))},
                                      schema=sets_schema()), sl[wants_set].astype(np.int64))
        wants_sig = (nd & NEED_SIGNATURE) != 0
        if wants_sig.any():
            sig_docs = np.unique(doc_of[wants_sig])
            taken = read_rows(signature_path(ctx.rdir, entry["shard"]), rows[sig_docs], ["signature"]).column(0)
            flat = pc.list_flatten(taken).to_numpy().astype(np.uint64)
            sigs = pa.LargeListArray.from_arrays(pa.array(np.arange(len(sig_docs) + 1) * ctx.cfg.num_perm,
                                                          pa.int64()), pa.array(flat, pa.uint64()))
            pick = np.searchsorted(sig_docs, doc_of[wants_sig])
            stats["signatures"] += len(sig_docs)
            outs["sigs"].add(pa.table({"gid": g[wants_sig], "values": sigs.take(pa.array(pick))},
                                      schema=sets_schema()), sl[wants_sig].astype(np.int64))
        if sum(o.bytes for o in outs.values()) > ctx.budget // OUTBOX_SHARE:
            for o in outs.values():
                o.flush()


def _shingle_sets(ctx, engine, entry: dict, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Shingle sets of ``rows`` (ascending) of one input shard, after checking the shard is the one stage 1 read."""
    import pyarrow.parquet as pq

    src = input_path(ctx.rdir, ctx.manifest["input_stage"], entry["shard"])
    if pq.ParquetFile(src).metadata.num_rows != entry["docs"]:
        raise MinhashError(f"{src}: row count differs from the stage-1 manifest ({entry['docs']})")
    texts = read_rows(src, rows, ["text"]).column(0).to_pylist()
    parts, offsets = [], [np.zeros(1, np.int64)]
    for start in range(0, len(texts), 2048):
        values, offs = engine.shingle_sets(texts[start:start + 2048], entry["domain"])
        offsets.append(offs[1:] + sum(len(p) for p in parts))
        parts.append(values)
    values = np.concatenate(parts) if parts else np.zeros(0, np.uint64)
    return values, np.concatenate(offsets)
