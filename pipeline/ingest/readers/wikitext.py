"""Wikitext → plain prose with mwparserfromhell (the parser MediaWiki tools use), for the MediaWiki dump reader.

Kept: running text, the visible text of internal links (``[[Target|label]]`` → ``label``) and of external links
with a label, headings (as their own line), the contents of formatting tags (bold, italics, spans, blockquotes).
Dropped: templates (infoboxes, citations, navboxes), ``<ref>`` footnotes, tables, files/images/media, categories,
interlanguage links, comments, invisible tags (math, gallery, timeline, ...), list markup, and the trailing
sections that are link lists rather than prose (References, See also, External links, ... — configurable).
A heuristic regex stripper gets nested templates and links inside file captions wrong; a real parser does not.
"""

from __future__ import annotations

import html
import re

DROP_SECTIONS = ("References", "Notes", "See also", "External links", "Further reading", "Bibliography",
                 "Sources", "Footnotes", "Citations")
#: link namespaces whose target is not prose (English and canonical names)
_DROP_LINK = re.compile(r"\s*:?\s*(file|image|media|category)\s*:", re.I)
_INTERWIKI = re.compile(r"\s*:?\s*[a-z]{2,3}(?:-[a-z0-9]{2,8})*\s*:", re.I)
_DROP_TAGS = {"ref", "references", "table", "gallery", "math", "timeline", "score", "imagemap", "graph",
              "categorytree", "inputbox", "templatedata", "section", "syntaxhighlight", "source", "chem", "hiero",
              "noinclude", "includeonly", "indicator", "mapframe", "maplink"}
_EMPTY_PARENS = re.compile(r" ?\(\s*[;,]?\s*\)")
_MARKUP_TAGS = {"li", "dt", "dd", "hr", "br"}


def _nodes_text(nodes, out: list[str]) -> None:
    from mwparserfromhell import nodes as n

    for node in nodes:
        if isinstance(node, n.Text):
            out.append(str(node.value))
        elif isinstance(node, n.Wikilink):
            title = str(node.title)
            if _DROP_LINK.match(title) or _INTERWIKI.match(title):
                continue
            if node.text is not None:
                _nodes_text(node.text.nodes, out)
            else:
                out.append(title.split("#", 1)[0].lstrip(":") or title)
        elif isinstance(node, n.ExternalLink):
            if node.title is not None:
                _nodes_text(node.title.nodes, out)
        elif isinstance(node, n.Heading):
            out.append("\n")
            _nodes_text(node.title.nodes, out)
            out.append("\n")
        elif isinstance(node, n.HTMLEntity):
            out.append(node.normalize())
        elif isinstance(node, n.Tag):
            tag = str(node.tag).strip().lower()
            if tag in _DROP_TAGS or tag in _MARKUP_TAGS:
                if tag == "br":
                    out.append("\n")
                continue
            if node.contents is not None:
                _nodes_text(node.contents.nodes, out)
        # Template, Argument, Comment: dropped


def wikitext_to_text(wikitext: str, drop_sections: tuple[str, ...] | list[str] = DROP_SECTIONS) -> str:
    """Readable prose of one page's wikitext (paragraphs separated by blank lines)."""
    import mwparserfromhell

    code = mwparserfromhell.parse(wikitext)
    drop = {s.strip().lower() for s in drop_sections}
    if drop:
        for section in code.get_sections(include_lead=False):     # with its subsections
            heading = section.filter_headings(recursive=False)
            if heading and heading[0].title.strip_code().strip().lower() in drop:
                try:
                    code.remove(section)
                except ValueError:      # inside a section removed already
                    pass
    out: list[str] = []
    _nodes_text(code.nodes, out)
    text = html.unescape("".join(out))
    text = _EMPTY_PARENS.sub("", text).replace("(; ", "(").replace("(, ", "(")   # left by removed templates
    lines = [re.sub(r"[ \t]+", " ", ln).strip() for ln in text.split("\n")]
    text = "\n".join(lines)
    return re.sub(r"\n{3,}", "\n\n", text).strip()
