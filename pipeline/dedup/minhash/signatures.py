"""Stage 1: datasketch-compatible MinHash signatures and LSH band keys, one task per shard.

For the same shingles (:mod:`pipeline.dedup.minhash.shingles`), seed, ``num_perm`` and scheme, a row of
:func:`compute_signatures` equals ``datasketch.MinHash(num_perm, seed, scheme=...)`` updated with the UTF-8 shingles
— ``hashvalues`` exactly, so :func:`to_minhash` hands our signatures to datasketch's ``LeanMinHash`` and LSH
classes.  The permutation parameters come from the same ``np.random.RandomState(seed)`` draws as datasketch's;
the input hash is its default SHA-1 (first 4 bytes little-endian; 8 for ``affine64``).

Two engines give identical results: ``numba`` (one compiled pass over a batch's bytes; :mod:`.kernels`) and
``numpy`` (Python shingle strings, ``hashlib.sha1`` through C-level ``map``, numpy permutations).  A band key is a
64-bit mix of the ``rows`` values of one band; two documents share a bucket of band ``j`` when their keys are equal
(a false key collision is ~N²/2^65 per band and is caught by the Jaccard check).

Memory (per shard task, not measured separately): the shard's input table and its texts as Python strings (about
2–3× the shard's text bytes), the signature matrix (``num_perm`` × 4 bytes per document, 8 with ``affine64``:
448 bytes at 112 permutations) and band keys (8 bytes × bands), plus one batch's shingle hashes (the numba kernel
sizes its output at 8 bytes per input byte of a 1 MB sub-batch).  Bounded by the shard size, not the corpus.
"""

from __future__ import annotations

import hashlib
import logging
import operator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import pipeline.dedup.minhash.shingles as sh
from pipeline.dedup.minhash.config import MinhashConfig, check_config
from pipeline.dedup.minhash.layout import MinhashError, band_column, input_path, prescores_path, signature_path
from pipeline.io import completed, recorded_sha256, write_marker, write_parquet

log = logging.getLogger(__name__)

_MERSENNE = np.uint64((1 << 61) - 1)
_SCHEME_CODES = {"affine32": 0, "legacy": 1, "affine64": 2}
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def permutations(num_perm: int, seed: int, scheme: str) -> tuple[np.ndarray, np.ndarray]:
    """(a, b) exactly as datasketch 2.x ``MinHash._init_permutations`` draws them."""
    gen = np.random.RandomState(seed)
    if scheme == "legacy":
        ab = np.array([(gen.randint(1, _MERSENNE, dtype=np.uint64), gen.randint(0, _MERSENNE, dtype=np.uint64))
                       for _ in range(num_perm)], dtype=np.uint64).T
        return ab[0].copy(), ab[1].copy()
    width, dtype = (32, np.uint32) if scheme == "affine32" else (64, np.uint64)
    a = gen.randint(0, 1 << (width - 1), num_perm, dtype=dtype) * dtype(2) + dtype(1)
    b = gen.randint(0, 1 << width, num_perm, dtype=dtype)
    return a, b


def signature_dtype(scheme: str) -> type:
    return np.uint64 if scheme == "affine64" else np.uint32


def empty_value(scheme: str) -> int:
    return (1 << 64) - 1 if scheme == "affine64" else (1 << 32) - 1


def to_minhash(signature: np.ndarray, cfg: MinhashConfig):
    """A ``datasketch.LeanMinHash`` holding one of our signatures (for datasketch's LSH classes)."""
    from datasketch import LeanMinHash, MinHash

    values = np.asarray(signature, dtype=np.uint64 if cfg.scheme in ("legacy", "affine64") else np.uint32)
    return LeanMinHash(MinHash(seed=cfg.seed, hashvalues=values, scheme=cfg.scheme))


def numba_available() -> bool:
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return True


@dataclass
class Signatures:
    sig: np.ndarray          # (docs, num_perm) uint32 (uint64 for affine64); all-max rows where count == 0
    count: np.ndarray        # int32: shingles (with repeats) per document
    kind: np.ndarray         # uint8: shingles.KIND_CODES of the kind used


