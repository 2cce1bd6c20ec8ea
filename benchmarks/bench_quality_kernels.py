"""CPU cost of the quality task's per-document work (heuristic chains, classifier, decontamination), and per stage.

    .venv/bin/python benchmarks/bench_quality_kernels.py [--repeats 3]
    .venv/bin/python benchmarks/bench_quality_kernels.py --run-dir RUN --before /path/to/old/checkout [--repeats 3]

This is the ``make bench`` topic ``quality_kernels`` (``benchmarks/topics.py``; ``run_all.py --quick`` runs it
with ``--repeats 1`` on the tiny corpus).  Every measurement below is over the same documents: every document of
``../shared/corpora`` (``--corpus``), its domain the file name.  Each repeat runs each measurement in a fresh
process, the four one after the other (interleaved, so all see the same load); CPU-seconds (user + system),
median of the repeats, with the spread; MB/CPU-s is the corpus's UTF-8 MB over the CPU-seconds of one repeat.

Scoring (the heuristic chains): every document through its domain's default chain (score only, without the
language filter), once with the numba kernels and once with the reference path
(``pipeline.quality.filters.text.KERNELS = None``).  The numba cache is warm (one untimed run first).

Classifier (issue 34: the score is computed inside the quality task, no extra pass): one floret model per
benchmark run, trained untimed by ``pipeline.quality.classifier.train_classifier`` with the default
``quality.classifier`` settings (within each domain, cross-fitted; only ``enabled`` set) on
the same documents written as the ``minhash`` shards of a temporary run; then ``Scorer.score`` of every document
(which reads its first ``max_chars`` characters) is timed, the model's load apart (``load_cpu``).

Decontamination: an evaluation file synthesised from the corpus itself, deterministically (``--decont-items``
items of ``--item-words`` normalised words each, at positions of the documents chosen by a hash of the item's
number, among documents with that many words), indexed untimed by ``pipeline.quality.decontaminate.build_index``
with the default ``quality.decontamination`` settings (n = 13); then ``Decontaminator.first_hit`` of every
document is timed (the index's load apart).  The documents an item came from hit (``docs_hit``).

``classifier.over_heuristics`` and ``decontamination.over_heuristics``: the measurement's CPU over the heuristic
chains' (with kernels) of the same repeat.

Stages (``--run-dir``, a finished run of ``mindloom corpus``, e.g. the one ``benchmarks/scale_corpus.py`` data
gives): the MinHash signatures stage (which pre-scores with the quality chains) and the quality stage are re-run
shard by shard with one worker on a copy of the run, in a fresh process per repeat, with this checkout's code and
with ``--before``'s.  Each fresh process pays its numba cache load; it is counted.  ``--cold`` adds one run per
stage with an empty numba cache (``NUMBA_CACHE_DIR``): what the first run on a machine pays to compile.  The
copies' outputs are compared with the run's own files (they must be equal).  A run without ``--run-dir`` keeps
the stage figures of the file it replaces (``stages_kept``: not re-measured).

Writes ``benchmarks/results/quality_kernels.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CORPORA = REPO.parent / "shared" / "corpora"
OUT = REPO / "benchmarks" / "results" / "quality_kernels.json"

_SCORE = r"""
import json, resource, sys
from pathlib import Path
from pipeline.config import DEFAULT_CONFIG, load_config
from pipeline.quality.filters import text as T
from pipeline.quality.filters.chain import Chain
if sys.argv[1] == "reference":
    T.KERNELS = None
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF); return r.ru_utime + r.ru_stime
q = load_config(DEFAULT_CONFIG).quality
docs = [(p.stem, json.loads(line)["text"]) for p in sorted(Path(sys.argv[2]).glob("*.jsonl"))
        for line in p.read_text(encoding="utf-8").splitlines()]
chains = {d: Chain.build(q, d) for d in {d for d, _ in docs}}
for c in chains.values():
    c.filters = [f for f in c.filters if f.name != "language"]
c0 = cpu()
for d, text in docs:
    chains[d].score(T.Doc(text, "x", d))
print(json.dumps({"cpu": cpu() - c0, "mb": sum(len(t.encode("utf-8", "surrogatepass")) for _, t in docs) / 1e6,
                  "docs": len(docs)}))
