"""The large corpus of ``bench_scale.py``: real text of ``../shared/corpora`` recombined into distinct documents.

How a document is made (deterministic for a seed; one ``random.Random(f"{seed}/{domain}")`` stream per domain):

1. every source document of the domain is cut into *units*: its paragraphs (blocks between blank lines) when it has
   at least ``MIN_PARAGRAPHS`` of them, else its lines (short encyclopedia entries, Chinese poems);
2. the generated document's length is the length of a source document of the same domain drawn at random, so each
   domain keeps its own size distribution;
3. it is filled with *runs* of 1..``RUN_MAX`` consecutive units, each run from a source document drawn at random until
   it reaches that length, has at least ``MIN_RUNS`` runs from at least two source documents (when the domain has two)
   and no run is more than a third of it (a large run makes the document grow); a unit is never used twice in one
   document; runs are joined by a blank line, units inside a run by the source's own separator;
4. every use of a unit is its own *variant*: its tokens (CJK characters, and the runs of other word characters
   between them) are shuffled in blocks of ``shuffle`` (default 4), each block in its own random order, while
   whitespace and punctuation stay in place, so the unit keeps its bytes, words and lines;
5. a document whose text was already generated (64-bit blake2b of the text) is drawn again, so no two documents are
   exact copies.

Why variants: the source is ~35 MB, so at 4 GB each unit is used about a hundred times, and a verbatim unit would
recur in a hundred documents, each use a longer run of the same tokens than real deduplicated text repeats.  The
held-out overlap check (``pipeline.sink.heldout_overlap``, 13-token runs) then found most training documents made of
the held-out split's paragraphs: it dropped 23 % of them at 1 GB and 82 % at 4 GB, with a cost that followed the
repetition, where on the source corpus itself it drops 4 of 1,152.  Format 5 swapped neighbouring words (each pair
with probability 0.3): two uses of a unit then agree on a pair with probability 0.58, and 13 tokens of code or
LaTeX span only two or three words, so at 4 GB, where the 1 % held-out sample holds about one use of every unit,
30 % of academic runs were still held-out runs (13 % at 1 GB), and the check's cost grew with that share.  A block
of four tokens has 24 orders, so two uses agree on one with probability 1/24, and punctuation no longer counts as
part of a word.  Measured on 300 units per domain, the share of one use's 13-token runs (words, CJK characters and
punctuation marks as tokens) found in a second use: code 22 % -> 3 %, academic 22 % -> 8 % and zh 36 % -> 13 % (RST
headings, box-drawn tables: rules with no words to shuffle), books, long and web 4-6 % -> under 1 %; on a 2 MB build,
word 10-grams already seen in an earlier web document fall from 82 % verbatim to 0.2 %.  This is how the corpus differs
from real text: its words keep their place only to within a block of four.

Domains never mix, so Chinese stays Chinese, code stays code and web stays web, and the quality filters keep a share
close to what they keep of the source (paragraph-level statistics are the source's; only the joins are new). Two
generated documents rarely share a run and one shared run is at most a third of each, so their word 5-gram Jaccard
stays far below MinHash's 0.8 threshold and exact and near dedup keep both (the benchmark reports what they
removed).

Planted duplicates, with known truth (issue #23: every dedup stage must work at scale).  After the distinct
documents above, each new document is instead, with probability ``dup_exact`` (default 0.15), an exact copy of a
document written earlier in the same domain, and with probability ``dup_near`` (0.15) a *near* copy: ``near_edit``
(2 %) of its MinHash tokens replaced by other tokens of the same document, so the copy's shingle Jaccard with its
original lands around 0.8-0.9.  The original is drawn from a reservoir of the domain's last ``RESERVOIR``
distinct documents (so copies sit in other files and shards than their originals).  ``<out>/truth.jsonl`` has one
line per planted copy: ``{"copy", "of", "kind": "exact"|"near", "domain", "jaccard"}``, the Jaccard computed with
the shingles mindloom's MinHash stage uses for that domain under the default config (code: code 8-grams; CJK
text: character 5-grams; else word 5-grams), so ``scale_truth.py`` can compare what each dedup stage removed with
what the LSH banding predicts for that pair.

Sizes are UTF-8 bytes of text, split over the domains in the source files' proportions; each domain is written as
``<out>/<domain>/part-NNNNN.jsonl`` files of at most ``file_mb`` MB (at least two per domain).  ``<out>/corpus.json``
records the parameters and counts; a folder with the same parameters is reused.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import time
from pathlib import Path

MIN_PARAGRAPHS = 4
RUN_MAX = 6
MIN_RUNS = 3
FORMAT = 6            # bump when the recipe changes: cached corpora are rebuilt
RESERVOIR = 512       # originals a planted copy is drawn from: the domain's last distinct documents
SHUFFLE = 4           # each use of a unit shuffles its tokens in blocks of this many


class SourceMissing(SystemExit):
    """The source corpus is absent (e.g. in CI): the benchmark cannot build its input."""


def _units(text: str) -> tuple[list[str], str]:
    paras = [p for p in text.split("\n\n") if p.strip()]
    if len(paras) >= MIN_PARAGRAPHS:
        return paras, "\n\n"
    return [ln for ln in text.split("\n") if ln.strip()], "\n"


def _esc(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)[1:-1]


class DomainPool:
    """One domain's source documents, cut into units with their JSON-escaped text and byte sizes."""

    def __init__(self, domain: str, texts: list[str]):
        self.domain = domain
        self.docs: list[tuple[list[str], list[int], str]] = []
        self.lengths: list[int] = []
        for t in texts:
            units, sep = _units(t)
            if units:
                self.docs.append((units, [len(u.encode("utf-8")) for u in units], sep))
                self.lengths.append(len(t.encode("utf-8")))
        if not self.docs:
            raise ValueError(f"domain {domain}: no text")

    def document(self, rng: random.Random, gen=None, shuffle: int = 0) -> tuple[str, int, int]:
        """(escaped text, UTF-8 bytes, distinct sources) of one generated document; with ``gen`` (a numpy
        Generator), each unit is a variant, its tokens shuffled in blocks of ``shuffle`` (:func:`variant`).

        Runs are added until the drawn length is reached, there are ``MIN_RUNS`` runs from two sources, and no run
        is more than a third of the document, so two documents sharing one run have a Jaccard of at most about 0.2
        (a document with one large run grows to three times that run).
        """
        target = max(rng.choice(self.lengths), 64)
        n = len(self.docs)
        parts: list[str] = []
        used: set[tuple[int, int]] = set()
        sources: set[int] = set()
        size = largest = attempts = 0
        while (size < target or len(parts) < MIN_RUNS or len(sources) < min(2, n)
               or largest * MIN_RUNS > size) and attempts < 10_000:
            attempts += 1
            j = rng.randrange(n)
            units, sizes, sep = self.docs[j]
            start = rng.randrange(len(units))
            run = [k for k in range(start, min(start + rng.randint(1, RUN_MAX), len(units))) if (j, k) not in used]
            if not run:
                continue
            used.update((j, k) for k in run)
            sources.add(j)
            parts.append(sep.join(variant(units[k], gen, shuffle) if gen is not None else units[k] for k in run))
            run_bytes = sum(sizes[k] for k in run)
            largest = max(largest, run_bytes)
            size += run_bytes + 2
        return _esc("\n\n".join(parts)), size - 2, len(sources)


