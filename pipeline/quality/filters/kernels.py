"""Compiled (numba) per-document text statistics: word tokens and the Gopher n-gram counts, over code points.

Why compiled: :func:`pipeline.quality.filters.text.split_words` runs a regular expression per whitespace chunk and
builds a Python string per token, and :func:`pipeline.quality.filters.gopher.ngram_chars` then numbers the words
through a dict and sorts nine hash arrays.  Together they were about two thirds of the quality scoring CPU (which
runs twice: MinHash pre-scoring and the quality stage).  Here a document is one uint32 code-point array; one pass
finds the token spans, numbers the distinct tokens and flags them, and a second pass counts the n-grams with hash
tables.  No token becomes a Python object unless a filter asks for the strings.

The results are identical to the pure-Python reference (tests/test_filters_kernels.py compares them on the shared
corpora and on random text): :func:`word_spans` gives exactly the tokens of ``text._TOKEN.findall``, and
:func:`ngram_counts` exactly the values of ``gopher.ngram_chars``, including its 64-bit n-gram hash (two n-grams
are the same when their hashes are, as there).  Character classes come from the same ``re``-derived table as the
MinHash kernel (:func:`pipeline.charclass.char_classes`), so ``\\w``, ``\\s``, ``\\d`` mean what
``re`` means.  Compiled functions are cached on disk (``cache=True``, beside this module in ``__pycache__``), so a
fresh worker process loads them instead of compiling.

All uint64 arithmetic uses typed constants: numba turns uint64 mixed with a Python int literal into float64.
"""

from __future__ import annotations

import numpy as np
from numba import njit

# char_classes() bits (pipeline.charclass.CLS_*)
_CLS_WORD = 1       # letter or digit: [^\W_]
_CLS_DIGIT = 2      # decimal digit: \d
_CLS_SPACE = 4      # whitespace: \s

_TOK_CJK = 8       # in text.CJK_RANGES                                  (token_classes() adds these three)
_TOK_W = 16        # [^\W{CJK}]: a word character that is not CJK
_TOK_X = 32        # [^\s{CJK}/-]: may sit inside a word

_DASH = 0x2D
_DOT = 0x2E
_SLASH = 0x2F
_UNDERSCORE = 0x5F
_PILCROW = 0xB6

_MULT = np.uint64(0x9E3779B97F4A7C15)   # gopher._MULT: the n-gram hash multiplier
_FM1 = np.uint64(0xFF51AFD7ED558CCD)
_FM2 = np.uint64(0xC4CEB9FE1A85EC53)
_U33 = np.uint64(33)

#: ngram_counts() output order: top 2..4, then dup 5..10 (gopher.TOP_NS, gopher.DUP_NS)
TOP_NS = (2, 3, 4)
DUP_NS = (5, 6, 7, 8, 9, 10)


@njit(inline="always")
def _is_cjk(c):
    """text.CJK_RANGES: Han (with extensions and compatibility ideographs) and kana."""
    return c >= 0x3040 and ((c <= 0x30FF) or (0x31F0 <= c <= 0x31FF) or (0x3400 <= c <= 0x4DBF)
            or (0x4E00 <= c <= 0x9FFF) or (0xF900 <= c <= 0xFAFF) or (0x20000 <= c <= 0x3134F))


def token_classes(cls: np.ndarray) -> np.ndarray:
    """The class table with the tokenizer's own bits added (_TOK_*), so each test is one lookup."""
    cp = np.arange(cls.shape[0], dtype=np.int64)
    cjk = np.zeros(cls.shape[0], bool)
    for lo, hi in ((0x3040, 0x30FF), (0x31F0, 0x31FF), (0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xF900, 0xFAFF),
                   (0x20000, 0x3134F)):
        cjk[lo:hi + 1] = True
    word = ((cls & _CLS_WORD) != 0) | (cp == _UNDERSCORE)
    inner = ((cls & _CLS_SPACE) == 0) & (cp != _SLASH) & (cp != _DASH) & ~cjk
    return (cls | np.where(cjk, _TOK_CJK, 0) | np.where(word & ~cjk, _TOK_W, 0)
            | np.where(inner, _TOK_X, 0)).astype(np.uint8)


@njit(inline="always")
def _is_w(c, cls):
    """``[^\\W{CJK}]``: a word character (``\\w``: letter, digit or '_') that is not CJK."""
    return (cls[c] & _TOK_W) != 0


@njit(inline="always")
def _is_x(c, cls):
    """``[^\\s{CJK}/-]``: what may sit inside a word between its word characters."""
    return (cls[c] & _TOK_X) != 0


