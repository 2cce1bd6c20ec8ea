"""The held-out validation split: a few documents per domain, fixed by hash, never seen in training.

Selection: every document gets ``heldout_key(seed, domain, doc_id)``, a 64-bit hash mapped to [0, 1); a domain's
held-out candidates are its ``k`` documents with the smallest keys, ``k = clamp(round(val_fraction * n),
val_min_docs, val_max_docs)`` and never more than half the domain.  Only a heap of about ``2 * val_max_docs``
keys per domain is kept while streaming, so the choice does not depend on shard order, worker count or a process
RNG, and a document stays held out when unrelated documents are added to the corpus (its key does not change).  The
tokenizer samples its training text from the *largest* keys of the same hash, so the two never overlap unless the
sample needs more than the non-held-out part of a domain.

Decontamination (exact, by the normalized-text hash of ingest): a candidate whose text also occurs among the
training documents stays in training (nothing is lost) and the next key takes its place; a document whose text
equals an already held-out one is dropped from the corpus altogether (``duplicate_of_heldout``), because in
training it would leak the held-out text.  Beyond the same text, a training document that shares runs of
``mixture.heldout_ngram`` tokens with a held-out one (a quote, a reformatted or partial copy) is dropped by the
scatter tasks when the overlap reaches ``mixture.heldout_overlap`` (``overlaps_heldout``,
:mod:`pipeline.sink.heldout_overlap`).

:func:`write_validation` packs each domain's held-out documents (in key order) into its own single-shard
MindRecord set under ``<run>/mindrecord_val/<domain>/`` with the same schema and manifest as the training set; the
tail is padded, not dropped, so every held-out token is evaluated.

Memory: the held-out documents' tokens (at most ``val_max_docs`` per domain, read from the mixture plan's
``heldout_tokens.parquet``, about 40 bytes per token): bounded by the configuration, not by the corpus.
"""

from __future__ import annotations

import hashlib
import heapq
import os
import shutil
from pathlib import Path

HELDOUT_FILE = "heldout.parquet"
VAL_DIR = "mindrecord_val"


