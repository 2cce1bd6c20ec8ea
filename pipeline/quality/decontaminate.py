"""Benchmark decontamination: remove every document that shares a word n-gram with an evaluation item.

The method is datatrove's (``decont/n_grams.py``) and GPT-3's (13-grams, as DCLM): normalise the evaluation texts
and the documents the same way, split them into words, hash every run of ``n`` consecutive words, and remove a
document as soon as one of its n-grams is among the evaluation n-grams.  A paraphrase that keeps 13 words in a
row is caught; an exact-text hash is not.  What is different here:

- **Normalisation** (:func:`words`): lowercase; diacritics stripped (NFKD, combining marks dropped, NFC); every
  run of digits becomes ``0`` (``3.14`` -> ``0 0``); punctuation, symbols and underscores separate words and are
  dropped (datatrove's ``simplify_text`` defaults, except that datatrove makes ``3.14`` one ``0``).  Words are
  runs of letters and digits, except that **every Han or kana character is a word of its own** (as everywhere in
  mindloom, ``pipeline/quality/filters/text.py``): Chinese and Japanese have no spaces, so a 13-gram there is 13
  characters, about 6-8 Chinese words.  Hangul is written with spaces and splits like Latin script.  No tokenizer model
  is needed (datatrove uses nltk).
- **What is indexed**: an item's ``text_fields`` joined in order (context, question, choices, answer, text), so
  n-grams inside the question, inside the answer and across the two all count.  This is datatrove with
  ``find_query_ngrams=True`` (its default indexes the answer and the question/answer overlap only) and GPT-3's
  choice.  An item with fewer than ``n`` words cannot be matched; the index manifest counts them.
- **Hashing**: each distinct word gets 64 bits of BLAKE2b; an n-gram's hash is the polynomial
  ``sum(h(w_k) * P^(n-1-k)) mod 2^64`` over its words, computed for a whole document with ``n`` numpy passes.
  The n-gram text is recovered from the document's words for the audit.  With N index n-grams and M document
  n-grams, a false match by collision has probability about ``N * M / 2^64`` (0.05 for 1e7 evaluation n-grams
  against a 1e11-word corpus).

The index is built **once per run**, by the plan step (:func:`build_index`, from ``pipeline.tasks.corpus``), into
``<run>/decontamination/``::

    ngrams.npy      uint64, sorted, unique: every n-gram hash of every item
    items.npy       uint32, same length: the first item (file order, then line order) that has that n-gram
    items.json      [[set, item id], ...]: set = the eval file's name
    manifest.json   n, normalisation version, per file its path, sha256, items and items too short; sizes

written under a temporary name and renamed; rebuilt only when the eval files' digests or the settings change, so a
rerun writes the same bytes.  Each quality worker memory-maps ``ngrams.npy``/``items.npy`` once (the pages are
shared between the workers of a machine) and looks every n-gram of a document up with ``numpy.searchsorted``.

Memory: 12 bytes per distinct evaluation n-gram (about 12 bytes per evaluation word: MMLU's ~1.5 M words ~ 18 MB),
plus ``items.json``; building holds about 3x that.  Per document, about 40 bytes per word while it is checked.
Time: linear in the corpus (one byte-translation or regular-expression pass, one dictionary lookup per word, ``n``
vector passes, one binary search per n-gram in ``log2(N)`` steps).  Throughput is the benchmark metric
``quality_kernels.decontamination_mb_per_cpu_s`` (short documents and Chinese are the slower end: numpy's per-call
cost); its CPU is about that of the heuristic chains on the same documents
(``quality_kernels.decontamination_over_heuristics_cpu``), so it roughly doubles the quality stage's CPU when on.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import unicodedata
from pathlib import Path
from typing import Any

from pipeline.configkit import ConfigError
from pipeline.io import read_json, sha256_file, write_json
from pipeline.quality.filters.text import CJK_RANGES

log = logging.getLogger(__name__)

REASON = "decontaminated"
INDEX_DIR = "decontamination"
#: bumped whenever :func:`words` or the hash changes: an index of another version is rebuilt
NORMALISATION = "v1: lower, nfkd-strip-marks-nfc, digits->0, punct/symbol/_ split, cjk char = word; blake2b-64 poly"
#: audit columns of a decontaminated document (removed/quality/decontaminated/<shard>.parquet)
AUDIT_KEYS = ("decont_set", "decont_item", "decont_ngram")

_MARKS = re.compile("[\u0300-\u036f\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\ufe20-\ufe2f]")
_NUMBER = re.compile(r"\d+")
_WORD = re.compile(f"[{CJK_RANGES}]|[^\\W_{CJK_RANGES}]+")
_CJK = re.compile(f"[{CJK_RANGES}]")
# ASCII text takes a byte path, faster than the regular expressions, with the same words: lowercase letters
# and digits stay (digits as '0', runs collapsed below), every other byte separates.
_ASCII_TABLE = bytes(c if 0x61 <= c <= 0x7A else 0x30 if 0x30 <= c <= 0x39 else 0x20 for c in range(256))
_P = 0x100000001B3                      # FNV-64 prime: odd, so the polynomial mixes every word's bits
_CACHE_MAX = 1 << 20


class _WordHashes(dict):
    """word (str or its UTF-8 bytes) -> 64 bits of BLAKE2b, computed on first sight; per process, cleared at
    ``_CACHE_MAX`` entries (about 100 MB).  A dict with ``__missing__`` so that ``map(cache.__getitem__, words)``
    runs in C for known words."""

    def __missing__(self, word: str | bytes) -> int:
        if len(self) >= _CACHE_MAX:
            self.clear()
        raw = word.encode("utf-8") if isinstance(word, str) else word
        h = self[word] = int.from_bytes(hashlib.blake2b(raw, digest_size=8).digest(), "little")
        return h


_WORD_HASHES = _WordHashes()


def _tokens(text: str) -> list:
    """The normalised words of ``text``: bytes for ASCII text, str otherwise (the same hash either way)."""
    if text.isascii():
        b = text.encode("ascii").lower().translate(_ASCII_TABLE)
        while b"00" in b:
            b = b.replace(b"00", b"0")
        return b.split()
    t = unicodedata.normalize("NFC", _MARKS.sub("", unicodedata.normalize("NFKD", text.lower())))
    return _WORD.findall(_NUMBER.sub("0", t))


def words_of(tokens: list) -> list[str]:
    return [w.decode("ascii") if isinstance(w, bytes) else w for w in tokens]


def words(text: str) -> list[str]:
    """The normalised words of ``text`` (see the module docstring)."""
    return words_of(_tokens(text))


def ngram_hashes(ws: list, n: int) -> Any:
    """uint64 hash of every run of ``n`` consecutive words (``len(ws) - n + 1`` of them; none when shorter)."""
    import numpy as np

    if len(ws) < n:
        return np.zeros(0, np.uint64)
    return polynomial_runs(np.fromiter(map(_WORD_HASHES.__getitem__, ws), np.uint64, count=len(ws)), n)


def polynomial_runs(unit_hashes: Any, n: int) -> Any:
    """``sum(h_k * P^(n-1-k)) mod 2^64`` over every run of ``n`` consecutive 64-bit unit hashes (words here,
    token ids in :mod:`pipeline.sink.heldout_overlap`): ``n`` vector passes."""
    import numpy as np

    m = len(unit_hashes) - n + 1
    if m <= 0 or n <= 0:
        return np.zeros(0, np.uint64)
    acc = unit_hashes[:m].copy()
    p = np.uint64(_P)
    with np.errstate(over="ignore"):
        for k in range(1, n):
            acc *= p
            acc += unit_hashes[k:k + m]
    return acc


def join_words(ws: list[str]) -> str:
    """Words back to readable text: no space next to a CJK character."""
    out = []
    for i, w in enumerate(ws):
        if i and not (_CJK.fullmatch(w) or _CJK.fullmatch(ws[i - 1])):
            out.append(" ")
        out.append(w)
    return "".join(out)


# --------------------------------------------------------------------------------------------------------------
# Reading the evaluation files

def _item_text(row: dict, fields: list[str]) -> str | None:
    parts = []
    for f in fields:
        v = row.get(f)
        if isinstance(v, list):
            v = " ".join(str(x) for x in v)
        if v is not None and v != "":
            parts.append(str(v))
    return "\n".join(parts) if parts else None


def read_items(path: Path, id_field: str, text_fields: list[str], where: str) -> list[tuple[str, str]]:
    """(item id, text) of every item of one eval file; a bad line raises ConfigError naming file and line."""
    items: list[tuple[str, str]] = []
    seen: set[str] = set()
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            if path.suffix == ".txt":
                items.append((str(lineno), line.strip()))
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{where}: {path}:{lineno}: not a JSON object ({exc.msg})") from None
            if not isinstance(row, dict) or row.get(id_field) in (None, ""):
                raise ConfigError(f"{where}: {path}:{lineno}: item has no {id_field!r} (quality.decontamination."
                                  "id_field)")
            item_id = str(row[id_field])
            text = _item_text(row, text_fields)
            if text is None:
                raise ConfigError(f"{where}: {path}:{lineno}: item {item_id!r} has none of the text fields "
                                  f"{text_fields} (quality.decontamination.text_fields)")
            if item_id in seen:
                raise ConfigError(f"{where}: {path}:{lineno}: item id {item_id!r} occurs twice in the file")
            seen.add(item_id)
            items.append((item_id, text))
    return items


# --------------------------------------------------------------------------------------------------------------
# Building the index (once per run)

def _settings(dc: Any) -> dict:
    return {"n": dc.n, "id_field": dc.id_field, "text_fields": list(dc.text_fields), "normalisation": NORMALISATION,
            **({"max_items_per_ngram": dc.max_items_per_ngram} if dc.max_items_per_ngram else {})}


def _files(dc: Any) -> list[dict]:
    out = []
    for i, p in enumerate(dc.paths):
        path = Path(p)
        if not path.is_file():
            raise ConfigError(f"quality.decontamination.paths[{i}]: evaluation file {path} does not exist")
        out.append({"path": str(path), "set": path.name, "sha256": sha256_file(path)})
    names = [f["set"] for f in out]
    if len(set(names)) != len(names):
        raise ConfigError(f"quality.decontamination.paths: two evaluation files share a name {names}; the audit "
                          "names items by file name")
    return out


def index_dir(rdir: Path) -> Path:
    return Path(rdir) / INDEX_DIR


def build_index(dc: Any, rdir: Path) -> dict | None:
    """Build ``<rdir>/decontamination/`` from the eval files of ``dc`` (a DecontaminationConfig); return its
    manifest, or None when decontamination is off or has no files.  Skipped when an index of the same files
    (sha256) and settings is already there."""
    import numpy as np

    if not dc.active:
        return None
    final = index_dir(rdir)
    files = _files(dc)
    settings = _settings(dc)
    if (final / "manifest.json").exists():
        old = read_json(final / "manifest.json")
        if old.get("settings") == settings and [(f["set"], f["sha256"]) for f in old.get("files", [])] == \
                [(f["set"], f["sha256"]) for f in files]:
            return old
    chunks, owners, catalogue = [], [], []
    for i, f in enumerate(files):
        items = read_items(Path(f["path"]), dc.id_field, list(dc.text_fields), f"quality.decontamination.paths[{i}]")
        f.update(items=len(items), too_short=0)
        for item_id, text in items:
            h = np.unique(ngram_hashes(_tokens(text), dc.n))
            if not len(h):
                f["too_short"] += 1
                continue
            chunks.append(h)
            owners.append(np.full(len(h), len(catalogue), np.uint32))
            catalogue.append([f["set"], item_id])
        if f["too_short"]:
            log.warning("decontamination: %d of %d items of %s have fewer than %d words and cannot be matched",
                        f["too_short"], f["items"], f["path"], dc.n)
    hashes = np.concatenate(chunks) if chunks else np.zeros(0, np.uint64)
    owner = np.concatenate(owners) if owners else np.zeros(0, np.uint32)
    # first occurrence: the earliest item owns the n-gram; counts: in how many items it occurs (once per item)
    uniq, first, counts = np.unique(hashes, return_index=True, return_counts=True)
    common = 0
    if dc.max_items_per_ngram:              # boilerplate shared by many items (licence headers, menus) is no item's
        keep = counts <= dc.max_items_per_ngram
        common = int(len(uniq) - keep.sum())
        uniq, first = uniq[keep], first[keep]
    manifest = {"settings": settings, "files": files, "items": len(catalogue), "ngrams": int(len(uniq)),
                "index_bytes": int(uniq.nbytes + len(uniq) * 4), **({"common_ngrams_left_out": common}
                                                                     if dc.max_items_per_ngram else {})}
    tmp = final.with_name(f".{INDEX_DIR}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    np.save(tmp / "ngrams.npy", uniq.astype("<u8"))
    np.save(tmp / "items.npy", owner[first].astype("<u4"))
    write_json(tmp / "items.json", catalogue)
    manifest["digest"] = hashlib.sha256(b"".join(
        (tmp / name).read_bytes() for name in ("ngrams.npy", "items.npy", "items.json"))).hexdigest()
    write_json(tmp / "manifest.json", manifest)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    log.info("decontamination index: %d items, %d %d-grams (%.1f MB) from %d files", len(catalogue), len(uniq),
             dc.n, manifest["index_bytes"] / 1e6, len(files))
    return manifest


def index_manifest(dc: Any, rdir: Path) -> dict | None:
    """The run's index manifest (None when decontamination is off); an error when it is missing or stale."""
    if not dc.active:
        return None
    path = index_dir(rdir) / "manifest.json"
    if not path.exists():
        raise ConfigError(f"quality.decontamination: no index at {path.parent}; the plan step builds it "
                          "(pipeline.quality.decontaminate.build_index)")
    manifest = read_json(path)
    if manifest["settings"] != _settings(dc) or \
            [f["path"] for f in manifest["files"]] != [str(Path(p)) for p in dc.paths]:
        raise ConfigError(f"quality.decontamination: the index at {path.parent} was built with other settings or "
                          "files; rebuild it (build_index)")
    return manifest


