"""What every filter measures a document with: words, lines, sentences and script, computed once per document.

Word splitting imitates datatrove's spaCy tokenizer for English closely enough for the published thresholds to
mean the same thing: a whitespace chunk loses its leading and trailing punctuation (one token per mark), keeps inner
punctuation (``3.14``, ``x=1``, ``don't``, ``so--well``) but splits at hyphens and slashes, and abbreviations keep
their period.  Against spaCy on the shared corpora the Gopher alpha-words rule agrees on nearly every document of
every domain (benchmarks/bench_filters.py; the whole Gopher quality filter's agreement with datatrove:
``filters.gopher_quality_same_decision``); it is one compiled regular expression, with no model to download.

Chinese and Japanese have no spaces, so every Han or kana character is one word: character-based counting is what
makes the word-count, stop-word, n-gram and words-per-line rules meaningful for CJK text instead of seeing a whole
paragraph as one "word".  Hangul is written with spaces and is tokenised like Latin script.
"""

from __future__ import annotations

import json
import math
import re
from functools import cached_property
from typing import Any

# Han (incl. extension A, compatibility and the supplementary planes) and kana: scripts written without spaces.
CJK_RANGES = "\u3040-\u30ff\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f"
_CJK_CHAR = re.compile(f"[{CJK_RANGES}]")
_LETTER = re.compile(r"[^\W\d_]")
_W = rf"[^\W{CJK_RANGES}]"              # a letter, digit or underscore that is not CJK
_CORE = rf"{_W}(?:[^\s{CJK_RANGES}/-]*{_W})?"
_TOKEN = re.compile(
    rf"[{CJK_RANGES}]"                              # one CJK character = one word
    r"|(?:Mrs?|Ms|Dr|St|Jr|Sr|vs|etc|[A-Z])\."      # abbreviations and initials keep their period
    rf"|{_CORE}(?:--+{_CORE})*¶?"                   # word with inner punctuation (3.14, x=1, don't, so--well)
    r"|-{2,}|\.{2,}"                                # dash and dot runs (--, ----, ...)
    r"|[^\w\s]")                                    # any other punctuation or symbol, one character each

# Unicode property Sentence_Terminal (Unicode 15, Basic Multilingual Plane): '.', '!', '?', '。', '！', '？', '।', ...
# It is the set FineWeb's "lines ending in punctuation" rule uses (datatrove TERMINAL_PUNCTUATION).
SENTENCE_TERMINALS = frozenset(
    "!.?\u0589\u061d\u061e\u061f\u06d4\u0700\u0701\u0702\u07f9\u0837\u0839\u083d\u083e\u0964\u0965\u104a\u104b"
    "\u1362\u1367\u1368\u166e\u1735\u1736\u17d4\u17d5\u1803\u1809\u1944\u1945\u1aa8\u1aa9\u1aaa\u1aab\u1b4e\u1b4f"
    "\u1b5a\u1b5b\u1b5e\u1b5f\u1b7d\u1b7e\u1b7f\u1c3b\u1c3c\u1c7e\u1c7f\u2024\u203c\u203d\u2047\u2048\u2049"
    "\u2cf9\u2cfa\u2cfb\u2e2e\u2e3c\u2e53\u2e54\u2e60\u2e61\u3002\ua4ff\ua60e\ua60f\ua6f3\ua6f7\ua876\ua877\ua8ce"
    "\ua8cf\ua92f\ua9c8\ua9c9\uaa5d\uaa5e\uaa5f\uaaf0\uaaf1\uabeb\ufe12\ufe15\ufe16\ufe52\ufe56\ufe57\uff01\uff0e"
    "\uff1f\uff61")
# A sentence ends at terminal punctuation (optionally closed by quotes/brackets) followed by a space, or right
# after a CJK full stop / exclamation / question mark, which are not followed by spaces.  A period after an initial
# or a common abbreviation ("n.", "Mr.") ends nothing, as in spaCy, whose tokenizer keeps those periods attached.
_SENTENCE_END = re.compile(r"(?<!\b[A-Za-z])(?<!\bMrs)(?<!\b(?:Mr|Ms|Dr|St|Jr|Sr|vs))(?<!\betc)"
                           r"[.!?‼⁇⁈⁉…]+[\"'”’)\]]*\s+|[。！？｡]+[」』”’）】]*")


