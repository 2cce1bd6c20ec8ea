"""C4 line cleaning + document rules (Raffel et al. 2020; datatrove C4QualityFilter) and FineWeb's custom rules.

C4 is the one filter that rewrites text: lines failing the line rules are removed and the kept lines are what later
filters see and what the corpus keeps, exactly as in datatrove.  The document rules then look at the kept lines:
'lorem ipsum' or a '{' drops the document (whichever comes first, as datatrove's single pass does), and so do fewer
than ``min_sentences`` sentences.  FineWeb runs C4 with the terminal-punctuation line rule off (our default).

CJK awareness: a line's words are counted per CJK character (a Chinese sentence is not "one word"), and 。！？ end a
line and a sentence like . ! ? do.
"""

from __future__ import annotations

import re

from pipeline.quality.filters.base import Drop, Filter, Scores
from pipeline.quality.filters.gopher import _duplicates
from pipeline.quality.filters.params import C4Params, FineWebParams
from pipeline.quality.filters.text import SENTENCE_TERMINALS, Doc, count_sentences, has_cjk, split_words

CITATION = re.compile(r"\[\d*]|\[edit]|\[citation needed]")
# datatrove END_PUNCTUATION plus the CJK full stop, exclamation and question marks and closing CJK quotes.
END_PUNCTUATION = (".", "?", "!", '"', "'", "。", "！", "？", "」", "』", "”")
POLICY_SUBSTRINGS = ("terms of use", "privacy policy", "cookie policy", "uses cookies", "use of cookies",
                     "use cookies")
_POLICY = re.compile("|".join(map(re.escape, POLICY_SUBSTRINGS)))     # any of them, in one scan of the line


def _line_words(line: str) -> list[str]:
    """Whitespace words (datatrove), except that a line with CJK characters counts each character as a word."""
    if has_cjk(line):
        return [w for w in split_words(line) if w.isalnum()]
    return line.split()


class C4Quality(Filter):
    name = "c4"
    prefix = "c4"
    score_names = ("n_sentences", "lorem_line", "curly_line", "lines_in", "lines_removed", "chars_removed")
    modifies_text = True
    p: C4Params

    def _clean(self, text: str) -> tuple[list[str], Scores]:
        p = self.p
        kept: list[str] = []
        lorem = curly = -1
        sentences = 0
        lines = text.splitlines()
        for i, line in enumerate(lines):
            line = line.strip()
            words = line.split()
            if p.max_word_length and words and max(map(len, words)) > p.max_word_length:
                continue
            if p.remove_citations and "[" in line:              # every citation marker starts with '['
                cleaned = CITATION.sub("", line)
                if cleaned != line:
                    line = cleaned
                    words = line.split()
            if p.filter_no_terminal_punct and (not line.endswith(END_PUNCTUATION) or line.endswith("...")):
                continue
            n_words = len(_line_words(line)) if has_cjk(line) else len(words)    # _line_words without a split
            if n_words < p.min_words_per_line:
                continue
            low = line.lower()
            if lorem < 0 and "lorem ipsum" in low:
                lorem = i
            if p.filter_javascript and "javascript" in low:
                continue
            if curly < 0 and "{" in line:
                curly = i
            if p.filter_policy and _POLICY.search(low):
                continue
            sentences += count_sentences(line)
            kept.append(line)
        return kept, {"n_sentences": sentences, "lorem_line": lorem, "curly_line": curly, "lines_in": len(lines),
                      "lines_removed": len(lines) - len(kept)}

    def score(self, doc: Doc) -> Scores:
        kept, s = self._clean(doc.text)
        cleaned = "\n".join(kept).strip()
        s["chars_removed"] = len(doc.text) - len(cleaned)
        doc.set_text(cleaned)
        return s

    def transform(self, doc: Doc) -> None:
        doc.set_text("\n".join(self._clean(doc.text)[0]).strip())

    def decide(self, s: Scores) -> Drop | None:
        hits = []
        if self.p.filter_lorem_ipsum and s["lorem_line"] >= 0:
            hits.append((s["lorem_line"], 0, ("c4_lorem_ipsum", f"'lorem ipsum' on line {s['lorem_line'] + 1}")))
        if self.p.filter_curly_bracket and s["curly_line"] >= 0:
            hits.append((s["curly_line"], 1, ("c4_curly_bracket", f"'{{' on line {s['curly_line'] + 1}")))
        if hits:
            return min(hits)[2]
        return self.check(s, "c4_too_few_sentences", "n_sentences", "<", "min_sentences")


class FineWebQuality(Filter):
    name = "fineweb"
    prefix = "fineweb"
    score_names = ("n_lines", "line_punct_ratio", "short_line_ratio", "char_dup_ratio", "new_line_ratio")
    p: FineWebParams

    def score(self, doc: Doc) -> Scores:
        text = doc.text
        lines = [ln for ln in text.split("\n") if ln.strip()]
        n = len(lines)
        if not n:
            return {"n_lines": 0, "line_punct_ratio": 0.0, "short_line_ratio": 0.0, "char_dup_ratio": 0.0,
                    "new_line_ratio": 0.0}
        chars = len(text) - text.count("\n")
        n_words = doc.n_words
        return {
            "n_lines": n,
            "line_punct_ratio": sum(ln[-1] in SENTENCE_TERMINALS for ln in lines) / n,
            "short_line_ratio": sum(len(ln) <= self.p.short_line_length for ln in lines) / n,
            "char_dup_ratio": _duplicates(lines)[1] / chars if chars else 0.0,
            "new_line_ratio": text.count("\n") / n_words if n_words else 0.0,
        }

    def decide(self, s: Scores) -> Drop | None:
        if not s["n_lines"]:
            return "fineweb_empty", "no non-empty line"
        punct = None
        if not (s["line_punct_ratio"] == 0 and self.p.line_punct_exclude_zero):
            punct = self.check(s, "fineweb_line_punct_ratio", "line_punct_ratio", "<", "line_punct_thr")
        return self.first(
            punct,
            self.check(s, "fineweb_short_line_ratio", "short_line_ratio", ">", "short_line_thr"),
            self.check(s, "fineweb_char_dup_ratio", "char_dup_ratio", ">", "char_duplicates_ratio"),
            self.check(s, "fineweb_list_ratio", "new_line_ratio", ">", "new_line_ratio"),
        )
