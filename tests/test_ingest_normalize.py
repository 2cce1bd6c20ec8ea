"""Normalization and byte decoding: exact outputs, code indentation kept, stable hashes and ids."""

from __future__ import annotations

import codecs
import hashlib
import json

import pytest
from conftest import SHARED_CORPORA

from pipeline.ingest.normalize import DecodeError, binary_reason, decode_bytes, doc_id, normalize_text, text_hash


def test_normalize_text_exact():
    raw = ("\r\n\n  \x1b[32m《感遇》\x1b[m\u00a0作者\u200b：张九龄\r\n"      # ANSI colours, NBSP, zero-width space
           "Cafe\u0301 na\u00efve\x07 \t \r\n\r\n\r\n\r\n"                 # NFD accent, BEL, trailing whitespace
           "def f(x):\r\n\tif x:\r\n\t\treturn  x  # two spaces kept\u2028end\x85\ufeff   \n\n")
    assert normalize_text(raw) == ("  《感遇》 作者：张九龄\nCafé naïve\n\ndef f(x):\n\tif x:\n\t\treturn  x  "
                                   "# two spaces kept\nend")
    assert normalize_text(normalize_text(raw)) == normalize_text(raw)           # idempotent
    assert normalize_text("  \n \t\n") == ""
    assert normalize_text("    indented first line\n") == "    indented first line"
    assert normalize_text("全角\u3000空格\u3000") == "全角\u3000空格"            # U+3000 kept inside, trailing cut


def test_hash_and_id_are_stable_values():
    assert text_hash("hello") == "46fb7408d4f285228f4af516ea25851b"
    assert doc_id("web", "docs/a.jsonl", 0) == doc_id("web", "docs/a.jsonl", 0) != doc_id("web", "docs/a.jsonl", 1)
    # the id scheme itself: sha1 of domain, source key and offset, NUL-separated (changing it renames every doc)
    assert doc_id("web", "docs/a.jsonl", 0) == "web-" + hashlib.sha1(b"web\x00docs/a.jsonl\x000").hexdigest()[:16]
    assert doc_id("web", "docs/a.jsonl", 0) == "web-12a2dda7e32c6eca"


def test_decode_bytes():
    assert decode_bytes(codecs.BOM_UTF16_LE + "数据".encode("utf-16-le")) == ("数据", "utf-16")
    assert decode_bytes("naïve".encode()) == ("naïve", "utf-8")
    assert decode_bytes("<p>数据</p>".encode("gbk"), declared="GBK") == ("<p>数据</p>", "gbk")
    assert decode_bytes("数据".encode(), declared="no-such-charset") == ("数据", "utf-8")
    with pytest.raises(DecodeError, match="binary_file: NUL byte at offset 3"):
        decode_bytes(b"GIF\x00\x01")
    assert binary_reason(b"\x1b[31mred\x1b[0m\n") == ""                        # terminal colours are text
    assert binary_reason(bytes(range(1, 32)) * 4) == "100 control bytes in the first 124"


@pytest.mark.skipif(not SHARED_CORPORA.exists(), reason="../shared/corpora is absent")
def test_fortunes_lose_their_ansi_colours():
    recs = [json.loads(line) for line in open(SHARED_CORPORA / "zh.jsonl", encoding="utf-8")]
    coloured = [r["text"] for r in recs if "\x1b[" in r["text"]]
    assert len(coloured) > 100
    assert not any("\x1b" in normalize_text(t) or "[m" in normalize_text(t) for t in coloured)


def _plain_normalize(text: str) -> str:
    """normalize_text without its shortcuts: every pass always runs (the reference the shortcuts must equal)."""
    import unicodedata

    from pipeline.ingest.normalize import _ANSI, _BLANK_RUNS, _CONTROL, _LEADING_BLANK_LINES, _NEWLINES, _SPACES

    text = _NEWLINES.sub("\n", text)
    text = _ANSI.sub("", text)
    text = _CONTROL.sub("", text)
    text = _SPACES.sub(" ", text)
    text = unicodedata.normalize("NFC", text)
    text = "\n".join(line.rstrip(" \t\u3000") for line in text.split("\n"))
    text = _BLANK_RUNS.sub("\n\n", text)
    text = _LEADING_BLANK_LINES.sub("", text)
    return text.rstrip()


def test_shortcuts_of_normalize_text_change_nothing():
    import random

    from pipeline.ingest.normalize import normalize_text

    rnd = random.Random(7)
    pieces = ["a", "Z", " ", "\t", "\n", "\r", "\r\n", "\u3000", "\xa0", "\x00", "\x07", "\x7f", "\x85", "\x9f",
              "\xad", "\u2028", "\x1b[31m", "é", "e\u0301", "\x0b", "\u200b", "中", "\u2005", "\ufeff"]
    for _ in range(20000):
        text = "".join(rnd.choice(pieces) for _ in range(rnd.randint(0, 25)))
        assert normalize_text(text) == _plain_normalize(text), repr(text)