@njit(inline="always")
def _at(cp, n, i, c):
    return i < n and cp[i] == c


@njit(cache=True)
def _abbreviation(cp, n, p):
    """End of ``(?:Mrs?|Ms|Dr|St|Jr|Sr|vs|etc|[A-Z])\\.`` at p, or -1 (tried in the regular expression's order)."""
    c = cp[p]
    if c == 0x4D:                                                       # M
        if _at(cp, n, p + 1, 0x72):                                     # Mr
            if _at(cp, n, p + 2, 0x73) and _at(cp, n, p + 3, _DOT):     # Mrs.
                return p + 4
            if _at(cp, n, p + 2, _DOT):
                return p + 3
        if _at(cp, n, p + 1, 0x73) and _at(cp, n, p + 2, _DOT):         # Ms.
            return p + 3
    elif c == 0x44 or c == 0x53 or c == 0x4A:                           # Dr. / St. Sr. / Jr.
        second = 0x72 if c != 0x53 else 0x74
        if _at(cp, n, p + 1, second) and _at(cp, n, p + 2, _DOT):
            return p + 3
        if c == 0x53 and _at(cp, n, p + 1, 0x72) and _at(cp, n, p + 2, _DOT):
            return p + 3
    elif c == 0x76:                                                     # vs.
        if _at(cp, n, p + 1, 0x73) and _at(cp, n, p + 2, _DOT):
            return p + 3
    elif c == 0x65:                                                     # etc.
        if _at(cp, n, p + 1, 0x74) and _at(cp, n, p + 2, 0x63) and _at(cp, n, p + 3, _DOT):
            return p + 4
    if 0x41 <= c <= 0x5A and _at(cp, n, p + 1, _DOT):                   # [A-Z].
        return p + 2
    return -1


@njit(cache=True)
def _core(cp, n, p, cls):
    """End of ``{_W}(?:[^\\s{CJK}/-]*{_W})?`` at p (cp[p] is a word character): just past the last word character
    of the run of in-word characters that follows."""
    end = p + 1
    j = p + 1
    while j < n:
        c = cp[j]
        if not _is_x(c, cls):
            break
        j += 1
        if _is_w(c, cls):
            end = j
    return end


@njit(cache=True)
def _hash_span(cp, s, e):
    h = np.uint64(e - s)
    for i in range(s, e):
        h = (h + np.uint64(cp[i])) * _MULT
    h ^= h >> _U33
    h *= _FM1
    h ^= h >> _U33
    return h


@njit(cache=True)
def span_ids(cp, starts, ends):
    """Ids of the strings cp[starts[t]:ends[t]], numbered by first occurrence from 1 (``dict.fromkeys`` order).

    Open addressing on a hash of the code points; equal hashes are confirmed by comparing the code points, so
    the ids are exact.
    """
    k = starts.shape[0]
    ids = np.empty(k, np.uint64)
    size = 16
    while size < 2 * k:
        size *= 2
    mask = np.uint64(size - 1)
    slot_token = np.full(size, -1, np.int64)     # first span of the distinct string in each slot
    slot_id = np.zeros(size, np.uint64)
    distinct = 0
    for t in range(k):
        s, e = starts[t], ends[t]
        slot = _hash_span(cp, s, e) & mask
        while True:
            other = slot_token[np.int64(slot)]
            if other < 0:
                distinct += 1
                slot_token[np.int64(slot)] = t
                slot_id[np.int64(slot)] = np.uint64(distinct)
                ids[t] = np.uint64(distinct)
                break
            os_, oe = starts[other], ends[other]
            if oe - os_ == e - s:
                same = True
                for i in range(e - s):
                    if cp[os_ + i] != cp[s + i]:
                        same = False
                        break
                if same:
                    ids[t] = slot_id[np.int64(slot)]
                    break
            slot = (slot + np.uint64(1)) & mask
    return ids


