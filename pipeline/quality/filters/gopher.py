"""Gopher quality and Gopher repetition rules (Rae et al. 2021, App. A), as datatrove 0.10.1 implements them.

Rule order and reason names are datatrove's, so drop counts compare one to one.  Differences, all deliberate:
words come from :func:`pipeline.quality.filters.text.split_words` (no spaCy), an empty document is a reason instead of
a ZeroDivisionError, n-grams are compared as word tuples (datatrove joins words without a separator, so "ab"+"c" equals
"a"+"bc"), and CJK documents use per-character words, the FineWeb-2 Mandarin stop words and no mean-word-length rule (a
per-character mean is always about 1).
"""

from __future__ import annotations

import re

from pipeline.quality.filters.base import Drop, Filter, Scores
from pipeline.quality.filters.params import GopherQualityParams, GopherRepetitionParams
from pipeline.quality.filters.text import Doc, compiled

BULLETS = ("•", "-")


# Line breaks of str.splitlines() other than "\n": texts without them have the lines of text.split("\n"), so the
# per-line rules can run as one multi-line regular expression over the whole text.
_OTHER_BREAKS = re.compile("[\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")
_BULLET_LINE = re.compile(r"^[^\S\n]*[•-]", re.MULTILINE)
_ELLIPSIS_LINE = re.compile(r"(?:\.\.\.|…)[^\S\n]*$", re.MULTILINE)


def _bullet_lines(text: str, lines: list[str]) -> int:
    """Lines (of ``text.splitlines()``) whose first non-space character is a bullet."""
    if _OTHER_BREAKS.search(text):
        return sum(ln.lstrip().startswith(BULLETS) for ln in lines)
    return len(_BULLET_LINE.findall(text))


def _ellipsis_lines(text: str, lines: list[str]) -> int:
    """Lines (of ``text.splitlines()``) ending in an ellipsis, trailing spaces aside."""
    if _OTHER_BREAKS.search(text):
        return sum(ln.rstrip().endswith(("...", "…")) for ln in lines)
    return len(_ELLIPSIS_LINE.findall(text))


class GopherQuality(Filter):
    name = "gopher_quality"
    prefix = "gopher"
    score_names = ("n_words", "avg_word_length", "hash_ratio", "ellipsis_ratio", "bullet_lines_ratio",
                   "ellipsis_lines_ratio", "alpha_words_ratio", "stop_words", "cjk_stop_words", "cjk_ratio")
    p: GopherQualityParams

    def __init__(self, params: GopherQualityParams):
        super().__init__(params)
        self._stop = frozenset(params.stop_words)
        self._cjk_stop = frozenset(params.cjk_stop_words)
        self._longest_stop = max(map(len, self._stop | self._cjk_stop), default=0)

    def score(self, doc: Doc) -> Scores:
        text = doc.text
        n_tokens = doc.n_words
        # Per-word rules as array operations over the words' flags and lengths (same counts as the plain loops:
        # is_symbol_token, has_letter and the CJK flag per word).
        content = doc.content_mask
        latin = content & ~doc.cjk_mask
        n_latin = int(latin.sum())
        n_alpha = doc.n_letter_words
        words = doc.distinct_words_upto(self._longest_stop)     # the stop-word rules count distinct words
        lines = doc.lines
        n_lines = len(lines)
        if doc.spans is None:
            bullets, ellipses = _bullet_lines(text, lines), _ellipsis_lines(text, lines)
        else:
            kernels, classes = compiled()
            bullets, ellipses = kernels.line_marks(doc.codepoints, classes)
        return {
            "n_words": int(content.sum()),
            "avg_word_length": int(doc.word_lengths[latin].sum()) / n_latin if n_latin else 0.0,
            "hash_ratio": text.count("#") / n_tokens if n_tokens else 0.0,
            "ellipsis_ratio": (text.count("...") + text.count("…")) / n_tokens if n_tokens else 0.0,
            "bullet_lines_ratio": bullets / n_lines if n_lines else 0.0,
            "ellipsis_lines_ratio": ellipses / n_lines if n_lines else 0.0,
            "alpha_words_ratio": n_alpha / n_tokens if n_tokens else 0.0,
            "stop_words": len(self._stop.intersection(words)),
            "cjk_stop_words": len(self._cjk_stop.intersection(words)),
            "cjk_ratio": doc.cjk_ratio,
        }

    def decide(self, s: Scores) -> Drop | None:
        cjk = s["cjk_ratio"] >= self.p.cjk_min_ratio
        avg = "avg_word_length"
        return self.first(
            self.check(s, "gopher_short_doc", "n_words", "<", "min_words"),
            self.check(s, "gopher_long_doc", "n_words", ">", "max_words"),
            None if cjk else self.check(s, "gopher_below_avg_threshold", avg, "<", "min_avg_word_length"),
            None if cjk else self.check(s, "gopher_above_avg_threshold", avg, ">", "max_avg_word_length"),
            self.check(s, "gopher_too_many_hashes", "hash_ratio", ">", "max_symbol_word_ratio"),
            self.check(s, "gopher_too_many_ellipsis", "ellipsis_ratio", ">", "max_symbol_word_ratio"),
            self.check(s, "gopher_too_many_bullets", "bullet_lines_ratio", ">", "max_bullet_lines_ratio"),
            self.check(s, "gopher_too_many_end_ellipsis", "ellipsis_lines_ratio", ">", "max_ellipsis_lines_ratio"),
            self.check(s, "gopher_below_alpha_threshold", "alpha_words_ratio", "<", "min_alpha_words_ratio"),
            self.check(s, "gopher_enough_stop_words", "cjk_stop_words" if cjk else "stop_words", "<",
                       "min_stop_words"),
        )


