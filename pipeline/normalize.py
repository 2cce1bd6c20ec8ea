"""Text normalization and stable document ids.

Normalization is conservative because the same function serves prose and source code: it never touches
indentation or spaces inside a line (code depends on them), it only removes what no downstream stage wants:
ANSI colour sequences, control characters, Windows/Mac line endings, trailing whitespace and runs of blank lines.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
# C0 and C1 controls except tab and newline, plus DEL, zero-width no-break space (BOM) and U+FFFE/U+FFFF.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ufeff\ufffe\uffff]")
_TRAILING_WS = re.compile(r"[ \t\u3000]+$", re.MULTILINE)
_BLANK_RUNS = re.compile(r"\n{3,}")


def normalize_text(text: str) -> str:
    """NFC, no ANSI/control characters, ``\\n`` line endings, no trailing spaces, at most one blank line in a row."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = _ANSI.sub("", text)
    text = _CONTROL.sub("", text)
    text = unicodedata.normalize("NFC", text)
    text = _TRAILING_WS.sub("", text)
    text = _BLANK_RUNS.sub("\n\n", text)
    return text.strip("\n ")


def text_hash(text: str) -> str:
    """Hash used for exact dedup: 128-bit BLAKE2b of the normalized text."""
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).hexdigest()


def doc_id(domain: str, source_key: str, offset: int) -> str:
    """Stable id from domain, source file key and byte offset: the same input gives the same id on every run."""
    digest = hashlib.sha1(f"{domain}\x00{source_key}\x00{offset}".encode()).hexdigest()[:16]
    return f"{domain}-{digest}"


_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\u3040-\u30ff\uac00-\ud7af]")


def cjk_ratio(text: str) -> float:
    """Share of non-space characters that are CJK ideographs, kana or hangul."""
    non_space = sum(1 for c in text if not c.isspace())
    return len(_CJK.findall(text)) / non_space if non_space else 0.0