@njit(cache=True)
def word_spans(cp, cls):
    """Word tokens of one document (the tokens of ``text._TOKEN.findall``) as code-point spans; ``cls`` is
    :func:`token_classes`.

    Returns (starts, ends, ids, flags): ``ids`` number the distinct tokens by first occurrence from 1 (as
    ``dict.fromkeys`` would); ``flags`` bit 1: the token starts with a word character (not a symbol token),
    bit 2: it is one CJK character, bit 4: it holds a letter (``[^\\W\\d_]``).
    """
    n = cp.shape[0]
    starts = np.empty(n, np.int64)
    ends = np.empty(n, np.int64)
    k = 0
    p = 0
    while p < n:
        c = cp[p]
        if (cls[c] & _CLS_SPACE) != 0:
            p += 1
            continue
        if (cls[c] & _TOK_CJK) != 0:
            e = p + 1
        else:
            e = _abbreviation(cp, n, p)
            if e < 0:
                if _is_w(c, cls):
                    e = _core(cp, n, p, cls)
                    while _at(cp, n, e, _DASH) and _at(cp, n, e + 1, _DASH):     # (?:--+{_CORE})*
                        d = e + 2
                        while _at(cp, n, d, _DASH):
                            d += 1
                        if d < n and _is_w(cp[d], cls):
                            e = _core(cp, n, d, cls)
                        else:
                            break
                    if _at(cp, n, e, _PILCROW):
                        e += 1
                elif (c == _DASH or c == _DOT) and _at(cp, n, p + 1, c):       # -{2,} | \.{2,}
                    e = p + 2
                    while _at(cp, n, e, c):
                        e += 1
                else:
                    e = p + 1                                                   # [^\w\s]
        starts[k] = p
        ends[k] = e
        k += 1
        p = e
    starts = starts[:k]
    ends = ends[:k]
    ids = span_ids(cp, starts, ends)
    flags = np.zeros(k, np.uint8)
    for t in range(k):
        s, e = starts[t], ends[t]
        c = cp[s]
        f = 0
        if (cls[c] & _CLS_WORD) != 0 or c == _UNDERSCORE:
            f |= 1
        if e - s == 1 and (cls[c] & _TOK_CJK) != 0:
            f |= 2
        for i in range(s, e):
            if (cls[cp[i]] & (_CLS_WORD | _CLS_DIGIT)) == _CLS_WORD:
                f |= 4
                break
        flags[t] = f
    return starts, ends, ids, flags


@njit(cache=True)
def _count_table(h, pos, m, keys, counts, used):
    """Count the hashes h[pos[:m]] in an open-addressing table; return each position's slot."""
    size = keys.shape[0]
    mask = np.uint64(size - 1)
    used[:] = False
    slots = np.empty(m, np.int64)
    for j in range(m):
        key = h[pos[j]]
        x = key ^ (key >> _U33)
        x *= _FM1
        x ^= x >> _U33
        slot = np.int64(x & mask)
        while used[slot] and keys[slot] != key:
            slot = (slot + 1) & (size - 1)
        if not used[slot]:
            used[slot] = True
            keys[slot] = key
            counts[slot] = 0
        counts[slot] += 1
        slots[j] = slot
    return slots


@njit(cache=True)
def ngram_counts(ids, lengths, cjk):
    """gopher.ngram_chars as 9 integers (top_2..4, dup_5..10) from word ids, lengths and CJK flags.

    Same 64-bit polynomial n-gram hash as the reference (two n-grams are the same when their hashes are);
    grouping by hash table instead of by sorting.  The duplicate scan for n >= 5 visits only the positions whose
    (n-1)-gram occurs twice or more: any other position's n-gram occurs once (barring a 64-bit hash collision,
    the reference's own caveat), and a unique n-gram is never a repeat and moves the scan's skip mark to its own
    position + 1, which skips nothing; so leaving it out changes no count.
    """
    out = np.zeros(9, np.int64)
    L = ids.shape[0]
    if L < 2:
        return out
    prefix = np.zeros(L + 1, np.int64)
    for i in range(L):
        prefix[i + 1] = prefix[i] + lengths[i]
    gaps = np.zeros(L, np.int64)
    for i in range(1, L):
        gaps[i] = gaps[i - 1] + (0 if (cjk[i - 1] or cjk[i]) else 1)
    size = 16
    while size < 2 * L:
        size *= 2
    keys = np.empty(size, np.uint64)
    counts = np.empty(size, np.int64)
    used = np.empty(size, np.bool_)
    seen = np.empty(size, np.bool_)
    h = ids.copy()
    pos = np.arange(L)                   # positions still in play, ascending
    m = L
    for n in range(2, 11):
        # positions with a whole n-gram: i <= L - n
        k = 0
        for j in range(m):
            i = pos[j]
            if i <= L - n:
                h[i] = h[i] * _MULT + ids[i + n - 1]
                pos[k] = i
                k += 1
        m = k
        if m == 0:
            break
        slots = _count_table(h, pos, m, keys, counts, used)
        if n <= 4:
            top = 0
            for j in range(m):
                if counts[slots[j]] > top:
                    top = counts[slots[j]]
            for j in range(m):
                if counts[slots[j]] == top:
                    i = pos[j]
                    out[n - 2] = (prefix[i + n] - prefix[i] + gaps[i + n - 1] - gaps[i]) * top
                    break
        else:
            seen[:] = False
            chars = 0
            nxt = 0
            for j in range(m):
                i = pos[j]
                if i < nxt or counts[slots[j]] < 2:
                    continue
                slot = slots[j]
                if seen[slot]:
                    chars += prefix[i + n] - prefix[i]
                    nxt = i + n
                else:
                    seen[slot] = True
                    nxt = i + 1
            out[n - 2] = chars
        if n >= 4:                       # from 5 on only repeated (n-1)-grams can give repeated n-grams
            k = 0
            for j in range(m):
                if counts[slots[j]] >= 2:
                    pos[k] = pos[j]
                    k += 1
            m = k
    return out


