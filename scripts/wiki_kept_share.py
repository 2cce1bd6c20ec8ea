"""How many Wikipedia pages survive the encyclopedia quality chain, read by the MediaWiki reader.

    .venv/bin/python scripts/wiki_kept_share.py [--cache .cache/demo-sources] [--out FILE.json]

Input: the English Wikipedia dump excerpt in the gensim 4.3.3 wheel (the demo corpus's source, fetched with pip
once).  Three runs of ingest + the ``encyclopedia`` chain of ``configs/default.yaml``: the dump through the
``mediawiki`` reader; the same pages' raw wikitext as JSONL (what a plain reader would give); and, as clean
prose, the Jane Austen chapters of the shared sample corpus (``../shared/corpora/books.jsonl``, Project
Gutenberg text, when present).  Prints (and writes) the counts.
"""

from __future__ import annotations

import argparse
import bz2
import json
import sys
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def chain_counts(tmp: Path, name: str, source: dict) -> dict:
    from pipeline.config import config_from_dict, load_config
    from pipeline.ingest.run import plan_ingest, run_ingest_shard
    from pipeline.quality.run import run_quality_shard

    cfg = config_from_dict({"data_root": str(tmp / name), "sources": [{"domain": "encyclopedia", **source}],
                            "quality": load_config().to_dict()["quality"], "ingest": {"workers": 1}})
    out = {"ingest_in": 0, "documents": 0, "kept": 0, "ingest_removed": {}, "quality_removed": {}}
    for spec in plan_ingest(cfg):
        st = run_ingest_shard(cfg, tmp / name / "run", spec)        # the plan shard's stats, summed over its parts
        out["ingest_in"] += st["in_docs"]
        for reason, v in st["removed"].items():
            out["ingest_removed"][reason] = out["ingest_removed"].get(reason, 0) + v["docs"]
        for part in st["parts"]:         # a large dump writes several output shards (ingest.shard_bytes)
            qs = run_quality_shard(cfg.quality, tmp / name / "run", part, input_stage="ingest")
            out["documents"] += qs["in_docs"]
            out["kept"] += qs["kept_docs"]
            for reason, v in qs["removed"].items():
                out["quality_removed"][reason] = out["quality_removed"].get(reason, 0) + v["docs"]
    out["kept_share"] = round(out["kept"] / max(1, out["documents"]), 4)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", type=Path, default=REPO / ".cache" / "demo-sources")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    import mwxml

    from pipeline.democorpus import _WIKI_MEMBER, GENSIM, fetch_package

    with zipfile.ZipFile(fetch_package(*GENSIM, args.cache)) as zf:
        dump = zf.read(_WIKI_MEMBER)
    with tempfile.TemporaryDirectory(prefix="wiki-share-") as d:
        tmp = Path(d)
        (tmp / "enwiki.xml.bz2").write_bytes(dump)
        raw = []
        for page in mwxml.Dump.from_file(bz2.open(tmp / "enwiki.xml.bz2")):
            text = [r.text for r in page][-1]
            if page.namespace == 0 and not page.redirect and text:
                raw.append({"id": str(page.id), "text": text})
        (tmp / "raw.jsonl").write_text("".join(json.dumps(r) + "\n" for r in raw), encoding="utf-8")
        books = REPO.parent / "shared" / "corpora" / "books.jsonl"
        prose = [r for r in map(json.loads, books.read_text(encoding="utf-8").splitlines())
                 if r["source"] == "r-cran-janeaustenr"] if books.exists() else []
        (tmp / "prose.jsonl").write_text("".join(json.dumps(r) + "\n" for r in prose), encoding="utf-8")
        result = {"input": f"{GENSIM[0]}=={GENSIM[1]}:{_WIKI_MEMBER}",
                  "mediawiki_reader": chain_counts(tmp, "reader", {"reader": "mediawiki",
                                                                    "paths": [str(tmp / "enwiki.xml.bz2")]}),
                  "raw_wikitext": chain_counts(tmp, "raw", {"paths": [str(tmp / "raw.jsonl")]}),
                  "clean_prose_austen_chapters": chain_counts(tmp, "prose", {"paths": [str(tmp / "prose.jsonl")]})
                  if prose else "needs ../shared/corpora/books.jsonl"}
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
