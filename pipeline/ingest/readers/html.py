"""HTML pages → main-content text, with title and URL kept in meta; also the extraction used by the WARC reader.

Extractor choice (``make bench``, topic ingest: the extractor table of BENCHMARKS.md, measured on the 413 pages of
``shared/corpora/web_html`` by ``benchmarks/bench_ingest.py --extractors``, bag-of-words F1 against the pages' own
main-content element): Resiliparse and Trafilatura reach about the same F1 (Trafilatura with the higher precision,
Resiliparse with the higher recall), and Resiliparse takes a small fraction of Trafilatura's time per page.  Equal
quality at far less CPU makes Resiliparse the default; ``extractor: trafilatura`` stays available for sources where
precision matters more than cost.

Charset: a BOM, then the HTTP ``Content-Type`` charset (WARC), then ``<meta charset>``, then UTF-8, then detection.
"""

from __future__ import annotations

import html as htmllib
import re
from collections.abc import Iterator
from dataclasses import dataclass

from pipeline.configkit import _f
from pipeline.ingest.normalize import DecodeError, decode_bytes
from pipeline.ingest.readers.base import FileRef, ParsedDoc, RawRecord, Reader, Rejection
from pipeline.ingest.readers.text import read_whole

EXTRACTORS = ("resiliparse", "trafilatura")
_META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([A-Za-z0-9_.:-]+)""", re.IGNORECASE)
_TITLE = re.compile(r"<title[^>]*>(.*?)</title\s*>", re.IGNORECASE | re.DOTALL)


def meta_charset(data: bytes) -> str | None:
    m = _META_CHARSET.search(data[:8192])
    return m.group(1).decode("ascii") if m else None


def extract(data: bytes, extractor: str = "resiliparse", declared: str | None = None) -> tuple[str, dict]:
    """(main-content text, meta with ``title`` and ``encoding``).  Raises DecodeError for binary/undecodable."""
    page, enc = decode_bytes(data, declared or meta_charset(data))
    meta: dict = {"encoding": enc}
    if extractor == "trafilatura":
        import trafilatura

        text = trafilatura.extract(page, include_comments=False, include_tables=True, deduplicate=False) or ""
        if m := _TITLE.search(page[:65536]):
            meta["title"] = " ".join(htmllib.unescape(m.group(1)).split())
    else:
        from resiliparse.extract.html2text import extract_plain_text
        from resiliparse.parse.html import HTMLTree

        tree = HTMLTree.parse(page)
        text = extract_plain_text(tree, main_content=True, alt_texts=False, preserve_formatting=True)
        if tree.title:
            meta["title"] = " ".join(tree.title.split())
    return text, meta


def page_template(data: bytes, declared: str | None = None, max_lines: int = 40) -> tuple[list[str], list[str]]:
    """The page's template as main-content extraction sees it: the lines of the whole page's text that the main
    content does not hold, split into those before it and those after it (navigation, breadcrumbs, cookie notes,
    footers), at most ``max_lines`` each. The ablation's positive control plants them around other documents: junk
    taken from real pages, not a made-up list. ([], []) for a page with no main content or no template."""
    from resiliparse.extract.html2text import extract_plain_text
    from resiliparse.parse.html import HTMLTree

    page, _ = decode_bytes(data, declared or meta_charset(data))
    tree = HTMLTree.parse(page)

    def lines(main: bool) -> list[str]:
        text = extract_plain_text(tree, main_content=main, alt_texts=False, preserve_formatting=True)
        return [ln.strip() for ln in text.split("\n") if ln.strip()]

    whole, main = lines(False), set(lines(True))
    at = [i for i, ln in enumerate(whole) if ln in main]
    if not at:
        return [], []
    return ([ln for ln in whole[:at[0]] if ln not in main][:max_lines],
            [ln for ln in whole[at[-1] + 1:] if ln not in main][:max_lines])


@dataclass
class HtmlOptions:
    extractor: str = _f("resiliparse", desc="Main-content extractor.", choices=EXTRACTORS)
    url_prefix: str = _f("", desc="meta.url = url_prefix + path relative to the root (empty: no url).")
    suffixes: list[str] = _f(factory=lambda: [".html", ".htm", ".xhtml"],
                             desc="File name endings taken from folders and globs (compressed variants too).")


class HtmlReader(Reader):
    name = "html"
    Options = HtmlOptions

    def accepts(self, rel: str) -> bool:
        from pipeline.ingest.readers.storage import strip_compression

        return strip_compression(rel.lower()).endswith(tuple(s.lower() for s in self.opts.suffixes))

    def read(self, ref: FileRef, unit: dict, storage) -> Iterator[RawRecord | Rejection]:
        data = read_whole(storage, ref, self.max_record_bytes)
        meta = {"path": ref.rel}
        if self.opts.url_prefix:
            meta["url"] = self.opts.url_prefix + ref.rel
        yield RawRecord(ref.rel, "", 0, len(data), data, meta)

    def template(self, raw: RawRecord) -> tuple[list[str], list[str]]:
        return page_template(raw.payload)

    def parse(self, raw: RawRecord) -> ParsedDoc | Rejection:
        try:
            text, meta = extract(raw.payload, self.opts.extractor)
        except DecodeError as exc:
            return Rejection(exc.reason, exc.detail)
        return ParsedDoc(text, {**raw.meta, **meta})