def variant(unit: str, gen, shuffle: int) -> str:
    """``unit`` with its tokens shuffled in blocks of ``shuffle``: every block of that many consecutive tokens (from
    a random first offset) gets its own random order.  Tokens are CJK characters and the runs of other word
    characters between them; whitespace and punctuation stay where they are (indentation, line breaks, a code
    line's brackets), so the unit keeps its bytes, words and lines.  ``shuffle`` 0 or 1: the unit as it is."""
    import numpy as np

    parts = _TOKEN.split(unit)                # separators at even places, tokens at odd ones
    n = len(parts) // 2
    if n < 2 or shuffle < 2:
        return unit
    block = (np.arange(n) + int(gen.integers(shuffle))) // shuffle
    order = np.lexsort((gen.random(n), block))
    toks = np.empty(n, dtype=object)
    toks[:] = parts[1::2]
    parts[1::2] = toks[order].tolist()
    return "".join(parts)


def load_pools(src: Path) -> dict[str, DomainPool]:
    files = sorted(src.glob("*.jsonl")) if src.is_dir() else []
    if not files:
        raise SourceMissing(f"bench-scale needs the source corpora: no {src}/*.jsonl (the shared corpora, "
                            "../shared/corpora, are absent here; pass --source DIR with <domain>.jsonl files)")
    pools = {}
    for f in files:
        with open(f, encoding="utf-8") as fh:
            pools[f.stem] = DomainPool(f.stem, [json.loads(x)["text"] for x in fh if x.strip()])
    return pools


