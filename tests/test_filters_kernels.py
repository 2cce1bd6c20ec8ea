"""The compiled word/n-gram kernels (pipeline/quality/filters/kernels.py) against the pure-Python reference.

The reference is what runs without numba: ``split_words`` (the ``_TOKEN`` regular expression), the per-word
checks and ``gopher.ngram_chars``.  Both paths must give the same tokens, flags, n-gram counts and, through whole
default chains, the same scores (bitwise) and the same decisions, on real text and on random text built from the
characters the tokenizer treats specially.
"""

from __future__ import annotations

import json
import math
import random

import pytest
from conftest import SHARED_CORPORA, prose_records, stdlib_records

pytest.importorskip("numba")

from pipeline.quality.filters import text as text_mod  # noqa: E402
from pipeline.quality.filters.gopher import ngram_chars  # noqa: E402
from pipeline.quality.filters.text import (  # noqa: E402
    _TOKEN,
    Doc,
    _codepoints,
    cjk_word_flags,
    has_letter,
    is_symbol_token,
    split_words,
)

POEM = "《感遇・其一》\n作者：张九龄\n兰叶春葳蕤，桂华秋皎洁。ゝ゛・ー ２０２３年 ½ ²x _x 𠀀 Mr. A. etc. x--y --"
PIECES = ["a", "Z", "M", "r", "s", "S", "t", "D", "J", "v", "e", "c", "3", "٣", "_", " ", "\t", "\n", "\u3000",
          "\xa0", "\x1f", ".", "..", "-", "--", "/", "¶", "Mr", "Mrs", "etc", "中", "ー", "ｶ", "한", "é", "e\u0301",
          "²", "½", "'", "(", "=", "𠀀", "😀", "\ud800", "…", "•", "\r", "\r\n", "\n\n", "\x0b", "\x1c", "\x85",
          "\u2028", "...", "a b"]