_PARAGRAPH = re.compile(r"\n{2,}")
_LINES = re.compile(r"\n+")
TOP_NS = (2, 3, 4)
DUP_NS = (5, 6, 7, 8, 9, 10)


def _duplicates(items: list[str]) -> tuple[int, int]:
    """(duplicate elements, characters in them): every repeat after the first occurrence counts."""
    seen: set[str] = set()
    n = chars = 0
    for x in items:
        if x in seen:
            n += 1
            chars += len(x)
        else:
            seen.add(x)
    return n, chars


_MULT = 0x9E3779B97F4A7C15            # odd 64-bit multiplier of the rolling n-gram hash


def ngram_chars(words: list[str], cjk_flags, lengths=None) -> dict[str, int]:
    """Characters behind the top n-gram (n = 2..4) and in duplicated n-grams (n = 5..10), as datatrove counts them.

    Top n-gram: the most frequent n-gram (the earliest on ties, like ``Counter.most_common``), its length with the
    separating spaces (none next to a CJK character: the text has none there) times its count.  Duplicated n-grams:
    scanning left to right, an n-gram seen before adds its characters (without spaces, as datatrove's ``"".join``)
    and the scan jumps past it.  N-grams are compared through a 64-bit polynomial hash of word ids, built one n from
    the previous, and grouped by sorting the hashes once per n; only positions whose n-gram hash occurs twice or
    more are scanned, since a unique n-gram can never be a repeat.  ``cjk_flags`` (list or boolean array) and
    ``lengths`` (word lengths, computed when not given) are per word.
    """
    import numpy as np

    out = {**{f"top_{n}_gram": 0 for n in TOP_NS}, **{f"dup_{n}_gram": 0 for n in DUP_NS}}
    if len(words) < 2:
        return out
    index = {w: i for i, w in enumerate(dict.fromkeys(words), 1)}      # ids by first occurrence, from 1
    ids = np.fromiter(map(index.__getitem__, words), np.uint64, len(words))
    if lengths is None:
        lengths = np.fromiter(map(len, words), np.int64, len(words))
    prefix = np.zeros(len(words) + 1, np.int64)
    np.cumsum(lengths, out=prefix[1:])
    flags = np.asarray(cjk_flags, bool)
    gaps = np.zeros(len(words), np.int64)
    np.cumsum(~(flags[:-1] | flags[1:]), out=gaps[1:])
    mult = np.uint64(_MULT)
    h = ids
    for n in range(2, max(DUP_NS) + 1):
        h = h[:-1] * mult + ids[n - 1:]         # hash of words[i:i+n], wrapping modulo 2**64
        if not len(h):
            break
        perm = h.argsort(kind="quicksort")
        ordered = h[perm]
        same = ordered[1:] == ordered[:-1]      # sorted neighbours with the same hash: one group
        if n in TOP_NS:
            i, top = _top_group(perm, same)
            out[f"top_{n}_gram"] = int(prefix[i + n] - prefix[i] + gaps[i + n - 1] - gaps[i]) * top
            continue
        if not same.any():
            continue
        in_group = np.zeros(len(h), bool)       # sorted positions whose hash occurs twice or more
        in_group[1:] = same
        in_group[:-1] |= same
        chosen = np.flatnonzero(in_group)
        positions = perm[chosen]
        order = positions.argsort(kind="stable")
        positions = positions[order]
        keys = ordered[chosen][order]
        sizes = prefix[positions + n] - prefix[positions]
        seen: set[int] = set()
        chars = nxt = 0
        for i, key, size in zip(positions.tolist(), keys.tolist(), sizes.tolist(), strict=True):
            if i < nxt:
                continue
            if key in seen:
                chars += size
                nxt = i + n
            else:
                seen.add(key)
                nxt = i + 1
        out[f"dup_{n}_gram"] = chars
    return out


