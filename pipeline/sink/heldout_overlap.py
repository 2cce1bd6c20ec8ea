"""Training documents that share a run of ``n`` tokens with a held-out validation document (``overlaps_heldout``).

The held-out split (:mod:`pipeline.sink.validation`) must not appear in training, or its loss measures memory.
An exact-text hash (``duplicate_of_heldout``, in the mixture plan) catches only verbatim copies; a document that
quotes, reformats or paraphrases a held-out one keeps long runs of the same tokens, and this check catches those,
the way benchmark decontamination catches an evaluation item inside a document (``pipeline.quality.decontaminate``,
13-grams of words as in GPT-3 and DCLM).  Here the units are the corpus's own token ids, which the sink already
holds, so nothing is normalised or split again.

- The mixture plan picks the held-out documents and writes their tokens (``mixture/heldout_tokens.parquet``,
  which the validation sets are then packed from), then :func:`build_index` hashes every run of ``n`` tokens of
  each of them into ``mixture/heldout_index/``: one ``.npy`` file per array a lookup reads (:data:`ARRAYS`): the
  n-grams (uint64, sorted, unique), each one's rank in (held-out document, n-gram) order and the document of
  each rank, every held-out document's count of distinct runs, the bitmap and the bucket starts.  All of it is
  computed once by the plan, so a scatter task maps the files and computes nothing before its first shard.
- Each scatter task (:mod:`pipeline.sink.scatter`), which reads its shard's tokens anyway, hashes the runs of its
  training documents (:meth:`OverlapIndex.matches`).  A document is dropped (no copies; stats stage and reason
  ``overlaps_heldout``) when ``heldout_overlap`` (default 0.5) or more of its runs are held-out runs (it is
  mostly held-out text: a copy, an excerpt), or when it holds that share of one held-out document's distinct runs
  (it contains most of that document: a longer copy, a new version).  ``removed/overlaps_heldout/<shard>.parquet``
  names each dropped document, the held-out document it overlaps most, both shares and its first matched run.

Why two shares and not "any shared run": runs of 13 tokens are short, and boilerplate shares them.  On
``../shared/corpora`` (17 held-out documents, 1,152 training documents), 172 training documents share at least
one 13-token run with a held-out document: 64 of 214 academic ones (a LaTeX preamble, an author block), 85 of 261
code files (a Go licence header), 12 of 37 web pages.  Their shares stay under 0.1, except short Go files whose
licence header is 35-42 % of their runs but 0.5 % of the held-out file's.  Four code files pass 0.5: three near
copies (0.70-0.86 both ways) and a Python 2 ``string.py`` that holds half of the held-out Python 3 one.

Hash: each token id gets 64 bits of splitmix64; a run's hash is ``sum(h(t_k) * P^(n-1-k)) mod 2^64`` (``n``
vector passes over the shard; benchmark decontamination's ``decontaminate.polynomial_runs``).  A false match by
collision: about ``N * M / 2^64`` runs for ``N`` held-out and ``M`` training runs (0.5 for 1e7 against 1e12), and a
document needs a share of its runs, not one, to be dropped.  A bitmap of ``16 * N`` bits (at least 2^16) is checked
first, so only about one run in 16 (plus the true matches) goes to the lookup, which reads the run's bucket of the
sorted n-grams (bucketed by their top bits, one or two per bucket).

Memory: 14 bytes per held-out run (the n-gram, its rank and that rank's document; 16 with 32,768 held-out
documents or more), plus the bitmap (2-4 bytes per run) and the bucket starts (2-4 bytes), memory-mapped: the pages
are the machine's page cache, shared by every scatter task that maps them, and read only where a lookup lands;
per shard, about 40 bytes per token while it is checked.  A scatter task maps them once: the scatter runs in the
task's process, not a pool.  The plan's build peak grows with the held-out tokens (the runs' hashes, their sort
order and the arrays it writes), not with the corpus.
Time: linear in the shard's training tokens, plus a cost per matching run (a bucket lookup and one sort of the
slice's matches); opening the index costs a few file maps per process at any size (the plan computes it).  The
matches grow with how much of the corpus repeats held-out text: at most every run, so the cost per token is
bounded, a multiple of that of a shard without matches.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.pools import step_cache

INDEX_DIR = "heldout_index"
ARRAYS = ("ngrams", "rank", "doc_by_rank", "doc_unique", "bitmap", "starts")    # the index's files, <name>.npy
TOKENS_FILE = "heldout_tokens.parquet"
REASON = "overlaps_heldout"
CHUNK_TOKENS = 1 << 22


def _mix(ids: Any) -> Any:
    """splitmix64 of every id: 64 well-spread bits per token id."""
    import numpy as np

    with np.errstate(over="ignore"):       # in place: one array of 8 bytes per token, and one shift at a time
        z = ids.astype(np.uint64)
        z += np.uint64(0x9E3779B97F4A7C15)
        z ^= z >> np.uint64(30)
        z *= np.uint64(0xBF58476D1CE4E5B9)
        z ^= z >> np.uint64(27)
        z *= np.uint64(0x94D049BB133111EB)
        z ^= z >> np.uint64(31)
        return z


def _new(x: Any) -> Any:
    """Where a sorted array's value changes (the first element included): the starts of its runs of equal values."""
    import numpy as np

    return np.concatenate([[True], x[1:] != x[:-1]])