def _real_texts() -> list[tuple[str, str]]:
    """(domain, text) from ../shared/corpora when present, else the standard library's prose and code."""
    out = []
    for path in sorted(SHARED_CORPORA.glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            out.append((path.stem, json.loads(line)["text"]))
    if not out:
        out = [("web", r["text"]) for r in prose_records(40)] + [("code", r["text"]) for r in stdlib_records(20)]
    return out + [("web", POEM * 3), ("web", ""), ("web", "x"), ("web", "a b")]


def _random_texts(n: int, seed: int) -> list[str]:
    rnd = random.Random(seed)
    texts = ["".join(rnd.choice(PIECES) for _ in range(rnd.randint(0, 30))) for _ in range(n)]
    # and any code point at all, to exercise every class-table entry the tokenizer reads
    texts += ["".join(chr(rnd.randrange(0x110000)) if rnd.random() < 0.3 else rnd.choice(PIECES)
                      for _ in range(rnd.randint(0, 30))) for _ in range(n)]
    return texts


def _kernel_words(text: str):
    kernels, classes = text_mod.compiled()
    starts, ends, ids, flags = kernels.word_spans(_codepoints(text), classes)
    return [text[s:e] for s, e in zip(starts.tolist(), ends.tolist(), strict=True)], ids, flags


def test_kernel_tokens_ids_and_flags_equal_the_reference():
    assert text_mod.compiled() is not None
    texts = [t for _, t in _real_texts()] + _random_texts(5000, 11)
    for text in texts:
        words, ids, flags = _kernel_words(text)
        ref = split_words(text)
        assert words == ref == _TOKEN.findall(text), repr(text[:300])
        first = {w: i for i, w in enumerate(dict.fromkeys(ref), 1)}
        assert ids.tolist() == [first[w] for w in ref]
        assert ((flags & 1) != 0).tolist() == [not is_symbol_token(w) for w in ref]
        assert ((flags & 2) != 0).tolist() == cjk_word_flags(ref)
        assert ((flags & 4) != 0).tolist() == [has_letter(w) for w in ref]


def test_kernel_ngram_counts_equal_the_reference():
    kernels, _ = text_mod.compiled()
    rnd = random.Random(2)
    # repetitive texts too: the duplicate-n-gram scan and the top n-gram tie rule need repeats to be tested
    texts = [t for _, t in _real_texts()] + _random_texts(1000, 12)
    texts += [" ".join(rnd.choice(["a", "b", "cc", "中", "."]) for _ in range(rnd.randint(0, 60)))
              for _ in range(3000)]
    for text in texts:
        doc = Doc(text)
        ref = split_words(text)
        want = ngram_chars(ref, cjk_word_flags(ref))
        starts, ends, ids, flags = doc.spans
        got = kernels.ngram_counts(ids, ends - starts, (flags & 2) != 0).tolist()
        assert got == list(want.values()), repr(text[:300])


def test_kernel_line_and_paragraph_counts_equal_the_reference():
    from pipeline.quality.filters.gopher import _LINES, _PARAGRAPH, _bullet_lines, _duplicates, _ellipsis_lines
    from pipeline.quality.filters.text import cjk_char_count

    kernels, classes = text_mod.compiled()
    rnd = random.Random(4)
    lines = ["a", "b b", "- x", "• y", "  -z", "end...", "end…  ", "…", "..", " ", "", "中文。"]
    texts = [t for _, t in _real_texts()] + _random_texts(3000, 14)
    texts += [rnd.choice(["", "\n", " "]).join(rnd.choice(lines) + rnd.choice(["\n", "\n\n", "\n\n\n", "\r\n", " \n"])
                                               for _ in range(rnd.randint(0, 12))) for _ in range(3000)]
    for text in texts:
        cp = _codepoints(text)
        paragraphs, lines_ = _PARAGRAPH.split(text.strip()), _LINES.split(text)
        want = (len(paragraphs), *_duplicates(paragraphs), len(lines_), *_duplicates(lines_))
        assert kernels.repetition_counts(cp, classes) == want, repr(text[:300])
        split = text.splitlines()
        assert kernels.line_marks(cp, classes) == (_bullet_lines(text, split), _ellipsis_lines(text, split))
        assert kernels.cjk_count(cp) == cjk_char_count(text)


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a.hex() == b.hex()
    return type(a) is type(b) and a == b


def test_default_chains_score_and_decide_identically_with_and_without_kernels(monkeypatch):
    """Every score of every default chain, bitwise, and every decision, compiled path against the reference."""
    from pipeline.config import DEFAULT_CONFIG, load_config
    from pipeline.quality.filters.chain import Chain

    quality = load_config(DEFAULT_CONFIG).quality
    docs = _real_texts() + [("web", t) for t in _random_texts(300, 13)]
    chains: dict[str, Chain] = {}
    results = {}
    for engine in ("kernels", "reference"):
        if engine == "reference":
            monkeypatch.setattr(text_mod, "KERNELS", None)
        out = []
        for domain, text in docs:
            chain = chains.get(domain) or chains.setdefault(domain, Chain.build(quality, domain))
            doc = Doc(text, "d", domain)
            if engine == "kernels":
                assert doc.spans is not None
            row = chain.score(doc)
            out.append((row, chain.decide(row), doc.text))
        results[engine] = out
    kept = 0
    for (row_k, drop_k, text_k), (row_r, drop_r, text_r) in zip(results["kernels"], results["reference"],
                                                                 strict=True):
        assert row_k.keys() == row_r.keys()
        assert all(_same(row_k[k], row_r[k]) for k in row_k), [k for k in row_k if not _same(row_k[k], row_r[k])]
        assert drop_k == drop_r and text_k == text_r
        kept += drop_k is None
    assert 0 < kept < len(docs)         # the comparison covers kept and dropped documents


def _reference_c4_clean(p, text: str):
    """C4Quality._clean as it was before the single-scan policy check and the reused line split."""
    from pipeline.quality.filters.c4 import CITATION, END_PUNCTUATION, POLICY_SUBSTRINGS, _line_words
    from pipeline.quality.filters.text import count_sentences

    kept, lorem, curly, sentences = [], -1, -1, 0
    lines = text.splitlines()
    for i, line in enumerate(lines):
        line = line.strip()
        words = line.split()
        if p.max_word_length and words and max(map(len, words)) > p.max_word_length:
            continue
        if p.remove_citations:
            line = CITATION.sub("", line)
        if p.filter_no_terminal_punct and (not line.endswith(END_PUNCTUATION) or line.endswith("...")):
            continue
        if len(_line_words(line)) < p.min_words_per_line:
            continue
        low = line.lower()
        if lorem < 0 and "lorem ipsum" in low:
            lorem = i
        if p.filter_javascript and "javascript" in low:
            continue
        if curly < 0 and "{" in line:
            curly = i
        if p.filter_policy and any(s in low for s in POLICY_SUBSTRINGS):
            continue
        sentences += count_sentences(line)
        kept.append(line)
    return kept, {"n_sentences": sentences, "lorem_line": lorem, "curly_line": curly, "lines_in": len(lines),
                  "lines_removed": len(lines) - len(kept)}


def test_c4_line_cleaning_equals_the_plain_loop():
    import dataclasses

    from pipeline.quality.filters.c4 import C4Quality
    from pipeline.quality.filters.params import C4Params

    rnd = random.Random(6)
    parts = ["word", "two words here", "[1]", "[edit]", "[citation needed]", "[x]", "Privacy Policy", "uses cookies",
             "JavaScript", "lorem ipsum", "{", "中文字符", "。", ". ", "end.", "ok!", " ", "a b c d", "[12]" * 3]
    texts = [t for _, t in _real_texts()]
    texts += ["\n".join(" ".join(rnd.choice(parts) for _ in range(rnd.randint(0, 6)))
                        for _ in range(rnd.randint(0, 8)))
              for _ in range(3000)]
    for params in (C4Params(), dataclasses.replace(C4Params(), filter_no_terminal_punct=True, min_words_per_line=1,
                                                   max_word_length=8, remove_citations=False)):
        c4 = C4Quality(params)
        for text in texts:
            assert c4._clean(text) == _reference_c4_clean(params, text), repr(text[:300])


def test_token_class_table_is_the_regular_expressions_classes():
    import re

    from pipeline.quality.filters.kernels import _TOK_CJK, _TOK_W, _TOK_X
    from pipeline.quality.filters.text import _CORE, _W, CJK_RANGES

    assert _CORE.startswith(_W)
    _, table = text_mod.compiled()
    everything = "".join(map(chr, range(0x110000)))
    for pattern, bit in ((f"{_W}+", _TOK_W), (rf"[^\s{CJK_RANGES}/-]+", _TOK_X), (f"[{CJK_RANGES}]+", _TOK_CJK)):
        want = bytearray(0x110000)
        for m in re.finditer(pattern, everything):
            want[m.start():m.end()] = b"\x01" * (m.end() - m.start())
        got = ((table & bit) != 0).astype("uint8").tobytes()
        assert got == bytes(want), pattern