"""

# Every measurement reads the documents the same way: (domain = file name, text), files in name order.
_DOCS = r"""
import json, resource, sys
from pathlib import Path
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF); return r.ru_utime + r.ru_stime
docs = [(p.stem, json.loads(line)["text"]) for p in sorted(Path(sys.argv[1]).glob("*.jsonl"))
        for line in p.read_text(encoding="utf-8").splitlines()]
"""

# Untimed, once per benchmark run: the classifier (train_classifier on the documents as a run's minhash shards) and
# the decontamination index of an evaluation file made from the documents.  argv: corpus, work dir, items, words.
_SETUP = _DOCS + r"""
import dataclasses, hashlib, shutil
import pyarrow as pa
from pipeline.config import DEFAULT_CONFIG, load_config
from pipeline.configkit import ConfigError
from pipeline.io import write_parquet
from pipeline.quality import classifier as C, decontaminate as D
work, n_items, n_words = Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
cfg = load_config(DEFAULT_CONFIG)
run = work / "run"
(run / "minhash").mkdir(parents=True)
domains = sorted({d for d, _ in docs})
for dom in domains:
    texts = [t for d, t in docs if d == dom]
    write_parquet(pa.table({"doc_id": [f"{dom}-{i:06d}" for i in range(len(texts))], "domain": [dom] * len(texts),
                            "text": texts}), run / "minhash" / f"{dom}.parquet")
cc = dataclasses.replace(cfg.quality.classifier, enabled=True)
try:                                    # fastText's own epochs and lr on the same sample, for comparison
    ft_held = C.train_classifier(dataclasses.replace(cc, epochs=5, lr=0.1), run, domains, cfg.seed,
                                 input_stage="minhash", quality=cfg.quality)["held_out"]
except ConfigError:
    ft_held = None
shutil.rmtree(C.classifier_dir(run), ignore_errors=True)
c0 = cpu()
try:
    man = C.train_classifier(cc, run, domains, cfg.seed, input_stage="minhash", quality=cfg.quality)
except ConfigError as exc:              # a corpus without the positive or negative domains (the demo corpus)
    man = {"skipped": str(exc)}
train_cpu = cpu() - c0
# the evaluation file: item k is n_words words at a position drawn from blake2b(k), among documents with enough words
c0 = cpu()
counts = [len(D.words(t)) for _, t in docs]
eligible = [i for i, c in enumerate(counts) if c >= n_words]
picks = {}
for k in range(n_items if eligible else 0):
    h = int.from_bytes(hashlib.blake2b(f"decontamination item {k}".encode(), digest_size=8).digest(), "big")
    i = eligible[h % len(eligible)]
    picks.setdefault(i, []).append((k, (h >> 32) % (counts[i] - n_words + 1)))
items = {}
for i, ks in picks.items():
    ws = D.words(docs[i][1])
    for k, start in ks:
        items[k] = {"id": f"item{k}", "text": " ".join(ws[start:start + n_words]),
                    "source": f"{docs[i][0]}:{i}:{start}"}
evals = work / "eval" / "synthetic.jsonl"
evals.parent.mkdir()
evals.write_text("".join(json.dumps(items[k]) + "\n" for k in sorted(items)), encoding="utf-8")
dc = dataclasses.replace(cfg.quality.decontamination, enabled=True, paths=[str(evals)])
index = D.build_index(dc, run)
print(json.dumps({
    "classifier_dir": None if "skipped" in man else str(C.classifier_dir(run)), "index_dir": str(D.index_dir(run)),
    "n": dc.n,
    "classifier": man if "skipped" in man else {
        "train_cpu": round(train_cpu, 2), "train": man["train"], "held_out": man["held_out"],
        "held_out_fasttext_defaults": ft_held,
        "model_bytes": sum(p.stat().st_size for p in (C.classifier_dir(run) / "models").glob("*.bin")),
        "probe_max_separation": man["probe"]["max_separation"],
        "settings": {k: man["settings"][k] for k in ("training", "folds", "max_chars", "word_ngrams", "dim",
                                                      "buckets", "epochs", "lr")}},
    "decontamination": {"build_cpu": round(cpu() - c0, 2), "items": index["items"], "item_words": n_words,
                        "source_docs": len(picks), "ngrams": index["ngrams"], "index_bytes": index["index_bytes"],
                        "n": dc.n}}))