def _all_runs(tokens: Any, n: int) -> Any:
    """The hash of the run of ``n`` tokens starting at every position that has ``n`` tokens after it (runs across
    document boundaries included: callers drop them)."""
    import numpy as np

    from pipeline.quality.decontaminate import polynomial_runs

    if len(tokens) < n or n <= 0:
        return np.zeros(0, np.uint64)
    return polynomial_runs(_mix(np.asarray(tokens)), n)


def _inside(starts: Any, ends: Any, n: int) -> tuple[Any, Any]:
    """(document index, whether the run lies inside it) of runs starting at ``starts``; ``ends`` are the
    documents' cumulative token counts."""
    import numpy as np

    doc = np.searchsorted(ends, starts, side="right")
    inside = doc < len(ends)
    inside[inside] = starts[inside] + n <= ends[doc[inside]]
    return doc, inside


def run_hashes(tokens: Any, lengths: Any, n: int) -> tuple[Any, Any, Any]:
    """(hash, document index, start in ``tokens``) of every run of ``n`` tokens inside one document; ``tokens``
    is the documents' ids end to end, ``lengths`` their token counts.  Runs across a document boundary are left
    out."""
    import numpy as np

    acc, inside, doc = _runs_inside(tokens, lengths, n)
    return acc[inside], doc, np.flatnonzero(inside)


def _runs_inside(tokens: Any, lengths: Any, n: int) -> tuple[Any, Any, Any]:
    """The hash of the run at every position, whether it lies inside one document, and the document of each run
    that does.  The documents' runs are marked from their bounds (1 byte per token), not looked up per run."""
    import numpy as np

    acc = _all_runs(tokens, n)
    lengths = np.asarray(lengths, np.int64)
    valid = np.maximum(lengths - n + 1, 0)             # runs inside each document
    begins = np.cumsum(lengths) - lengths
    marks = np.zeros(len(acc) + 1, np.int8)            # +1 where a document's runs begin, -1 after its last one
    np.add.at(marks, begins[valid > 0], 1)
    np.add.at(marks, (begins + valid)[valid > 0], -1)
    inside = np.cumsum(marks[:-1], dtype=np.int8).view(bool)
    return acc, inside, np.repeat(np.arange(len(lengths), dtype=np.int32), valid)


