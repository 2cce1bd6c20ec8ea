"""MediaWiki XML dumps (``pages-articles*.xml[.bz2|.gz|.zst]``): one document per page, wikitext → prose.

``mwxml`` streams the dump (the storage layer decompresses by suffix), page by page, so a multi-GB dump is never
held in memory; a page's latest revision is the document.  A multistream ``.bz2`` dump (Wikimedia's
``*-pages-articles-multistream.xml.bz2``, with or without its index) is planned into byte ranges of whole bz2
streams (:mod:`pipeline.ingest.readers.multistream`), so several tasks read one dump in parallel and their output
shards, concatenated in plan order, are what reading it whole gives.  Pages outside ``options.namespaces``
(default: the main/article namespace 0) are counted as ``wiki_namespace``, redirects as ``wiki_redirect`` and
disambiguation pages (link lists, ``options.skip_disambiguation``) as ``wiki_disambiguation``: all are policy skips
(``strict`` does not fail on them) and none is listed row by row.  The wikitext is turned into prose by
:func:`pipeline.ingest.readers.wikitext.wikitext_to_text` (mwparserfromhell) in the worker processes; the title
leads the text, and title, page id, revision id and namespace go into ``meta``.  The page id is the document's
offset and its location (``page id 675``), so ids and origins are the same however the dump is cut.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from xml.etree.ElementTree import ParseError

from pipeline.configkit import _f
from pipeline.ingest.readers.base import FileRef, ParsedDoc, RawRecord, Reader, ReadError, Rejection
from pipeline.ingest.readers.multistream import open_range, plan_ranges
from pipeline.ingest.readers.storage import compression_of
from pipeline.ingest.readers.wikitext import DROP_SECTIONS, wikitext_to_text

#: the disambiguation template family of the English Wikipedia (and its redirects)
_DISAMBIGUATION = re.compile(r"\{\{\s*(?:disambiguation|disambig|disamb|dab|dbig|hndis|geodis|numberdis|"
                             r"letter-number ?combination disambiguation|[a-z ]+ disambiguation)\s*[|}]", re.I)

_SPLIT_DUMP = re.compile(r"\.xml-p\d+p\d+\.bz2\Z")


@dataclass
class MediawikiOptions:
    namespaces: list[int] = _f(factory=lambda: [0], desc="Namespace ids whose pages become documents (0: "
                               "articles); others are counted as wiki_namespace.")
    skip_disambiguation: bool = _f(True, desc="Skip disambiguation pages (lists of links to other articles, "
                                   "marked by a {{disambiguation}}-family template) as wiki_disambiguation.")
    drop_sections: list[str] = _f(factory=lambda: list(DROP_SECTIONS), desc="Sections (with their subsections) "
                                  "left out by heading: link lists and references rather than prose.")


class MediawikiReader(Reader):
    name = "mediawiki"
    suffixes = (".xml", ".xml.bz2", ".xml.gz", ".xml.zst")
    Options = MediawikiOptions

    def accepts(self, rel: str) -> bool:
        """Also Wikimedia's split dumps, ``…-multistream1.xml-p1p41242.bz2``."""
        return super().accepts(rel) or bool(_SPLIT_DUMP.search(rel.lower()))

    def units(self, ref: FileRef, storage, docs_per_shard: int, shard_bytes: int = 64 << 20) -> list[dict]:
        """A multistream ``.bz2`` dump: ranges of whole bz2 streams (``multistream.py``); anything else: whole."""
        if compression_of(ref.path) == "bz2" and ref.size:
            ranges = plan_ranges(ref, storage, docs_per_shard, shard_bytes)
            if ranges is not None:
                return ranges
        return [{"docs_estimate": 1}]

    def read(self, ref: FileRef, unit: dict, storage) -> Iterator[RawRecord | Rejection]:
        import mwxml

        if ref.size == 0:
            yield Rejection("empty_file", "file is empty (0 bytes)", ref.rel, "")
            return
        ranged = "head" in unit
        n, last, broken = 0, None, False
        where = f"bytes {unit['start']}-{unit['end']}" if ranged else ""
        fh = open_range(storage, ref, unit) if ranged else storage.open(ref.path)
        with fh:
            try:
                dump = mwxml.Dump.from_file(fh)
                for page in dump:
                    n += 1
                    last = page.id
                    yield from self._page(page, ref)
            except (ParseError, ValueError, KeyError, AssertionError) as exc:
                broken = True
                yield Rejection("corrupt_file", f"not a readable MediaWiki dump {_after(n, last, where)} ({exc})",
                                ref.rel, _next(last, where))
            except (EOFError, zlib.error, OSError) as exc:
                broken = True
                reason = "truncated_file" if isinstance(exc, EOFError) else "corrupt_file"
                yield Rejection(reason, f"dump stream broken {_after(n, last, where)} ({exc})", ref.rel,
                                _next(last, where))
            except ReadError as exc:
                broken = True
                yield Rejection(exc.reason, f"{exc.detail} ({_after(n, last, where)})", ref.rel, _next(last, where))
        # a range without pages (a tail of streams) is not an empty dump: only a dump read whole can be one
        if n == 0 and not broken and (not ranged or unit["start"] == 0 and unit["end"] >= ref.size):
            yield Rejection("empty_file", "no page in the dump", ref.rel, "")

    def _page(self, page, ref: FileRef) -> Iterator[RawRecord | Rejection]:
        where = f"page id {page.id}"
        text, rev_id = None, None
        for rev in page:                      # the latest revision is the document
            text, rev_id = rev.text, rev.id
        nbytes = len((text or "").encode("utf-8"))
        if page.namespace not in self.opts.namespaces:
            yield Rejection("wiki_namespace", f"namespace {page.namespace}: {page.title!r}", ref.rel, where, nbytes,
                            policy=True, listed=False)
        elif page.redirect:
            yield Rejection("wiki_redirect", f"{page.title!r} redirects to {page.redirect!r}", ref.rel, where,
                            nbytes, policy=True, listed=False)
        elif text is not None and self.opts.skip_disambiguation and _DISAMBIGUATION.search(text):
            yield Rejection("wiki_disambiguation", f"{page.title!r} is a disambiguation page", ref.rel, where,
                            nbytes, policy=True, listed=False)
        elif text is None:
            yield Rejection("empty_text", f"{page.title!r} has no revision text", ref.rel, where, 0)
        elif nbytes > self.max_record_bytes:
            yield Rejection("record_too_large", f"{page.title!r}: wikitext > ingest.max_record_bytes "
                                                f"({self.max_record_bytes})", ref.rel, where, nbytes)
        else:
            meta = {"title": page.title, "page_id": page.id, "revision_id": rev_id, "namespace": page.namespace}
            yield RawRecord(ref.rel, where, int(page.id), nbytes, text, meta)

    def parse(self, raw: RawRecord) -> ParsedDoc | Rejection:
        body = wikitext_to_text(raw.payload, self.opts.drop_sections)
        if not body:
            return Rejection("empty_text", f"{raw.meta['title']!r}: no prose left after removing the markup")
        return ParsedDoc(f"{raw.meta['title']}\n\n{body}", dict(raw.meta))


def _after(n: int, last, where: str) -> str:
    return (f"after {n} pages" + (f" (last page id {last})" if last is not None else "")
            + (f" of {where}" if where else ""))


def _next(last, where: str) -> str:
    return f"after page id {last}" if last is not None else (where or "first page")