# CJK_RANGES as inclusive code-point bounds, for the vectorised checks below.
_CJK_BOUNDS = ((0x3040, 0x30FF), (0x31F0, 0x31FF), (0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xF900, 0xFAFF),
               (0x20000, 0x3134F))


def _load_kernels():
    """The compiled kernels (:mod:`pipeline.quality.filters.kernels`) and the character-class table they read, or
    None where numba is not installed (the pure-Python functions of this module then do the work)."""
    try:
        from pipeline.charclass import char_classes
        from pipeline.quality.filters import kernels
    except ImportError:
        return None
    return kernels, kernels.token_classes(char_classes())


_UNLOADED = object()
#: (kernels module, class table), None without numba, or _UNLOADED before first use (importing numba costs time,
#: which processes that never score a document should not pay); tests set it to None to run the reference path.
KERNELS: Any = _UNLOADED


def compiled() -> tuple[Any, Any] | None:
    """(kernels module, class table) or None; loaded on first use."""
    global KERNELS
    if KERNELS is _UNLOADED:
        KERNELS = _load_kernels()
    return KERNELS


def has_cjk(text: str) -> bool:
    return not text.isascii() and _CJK_CHAR.search(text) is not None


def _codepoints(text: str):
    import numpy as np

    return np.frombuffer(text.encode("utf-32-le", "surrogatepass"), np.uint32)


def _is_cjk(cp):
    """Boolean array: which code points are Han or kana (CJK_RANGES)."""
    mask = (cp >= _CJK_BOUNDS[0][0]) & (cp <= _CJK_BOUNDS[0][1])
    for lo, hi in _CJK_BOUNDS[1:]:
        mask |= (cp >= lo) & (cp <= hi)
    return mask


def first_codepoints(words: list[str]):
    """The first character of every word, as a uint32 array."""
    from operator import itemgetter

    return _codepoints("".join(map(itemgetter(0), words)))


def word_lengths(words: list[str]):
    import numpy as np

    return np.fromiter(map(len, words), np.int64, len(words))


def cjk_word_mask(words: list[str], firsts=None, lengths=None):
    """Boolean array: which words of :func:`split_words` are a CJK character (those are always single characters)."""
    firsts = first_codepoints(words) if firsts is None else firsts
    lengths = word_lengths(words) if lengths is None else lengths
    return (lengths == 1) & _is_cjk(firsts)


def cjk_word_flags(words: list[str]) -> list[bool]:
    """For each word of :func:`split_words`, whether it is a CJK character (those are always single characters)."""
    return cjk_word_mask(words).tolist()


_BMP_TABLES: dict = {}


def _char_table(cp, predicate):
    """``predicate`` of every code point of ``cp`` (a uint32 array).

    Basic Multilingual Plane code points are looked up in a 65,536-entry table built on first use (per process);
    the few others are evaluated one by one.
    """
    import numpy as np

    table = _BMP_TABLES.get(predicate)
    if table is None:
        table = _BMP_TABLES[predicate] = np.fromiter(map(predicate, map(chr, range(0x10000))), bool, 0x10000)
    high = cp > 0xFFFF
    if not high.any():
        return table[cp]
    out = table[np.where(high, 0, cp)]
    where = np.flatnonzero(high)
    out[where] = np.fromiter(map(predicate, map(chr, cp[where].tolist())), bool, len(where))
    return out


def _is_word_char(c: str) -> bool:
    return c.isalnum() or c == "_"


def _is_letter_char(c: str) -> bool:
    """``[^\\W\\d_]`` of :data:`_LETTER` for one character: a word character that is no decimal digit or '_'."""
    return c.isalnum() and not c.isdecimal()


def split_words(text: str) -> list[str]:
    """Word tokens: letter/digit runs, single CJK characters, punctuation marks (see module docstring).

    The same tokens as ``_TOKEN.findall(text)``, found faster: no token contains or crosses whitespace (the
    regular expression's ``\\s`` and ``str.split()`` agree on what whitespace is), so each whitespace-separated
    chunk is tokenised on its own, and a chunk of letters and digits without CJK characters is one token whole.
    """
    findall = _TOKEN.findall
    out: list[str] = []
    add, extend = out.append, out.extend
    if text.isascii():
        for chunk in text.split():
            if chunk.isalnum():
                add(chunk)
            else:
                extend(findall(chunk))
        return out
    cjk = _CJK_CHAR.search
    for chunk in text.split():
        if chunk.isalnum() and (chunk.isascii() or cjk(chunk) is None):
            add(chunk)
        else:
            extend(findall(chunk))
    return out


