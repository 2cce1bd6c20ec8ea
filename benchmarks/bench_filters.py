"""Quality-filter benchmark: mindloom's filters vs datatrove 0.10.1's on the same documents, side by side.

    .venv/bin/python benchmarks/bench_filters.py [--mb 4] [--repeats 3] [--write-md | --md-only]

datatrove runs in its own virtual environment, ``.cache/bench-venvs/datatrove`` (``datatrove[processing]==0.10.1``
+ ``spacy``, its English word tokenizer; created on first use, reused when present).  Documents: the English
domains of ``../shared/corpora`` (web, books, encyclopedia, academic), normalized as ingest does, taken round-robin
over the domains up to ``--mb`` megabytes of text.  Each tool runs in a fresh process per repeat; repeats of the
two tools are interleaved and the median time is reported (other jobs share this machine).

Per filter, with published defaults on both sides (C4 with FineWeb's ``filter_no_terminal_punct=False``):
  * throughput (MB/s and docs/s of text through ``score + decide`` vs ``filter()``), one core;
  * agreement: share of documents where both keep or both drop, and where both give the same reason.
``chain`` is FineWeb's order (Gopher repetition → Gopher quality → C4 → FineWeb): datatrove stops at the first
drop, mindloom scores every filter for every document (that is what makes re-tuning from stored scores possible)
and shares one tokenization between them.

Writes ``benchmarks/results/filters.json``; ``--write-md`` also replaces this benchmark's section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VENV = REPO / ".cache" / "bench-venvs" / "datatrove"
RESULTS = REPO / "benchmarks" / "results"
CORPUS = REPO.parent / "shared" / "corpora"
DOMAINS = ("web", "books", "encyclopedia", "academic")
FILTERS = ("gopher_quality", "gopher_repetition", "c4", "fineweb")
MD_START, MD_END = "<!-- bench_filters:start -->", "<!-- bench_filters:end -->"
# datatrove reason -> mindloom reason (mindloom prefixes every reason with its filter)
PREFIX = {"gopher_quality": "", "gopher_repetition": "gopher_rep_", "c4": "c4_", "fineweb": "fineweb_"}


# ------------------------------------------------------------------------------------------------------------
# Workers: run in a fresh process of either interpreter; imports stay inside.


def _time_filters(texts: list[str], run_one) -> dict:
    """{filter: {"seconds", "reasons"}} for every filter and the chain; run_one(name, text) -> reason or ''."""
    out = {}
    for name in (*FILTERS, "chain"):
        for t in texts[:5]:                       # warm-up: lazy model/regex loading is not throughput
            run_one(name, t)
        start = time.perf_counter()
        reasons = [run_one(name, t) for t in texts]
        out[name] = {"seconds": time.perf_counter() - start, "reasons": reasons}
    return out


def worker_mindloom(texts: list[str]) -> dict:
    sys.path.insert(0, str(REPO))
    from pipeline.quality.filters.chain import FILTER_CLASSES, Chain
    from pipeline.quality.filters.params import PARAMS
    from pipeline.quality.filters.text import Doc

    filters = {n: Chain("bench", [FILTER_CLASSES[n](PARAMS[n]())]) for n in FILTERS}
    filters["chain"] = Chain("bench", [f for n in ("gopher_repetition", "gopher_quality", "c4", "fineweb")
                                       for f in filters[n].filters])

    def run_one(name: str, text: str) -> str:
        chain = filters[name]
        drop = chain.decide(chain.score(Doc(text)))
        return drop[0] if drop else ""

    return _time_filters(texts, run_one)


def worker_datatrove(texts: list[str]) -> dict:
    from datatrove.data import Document
    from datatrove.pipeline.filters import (
        C4QualityFilter,
        FineWebQualityFilter,
        GopherQualityFilter,
        GopherRepetitionFilter,
    )

    made = {"gopher_quality": GopherQualityFilter(), "gopher_repetition": GopherRepetitionFilter(),
            "c4": C4QualityFilter(filter_no_terminal_punct=False), "fineweb": FineWebQualityFilter()}
    order = ("gopher_repetition", "gopher_quality", "c4", "fineweb")

    def run_one(name: str, text: str) -> str:
        doc = Document(text=text, id="x")
        for n in (order if name == "chain" else (name,)):
            result = made[n].filter(doc)
            if result is not True:
                return PREFIX[n] + (result[1] if isinstance(result, tuple) else "dropped")
        return ""

    return _time_filters(texts, run_one)


# ------------------------------------------------------------------------------------------------------------
# Driver


def _ensure_venv() -> Path:
    from common import peer

    return peer("datatrove")


def _documents(mb: float) -> list[tuple[str, str, str]]:
    """(domain, id, normalized text), round-robin over the domains until ``mb`` MB of text."""
    sys.path.insert(0, str(REPO))
    from pipeline.ingest.normalize import normalize_text

    pools = {d: [json.loads(x) for x in (CORPUS / f"{d}.jsonl").read_text(encoding="utf-8").splitlines()]
             for d in DOMAINS}
    out, size, i = [], 0, 0
    while size < mb * 1e6 and any(i < len(p) for p in pools.values()):
        for d in DOMAINS:
            if i < len(pools[d]) and size < mb * 1e6:
                text = normalize_text(pools[d][i]["text"])
                if text:
                    out.append((d, pools[d][i]["id"], text))
                    size += len(text.encode("utf-8"))
        i += 1
    return out


def _run(python: str, tool: str, docs_path: str) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as fh:
        out = fh.name
    subprocess.run([python, __file__, "--worker", tool, "--docs", docs_path, "--out", out], check=True,
                   env={**os.environ, "PYTHONHASHSEED": "0"})
    result = json.loads(Path(out).read_text())
    os.unlink(out)
    return result


def _machine() -> dict:
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor())
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(), "os": platform.platform()}


def _markdown(res: dict) -> str:
    lines = [MD_START, "## Quality filters vs datatrove 0.10.1 (`benchmarks/bench_filters.py`)", "",
             f"Command: `{res['command']}`  ", f"Machine: {res['machine']['cpu']}, {res['machine']['cores']} cores "
             f"(one used), Python {res['machine']['python']}; datatrove 0.10.1 with spaCy {res['spacy']} in "
             "`.cache/bench-venvs/datatrove`.  ", f"Documents: {res['docs']} ({res['mb']:.1f} MB) from the shared "
             f"corpora ({', '.join(DOMAINS)}), median of {res['repeats']} interleaved runs.", "",
             "| filter | mindloom MB/s | datatrove MB/s | speed-up | same keep/drop | same reason | "
             "drops mindloom / datatrove |", "|---|---|---|---|---|---|---|"]
    for name in (*FILTERS, "chain"):
        r = res["filters"][name]
        lines.append(f"| {name} | {r['mindloom_mb_s']:.2f} | {r['datatrove_mb_s']:.2f} | {r['speedup']:.1f}× | "
                     f"{100 * r['agree_decision']:.1f} % | {100 * r['agree_reason']:.1f} % | "
                     f"{r['mindloom_drops']} / {r['datatrove_drops']} |")
    lines += ["", "Differences come from word splitting: datatrove uses spaCy, mindloom one regular expression that "
              "imitates it (inner punctuation kept, hyphens split, abbreviations keep their period); the top "
              "disagreements are listed in `benchmarks/results/filters.json`.  The chain row is not like for like "
              "in work done: mindloom scores all four filters for every document (stored for re-tuning), "
              "datatrove stops at the first drop.", MD_END]
    return "\n".join(lines)


def _write_md(section: str) -> None:
    path = REPO / "BENCHMARKS.md"
    text = path.read_text(encoding="utf-8") if path.exists() else "# Benchmarks\n"
    if MD_START in text and MD_END in text:
        text = text[:text.index(MD_START)] + section + text[text.index(MD_END) + len(MD_END):]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    path.write_text(text, encoding="utf-8")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=4.0, help="megabytes of text to filter")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--write-md", action="store_true", help="replace this benchmark's section in BENCHMARKS.md")
    ap.add_argument("--md-only", action="store_true", help="only rewrite the section from results/filters.json")
    ap.add_argument("--worker", choices=("mindloom", "datatrove"), help=argparse.SUPPRESS)
    ap.add_argument("--docs", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        texts = [json.loads(x)["text"] for x in Path(args.docs).read_text(encoding="utf-8").splitlines()]
        fn = worker_mindloom if args.worker == "mindloom" else worker_datatrove
        Path(args.out).write_text(json.dumps(fn(texts)))
        return

    if args.md_only:
        _write_md(_markdown(json.loads((RESULTS / "filters.json").read_text())))
        return
    dt_python = str(_ensure_venv())
    docs = _documents(args.mb)
    size = sum(len(t.encode("utf-8")) for _, _, t in docs)
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False, encoding="utf-8") as fh:
        fh.write("".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for _, _, t in docs))
        docs_path = fh.name
    runs: dict[str, list[dict]] = {"mindloom": [], "datatrove": []}
    for i in range(args.repeats):
        for tool in (("mindloom", "datatrove") if i % 2 == 0 else ("datatrove", "mindloom")):
            runs[tool].append(_run(sys.executable if tool == "mindloom" else dt_python, tool, docs_path))
            print(f"run {i + 1}/{args.repeats} {tool}: " + ", ".join(
                f"{n} {runs[tool][-1][n]['seconds']:.2f}s" for n in (*FILTERS, "chain")), flush=True)
    os.unlink(docs_path)
    spacy = subprocess.run([dt_python, "-c", "import spacy; print(spacy.__version__)"], capture_output=True,
                           text=True).stdout.strip()
    res = {"command": "python benchmarks/bench_filters.py " + " ".join(sys.argv[1:]), "machine": _machine(),
           "spacy": spacy, "docs": len(docs), "mb": size / 1e6, "repeats": args.repeats,
           "per_domain_docs": {d: sum(1 for x in docs if x[0] == d) for d in DOMAINS}, "filters": {}}
    for name in (*FILTERS, "chain"):
        ours = [r[name] for r in runs["mindloom"]]
        theirs = [r[name] for r in runs["datatrove"]]
        t_ours = statistics.median(r["seconds"] for r in ours)
        t_theirs = statistics.median(r["seconds"] for r in theirs)
        a, b = ours[0]["reasons"], theirs[0]["reasons"]
        same = sum((x == "") == (y == "") for x, y in zip(a, b, strict=True))
        same_reason = sum(x == y for x, y in zip(a, b, strict=True))
        diffs: dict[str, dict] = {}
        for (dom, doc_id, _), x, y in zip(docs, a, b, strict=True):
            if x != y:
                slot = diffs.setdefault(f"{dom}: mindloom {x or 'KEPT'} / datatrove {y or 'KEPT'}",
                                        {"docs": 0, "examples": []})
                slot["docs"] += 1
                slot["examples"] = (slot["examples"] + [doc_id])[:2]
        res["filters"][name] = {
            "mindloom_s": [round(r["seconds"], 3) for r in ours],
            "datatrove_s": [round(r["seconds"], 3) for r in theirs],
            "mindloom_mb_s": size / 1e6 / t_ours, "datatrove_mb_s": size / 1e6 / t_theirs,
            "mindloom_docs_s": len(docs) / t_ours, "datatrove_docs_s": len(docs) / t_theirs,
            "speedup": t_theirs / t_ours, "agree_decision": same / len(docs), "agree_reason": same_reason / len(docs),
            "mindloom_drops": sum(1 for x in a if x), "datatrove_drops": sum(1 for y in b if y),
            "top_disagreements": dict(sorted(diffs.items(), key=lambda kv: -kv[1]["docs"])[:8])}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "filters.json").write_text(json.dumps(res, indent=1, ensure_ascii=False) + "\n")
    section = _markdown(res)
    print(section)
    if args.write_md:
        _write_md(section)


if __name__ == "__main__":
    main()
