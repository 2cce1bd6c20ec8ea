"""The whole data chain (``pipeline.tasks.corpus.run_all``) at 1×, 2×, 4×, 8× of a corpus: cost-growth exponent and
peak memory per stage.

    .venv/bin/python benchmarks/scaling.py [--scales 1,2,4,8] [--base-mb 4] [--quick]

Corpus: ``../shared/corpora`` (else ``data/demo-corpus``, built with ``python -m pipeline.democorpus`` when missing).
The 1× corpus takes the first documents of every domain up to ``--base-mb`` MB in the corpus's own proportions
(8 MB by default: the 8× run, about 75 MB of text, takes about two minutes on 2 cores and the four runs about
five).  Scale k adds k − 1 copies of it with controlled edits, decided per (document, copy) by a seeded hash:

* 20 % exact copies — exact dedup must remove them (planted count reported next to the removed count);
* 30 % near-duplicates — 2 % of the words (CJK: characters) replaced by words drawn from the same domain: about
  0.9 of the word 5-grams survive, work for a near-duplicate stage, invisible to exact dedup;
* 50 % new documents — 30 % of the words replaced (about 0.17 of the 5-grams survive): distinct text with the
  domain's word statistics, so the quality filters see realistic input.

Every copy gets a new id.  Each scale runs in a fresh process with the default config (configs/default.yaml:
quality chains, tokenizer, packing, mixture, validation split) over those files; every function of
``pipeline.tasks.corpus`` that ``run_all`` calls is timed, with the peak resident memory of the process and its
children while it runs (sampled, plus the exact high-water mark of the process, reset per stage).  Memory a stage
leaves allocated in the process is part of the next stage's baseline, as in ``mindloom corpus``; the table shows the
RSS at the start of each stage too.  Documents per stage come from the stage stats files.

The exponent is the least-squares slope of log(seconds) on log(input MB): 1 is linear.  Fixed costs (imports, the
tokenizer trained on a fixed-size sample, MindSpore start-up) pull it below 1 at small sizes, so the slope of the
last doubling is reported as well.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import REPO, RESULTS_DIR, PeakSampler, loglog_slope, machine, source_corpus, tree_rss_mb  # noqa: E402

EDIT_MIX = (("exact", 0.20, 0.0), ("near", 0.30, 0.02), ("new", 0.50, 0.30))     # class, share, substitution rate
TOKEN = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]|[^\s\u3400-\u9fff\uf900-\ufaff]+")


def _is_cjk(tok: str) -> bool:
    return len(tok) == 1 and ("\u3400" <= tok <= "\u9fff" or "\uf900" <= tok <= "\ufaff")


def base_corpus(src: Path, base_mb: float) -> dict[str, list[dict]]:
    """First documents of each domain, up to its share of ``base_mb`` (at least one per domain)."""
    files = sorted(src.glob("*.jsonl"))
    total = sum(f.stat().st_size for f in files)
    out = {}
    for f in files:
        want, size, docs = base_mb * 1e6 * f.stat().st_size / total, 0, []
        with open(f, encoding="utf-8") as fh:
            for line in fh:
                if size >= want and docs:
                    break
                rec = json.loads(line)
                docs.append(rec)
                size += len(rec["text"].encode("utf-8"))
        out[f.stem] = docs
    return out


def edit(text: str, rate: float, rng: random.Random, words: list[str], chars: list[str]) -> str:
    """Replace each token with probability ``rate`` by one drawn (frequency-weighted) from the domain."""
    if rate <= 0:
        return text

    def sub(m):
        if rng.random() >= rate:
            return m.group()
        pool = chars if _is_cjk(m.group()) and chars else words
        return rng.choice(pool) if pool else m.group()

    return TOKEN.sub(sub, text)


def _edit_class(r: float) -> tuple[str, float]:
    """The class (and substitution rate) that a uniform draw ``r`` falls into."""
    acc = 0.0
    for cls, share, rate in EDIT_MIX:
        acc += share
        if r < acc:
            return cls, rate
    return EDIT_MIX[-1][0], EDIT_MIX[-1][2]


def replicate(base: dict[str, list[dict]], scale: int, out: Path) -> dict:
    """Write ``<out>/<domain>.jsonl`` for one scale; return what was planted."""
    out.mkdir(parents=True, exist_ok=True)
    planted = {c: 0 for c, _, _ in EDIT_MIX}
    for dom, docs in base.items():
        toks = [t for d in docs for t in TOKEN.findall(d["text"])][:400_000]
        words, chars = [t for t in toks if not _is_cjk(t)], [t for t in toks if _is_cjk(t)]
        with open(out / f"{dom}.jsonl", "w", encoding="utf-8") as fh:
            for copy in range(scale):
                for d in docs:
                    rec = dict(d)
                    if copy:
                        rng = random.Random(f"{d['id']}#{copy}")
                        cls, rate = _edit_class(rng.random())
                        planted[cls] += 1
                        rec = {**d, "id": f"{d['id']}#copy{copy}", "text": edit(d["text"], rate, rng, words, chars)}
                    fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
    return planted


def chain_config(inputs: Path, data_root: Path) -> dict:
    """configs/default.yaml with the sources replaced by the replicated files."""
    from pipeline.config import load_config

    d = load_config(REPO / "configs" / "default.yaml").to_dict()
    d["sources"] = [{"domain": f.stem, "reader": "jsonl", "paths": [str(f)], **({"lang": "code"} if f.stem == "code"
                                                                                  else {})}
                    for f in sorted(inputs.glob("*.jsonl"))]
    d["data_root"] = str(data_root)
    return d


# ------------------------------------------------------------------------------------------------------------
# Worker: one scale in a fresh process


def worker(cfg_path: str, run_id: str, out_path: str) -> None:
    sys.path.insert(0, str(REPO))
    import inspect

    from pipeline.config import config_from_dict
    from pipeline.io import read_json
    from pipeline.tasks import corpus

    stages: dict[str, dict] = {}
    depth = [0]

    def timed(name, fn):
        def call(*a, **k):
            stage = a[0] if name == "run_stage_batch" else name       # batch tasks: timed by their stage
            if depth[0]:                       # nested helper calls count in their caller's stage
                return fn(*a, **k)
            depth[0] += 1
            try:
                start_rss = round(tree_rss_mb(os.getpid()), 1)
                with PeakSampler(reset_self=True) as peak:
                    t0 = time.perf_counter()
                    result = fn(*a, **k)
                    seconds = time.perf_counter() - t0
            finally:
                depth[0] -= 1
            st = stages.setdefault(stage, {"seconds": 0.0, "cpu_s": 0.0, "peak_rss_mb": 0.0, "rss_start_mb": start_rss,
                                          "calls": 0})
            st["seconds"] += seconds
            st["cpu_s"] += peak.cpu_s
            st["peak_rss_mb"] = max(st["peak_rss_mb"], peak.peak_mb)
            st["calls"] += 1
            return result
        return call

    collect_stats = corpus.collect_stats
    # not wrapped: run_all and run_step (every task), and the per-shard functions, which run inside run_stage_batch
    # (timed by stage) and must stay picklable by name for its pool
    skip = {"run_all", "run_step",
            *(f.__name__ for f in (*corpus.SHARD_STAGES.values(), *corpus.BATCH_STAGES.values()))}
    for name, fn in inspect.getmembers(corpus, inspect.isfunction):     # the chain's steps, wherever defined
        if fn.__module__ in (corpus.__name__, "pipeline.tasks.sink_steps") and name not in skip:
            setattr(corpus, name, timed(name, fn))
    cfg = config_from_dict(json.loads(Path(cfg_path).read_text()))
    t0 = time.perf_counter()
    corpus.run_all(cfg, run_id, progress=False)
    wall = time.perf_counter() - t0
    rdir = Path(cfg.data_root) / "runs" / run_id
    stats = {stage: {"in_docs": sum(v["in_docs"] for v in doms.values()),
                     "kept_docs": sum(v["kept_docs"] for v in doms.values()),
                     "removed": _sum_removed(doms)} for stage, doms in collect_stats(rdir).items()}
    manifest = read_json(rdir / "mindrecord" / "manifest.json")
    Path(out_path).write_text(json.dumps({"wall_s": round(wall, 2), "stages": {k: {**v, "seconds": round(
        v["seconds"], 2), "cpu_s": round(v["cpu_s"], 2)} for k, v in stages.items()}, "stats": stats,
        "tokens": manifest["tokens"], "cpu_s": round(sum(v["cpu_s"] for v in stages.values()), 2)}))


def _sum_removed(doms: dict) -> dict:
    out: dict[str, int] = {}
    for v in doms.values():
        for reason, n in v["removed"].items():
            out[reason] = out.get(reason, 0) + n
    return out


# ------------------------------------------------------------------------------------------------------------


def run(scales: list[int], base_mb: float, corpus: Path, work: Path) -> dict:
    base = base_corpus(corpus, base_mb)
    res = {"command": "benchmarks/scaling.py " + " ".join(sys.argv[1:]), "machine": machine(), "corpus": str(corpus),
           "base_mb": base_mb, "edit_mix": [{"class": c, "share": s, "substitution_rate": r} for c, s, r in EDIT_MIX],
           "runs": []}
    for k in scales:
        d = work / f"scale-{k}"
        planted = replicate(base, k, d / "in")
        in_mb = sum(len(json.loads(x)["text"].encode()) for f in (d / "in").glob("*.jsonl")
                    for x in f.read_text(encoding="utf-8").splitlines()) / 1e6
        (d / "config.json").write_text(json.dumps(chain_config(d / "in", d / "data")))
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, __file__, "--worker", str(d / "config.json"), f"scale{k}",
                            str(d / "result.json")], capture_output=True, text=True, timeout=3600)
        if p.returncode:
            raise RuntimeError(f"scale {k}x failed:\n{p.stderr[-3000:]}")
        r = json.loads((d / "result.json").read_text())
        r.update(scale=k, input_mb=round(in_mb, 2), planted=planted, process_wall_s=round(time.perf_counter() - t0, 2),
                 docs=sum(1 for f in (d / "in").glob("*.jsonl") for _ in open(f, encoding="utf-8")))
        res["runs"].append(r)
        peak = max(s["peak_rss_mb"] for s in r["stages"].values())
        print(f"  {k}x: {r['input_mb']} MB, {r['docs']} docs, chain {r['wall_s']} s, peak RSS {peak} MB", flush=True)
    runs = res["runs"]
    mb = [r["input_mb"] for r in runs]
    res["exponent"] = {"chain": loglog_slope(mb, [r["wall_s"] for r in runs]),
                       "chain_last_doubling": loglog_slope(mb[-2:], [r["wall_s"] for r in runs[-2:]]),
                       "chain_cpu": loglog_slope(mb, [r["cpu_s"] for r in runs]),
                       "chain_cpu_last_doubling": loglog_slope(mb[-2:], [r["cpu_s"] for r in runs[-2:]]),
                       "peak_memory": loglog_slope(mb, [max(s["peak_rss_mb"] for s in r["stages"].values())
                                                        for r in runs]),
                       "stages": {s: loglog_slope(mb, [r["stages"].get(s, {}).get("seconds") for r in runs])
                                  for s in runs[-1]["stages"]},
                       "stages_cpu": {s: loglog_slope(mb, [r["stages"].get(s, {}).get("cpu_s") for r in runs])
                                      for s in runs[-1]["stages"]}}
    res["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    return res


def metrics(res: dict) -> list[dict]:
    from common import metric

    if not res.get("runs"):
        return []
    ex, runs = res["exponent"], res["runs"]
    span = f"{runs[0]['scale']}× → {runs[-1]['scale']}× ({runs[0]['input_mb']} → {runs[-1]['input_mb']} MB)"
    out = [metric("scaling", "chain_time_exponent", "exponent", [ex["chain"]], compared=span, headline=True,
                  note="slope of log(chain wall seconds) on log(input MB); 1 = linear"),
           metric("scaling", "chain_cpu_exponent", "exponent", [ex.get("chain_cpu")], compared=span, headline=True,
                  note="the same on CPU seconds of the process tree (less disturbed by other jobs)"),
           metric("scaling", "chain_time_exponent_last_doubling", "exponent", [ex["chain_last_doubling"]],
                  compared="the two largest scales"),
           metric("scaling", "chain_cpu_exponent_last_doubling", "exponent", [ex.get("chain_cpu_last_doubling")],
                  compared="the two largest scales"),
           metric("scaling", "peak_memory_exponent", "exponent", [ex["peak_memory"]], compared=span),
           metric("scaling", "chain_mb_per_s_largest", "MB/s", [runs[-1]["input_mb"] / runs[-1]["wall_s"]],
                  compared=f"{runs[-1]['scale']}× corpus, whole chain, 2 cores")]
    return out


def markdown(res: dict) -> list[str]:
    if not res.get("runs"):
        return []
    from common import table

    runs = res["runs"]
    stages = list(runs[-1]["stages"])
    mix = ", ".join(f"{int(100 * m['share'])} % {m['class']} ({int(100 * m['substitution_rate'])} % of words "
                    f"replaced, expected word-5-gram Jaccard {_jaccard(m['substitution_rate']):.2f})"
                    for m in res["edit_mix"])
    out = [f"Corpus `{res['corpus']}`, 1× = {res['base_mb']} MB; copies: {mix}. One fresh process per scale running "
           "`pipeline.tasks.corpus.run_all` with `configs/default.yaml` (sources replaced).", ""]
    out += table(["Scale", "Input MB", "Docs", "Chain s", "CPU s", "MB/s", "Peak RSS MB", "Planted exact copies",
                  "Removed by exact dedup", "Docs after quality", "Tokens"],
                 [[f"{r['scale']}×", r["input_mb"], r["docs"], r["wall_s"], r.get("cpu_s"),
                   round(r["input_mb"] / r["wall_s"], 2),
                   max(s["peak_rss_mb"] for s in r["stages"].values()), r["planted"].get("exact"),
                   r["stats"].get("exact_dedup", {}).get("removed", {}).get("exact_duplicate", 0),
                   r["stats"].get("quality", {}).get("kept_docs"), f"{r['tokens']:,}"] for r in runs])
    out += ["", "Wall seconds / CPU seconds per stage (cost-growth exponents of both in the last columns):", ""]
    out += table(["Stage", *[f"{r['scale']}×" for r in runs], "Exponent (wall)", "Exponent (CPU)"],
                 [[s, *[f"{r['stages'][s]['seconds']} / {r['stages'][s].get('cpu_s', '–')}" if s in r["stages"]
                        else "–" for r in runs], res["exponent"]["stages"].get(s),
                   res["exponent"].get("stages_cpu", {}).get(s)] for s in stages])
    out += ["", "Peak RSS per stage, MB (RSS at the stage's start in brackets):", ""]
    out += table(["Stage", *[f"{r['scale']}×" for r in runs]],
                 [[s, *[f"{r['stages'][s]['peak_rss_mb']} ({r['stages'][s]['rss_start_mb']})" if s in r["stages"]
                        else "–" for r in runs]] for s in stages])
    near = runs[-1]["planted"].get("near", 0)
    out += ["", f"Near-duplicate copies planted at {runs[-1]['scale']}×: {near}. Removed by the chain's stages: "
            + ", ".join(f"{st}: {sum(v['removed'].values())}" for st, v in runs[-1]["stats"].items()
                        if v["removed"]) + "."]
    return out


def _jaccard(rate: float, n: int = 5) -> float:
    """Expected word-n-gram Jaccard of a copy with a share ``rate`` of its words replaced (independently)."""
    kept = (1 - rate) ** n
    return kept / (2 - kept)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scales", default="1,2,4,8")
    ap.add_argument("--base-mb", type=float, default=8.0, help="size of the 1× corpus (text MB)")
    ap.add_argument("--quick", action="store_true", help="base 0.3 MB, scales 1,2")
    ap.add_argument("--corpus", type=Path)
    ap.add_argument("--work", type=Path, help="keep the runs here (default: a temp folder, removed)")
    ap.add_argument("--out", type=Path, default=RESULTS_DIR / "scaling.json")
    ap.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(*args.worker)
        return 0
    import shutil
    import tempfile

    corpus = args.corpus or source_corpus()
    if corpus is None:
        subprocess.run([sys.executable, "-m", "pipeline.democorpus", "--out", str(REPO / "data" / "demo-corpus")],
                       check=True, cwd=REPO)
        corpus = source_corpus()
    scales = [1, 2] if args.quick else [int(x) for x in args.scales.split(",")]
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-scaling-"))
    try:
        res = run(scales, 0.3 if args.quick else args.base_mb, corpus, work)
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(res["exponent"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