def doc_kinds(texts: list[str], domain: str, cfg: MinhashConfig) -> tuple[np.ndarray, np.ndarray]:
    """Per document: kind code and shingle size (``auto`` decided from the document's CJK share)."""
    rule_kind, rule_n = _rule(cfg, domain)
    if rule_kind != "auto":
        return (np.full(len(texts), sh.KIND_CODES[rule_kind], np.int64), np.full(len(texts), rule_n, np.int64))
    kinds = [sh.resolve_kind(t, "auto", cfg.cjk_share) for t in texts]
    return (np.array([sh.KIND_CODES[k] for k in kinds], np.int64),
            np.array([cfg.ngram_for(k) for k in kinds], np.int64))


def _rule(cfg: MinhashConfig, domain: str) -> tuple[str, int]:
    for rule in cfg.domain_shingles:
        if rule.domain == domain:
            return rule.kind, (rule.n or cfg.ngram_for(rule.kind))
    return cfg.shingle_kind, cfg.ngram_for(cfg.shingle_kind)


class SignatureEngine:
    """Signatures (and, for the Jaccard check, shingle-hash sets) for batches of texts under one config."""

    def __init__(self, cfg: MinhashConfig, engine: str | None = None):
        self.cfg = cfg
        engine = engine or cfg.engine
        if engine == "auto":
            engine = "numba" if numba_available() else "numpy"
        if engine == "numba" and not numba_available():
            raise MinhashError("minhash.engine is 'numba' but numba is not installed (pip install numba)")
        self.engine = engine
        self.a, self.b = permutations(cfg.num_perm, cfg.seed, cfg.scheme)
        self.dtype = signature_dtype(cfg.scheme)
        self.empty = empty_value(cfg.scheme)

    # ---------------------------------------------------------------------------------------------------------
    def compute(self, texts: list[str], domain: str = "") -> Signatures:
        modes, ngrams = doc_kinds(texts, domain, self.cfg)
        if self.engine == "numba":
            sig, count = self._numba(texts, modes, ngrams)
        else:
            sig, count = self._numpy(texts, modes, ngrams)
        return Signatures(sig.astype(self.dtype, copy=False), count.astype(np.int32), modes.astype(np.uint8))

    def shingle_sets(self, texts: list[str], domain: str = "") -> tuple[np.ndarray, np.ndarray]:
        """Sorted distinct 64-bit hashes of each text's shingles: (values, offsets), for exact Jaccard.

        The numba engine uses a fast MurmurHash3-style hash, the numpy engine the first 8 bytes of SHA-1 (hashlib
        is its fastest option); sets are only ever compared within one process, so they need not agree.
        """
        modes, ngrams = doc_kinds(texts, domain, self.cfg)
        if self.engine == "numba":
            import pipeline.dedup.minhash.kernels as kernels

            cls = sh.char_classes()
            parts, counts = [], []
            for start, stop in _batches(texts, 1 << 20):     # the kernel sizes its output at 8 bytes per input byte
                src, offsets = _concat(texts[start:stop], self.cfg.lowercase)
                values, offs = kernels.shingle_sets(src, offsets, modes[start:stop], ngrams[start:stop],
                                                    self.cfg.normalize_numbers, cls)
                parts.append(values)
                counts.append(np.diff(offs))
        else:
            parts = [np.unique(_sha1_heads(self._shingles(t, m, n), 8)) for t, m, n in zip(texts, modes, ngrams,
                                                                                           strict=True)]
            counts = [np.array([len(p) for p in parts], np.int64)]
        offsets = np.zeros(len(texts) + 1, np.int64)
        offsets[1:] = np.cumsum(np.concatenate(counts)) if counts else []
        values = np.concatenate(parts) if parts else np.zeros(0, np.uint64)
        return values.astype(np.uint64), offsets

    # ---------------------------------------------------------------------------------------------------------
    def _numba(self, texts, modes, ngrams):
        import pipeline.dedup.minhash.kernels as kernels

        src, offsets = _concat(texts, self.cfg.lowercase)
        sig = np.empty((len(texts), self.cfg.num_perm), np.uint64)
        count = np.empty(len(texts), np.int64)
        kernels.signature_batch(src, offsets, modes, ngrams, self.cfg.normalize_numbers, sh.char_classes(),
                                _SCHEME_CODES[self.cfg.scheme], self.a.astype(np.uint64), self.b.astype(np.uint64),
                                np.uint64(self.empty), sig, count)
        return sig, count

    def _shingles(self, text: str, mode: int, n: int) -> list[str]:
        kind = {v: k for k, v in sh.KIND_CODES.items()}[int(mode)]
        return sh.shingles(text, kind, int(n), self.cfg.lowercase, self.cfg.normalize_numbers)

    def _numpy(self, texts, modes, ngrams):
        sig = np.full((len(texts), self.cfg.num_perm), self.empty, np.uint64)
        count = np.zeros(len(texts), np.int64)
        nbytes = 8 if self.cfg.scheme == "affine64" else 4
        for i, (text, mode, n) in enumerate(zip(texts, modes, ngrams, strict=True)):
            shs = self._shingles(text, mode, n)
            count[i] = len(shs)
            if shs:
                hv = _sha1_heads(shs, nbytes, little=True)
                for start in range(0, len(hv), 8192):           # bounds the (shingles × perms) matrix
                    sig[i] = np.minimum(sig[i], self._permute(hv[start:start + 8192]).min(axis=0))
        return sig, count

    def _permute(self, hv: np.ndarray) -> np.ndarray:
        """datasketch's update_batch arithmetic on a column of input hashes."""
        if self.cfg.scheme == "legacy":
            phv = (hv.astype(np.uint64)[:, None] * self.a + self.b) % _MERSENNE
            return np.bitwise_and(phv, np.uint64(0xFFFFFFFF))
        if self.cfg.scheme == "affine32":
            h = _fmix32(hv.astype(np.uint32))[:, None]
            return (h * self.a + self.b).astype(np.uint64)
        h = _fmix64(hv.astype(np.uint64))[:, None]
        return h * self.a + self.b


