"""Text normalization, byte decoding and stable document ids.

Normalization is conservative because the same function serves prose and source code: it never touches
indentation, tabs or spaces inside a line (code depends on them).  It removes what no downstream stage wants:
ANSI escape sequences, control and invisible format characters, exotic line breaks (CR, CRLF, NEL, U+2028/9),
no-break and other typographic spaces (turned into a plain space), trailing whitespace, runs of blank lines;
then it applies Unicode NFC so the same text always hashes the same.  The ideographic space U+3000 is kept: CJK
typography uses it for paragraph indentation.

Byte decoding (:func:`decode_bytes`) is for files that do not promise UTF-8 (plain text, HTML, source code):
a BOM wins, then a declared charset (HTTP header, ``<meta charset>``), then strict UTF-8, then charset-normalizer's
detection.  Data with NUL bytes or many control bytes is refused as binary rather than decoded into garbage.
"""

from __future__ import annotations

import codecs
import hashlib
import re
import unicodedata

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
_NEWLINES = re.compile(r"\r\n|[\r\x85\u2028\u2029]")
# C0 and C1 controls except tab and newline, DEL, soft hyphen, zero-width space, word joiner, BOM, U+FFFE/U+FFFF.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\xad\u200b\u2060\ufeff\ufffe\uffff]")
#: the characters of _CONTROL that are ASCII, for a C-speed check of ASCII text
_ASCII_CONTROLS = bytes(range(0x00, 0x09)) + b"\x0b\x0c" + bytes(range(0x0e, 0x20)) + b"\x7f"
# Space separators other than the plain space and the ideographic space.
_SPACES = re.compile(r"[\xa0\u1680\u2000-\u200a\u202f\u205f]")
_CONTROL_OR_SPACE = re.compile(_CONTROL.pattern[:-1] + _SPACES.pattern[1:])
_BLANK_RUNS = re.compile(r"\n{3,}")
_LEADING_BLANK_LINES = re.compile(r"\A(?:[ \t\u3000]*\n)+")


def normalize_text(text: str) -> str:
    """NFC, no ANSI/control characters, ``\n`` line endings, no trailing spaces, at most one blank line in a row.

    Leading indentation of the first line is kept (a code snippet may start indented); leading and trailing
    blank lines are removed.  Each pass is skipped when a C-speed ``in`` test shows it has nothing to do (ASCII
    text, ``str.isascii()`` in constant time, has no special spaces and is NFC already).
    """
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    if "\x85" in text or "\u2028" in text or "\u2029" in text:
        text = _NEWLINES.sub("\n", text)
    if "\x1b" in text:
        text = _ANSI.sub("", text)
    if not text.isascii():
        if _CONTROL_OR_SPACE.search(text):  # one scan finds whether either substitution has work
            text = _CONTROL.sub("", text)
            text = _SPACES.sub(" ", text)
        if not unicodedata.is_normalized("NFC", text):
            text = unicodedata.normalize("NFC", text)
    elif len(text.encode("ascii").translate(None, _ASCII_CONTROLS)) != len(text):
        text = _CONTROL.sub("", text)       # ASCII text: no special spaces, already NFC; controls are rare
    if " \n" in text or "\t\n" in text or "\u3000\n" in text:
        # only a line followed by another one needs it: the last line's trailing space goes with rstrip() below
        text = "\n".join(line.rstrip(" \t\u3000") for line in text.split("\n"))
    if "\n\n\n" in text:
        text = _BLANK_RUNS.sub("\n\n", text)
    text = _LEADING_BLANK_LINES.sub("", text)
    return text.rstrip()


def text_hash(text: str) -> str:
    """Hash used for exact dedup: 128-bit BLAKE2b of the normalized text."""
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).hexdigest()


def doc_id(domain: str, source_key: str, offset: int) -> str:
    """Stable id from domain, source key (source name + path relative to its root) and offset in the file.

    Never built from absolute paths, so the same input gives the same id on every run and every machine.
    """
    digest = hashlib.sha1(f"{domain}\x00{source_key}\x00{offset}".encode()).hexdigest()[:16]
    return f"{domain}-{digest}"


_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\u3040-\u30ff\uac00-\ud7af]")


def cjk_ratio(text: str) -> float:
    """Share of non-space characters that are CJK ideographs, kana or hangul."""
    non_space = sum(1 for c in text if not c.isspace())
    return len(_CJK.findall(text)) / non_space if non_space else 0.0


# ---------------------------------------------------------------------------------------------------------------
# Bytes → str for files that do not promise UTF-8

_BOMS = ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"), (codecs.BOM_UTF8, "utf-8-sig"),
         (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))
_BINARY_CONTROLS = bytes(b for b in range(32) if b not in b"\t\n\r\f\b\x1b")
#: share of U+FFFD replacement characters above which detected-charset text is refused
MAX_REPLACEMENT_RATIO = 0.01


class DecodeError(ValueError):
    """Bytes that are not text: ``reason`` is ``binary_file`` or ``undecodable_text``."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def binary_reason(data: bytes, sample: int = 8192) -> str:
    """Why ``data`` looks binary ("" when it looks like text): NUL bytes or > 10 % control bytes in the head."""
    head = data[:sample]
    if not head or any(head.startswith(bom) for bom, _ in _BOMS):
        return ""
    nul = head.find(b"\x00")
    if nul >= 0:
        return f"NUL byte at offset {nul}"
    controls = len(head) - len(head.translate(None, _BINARY_CONTROLS))
    if controls > 0.1 * len(head):
        return f"{controls} control bytes in the first {len(head)}"
    return ""


def _codec(name: str | None) -> str | None:
    if not name:
        return None
    try:
        return codecs.lookup(name.strip().strip("'\"")).name
    except LookupError:
        return None


def decode_bytes(data: bytes, declared: str | None = None) -> tuple[str, str]:
    """(text, encoding used).  Raises :class:`DecodeError` for binary data or text no charset explains."""
    for bom, enc in _BOMS:
        if data.startswith(bom):
            try:
                return data.decode(enc), enc
            except UnicodeDecodeError as exc:
                raise DecodeError("undecodable_text", f"{enc} BOM but invalid data at byte {exc.start}") from None
    if why := binary_reason(data):
        raise DecodeError("binary_file", why)
    for enc in filter(None, (_codec(declared), "utf-8")):
        try:
            return data.decode(enc), enc
        except UnicodeDecodeError:
            continue
    from charset_normalizer import from_bytes

    best = from_bytes(data[: 1 << 20]).best()
    if best is None:
        raise DecodeError("undecodable_text", "not UTF-8 and no charset explains the bytes")
    text = data.decode(best.encoding, errors="replace")
    bad = text.count("\ufffd")
    if bad > MAX_REPLACEMENT_RATIO * max(len(text), 1):
        raise DecodeError("undecodable_text", f"{bad} undecodable characters as {best.encoding}")
    return text, best.encoding