def domain_targets(src: Path, total_bytes: int) -> dict[str, int]:
    """Bytes per domain, in the proportions of the source files."""
    sizes = {f.stem: f.stat().st_size for f in sorted(src.glob("*.jsonl"))}
    whole = sum(sizes.values())
    return {d: int(total_bytes * s / whole) for d, s in sizes.items()}


_CJK_RANGES = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af"
_CJK = re.compile(f"[{_CJK_RANGES}]")
# what a variant shuffles (a capture: split keeps it)
_TOKEN = re.compile(f"([{_CJK_RANGES}]|[^\\W{_CJK_RANGES}]+)")
_EDIT_TOKEN = {"word": re.compile(r"[^\W_]+"), "code": re.compile(r"\w+"),
               "char": _CJK}


def shingle_kind(domain: str, text: str) -> tuple[str, int]:
    """The (kind, n) mindloom's MinHash stage shingles ``text`` of ``domain`` with under the default config."""
    from pipeline.dedup.minhash.config import MinhashConfig
    from pipeline.dedup.minhash.shingles import resolve_kind

    cfg = MinhashConfig()
    rule = next((r for r in cfg.domain_shingles if r.domain == domain), None)
    kind = resolve_kind(text, rule.kind if rule else cfg.shingle_kind, cfg.cjk_share)
    return kind, (rule.n if rule and rule.n else cfg.ngram_for(kind))


def pair_jaccard(domain: str, a: str, b: str) -> float:
    """Exact Jaccard of the two texts' MinHash shingle sets (what the stage's exact check computes)."""
    from pipeline.dedup.minhash.shingles import shingles

    kind, n = shingle_kind(domain, a)
    sa, sb = set(shingles(a, kind, n)), set(shingles(b, kind, n))
    return len(sa & sb) / max(len(sa | sb), 1)