def symbol_mask(words: list[str], firsts=None):
    """Boolean array of :func:`is_symbol_token` for every word (computed per distinct first character)."""
    firsts = first_codepoints(words) if firsts is None else firsts
    return ~_char_table(firsts, _is_word_char)


def count_letter_words(words: list[str], firsts=None, lengths=None) -> int:
    """How many words :func:`has_letter` holds for: the first character decides most; the rest are searched."""
    import numpy as np

    if not words:
        return 0
    firsts = first_codepoints(words) if firsts is None else firsts
    lengths = word_lengths(words) if lengths is None else lengths
    first_letter = _char_table(firsts, _is_letter_char)
    search = _LETTER.search
    rest = np.flatnonzero(~first_letter & (lengths > 1)).tolist()
    return int(first_letter.sum()) + sum(1 for i in rest if search(words[i], 1) is not None)


def is_symbol_token(tok: str) -> bool:
    """True for punctuation/symbol tokens: the ones Gopher's word-count and mean-word-length rules ignore.

    Every token of :func:`split_words` that holds a letter, digit or CJK character starts with one, so the first
    character decides.
    """
    c = tok[0]
    return not (c.isalnum() or c == "_")


def has_letter(tok: str) -> bool:
    """Gopher's "contains at least one alphabetic character" (CJK characters are letters)."""
    return tok[0].isalpha() or _LETTER.search(tok) is not None


def count_sentences(line: str) -> int:
    """Sentences in one line: terminal punctuation followed by space (or a CJK full stop) ends one; a non-empty
    remainder is one more.  Plays the role of the spaCy sentencizer C4 uses per line."""
    if not line.strip():
        return 0
    ends = list(_SENTENCE_END.finditer(line))
    tail = line[ends[-1].end():] if ends else line
    return len(ends) + (1 if tail.strip() else 0)


def cjk_char_count(text: str) -> int:
    if text.isascii():
        return 0
    return int(_is_cjk(_codepoints(text)).sum())


def approx_tokens(n_chars: int, n_cjk: int, chars_per_token: float) -> int:
    """Subword tokens without a tokenizer: one per CJK character, one per ``chars_per_token`` other characters.

    4 characters per token is the usual figure for English BPE vocabularies; a CJK character is about one token
    in vocabularies that cover it (more in byte-fallback ones, so this undercounts rather than overcounts).
    """
    return n_cjk + math.ceil(max(n_chars - n_cjk, 0) / chars_per_token)


def _first_occurrences(ids):
    """Positions where a new id appears, for ids numbered by first occurrence from 1 (1, 2, 1, 3 → 0, 1, 3)."""
    import numpy as np

    if not len(ids):
        return np.zeros(0, np.int64)
    before = np.empty(len(ids), ids.dtype)
    before[0] = 0
    np.maximum.accumulate(ids[:-1], out=before[1:])
    return np.flatnonzero(ids > before)