@njit(cache=True)
def _segments(cp, lo, hi, min_run):
    """Spans of cp[lo:hi] between maximal runs of at least ``min_run`` newlines (``re.split('\\n{min_run,}')``)."""
    starts = np.empty(hi - lo + 1, np.int64)
    ends = np.empty(hi - lo + 1, np.int64)
    k = 0
    start = lo
    i = lo
    while i < hi:
        if cp[i] == 10:
            j = i
            while j < hi and cp[j] == 10:
                j += 1
            if j - i >= min_run:
                starts[k] = start
                ends[k] = i
                k += 1
                start = j
            i = j
        else:
            i += 1
    starts[k] = start
    ends[k] = hi
    return starts[:k + 1], ends[:k + 1]


@njit(cache=True)
def _duplicates(cp, starts, ends):
    """(segments, repeated segments, characters in them): gopher._duplicates over the spans."""
    ids = span_ids(cp, starts, ends)
    n = 0
    chars = 0
    top = 0
    for t in range(ids.shape[0]):
        if ids[t] <= top:
            n += 1
            chars += ends[t] - starts[t]
        else:
            top = ids[t]
    return ids.shape[0], n, chars


@njit(cache=True)
def repetition_counts(cp, cls):
    """gopher's paragraph and line duplicates: (paragraphs, repeated, their chars, lines, repeated, their chars).

    Paragraphs: ``re.split(r"\n{2,}", text.strip())``; lines: ``re.split(r"\n+", text)`` (with the empty first
    or last piece when the text starts or ends with a newline, as ``re.split`` gives them).
    """
    L = cp.shape[0]
    lo = 0
    while lo < L and (cls[cp[lo]] & _CLS_SPACE) != 0:
        lo += 1
    hi = L
    while hi > lo and (cls[cp[hi - 1]] & _CLS_SPACE) != 0:
        hi -= 1
    ps, pe = _segments(cp, lo, hi, 2)
    a, b, c = _duplicates(cp, ps, pe)
    ls, le = _segments(cp, 0, L, 1)
    d, e, f = _duplicates(cp, ls, le)
    return a, b, c, d, e, f


@njit(inline="always")
def _is_line_break(c):
    """The line boundaries of str.splitlines()."""
    return (10 <= c <= 13) or (0x1C <= c <= 0x1E) or c == 0x85 or c == 0x2028 or c == 0x2029


@njit(cache=True)
def line_marks(cp, cls):
    """(lines starting with a bullet, lines ending in an ellipsis) over ``text.splitlines()``, whitespace aside.

    A bullet is '•' or '-' as the first non-space character; an ellipsis is '...' or '…' at the end of the line
    after ``rstrip()``.  Empty pieces between breaks (e.g. of '\r\n') have no characters and count for neither.
    """
    L = cp.shape[0]
    bullets = 0
    ellipses = 0
    start = 0
    while start <= L:
        end = start
        while end < L and not _is_line_break(cp[end]):
            end += 1
        a = start
        while a < end and (cls[cp[a]] & _CLS_SPACE) != 0:
            a += 1
        if a < end:
            if cp[a] == 0x2022 or cp[a] == _DASH:
                bullets += 1
            b = end
            while (cls[cp[b - 1]] & _CLS_SPACE) != 0:
                b -= 1
            if cp[b - 1] == 0x2026 or (b - a >= 3 and cp[b - 1] == _DOT and cp[b - 2] == _DOT and cp[b - 3] == _DOT):
                ellipses += 1
        start = end + 1
    return bullets, ellipses


@njit(cache=True)
def cjk_count(cp):
    """Code points in text.CJK_RANGES."""
    n = 0
    for i in range(cp.shape[0]):
        if _is_cjk(cp[i]):
            n += 1
    return n