def unit_key(salt: str, seed: int, domain: str, doc_id: str) -> float:
    """A stable number in [0, 1) for (salt, seed, domain, doc id): 64 bits of blake2b."""
    digest = hashlib.blake2b(f"{salt}\x00{seed}\x00{domain}\x00{doc_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def heldout_key(seed: int, domain: str, doc_id: str) -> float:
    return unit_key("heldout", seed, domain, doc_id)


def heldout_count(n_docs: int, fraction: float, min_docs: int, max_docs: int) -> int:
    """Held-out documents for a domain of ``n_docs``: the fraction, clamped, and at most half the domain."""
    return max(0, min(max(round(fraction * n_docs), min_docs), max_docs, n_docs // 2))


class HeldoutSelector:
    """Streams (domain, doc_id, text_hash) once and keeps each domain's smallest keys.

    The heap holds ``2 * max_docs + 16`` entries so that candidates skipped by decontamination can be replaced.
    """

    def __init__(self, seed: int, fraction: float, min_docs: int, max_docs: int):
        self.seed, self.fraction, self.min_docs, self.max_docs = seed, fraction, min_docs, max_docs
        self.heaps: dict[str, list] = {}
        self.n_docs: dict[str, int] = {}

    def add(self, domain: str, doc_id: str, text_hash: str, shard: str) -> None:
        self.n_docs[domain] = self.n_docs.get(domain, 0) + 1
        if self.max_docs == 0:
            return
        heap = self.heaps.setdefault(domain, [])
        item = (-heldout_key(self.seed, domain, doc_id), doc_id, text_hash, shard)
        if len(heap) < 2 * self.max_docs + 16:
            heapq.heappush(heap, item)
        elif item > heap[0]:
            heapq.heapreplace(heap, item)

    def ranked(self) -> dict[str, tuple[int, list[tuple[float, str, str, str]]]]:
        """Per domain: (held-out count k, every kept (key, doc_id, text_hash, shard), smallest key first)."""
        out = {}
        for dom, n in sorted(self.n_docs.items()):
            k = heldout_count(n, self.fraction, self.min_docs, self.max_docs)
            out[dom] = (k, sorted((-neg, did, th, shard) for neg, did, th, shard in self.heaps.get(dom, [])))
        return out


def resolve_heldout(ranked: dict[str, tuple[int, list]], outside_hashes: set[str]) -> tuple[list, list]:
    """Pick each domain's held-out documents among its ranked heap entries; return (held_out, dropped).

    ``outside_hashes``: text hashes of heap entries that also occur among documents outside the heaps.  In key
    order (domains in name order): an entry whose text trains anyway (outside the heaps, or an earlier entry
    that was not held out) trains too; one whose text is already held out is dropped (``duplicate_of_heldout``);
    otherwise it is held out while the domain has fewer than ``k``, else it trains.  So a text is either held out
    once or only trains.  Items are ``(domain, key, doc_id, text_hash, shard)``.
    """
    held, dropped = [], []
    held_hashes: set[str] = set()
    train_hashes = set(outside_hashes)
    for dom in sorted(ranked):
        k, entries = ranked[dom]
        n_held = 0
        for key, did, th, shard in entries:
            if th in train_hashes:
                continue
            if th in held_hashes:
                dropped.append((dom, key, did, th, shard))
            elif n_held < k:
                held_hashes.add(th)
                held.append((dom, key, did, th, shard))
                n_held += 1
            else:
                train_hashes.add(th)
    return held, dropped


def write_validation(rdir: Path, *, seq_len: int, add_bos: bool, eos_id: int, bos_id: int, pad_id: int,
                     vocab_size: int, tokenizer_sha256: str, config_sha256: str, domain_field: bool = True,
                     boundaries: bool = False) -> dict:
    """Write ``mindrecord_val/<domain>/`` (one MindRecord set per domain) and ``mindrecord_val/manifest.json``.

    Needs :func:`pipeline.sink.mixture.plan_mixture` to have written ``mixture/heldout_tokens.parquet``.  Returns the
    top-level manifest: per domain its folder, documents, rows and tokens.  The three steps (:func:`finished`,
    :func:`write_sets`, :func:`commit_sets`) are separate so a task can write in a child process and verify from
    its own (``pipeline.tasks.sink_steps.write_validation``).
    """
    done = finished(rdir)
    if done is not None:
        return done
    return commit_sets(rdir, write_sets(rdir, seq_len=seq_len, add_bos=add_bos, eos_id=eos_id, bos_id=bos_id,
                                        pad_id=pad_id, vocab_size=vocab_size, tokenizer_sha256=tokenizer_sha256,
                                        config_sha256=config_sha256, domain_field=domain_field,
                                        boundaries=boundaries))


def finished(rdir: Path) -> dict | None:
    """The manifest of a validation set already written (its files' sizes checked), or None."""
    from pipeline.io import read_json
    from pipeline.sink import mindrecord

    final = Path(rdir) / VAL_DIR
    if not (final / mindrecord.MANIFEST).exists():
        return None
    manifest = read_json(final / mindrecord.MANIFEST)
    mindrecord.verify(final, full_read=False, hashes=False)
    return manifest


def write_sets(rdir: Path, *, seq_len: int, add_bos: bool, eos_id: int, bos_id: int, pad_id: int,
               vocab_size: int, tokenizer_sha256: str, config_sha256: str, domain_field: bool = True,
               boundaries: bool = False) -> Path:
    """Write every domain's set and the manifest into a temporary folder, unverified; returns the folder."""
    import numpy as np

    from pipeline.io import read_parquet, write_json
    from pipeline.sink import mindrecord
    from pipeline.sink.heldout_overlap import TOKENS_FILE

    rdir = Path(rdir)
    held = read_parquet(rdir / "mixture" / TOKENS_FILE)         # key order per domain (the mixture plan's)
    tmp = rdir / f".{VAL_DIR}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    col = held.column("tokens").combine_chunks()
    offsets, values = col.offsets.to_numpy(), col.values.to_numpy()
    by_domain: dict[str, list] = {}
    for i, (did, dom) in enumerate(zip(*(held.column(c).to_pylist() for c in ("doc_id", "domain")), strict=True)):
        by_domain.setdefault(dom, []).append((did, values[offsets[i]:offsets[i + 1]].astype(np.int32, copy=False)))
    sets = {}
    for dom in sorted(by_domain):
        docs = by_domain[dom]
        sub = mindrecord.write_token_set(
            tmp / dom, [dom] * len(docs), [t for _, t in docs], seq_len=seq_len, shard_num=1, name=f"val-{dom}",
            eos_id=eos_id, bos_id=bos_id if add_bos else None, pad_id=pad_id, remainder="pad",
            domain_field=domain_field, boundaries=boundaries, domains=[dom],
            extra={"split": "validation", "domain": dom, "doc_ids": [d for d, _ in docs], "vocab_size": vocab_size,
                   "tokenizer_sha256": tokenizer_sha256, "config_sha256": config_sha256})
        sets[dom] = {"dir": dom, "documents": len(docs), "samples": sub["samples"], "tokens": sub["tokens"],
                     "padded_tokens": sub["padded_tokens"]}
    manifest = {"format": "mindrecord-collection", "split": "validation", "sets": sets,
                "tokenizer_sha256": tokenizer_sha256, "config_sha256": config_sha256, "seq_len": seq_len}
    write_json(tmp / mindrecord.MANIFEST, manifest)
    return tmp


def commit_sets(rdir: Path, tmp: Path, mem_limit_mb: int | None = None) -> dict:
    """Verify the written sets in full (once, where written: later steps check sizes only; the reader limited to
    ``mem_limit_mb``, ``pack.verify_mem_mb``), then rename them into place; returns the manifest."""
    from pipeline.io import read_json
    from pipeline.sink import mindrecord

    final = Path(rdir) / VAL_DIR
    manifest = read_json(Path(tmp) / mindrecord.MANIFEST)
    mindrecord.verify(tmp, full_read=True, mem_limit_mb=mem_limit_mb)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    return manifest