class Doc:
    """One document and the measurements several filters share, each computed on first use.

    ``text`` can be replaced by a cleaning filter (C4 line cleaning); :meth:`set_text` drops the cached views so
    later filters in the chain see the cleaned text, as they do in datatrove.  Per-word measures are NumPy arrays
    (first character, length, CJK flag of every word), so rules count over them instead of looping in Python;
    tests/test_filters_rules.py checks them against the per-word functions.  With numba installed the words are
    found by the compiled :func:`pipeline.quality.filters.kernels.word_spans` as spans of the text (``spans``), and
    the word strings are only built when a filter asks for them; tests/test_filters_kernels.py checks that both
    paths give the same words and scores.
    """

    _CACHED = ("words", "cjk_flags", "cjk_mask", "first_codepoints", "word_lengths", "lines", "n_cjk", "cjk_ratio",
               "non_space_chars", "codepoints", "spans", "n_words", "distinct_words", "content_mask",
               "n_letter_words")

    def __init__(self, text: str, doc_id: str = "", domain: str = "", meta: str | dict | None = None,
                 columns: dict[str, Any] | None = None):
        self.text = text
        self.doc_id = doc_id
        self.domain = domain
        self._meta = meta
        self.columns = columns or {}

    def set_text(self, text: str) -> None:
        if text != self.text:
            self.text = text
            for name in self._CACHED:
                self.__dict__.pop(name, None)

    @cached_property
    def codepoints(self):
        """uint32 array: the code points of the text (one per str index)."""
        return _codepoints(self.text)

    @cached_property
    def spans(self):
        """(starts, ends, ids, flags) of the words from the compiled kernel, or None without numba."""
        if compiled() is None:
            return None
        kernels, classes = compiled()
        return kernels.word_spans(self.codepoints, classes)

    @cached_property
    def words(self) -> list[str]:
        if self.spans is None:
            return split_words(self.text)
        starts, ends = self.spans[0].tolist(), self.spans[1].tolist()
        return list(map(self.text.__getitem__, map(slice, starts, ends)))

    @cached_property
    def n_words(self) -> int:
        """Number of word tokens (symbols included)."""
        return len(self.words) if self.spans is None else len(self.spans[0])

    @cached_property
    def distinct_words(self) -> list[str]:
        """The distinct words, in order of first occurrence."""
        if self.spans is None:
            return list(dict.fromkeys(self.words))
        return self.distinct_words_upto(None)

    def distinct_words_upto(self, longest: int | None) -> list[str]:
        """The distinct words of at most ``longest`` characters (all with None), in order of first occurrence:
        a stop-word list only needs the short ones, and building fewer strings is cheaper."""
        if self.spans is None:
            words = self.__dict__.get("distinct_words") or list(dict.fromkeys(self.words))
            return words if longest is None else [w for w in words if len(w) <= longest]
        starts, ends, ids, _ = self.spans
        first = _first_occurrences(ids)
        if longest is not None:
            first = first[(ends[first] - starts[first]) <= longest]
        return list(map(self.text.__getitem__, map(slice, starts[first].tolist(), ends[first].tolist())))

    @cached_property
    def first_codepoints(self):
        """uint32 array: the first character of every word."""
        if self.spans is None:
            return first_codepoints(self.words)
        return self.codepoints[self.spans[0]]

    @cached_property
    def word_lengths(self):
        """int64 array: the length of every word."""
        if self.spans is None:
            return word_lengths(self.words)
        return self.spans[1] - self.spans[0]

    @cached_property
    def cjk_mask(self):
        """Boolean array: which words are a CJK character."""
        if self.spans is None:
            return cjk_word_mask(self.words, self.first_codepoints, self.word_lengths)
        return (self.spans[3] & 2) != 0

    @cached_property
    def content_mask(self):
        """Boolean array: which words are not symbol tokens (:func:`is_symbol_token`)."""
        if self.spans is None:
            return ~symbol_mask(self.words, self.first_codepoints)
        return (self.spans[3] & 1) != 0

    @cached_property
    def n_letter_words(self) -> int:
        """How many words hold a letter (:func:`has_letter`)."""
        if self.spans is None:
            return count_letter_words(self.words, self.first_codepoints, self.word_lengths)
        return int(((self.spans[3] & 4) != 0).sum())

    @cached_property
    def cjk_flags(self) -> list[bool]:
        return self.cjk_mask.tolist()

    @cached_property
    def lines(self) -> list[str]:
        return self.text.splitlines()

    @cached_property
    def n_cjk(self) -> int:
        if self.text.isascii() or compiled() is None:
            return cjk_char_count(self.text)
        return int(compiled()[0].cjk_count(self.codepoints))

    @cached_property
    def non_space_chars(self) -> int:
        return len(self.text) - sum(self.text.count(c) for c in " \t\n\r\u3000\xa0")

    @cached_property
    def cjk_ratio(self) -> float:
        """Share of non-space characters that are Han or kana."""
        return self.n_cjk / self.non_space_chars if self.non_space_chars else 0.0

    @property
    def meta(self) -> dict:
        if isinstance(self._meta, str):
            try:
                self._meta = json.loads(self._meta) if self._meta else {}
            except ValueError:
                self._meta = {}
        return self._meta or {}