def doc_ngram_chars(doc: Doc) -> dict[str, int]:
    """:func:`ngram_chars` of a document's words: the compiled kernel when numba is there (same values)."""
    if doc.spans is None:
        return ngram_chars(doc.words, doc.cjk_mask, doc.word_lengths)
    kernels = compiled()[0]
    starts, ends, ids, _ = doc.spans
    values = kernels.ngram_counts(ids, doc.word_lengths, doc.cjk_mask).tolist()
    return dict(zip((*(f"top_{n}_gram" for n in TOP_NS), *(f"dup_{n}_gram" for n in DUP_NS)), values, strict=True))


def _top_group(perm, same) -> tuple[int, int]:
    """(earliest position of the largest groups, their size) from a sort permutation and its equal-neighbour mask.

    The same choice as ``np.unique(..., return_index=True, return_counts=True)`` followed by
    ``first[counts == counts.max()].min()``: the first occurrence of every group of the largest size, the earliest.
    """
    import numpy as np

    if not same.any():
        return 0, 1                             # every n-gram once: the first one
    bounds = np.flatnonzero(np.concatenate(([True], ~same)))
    counts = np.diff(bounds, append=len(perm))
    top = int(counts.max())
    firsts = np.minimum.reduceat(perm, bounds)
    return int(firsts[counts == top].min()), top


class GopherRepetition(Filter):
    name = "gopher_repetition"
    prefix = "gopher_rep"
    score_names = ("n_chars", "dup_para_frac", "dup_para_char_frac", "dup_line_frac", "dup_line_char_frac",
                   *(f"top_{n}_gram" for n in TOP_NS), *(f"dup_{n}_gram" for n in DUP_NS))
    p: GopherRepetitionParams

    def score(self, doc: Doc) -> Scores:
        text = doc.text
        size = len(text)
        s: Scores = {"n_chars": size}
        if not size:
            return s | {k: 0.0 for k in self.score_names[1:]}
        if doc.spans is None:
            paragraphs = _PARAGRAPH.split(text.strip())
            n_para, n, chars = len(paragraphs), *_duplicates(paragraphs)
            lines = _LINES.split(text)
            n_lines, n_line, line_chars = len(lines), *_duplicates(lines)
        else:
            kernels, classes = compiled()
            n_para, n, chars, n_lines, n_line, line_chars = kernels.repetition_counts(doc.codepoints, classes)
        s["dup_para_frac"], s["dup_para_char_frac"] = n / n_para, chars / size
        s["dup_line_frac"], s["dup_line_char_frac"] = n_line / n_lines, line_chars / size
        # n-gram rules look at words only; CJK text contributes one word per character.
        for key, chars in doc_ngram_chars(doc).items():
            s[key] = chars / size
        return s

    def decide(self, s: Scores) -> Drop | None:
        if not s["n_chars"]:
            return "gopher_rep_empty", "n_chars=0"
        return self.first(
            self.check(s, "gopher_rep_dup_para_frac", "dup_para_frac", ">", "dup_para_frac"),
            self.check(s, "gopher_rep_dup_para_char_frac", "dup_para_char_frac", ">", "dup_para_char_frac"),
            self.check(s, "gopher_rep_dup_line_frac", "dup_line_frac", ">", "dup_line_frac"),
            self.check(s, "gopher_rep_dup_line_char_frac", "dup_line_char_frac", ">", "dup_line_char_frac"),
            *(self.check(s, f"gopher_rep_top_{n}_gram", f"top_{n}_gram", ">", f"top_{n}_gram") for n in TOP_NS),
            *(self.check(s, f"gopher_rep_duplicated_{n}_n_grams", f"dup_{n}_gram", ">", f"dup_{n}_gram")
              for n in DUP_NS),
        )