"""

# Timed: Scorer.score of every document (argv: corpus, classifier dir); the model's load apart.
_CLASSIFIER = _DOCS + r"""
import statistics
c0 = cpu()
from pipeline.quality.classifier import Decider
decider = Decider(sys.argv[2])
ids, seen = [], {}
for d, _ in docs:                       # the ids the setup gave the documents: <domain>-<index in its domain>
    ids.append(f"{d}-{seen.get(d, 0):06d}")
    seen[d] = seen.get(d, 0) + 1
c1 = cpu()
scores = [decider.score(text, d, i) for (d, text), i in zip(docs, ids)]
c2 = cpu()
read = sum(len(t[:decider.scorer.max_chars].encode("utf-8", "surrogatepass")) for _, t in docs) / 1e6
mean = {d: round(statistics.mean(s for (dd, _), s in zip(docs, scores) if dd == d and s is not None), 4)
        for d in sorted({dd for (dd, _), s in zip(docs, scores) if s is not None})}
print(json.dumps({"cpu": c2 - c1, "load_cpu": c1 - c0, "mb_read": read, "mean_score": mean}))
"""

# Timed: Decontaminator.first_hit of every document (argv: corpus, index dir, n); the index's load apart.
_DECONTAMINATION = _DOCS + r"""
c0 = cpu()
from pipeline.quality.decontaminate import Decontaminator
dec = Decontaminator(sys.argv[2], int(sys.argv[3]))
c1 = cpu()
hits = [dec.first_hit(text) for _, text in docs]
c2 = cpu()
print(json.dumps({"cpu": c2 - c1, "load_cpu": c1 - c0, "docs_hit": sum(h is not None for h in hits)}))
"""

_STAGE = r"""
import json, resource, sys
from pathlib import Path
def cpu():
    s = resource.getrusage(resource.RUSAGE_SELF); c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime
stage, run = sys.argv[1], Path(sys.argv[2])
cfg = json.loads((run / "config.json").read_text())
cfg["quality"]["workers"] = 1
cfg["task_workers"] = 1
(run / "config.json").write_text(json.dumps(cfg))
from pipeline.tasks import corpus as C
fn, out = {"signatures": (C.minhash_signatures, "minhash/signatures"), "quality": (C.quality_shard, "quality")}[stage]
for f in (run / out).glob("*.done"):
    f.unlink()
specs = [{**s, "run_dir": str(run)} for s in json.loads((run / "plan.json").read_text())]
c0 = cpu()
for s in specs:
    fn(s)
