"""MediaWiki dump reader: real Wikipedia pages (gensim's enwiki excerpt) through ingest and the encyclopedia chain."""

from __future__ import annotations

import bz2
import json
import zipfile
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import REPO

from pipeline.config import ConfigError, config_from_dict, load_config
from pipeline.ingest.readers.wikitext import wikitext_to_text
from pipeline.ingest.run import plan_ingest, run_ingest_shard
from pipeline.quality.run import run_quality_shard

SAMPLE = REPO / "tests" / "fixtures" / "enwiki-sample.xml"


def dump(tmp: Path, data: bytes | None = None) -> Path:
    path = tmp / "enwiki.xml.bz2"
    path.write_bytes(bz2.compress(data if data is not None else SAMPLE.read_bytes()))
    return path


def ingest(tmp: Path, path: Path, **options) -> tuple[list[dict], dict, Path, list[dict]]:
    cfg = config_from_dict({"data_root": str(tmp / "data"), "ingest": {"workers": 1},
                            "quality": load_config().to_dict()["quality"],
                            "sources": [{"domain": "encyclopedia", "reader": "mediawiki", "paths": [str(path)],
                                         "options": options}]})
    rdir = tmp / "data" / "run"
    specs = plan_ingest(cfg)
    stats = [run_ingest_shard(cfg, rdir, s) for s in specs]
    docs = [r for s in specs for r in pq.read_table(rdir / "ingest" / f"{s['shard']}.parquet").to_pylist()]
    removed: dict = {}
    for st in stats:
        for reason, v in st["removed"].items():
            removed[reason] = removed.get(reason, 0) + v["docs"]
    return docs, removed, rdir, specs


def test_wikitext_to_text_keeps_prose_and_link_text_only():
    wikitext = ("{{Infobox|name=X}}'''Modus''' is a [[logic|logical]] [[fallacy]].<ref>{{cite book|t=A}}</ref> "
                "See [http://x.org the site] ({{IPA|x}}; born 1 April).\n[[File:A.png|thumb|A [[caption]]]]\n"
                "== Form ==\n* If ''P'', then Q.\n{| class=wikitable\n|-\n| a || b\n|}\n<!-- note -->&amp; done\n"
                "== See also ==\n* [[Other]]\n=== More ===\nx\n[[Category:Logic]] [[de:Modus]]")
    assert wikitext_to_text(wikitext) == ("Modus is a logical fallacy. See the site (born 1 April).\n\nForm\n\n"
                                          "If P, then Q.\n\n& done")


def test_dump_pages_become_documents_with_skips_counted(tmp_path):
    docs, removed, rdir, specs = ingest(tmp_path, dump(tmp_path))
    assert removed == {"wiki_redirect": 1, "wiki_namespace": 1, "wiki_disambiguation": 1}
    assert [(d["origin"], json.loads(d["meta"])["title"]) for d in docs] == [
        ("enwiki.xml.bz2:page id 675", "Affirming the consequent"),
        ("enwiki.xml.bz2:page id 742", "Algorithms (journal)"),
        ("enwiki.xml.bz2:page id 766", "Abstract (law)")]
    assert json.loads(docs[0]["meta"]) == {"title": "Affirming the consequent", "page_id": 675,
                                           "revision_id": json.loads(docs[0]["meta"])["revision_id"], "namespace": 0}
    for d in docs:
        title = json.loads(d["meta"])["title"]
        assert d["text"].startswith(f"{title}\n\n") and d["lang"] == "en"
        assert not any(m in d["text"] for m in ("{{", "}}", "[[", "]]", "<ref", "{|", "Category:", "'''"))
    assert docs[0]["text"].startswith(
        "Affirming the consequent\n\nAffirming the consequent, sometimes called converse error, fallacy of the "
        "converse or confusion of necessity and sufficiency, is a formal fallacy of inferring the converse from the "
        "original statement. The corresponding argument has the general form:\n\nIf P, then Q.\nQ.\nTherefore, P.")
    assert not (rdir / "rejects" / "ingest" / f"{specs[0]['shard']}.parquet").exists()   # policy skips: unlisted
    # the encyclopedia chain of the default config keeps two; the journal stub fails Gopher's alpha-words rule
    q = run_quality_shard(load_config().quality, rdir, specs[0]["shard"], input_stage="ingest")
    assert (q["in_docs"], q["kept_docs"], sorted(q["removed"])) == (3, 2, ["gopher_below_alpha_threshold"])


def test_namespaces_and_disambiguation_are_options(tmp_path):
    docs, removed, _, _ = ingest(tmp_path, dump(tmp_path), namespaces=[0, 4], skip_disambiguation=False)
    assert removed == {"wiki_redirect": 2}                  # the namespace-4 page is a redirect too
    assert [json.loads(d["meta"])["title"] for d in docs][1] == "Asia Minor (disambiguation)"
    with pytest.raises(ConfigError, match=r"options.namespace: unknown field"):
        ingest(tmp_path / "bad", dump(tmp_path), namespace=[0])