_DIGEST = operator.methodcaller("digest")


def _sha1_heads(shingle_list: list[str], nbytes: int, little: bool = False) -> np.ndarray:
    """First ``nbytes`` (4 or 8) of SHA-1 of every UTF-8 shingle; little-endian = datasketch's sha1_hash32/64."""
    digests = b"".join(map(_DIGEST, map(hashlib.sha1, (s.encode("utf-8", "surrogatepass") for s in shingle_list))))
    raw = np.frombuffer(digests, np.uint8).reshape(-1, 20)[:, :nbytes].copy()
    if nbytes == 4:
        return raw.view("<u4" if little else ">u4").ravel().astype(np.uint64)
    return raw.view("<u8" if little else ">u8").ravel().astype(np.uint64)


def _fmix32(h: np.ndarray) -> np.ndarray:
    h = h ^ (h >> np.uint32(16))
    h = h * np.uint32(0x85EBCA6B)
    h = h ^ (h >> np.uint32(13))
    h = h * np.uint32(0xC2B2AE35)
    return h ^ (h >> np.uint32(16))


def _fmix64(h: np.ndarray) -> np.ndarray:
    h = h ^ (h >> np.uint64(33))
    h = h * np.uint64(0xFF51AFD7ED558CCD)
    h = h ^ (h >> np.uint64(33))
    h = h * np.uint64(0xC4CEB9FE1A85EC53)
    return h ^ (h >> np.uint64(33))


def _concat(texts: list[str], lowercase: bool) -> tuple[np.ndarray, np.ndarray]:
    encoded = [sh.encode(t, lowercase) for t in texts]
    offsets = np.zeros(len(encoded) + 1, np.int64)
    offsets[1:] = np.cumsum([len(e) for e in encoded])
    return np.frombuffer(b"".join(encoded), np.uint8), offsets