print(json.dumps({"cpu": cpu() - c0}))
"""


def _python(code: str, root: Path, *args: str, env_extra: dict | None = None) -> dict:
    env = {**os.environ, "PYTHONPATH": str(root), **(env_extra or {})}
    out = subprocess.run([sys.executable, "-c", code, *args], cwd=root, env=env, capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"measurement process failed (rc {out.returncode}, args {list(args)}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _summary(values: list[float], digits: int = 2) -> dict:
    return {"median": round(statistics.median(values), digits), "min": round(min(values), digits),
            "max": round(max(values), digits), "runs": [round(v, digits) for v in values]}


def _rates(mb: float, runs: list[dict], heuristics: list[dict]) -> dict:
    """CPU-s (and the load's), MB/CPU-s and the share of the heuristic chains' CPU, per repeat."""
    cpu = [r["cpu"] for r in runs]
    return {"cpu": _summary(cpu, 3), "load_cpu": _summary([r["load_cpu"] for r in runs], 3),
            "mb_per_cpu_s": _summary([mb / max(c, 1e-9) for c in cpu]),
            "over_heuristics": _summary([c / max(h["cpu"], 1e-9) for c, h in zip(cpu, heuristics, strict=True)], 3)}


def measure_scoring(corpus: Path, repeats: int, decont_items: int, item_words: int) -> dict:
    """The heuristic chains (kernels and reference), the classifier and the decontamination lookup on every
    document of ``corpus``: one fresh process per measurement and repeat, interleaved."""
    with tempfile.TemporaryDirectory(prefix="bench-quality-") as tmp:
        setup = _python(_SETUP, REPO, str(corpus), tmp, str(decont_items), str(item_words))
        _python(_SCORE, REPO, "kernels", str(corpus))                # warm the numba cache
        runs: dict[str, list[dict]] = {"reference": [], "kernels": [], "classifier": [], "decontamination": []}
        for _ in range(repeats):
            for e in ("reference", "kernels"):
                runs[e].append(_python(_SCORE, REPO, e, str(corpus)))
            if setup["classifier_dir"]:
                runs["classifier"].append(_python(_CLASSIFIER, REPO, str(corpus), setup["classifier_dir"]))
            runs["decontamination"].append(_python(_DECONTAMINATION, REPO, str(corpus), setup["index_dir"],
                                                   str(setup["n"])))
    mb = runs["kernels"][0]["mb"]
    heur = runs["kernels"]
    return {"scoring": {"mb": round(mb, 2), "docs": runs["kernels"][0].get("docs"),
                       **{e: _summary([r["cpu"] for r in runs[e]]) for e in ("reference", "kernels")},
                       "kernels_mb_per_cpu_s": _summary([mb / max(r["cpu"], 1e-9) for r in heur]),
                       "reference_over_kernels": _summary([r["cpu"] / max(k["cpu"], 1e-9)
                                                           for r, k in zip(runs["reference"], heur, strict=True)])},
           "classifier": {**_rates(mb, runs["classifier"], heur),
                          "mb_read": round(runs["classifier"][0]["mb_read"], 2),
                          "mean_score": runs["classifier"][0]["mean_score"], **setup["classifier"]}
           if runs["classifier"] else setup["classifier"],
           "decontamination": {**_rates(mb, runs["decontamination"], heur),
                               "docs_hit": runs["decontamination"][0]["docs_hit"], **setup["decontamination"]}}


def _equal_outputs(a: Path, b: Path) -> int:
    import pyarrow.parquet as pq

    n = 0
    for sub in ("minhash/signatures", "quality", "quality/scores"):
        for f in sorted((a / sub).glob("*.parquet")):
            ta, tb = pq.read_table(f), pq.read_table(b / sub / f.name)
            if not (ta.equals(tb) and ta.schema.metadata == tb.schema.metadata):
                raise SystemExit(f"{sub}/{f.name}: output differs from the run's own file")
            n += 1
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--run-dir", type=Path)
    ap.add_argument("--before", type=Path, help="checkout with the code to compare against (stages)")
    ap.add_argument("--cold", action="store_true", help="also run each stage once with an empty numba cache")
    ap.add_argument("--corpus", type=Path, default=CORPORA,
                    help="folder of <domain>.jsonl (default ../shared/corpora)")
    ap.add_argument("--decont-items", type=int, default=2000, help="items of the synthesised evaluation file")
    ap.add_argument("--item-words", type=int, default=30, help="normalised words per evaluation item")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    result: dict = {"command": " ".join([".venv/bin/python benchmarks/bench_quality_kernels.py", *sys.argv[1:]]),
                    "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                    "load_avg_start": [round(x, 2) for x in os.getloadavg()], "repeats": args.repeats}
    if args.corpus.exists() and any(args.corpus.glob("*.jsonl")):
        result.update(measure_scoring(args.corpus, args.repeats, args.decont_items, args.item_words))
        for key in ("scoring", "classifier", "decontamination"):
            print(key, json.dumps({k: v for k, v in result[key].items() if k not in ("train", "settings")}))
    if args.run_dir:
        roots = {"after": REPO, **({"before": args.before.resolve()} if args.before else {})}
        result["stages"] = {}
        for stage in ("signatures", "quality"):
            for name, root in roots.items():
                values = []
                for _ in range(args.repeats):
                    with tempfile.TemporaryDirectory() as tmp:
                        run = Path(tmp) / "run"
                        shutil.copytree(args.run_dir, run)
                        values.append(_python(_STAGE, root, stage, str(run))["cpu"])
                        _equal_outputs(args.run_dir, run)
                result["stages"].setdefault(stage, {})[name] = _summary(values)
            if args.cold:
                with tempfile.TemporaryDirectory() as tmp:
                    run = Path(tmp) / "run"
                    shutil.copytree(args.run_dir, run)
                    cold = _python(_STAGE, REPO, stage, str(run), env_extra={"NUMBA_CACHE_DIR": str(Path(tmp) / "nb")})
                result["stages"][stage]["after_cold_cache"] = round(cold["cpu"], 2)
            print(stage, json.dumps(result["stages"][stage]))
    elif args.out.exists() and "stages" in (old := json.loads(args.out.read_text())):
        result["stages"] = old["stages"]                 # the stage figures the docs cite: kept, not re-measured
        result["stages_kept"] = old.get("stages_kept") or ("not re-measured: kept from the file this run replaced"
                                                            + (f", written {old['date']}" if old.get("date") else ""))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