def test_truncated_dump_is_a_counted_reject(tmp_path):
    """A cut inside the first megabyte fails before any page is framed (reads are buffered by the MiB); the
    whole-excerpt test below cuts a real 6 MB dump and keeps the pages before the cut."""
    path = tmp_path / "cut.xml.bz2"
    path.write_bytes(bz2.compress(SAMPLE.read_bytes())[:-200])
    docs, removed, _, _ = ingest(tmp_path, path)
    assert (docs, removed) == ([], {"truncated_file": 1})


def test_whole_gensim_excerpt_through_the_encyclopedia_chain(tmp_path):
    """The full excerpt (206 pages) when the demo's gensim wheel is cached (make corpus); skipped offline."""
    from pipeline.democorpus import _WIKI_MEMBER

    wheels = sorted((REPO / ".cache" / "demo-sources").glob("gensim-4.3.3-*.whl"))
    if not wheels:
        pytest.skip("gensim 4.3.3 wheel not cached (make corpus)")
    with zipfile.ZipFile(wheels[0]) as zf:
        path = tmp_path / "enwiki.xml.bz2"
        path.write_bytes(zf.read(_WIKI_MEMBER))
    docs, removed, rdir, specs = ingest(tmp_path, path)
    assert removed == {"wiki_redirect": 99, "wiki_disambiguation": 8, "wiki_namespace": 1} and len(docs) == 98
    q = run_quality_shard(load_config().quality, rdir, specs[0]["shard"], input_stage="ingest")
    assert (q["in_docs"], q["kept_docs"]) == (98, 88)
    cut = tmp_path / "cut" / "enwiki.xml.bz2"
    cut.parent.mkdir()
    cut.write_bytes(path.read_bytes()[:-100_000])
    docs_cut, removed_cut, _, _ = ingest(cut.parent, cut)
    assert removed_cut["truncated_file"] == 1 and 0 < len(docs_cut) < len(docs)
    assert [d["doc_id"] for d in docs_cut] == [d["doc_id"] for d in docs[:len(docs_cut)]]


def test_wikitext_in_jsonl_reads_as_the_dump_reader_does(tmp_path):
    """A dump exported to JSONL (gensim's, HF's raw wikitext) with ``markup: wikitext``: the same prose as the
    MediaWiki reader for the same pages, and the redirect counted; without the option the markup stays."""
    import xml.etree.ElementTree as ET

    ns = {"mw": "http://www.mediawiki.org/xml/export-0.10/"}
    pages = [(p.findtext("mw:title", namespaces=ns), p.findtext("mw:revision/mw:text", namespaces=ns))
             for p in ET.parse(SAMPLE).getroot().findall("mw:page", ns) if p.findtext("mw:ns", namespaces=ns) == "0"]
    wanted = ["ANOVA", "Affirming the consequent", "Algorithms (journal)", "Abstract (law)"]
    records = [{"title": t, "text": x} for t, x in pages if t in wanted]
    assert [r["title"] for r in records] == wanted
    src = tmp_path / "wiki.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in records))

    def read(markup: str | None) -> tuple[list[str], dict]:
        opts = {"keep_fields": ["title"], **({"markup": markup} if markup else {})}
        cfg = config_from_dict({"data_root": str(tmp_path / f"data-{markup}"), "ingest": {"workers": 1},
                                "sources": [{"domain": "encyclopedia", "reader": "jsonl", "paths": [str(src)],
                                             "options": opts}]})
        rdir = tmp_path / f"data-{markup}" / "run"
        stats = [run_ingest_shard(cfg, rdir, s) for s in plan_ingest(cfg)]
        texts = [r["text"] for s in stats
                 for r in pq.read_table(rdir / "ingest" / f"{s['shard']}.parquet").to_pylist()]
        return texts, {k: v["docs"] for st in stats for k, v in st["removed"].items()}

    converted, removed = read("wikitext")
    from_dump = [d["text"] for d in ingest(tmp_path / "dump", dump(tmp_path))[0]]      # "<title>\n\n<prose>"
    assert converted == [t.split("\n\n", 1)[1] for t in from_dump] and removed == {"wiki_redirect": 1}
    raw, removed = read(None)
    assert removed == {} and len(raw) == 4 and any("{{" in t for t in raw)
    with pytest.raises(ConfigError, match=r"source 'encyclopedia' \(jsonl\) options\.markup: must be one of"):
        config_from_dict({"sources": [{"domain": "encyclopedia", "reader": "jsonl", "paths": [str(src)],
                                       "options": {"markup": "html"}}]})