def build_index(directory: Path, flat: Any, lengths: Any, n: int) -> dict:
    """Write the index of every run of ``n`` tokens of the held-out documents (``flat``: their token ids end to end,
    in ``heldout.parquet`` order; ``lengths``: their token counts) into ``directory`` (:data:`ARRAYS`, written
    under a temporary name and renamed); returns its counts and the digest of its files."""
    import hashlib
    import os
    import shutil

    import numpy as np

    lengths = np.asarray(lengths, np.int64)
    acc, inside, doc = _runs_inside(flat, lengths, n)
    hashes = acc[inside]
    del acc, inside
    # by hash, then the first document that has it: runs come in document order, and a stable sort keeps it
    order = np.argsort(hashes, kind="stable")
    hashes = hashes[order]
    doc = doc[order]
    del order
    first = _new(hashes) if len(hashes) else np.zeros(0, bool)
    ngrams = hashes[first]
    del hashes
    arrays = _lookup_arrays(ngrams, doc[first])
    runs = len(ngrams)
    del ngrams, doc, first
    directory = Path(directory)
    tmp = directory.with_name(f".{directory.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    digest = hashlib.sha256()
    for name in ARRAYS:
        np.save(tmp / f"{name}.npy", arrays.pop(name))
        with open(tmp / f"{name}.npy", "rb") as f:
            while block := f.read(1 << 20):
                digest.update(block)
    if directory.exists():
        shutil.rmtree(directory)
    os.replace(tmp, directory)
    return {"n": n, "heldout_docs": len(lengths), "runs": runs,
            "docs_shorter_than_n": int((lengths < n).sum()), "sha256": digest.hexdigest()}


def _lookup_arrays(ngrams: Any, docs: Any) -> dict:
    """What a lookup reads, computed once by the plan: ``ngrams`` (sorted, unique) and each one's first held-out
    document ``docs`` become the arrays of :data:`ARRAYS`."""
    import numpy as np

    docs = docs.astype(np.int16 if len(docs) and docs.max() < 1 << 15 else np.int32)      # 2 bytes per run
    # each n-gram's place in (held-out document, n-gram) order: one sort of (document, rank) keys then groups a
    # training document's distinct held-out runs by held-out document as well (no second sort per shard)
    order = np.argsort(docs, kind="stable")
    rank = np.empty(len(docs), np.int32 if len(docs) < 1 << 31 else np.int64)
    rank[order] = np.arange(len(docs), dtype=rank.dtype)
    bits = 1 << max(16, (16 * max(1, len(ngrams)) - 1).bit_length())
    bitmap = np.zeros(bits // 8, np.uint8)
    shift = _shift(bits)                  # a hash's slot: its top bits; sorted, as the n-grams are
    byte = (ngrams >> (shift + np.uint64(3))).view(np.int64)           # < 2^61: the view is the value
    if len(byte):
        first = np.flatnonzero(_new(byte))    # sorted: no np.unique; OR each byte's bits at once
        bit = (ngrams >> shift).astype(np.uint8) & np.uint8(7)
        bit = np.left_shift(np.uint8(1), bit, out=bit)
        bitmap[byte[first]] = np.bitwise_or.reduceat(bit, first)
        del bit
    del byte
    k = _bucket_bits(len(ngrams))
    starts = np.searchsorted(ngrams >> np.uint64(64 - k), np.arange((1 << k) + 1, dtype=np.uint64)).astype(
        np.int32 if len(ngrams) < 1 << 31 else np.int64)
    return {"ngrams": ngrams.astype("<u8"), "rank": rank, "doc_by_rank": docs[order],
            "doc_unique": np.bincount(docs) if len(docs) else np.zeros(1, np.int64), "bitmap": bitmap,
            "starts": starts}


def _shift(bits: int) -> Any:
    """The right shift that leaves a hash's top log2(``bits``) bits: its slot in a bitmap of ``bits`` bits."""
    import numpy as np

    return np.uint64(64 - (bits.bit_length() - 1))


def _bucket_bits(runs: int) -> int:
    """``k`` of the 2^k lookup buckets (by a hash's top ``k`` bits): one or two n-grams each."""
    return max(1, runs.bit_length() - 1)


def write_heldout(rdir: Path, held: list, n: int, overlap: float) -> dict | None:
    """Write ``mixture/heldout_tokens.parquet`` (doc_id, domain, tokens of every held-out document, in ``held``
    order) and, when ``n`` > 0, the index of their runs; returns what the scatter tasks need: the index's file,
    counts and sha256, ``n`` and the ``overlap`` share (None without an index).

    ``held`` holds (domain, key, doc_id, text hash, shard) per held-out document.  Only the token columns of the
    shards that hold one are read, a document's rows filtered there; tokens stay in Arrow buffers (4 bytes each)."""
    import shutil

    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from pipeline.io import read_parquet, write_parquet

    by_shard: dict[str, list[str]] = {}
    for h in held:
        by_shard.setdefault(h[4], []).append(h[2])
    schema = pa.schema([("doc_id", pa.string()), ("tokens", pa.list_(pa.int32()))])
    parts = [pa.Table.from_batches([], schema)]
    for shard in sorted(by_shard):
        t = read_parquet(Path(rdir) / "tokenize" / f"{shard}.parquet", columns=["doc_id", "tokens"])
        t = t.filter(pc.is_in(t.column("doc_id"), value_set=pa.array(by_shard[shard], pa.string())))
        parts.append(t.cast(schema))
    found = pa.concat_tables(parts)
    row = {d: i for i, d in enumerate(found.column("doc_id").to_pylist())}
    tokens = found.column("tokens").take(pa.array([row[h[2]] for h in held], pa.int64())).combine_chunks()
    write_parquet(pa.table({"doc_id": pa.array([h[2] for h in held], pa.string()),
                            "domain": pa.array([h[0] for h in held], pa.string()), "tokens": tokens}),
                  Path(rdir) / "mixture" / TOKENS_FILE)
    path = Path(rdir) / "mixture" / INDEX_DIR
    if n <= 0:
        shutil.rmtree(path, ignore_errors=True)
        return None
    offsets = tokens.offsets.to_numpy()
    counts = build_index(path, tokens.values.to_numpy()[offsets[0]:offsets[-1]], np.diff(offsets), n)
    return {**counts, "overlap": overlap, "dir": INDEX_DIR}


class OverlapIndex:
    """The held-out runs of one mixture plan (:func:`loaded_index` keeps one per process)."""

    def __init__(self, directory: Path, n: int):
        import numpy as np

        self.n = n
        # plain arrays over the mapped files (np.memmap's subclass makes every lookup slower); the pages are shared
        # by every process of the machine that maps them
        a = {name: np.asarray(np.load(Path(directory) / f"{name}.npy", mmap_mode="r")) for name in ARRAYS}
        self.ngrams, self.rank, self.doc_by_rank = a["ngrams"], a["rank"], a["doc_by_rank"]
        self.doc_unique, self.bitmap, self._starts = a["doc_unique"], a["bitmap"], a["starts"]
        self._shift = _shift(8 * len(self.bitmap))
        self._top = np.uint64(64 - _bucket_bits(len(self.ngrams)))

    def _find(self, q: Any) -> Any:
        """Position of each hash of ``q`` in the sorted n-grams, or -1: a look at its bucket's one or two entries
        (a binary search over millions of n-grams is ~22 dependent memory reads; this is two or three)."""
        import numpy as np

        b = (q >> self._top).astype(np.int64)
        lo, hi = self._starts[b].astype(np.int64), self._starts[b + 1].astype(np.int64)
        out = np.full(len(q), -1, np.int64)
        todo, j = np.flatnonzero(lo < hi), 0
        while len(todo):
            p = lo[todo] + j
            hit = self.ngrams[p] == q[todo]
            out[todo[hit]] = p[hit]
            todo = todo[~hit & (p + 1 < hi[todo])]
            j += 1
        return out

    def matches(self, tokens: Any, lengths: Any) -> dict[int, dict]:
        """For every document with a run of ``n`` tokens that a held-out document has: ``train_share`` (the share
        of its runs found in held-out documents), ``heldout_row`` and ``heldout_share`` (the held-out document it
        covers most, and the share of that document's distinct runs it holds), and ``offset`` (where in the
        document its first matching run starts)."""
        import numpy as np

        lengths = np.asarray(lengths, np.int64)
        if not len(self.ngrams):
            return {}
        hashes = _all_runs(tokens, self.n)
        slot = hashes >> self._shift
        maybe = (self.bitmap[(slot >> np.uint64(3)).astype(np.int64)]
                 >> (slot & np.uint64(7)).astype(np.uint8)) & np.uint8(1)
        cand = np.flatnonzero(maybe)
        pos = self._find(hashes[cand])
        match = pos >= 0
        hit, where = cand[match], pos[match]
        ends = np.cumsum(lengths)
        doc, inside = _inside(hit, ends, self.n)
        hit, where, doc = hit[inside], where[inside], doc[inside]
        if not len(hit):
            return {}
        first = np.flatnonzero(_new(doc))    # runs are in order: sorted docs
        width = len(self.ngrams)
        key = doc * width + self.rank[where]
        key.sort()                                  # the one sort: by document, then held-out document, then run
        key = key[_new(key)]    # distinct (document, held-out run)
        pd, ph = key // width, self.doc_by_rank[key % width].astype(np.int64)
        matched = np.bincount(pd, minlength=len(lengths))
        group = np.flatnonzero(_new(pd) | _new(ph))
        g_doc, g_held = pd[group], ph[group]                         # (document, held-out document) groups
        share = np.diff(np.append(group, len(pd))) / np.maximum(1, self.doc_unique[g_held])
        g_first = np.flatnonzero(_new(g_doc))
        top = np.repeat(np.maximum.reduceat(share, g_first), np.diff(np.append(g_first, len(g_doc))))
        best = np.flatnonzero(share == top)                          # the first held-out document at the max
        best = best[_new(g_doc[best])]
        starts = ends - lengths
        return {d: {"train_share": round(min(1.0, int(matched[d]) / max(1, int(lengths[d]) - self.n + 1)), 4),
                    "heldout_row": h, "heldout_share": round(sh, 4), "offset": int(hit[f] - starts[d])}
                for d, f, h, sh in zip(doc[first].tolist(), first.tolist(), g_held[best].tolist(),
                                       share[best].tolist(), strict=True)}


_LOADED: list = step_cache()     # [(key, OverlapIndex)]: the last index this process mapped, until another step


def loaded_index(path: Path, index: dict) -> OverlapIndex:
    """The plan's index, mapped once per process and kept for the next shard of the same plan.  Mapping is cheap
    (the plan computed every array), but a task checks many shards and need not open six files for each.  A
    process that runs task after task keeps it for the step's next scatter task and drops it when a task of
    another step starts (:func:`pipeline.pools.step_cache`), which unmaps it."""
    key = (str(path.resolve()), index.get("sha256"), index["n"])
    if not _LOADED or _LOADED[0][0] != key:
        _LOADED[:] = [(key, OverlapIndex(path, index["n"]))]
    return _LOADED[0][1]


def index_written(rdir: Path, index: dict | None) -> bool:
    """Whether the plan's held-out index (``index``, from ``plan.json``; None: no index) is on disk in this
    version's layout: a plan written before the index was a folder of arrays is planned again."""
    return index is None or (index.get("dir") == INDEX_DIR and (Path(rdir) / "mixture" / INDEX_DIR).is_dir())


def plan_index(rdir: Path) -> dict | None:
    """The mixture plan's held-out index (counts, sha256, ``n``, ``overlap``), or None: no mixture plan, or
    ``heldout_ngram`` 0."""
    from pipeline.io import read_json

    plan = Path(rdir) / "mixture" / "plan.json"
    return read_json(plan).get("heldout_index") if plan.exists() else None


def drop_overlapping(rdir: Path, shard: str, table: Any, copies: Any, index: dict) -> int:
    """Give no copies to the shard's training documents that overlap a held-out document (see the module
    docstring), in place in ``copies``; write the shard's ``overlaps_heldout`` stats and, when any is dropped, its
    audit ``removed/overlaps_heldout/<shard>.parquet``.  Returns how many were dropped.

    ``table`` holds the tokenized shard's doc_id, domain, tokens and n_bytes.  The shard's training documents are
    checked in slices of about ``CHUNK_TOKENS`` tokens, so memory stays at about 40 bytes per token of a slice."""
    import numpy as np
    import pyarrow as pa

    from pipeline.io import count_removed, new_stats, read_parquet, write_parquet, write_stats

    idx = loaded_index(Path(rdir) / "mixture" / index["dir"], index)
    tokens = table.column("tokens").combine_chunks()
    offsets = tokens.offsets.to_numpy()
    values = tokens.values.to_numpy()
    lengths = np.diff(offsets)
    n_bytes = table.column("n_bytes").to_numpy()
    train = np.flatnonzero(copies > 0)
    train_tokens = values[offsets[0]:offsets[-1]][np.repeat(copies > 0, lengths)]
    cum = np.concatenate([[0], np.cumsum(lengths[train])])
    found: dict[int, dict] = {}
    lo = 0
    while lo < len(train):                   # slices of consecutive training documents, about CHUNK_TOKENS each
        hi = max(lo + 1, int(np.searchsorted(cum, cum[lo] + CHUNK_TOKENS, side="right")) - 1)
        for d, m in idx.matches(train_tokens[cum[lo]:cum[hi]], lengths[train[lo:hi]]).items():
            if max(m["train_share"], m["heldout_share"]) >= index["overlap"]:
                found[int(train[lo + d])] = m
        lo = hi
    stats = new_stats(shard.rsplit("-", 1)[0])
    stats["in_docs"], stats["in_bytes"] = len(train), int(n_bytes[train].sum())
    for d in found:
        count_removed(stats, REASON, int(n_bytes[d]))
        copies[d] = 0
    stats["kept_docs"] = len(train) - len(found)
    stats["kept_bytes"] = stats["in_bytes"] - sum(s["bytes"] for s in stats["removed"].values())
    audit = Path(rdir) / "removed" / REASON / f"{shard}.parquet"
    if found:
        rows = sorted(found)
        held_ids = read_parquet(Path(rdir) / "mixture" / "heldout.parquet", columns=["doc_id"]).column("doc_id")
        ids, doms = table.column("doc_id"), table.column("domain")
        write_parquet(pa.table({
            "doc_id": pa.array([ids[d].as_py() for d in rows], pa.string()),
            "domain": pa.array([doms[d].as_py() for d in rows], pa.string()),
            "heldout_doc_id": pa.array([held_ids[found[d]["heldout_row"]].as_py() for d in rows], pa.string()),
            "train_share": pa.array([found[d]["train_share"] for d in rows], pa.float64()),
            "heldout_share": pa.array([found[d]["heldout_share"] for d in rows], pa.float64()),
            "first_run": pa.array([values[offsets[d] + found[d]["offset"]:offsets[d] + found[d]["offset"] + idx.n]
                                   .tolist() for d in rows], pa.list_(pa.int32()))}), audit)
    else:
        audit.unlink(missing_ok=True)
    write_stats(rdir, REASON, shard, stats)
    return len(found)
