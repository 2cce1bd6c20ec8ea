"""Shingles: the exact strings a document's MinHash signature is computed over.

One normalization, three ways to cut tokens, all defined with Python's own ``re`` character classes so that the
compiled engine (:mod:`pipeline.dedup.minhash.kernels`) reproduces them byte for byte (it reads the same classes from
:func:`char_classes`, built from ``re`` itself):

* normalization: ``str.lower()`` (``lowercase``), then every run of decimal digits (``\\d+``) becomes ``0``
  (``normalize_numbers``);
* ``word``: tokens are the runs of letters and digits (``[^\\W_]+``); punctuation, symbols, ``_`` and whitespace
  separate them.  A shingle is ``n`` consecutive tokens joined by one space;
* ``code``: tokens are identifiers/numbers (``\\w+``, ``_`` included) and every other non-space character on its
  own (``[^\\w\\s]``), so ``a=b`` and ``a = b`` give the same shingles;
* ``char``: the ``word`` tokens joined by single spaces, cut into ``n`` consecutive characters (for CJK text, which
  has no spaces between words).

A document with fewer than ``n`` units has one shingle (all of them); one with none has no shingles and no
signature.  ``auto`` picks ``char`` when CJK characters make up at least ``cjk_share`` of the document.

``datasketch.MinHash(num_perm, seed).update_batch([s.encode("utf-8") for s in shingles(...)])`` yields the same
``hashvalues`` as our signatures (tests/test_minhash_signatures.py checks it).
"""

from __future__ import annotations

import functools
import os
import re

import numpy as np

KIND_CODES = {"word": 0, "code": 1, "char": 2}

_DIGITS = re.compile(r"\d+")
_WORD_SEP = re.compile(r"[\W_]+")
_WORD_TOKEN = re.compile(r"[^\W_]+")
_CODE_TOKEN = re.compile(r"\w+|[^\w\s]")
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\U00020000-\U0002fa1f]")

# Bits of the per-code-point class table used by the compiled engine.
CLS_WORD = 1      # letter or digit: [^\W_]
CLS_DIGIT = 2     # decimal digit: \d
CLS_SPACE = 4     # whitespace: \s


def normalize(text: str, lowercase: bool = True, numbers: bool = True) -> str:
    if lowercase:
        text = text.lower()
    if numbers:
        text = _DIGITS.sub("0", text)
    return text


def tokens(text: str, kind: str, lowercase: bool = True, numbers: bool = True) -> list[str]:
    """Tokens of ``text`` for kind ``word``/``code``; for ``char`` the characters of the normalized text."""
    text = normalize(text, lowercase, numbers)
    if kind == "code":
        return _CODE_TOKEN.findall(text)
    words = _WORD_TOKEN.findall(text)
    if kind == "char":
        return list(" ".join(words))
    return words


def shingles(text: str, kind: str, n: int, lowercase: bool = True, numbers: bool = True) -> list[str]:
    """The shingle strings, in document order (with repeats), for one concrete kind (not ``auto``)."""
    if kind not in KIND_CODES:
        raise ValueError(f"shingle kind must be one of {sorted(KIND_CODES)}, got {kind!r}")
    units = tokens(text, kind, lowercase, numbers)
    sep = "" if kind == "char" else " "
    if not units:
        return []
    if len(units) < n:
        return [sep.join(units)]
    return [sep.join(units[i:i + n]) for i in range(len(units) - n + 1)]


def cjk_share(text: str) -> float:
    """Share of CJK ideographs, kana and hangul among the characters of ``text``."""
    if not text or text.isascii():
        return 0.0
    return len(_CJK.findall(text)) / len(text)


def resolve_kind(text: str, kind: str, share: float) -> str:
    if kind != "auto":
        return kind
    return "char" if share > 0 and cjk_share(text) >= share else "word"


@functools.lru_cache(maxsize=1)
def char_classes() -> np.ndarray:
    """uint8[0x110000]: CLS_* bits per code point, computed with the same ``re`` classes as the functions above.

    Building it scans all 1.1M code points with ``re`` (~0.3 s), so the result is cached beside this module,
    keyed by the Unicode database version ``re`` uses (a different Python rebuilds it).
    """
    import sys
    import unicodedata
    from pathlib import Path

    cache = Path(__file__).resolve().parent / "__pycache__" / (
        f"char_classes-{unicodedata.unidata_version}-py{sys.version_info[0]}{sys.version_info[1]}.npy")
    try:
        table = np.load(cache)
        if table.shape == (0x110000,) and table.dtype == np.uint8:
            return table
    except (OSError, ValueError):
        pass
    table = np.zeros(0x110000, dtype=np.uint8)
    everything = "".join(map(chr, range(0x110000)))
    for pattern, bit in ((r"[^\W_]+", CLS_WORD), (r"\d+", CLS_DIGIT), (r"\s+", CLS_SPACE)):
        for m in re.finditer(pattern, everything):
            table[m.start():m.end()] |= bit
    try:
        cache.parent.mkdir(exist_ok=True)
        tmp = cache.with_suffix(f".{os.getpid()}.tmp")
        with open(tmp, "wb") as fh:
            np.save(fh, table)
        os.replace(tmp, cache)
    except OSError:             # read-only install: rebuild per process
        pass
    return table


def encode(text: str, lowercase: bool) -> bytes:
    """UTF-8 bytes the compiled engine reads (lowercased here, as ``str.lower`` has no byte-level equivalent)."""
    return (text.lower() if lowercase else text).encode("utf-8", "surrogatepass")