def near_copy(domain: str, text: str, rng: random.Random, edit: float) -> str:
    """``text`` with ``edit`` of its MinHash tokens replaced by other tokens of the same text."""
    kind, _ = shingle_kind(domain, text)
    spans = [m.span() for m in _EDIT_TOKEN[kind].finditer(text)]
    if len(spans) < 2:
        return text + " " + text[: max(1, len(text) // 50)]
    vocab = [text[a:b] for a, b in spans]
    picked = sorted(rng.sample(range(len(spans)), max(1, round(edit * len(spans)))))
    out, last = [], 0
    for i in picked:
        a, b = spans[i]
        new = rng.choice(vocab)
        if new == vocab[i]:
            new = vocab[i] + vocab[(i + 1) % len(vocab)]
        out += [text[last:a], new]
        last = b
    return "".join(out) + text[last:]


def build(src: Path, out: Path, total_mb: float, seed: int = 1234, file_mb: float = 256.0, dup_exact: float = 0.15,
          dup_near: float = 0.15, near_edit: float = 0.02, shuffle: int = SHUFFLE, log=print) -> dict:
    """Write the corpus (or reuse it when ``out/corpus.json`` has the same parameters); return that record."""
    params = {"format": FORMAT, "source": str(src.resolve()), "total_mb": total_mb, "seed": seed, "file_mb": file_mb,
              "min_paragraphs": MIN_PARAGRAPHS, "run_max": RUN_MAX, "min_runs": MIN_RUNS, "dup_exact": dup_exact,
              "dup_near": dup_near, "near_edit": near_edit, "reservoir": RESERVOIR, "shuffle": shuffle}
    meta = out / "corpus.json"
    if meta.exists():
        old = json.loads(meta.read_text())
        if old.get("params") == params:
            return old
    pools = load_pools(src)
    t0 = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    domains = {}
    with open(out / "truth.jsonl.tmp", "w", encoding="utf-8") as truth:
        for dom, want in domain_targets(src, int(total_mb * 1e6)).items():
            domains[dom] = _build_domain(pools[dom], out / dom, want, seed, file_mb, dup_exact, dup_near, near_edit,
                                         shuffle, truth)
            d = domains[dom]
            log(f"  corpus {dom}: {d['docs']} docs ({d['exact_copies']} exact + {d['near_copies']} near copies), "
                f"{d['text_bytes'] / 1e6:.1f} MB in {d['files']} files")
    os.replace(out / "truth.jsonl.tmp", out / "truth.jsonl")
    rec = {"params": params, "domains": domains, "text_bytes": sum(d["text_bytes"] for d in domains.values()),
           "docs": sum(d["docs"] for d in domains.values()),
           "planted": {"exact": sum(d["exact_copies"] for d in domains.values()),
                       "near": sum(d["near_copies"] for d in domains.values())},
           "build_s": round(time.perf_counter() - t0, 1)}
    meta.write_text(json.dumps(rec, indent=1) + "\n")
    return rec


def _build_domain(pool: DomainPool, ddir: Path, want: int, seed: int, file_mb: float, dup_exact: float,
                  dup_near: float, near_edit: float, shuffle: int, truth) -> dict:
    """One domain's files: distinct documents with planted exact and near copies (truth lines to ``truth``)."""
    dom = pool.domain
    import numpy as np

    rng, dup_rng = random.Random(f"{seed}/{dom}"), random.Random(f"{seed}/{dom}/dup")
    gen = np.random.default_rng(int.from_bytes(
        hashlib.blake2b(f"{seed}/{dom}/shuffle".encode(), digest_size=8).digest(), "little"))
    n_files = max(2, -(-want // int(file_mb * 1e6)))
    per_file = want / n_files
    ddir.mkdir(exist_ok=True)
    for old in ddir.glob("*.jsonl"):
        old.unlink()
    seen: set[bytes] = set()
    recent: list[tuple[str, str]] = []            # (id, text) of the last RESERVOIR distinct documents
    docs = written = redrawn = sources = n_exact = n_near = 0
    extra = ', "lang": "code"' if dom == "code" else ""
    for fi in range(n_files):
        with open(ddir / f"part-{fi:05d}.jsonl", "w", encoding="utf-8") as fh:
            while written < per_file * (fi + 1):
                doc_id = f"{dom}/s{seed}/{docs:09d}"
                u = dup_rng.random()
                if recent and u < dup_exact + dup_near:
                    of, orig = recent[dup_rng.randrange(len(recent))]
                    if u < dup_exact:
                        text, kind, jac = orig, "exact", 1.0
                        n_exact += 1
                    else:
                        text = near_copy(dom, orig, dup_rng, near_edit)
                        kind, jac = "near", round(pair_jaccard(dom, orig, text), 4)
                        n_near += 1
                    truth.write(json.dumps({"copy": doc_id, "of": of, "kind": kind, "domain": dom, "jaccard": jac})
                                + "\n")
                    esc, size = _esc(text), len(text.encode("utf-8"))
                else:
                    esc, size, nsrc = pool.document(rng, gen, shuffle)
                    key = hashlib.blake2b(esc.encode("utf-8"), digest_size=8).digest()
                    if key in seen:
                        redrawn += 1
                        if redrawn > 1000 + docs:
                            raise RuntimeError(f"{dom}: cannot draw distinct documents")
                        continue
                    seen.add(key)
                    sources += nsrc
                    recent.append((doc_id, json.loads(f'"{esc}"')))
                    if len(recent) > RESERVOIR:
                        recent.pop(dup_rng.randrange(len(recent)))
                fh.write(f'{{"id": "{doc_id}", "domain": "{dom}"{extra}, "source": "bench-scale", "text": "{esc}"}}\n')
                docs += 1
                written += size
    return {"files": n_files, "docs": docs, "text_bytes": written, "redrawn_duplicates": redrawn,
            "exact_copies": n_exact, "near_copies": n_near,
            "mean_sources_per_doc": round(sources / max(docs - n_exact - n_near, 1), 2),
            "source_docs": len(pool.docs)}


def shingle_jaccard(a: str, b: str, n: int = 5) -> float:
    """Word n-gram Jaccard of two texts (what MinHash estimates), for checks."""
    def grams(t):
        w = t.split()
        return {tuple(w[i:i + n]) for i in range(max(len(w) - n + 1, 1))}
    ga, gb = grams(a), grams(b)
    return len(ga & gb) / max(len(ga | gb), 1)