def band_keys(sig: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """uint64 (docs, bands): a 64-bit mix of each band's ``rows`` values (band number included)."""
    n = sig.shape[0]
    vals = sig[:, :bands * rows].astype(np.uint64).reshape(n, bands, rows)
    h = np.broadcast_to(_fmix64(np.arange(1, bands + 1, dtype=np.uint64) * _GOLDEN), (n, bands)).copy()
    for r in range(rows):
        h = _fmix64((h ^ vals[:, :, r]) * _GOLDEN)
    return h


# ------------------------------------------------------------------------------------------------------------
# Stage 1 entry point


def run_signatures_shard(rdir: Path, shard: str, cfg: MinhashConfig, input_stage: str = "exact_dedup",
                         quality: Any = None) -> dict:
    """Signatures of one input shard → ``minhash/signatures/<shard>.parquet``; returns small stats.

    With a :class:`~pipeline.config.QualityConfig`, the chain's verdicts go beside them (:mod:`.prescore`), and its
    score rows to ``minhash/prescores/<shard>.parquet`` for the quality stage.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline.dedup.minhash.prescore import EXTRA_COLUMNS, chain_verdicts
    from pipeline.quality.prescored import quality_digest, write_prescores

    cfg = check_config(cfg)
    if not cfg.enabled:
        return {"shard": shard, "skipped": "minhash.enabled is false"}
    rdir = Path(rdir)
    out = signature_path(rdir, shard)
    digest = cfg.digest()
    src = input_path(rdir, input_stage, shard)
    if not src.exists():
        raise MinhashError(f"{src}: input shard of minhash stage 1 is missing (is stage {input_stage!r} done?)")
    src_sha256 = recorded_sha256(src)
    q_digest = quality_digest(quality)
    if (done := completed(out)) and done.get("config") == digest and done.get("input_sha256") == src_sha256 \
            and done.get("quality_sha256", "") == q_digest:
        return done["stats"]
    names = set(pq.read_schema(src).names)
    missing = {"doc_id", "text"} - names
    if missing:
        raise MinhashError(f"{src}: column(s) {sorted(missing)} missing (has {sorted(names)})")
    cols = [c for c in ("doc_id", "domain", "source", "text", cfg.score_column, *EXTRA_COLUMNS) if c and c in names]
    table = pq.read_table(src, columns=cols)
    n = table.num_rows
    texts = table.column("text").to_pylist()
    domains = table.column("domain").to_pylist() if "domain" in names else [shard.rsplit("-", 1)[0]] * n
    engine = SignatureEngine(cfg)
    sig = np.empty((n, cfg.num_perm), engine.dtype)
    count = np.zeros(n, np.int32)
    kind = np.zeros(n, np.uint8)
    for start, stop in _batches(texts, cfg.batch_bytes):
        for dom in sorted(set(domains[start:stop])):
            idx = [i for i in range(start, stop) if domains[i] == dom]
            res = engine.compute([texts[i] for i in idx], dom)
            sig[idx], count[idx], kind[idx] = res.sig, res.count, res.kind
    keys = band_keys(sig, cfg.bands, cfg.rows)
    keep, chain_score, chains, rows = chain_verdicts(quality, table, domains)
    if chains:                          # the quality stage decides from these rows instead of scoring again
        write_prescores(prescores_path(rdir, shard), quality, chains, table.column("doc_id").to_pylist(), domains,
                        rows)
    score = (table.column(cfg.score_column).cast(pa.float64()).fill_null(float("nan"))
             if cfg.score_column and cfg.score_column in names else pa.array(chain_score))
    arrays = {"row": pa.array(np.arange(n, dtype=np.int32)), "doc_id": table.column("doc_id"),
              "domain": pa.array(domains, pa.string()),
              "source": table.column("source") if "source" in names else pa.array([""] * n, pa.string()),
              "n_chars": pa.array([len(t) for t in texts], pa.int64()), "score": score,
              "keep": pa.array(keep), "shingles": pa.array(count), "kind": pa.array(kind)}
    for j in range(cfg.bands):
        arrays[band_column(j)] = pa.array(keys[:, j])
    flat = pa.array(sig.reshape(-1))
    arrays["signature"] = pa.FixedSizeListArray.from_arrays(flat, cfg.num_perm)
    write_parquet(pa.table(arrays), out)
    domain = domains[0] if domains else shard.rsplit("-", 1)[0]
    stats = {"shard": shard, "docs": n, "no_shingles": int((count == 0).sum()), "engine": engine.engine,
             "shingles": int(count.sum()), "bytes": int(sum(len(t.encode("utf-8", "surrogatepass")) for t in texts))}
    write_marker(out, {"stats": stats, "docs": n, "domain": domain, "config": digest,
                       "input_sha256": src_sha256, "quality_sha256": q_digest})
    log.info("minhash signatures %s: %d docs, %d shingles (%s)", shard, n, stats["shingles"], engine.engine)
    return stats


def _batches(texts: list[str], batch_bytes: int):
    start, size = 0, 0
    for i, t in enumerate(texts):
        size += len(t)
        if size >= batch_bytes:
            yield start, i + 1
            start, size = i + 1, 0
    if start < len(texts):
        yield start, len(texts)