# --------------------------------------------------------------------------------------------------------------
# Looking documents up (each quality worker, once per process)

class Decontaminator:
    """The loaded index: :meth:`first_hit` of a document's text."""

    def __init__(self, directory: str | Path, n: int):
        import numpy as np

        d = Path(directory)
        self.n = n
        # plain arrays over the mapped files (np.memmap's subclass overhead made every lookup slower)
        self.ngrams = np.asarray(np.load(d / "ngrams.npy", mmap_mode="r"))
        self.owner = np.asarray(np.load(d / "items.npy", mmap_mode="r"))
        self.items = read_json(d / "items.json")

    def first_hit(self, text: str) -> dict | None:
        """The document's first n-gram found in the index: ``{decont_set, decont_item, decont_ngram}``, else None."""
        import numpy as np

        if not len(self.ngrams):
            return None
        ws = _tokens(text)
        h = ngram_hashes(ws, self.n)
        if not len(h):
            return None
        order = np.argsort(h)                   # sorted queries walk the index in order: far fewer cache misses
        pos = np.searchsorted(self.ngrams, h[order])
        np.minimum(pos, len(self.ngrams) - 1, out=pos)
        found = np.flatnonzero(self.ngrams[pos] == h[order])
        if not len(found):
            return None
        k = found[np.argmin(order[found])]      # the hit that comes first in the document
        i = int(order[k])
        eval_set, item_id = self.items[int(self.owner[pos[k]])]
        gram = join_words(words_of(ws[i:i + self.n]))
        return {"decont_set": eval_set, "decont_item": item_id, "decont_ngram": gram}


def drop_of(hit: dict) -> tuple[str, str]:
    """(reason, detail) of a decontaminated document."""
    gram = hit["decont_ngram"]
    gram = gram if len(gram) <= 200 else gram[:197] + "..."
    return REASON, f"eval item {hit['decont_set']}:{hit['decont_item']} shares '{gram}'"
