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

import re

from pipeline import charclass

KIND_CODES = {"word": 0, "code": 1, "char": 2}

_DIGITS = re.compile(r"\d+")
_WORD_SEP = re.compile(r"[\W_]+")
_WORD_TOKEN = re.compile(r"[^\W_]+")
_CODE_TOKEN = re.compile(r"\w+|[^\w\s]")
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\U00020000-\U0002fa1f]")

# Bits of the per-code-point class table used by the compiled engine (pipeline/charclass.py builds it).
CLS_WORD, CLS_DIGIT, CLS_SPACE = charclass.CLS_WORD, charclass.CLS_DIGIT, charclass.CLS_SPACE
char_classes = charclass.char_classes


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


def encode(text: str, lowercase: bool) -> bytes:
    """UTF-8 bytes the compiled engine reads (lowercased here, as ``str.lower`` has no byte-level equivalent)."""
    return (text.lower() if lowercase else text).encode("utf-8", "surrogatepass")
