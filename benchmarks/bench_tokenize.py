"""Tokenization benchmark: SentencePiece training on the stratified sample, then encoding with 1 and 2 processes.

    .venv/bin/python benchmarks/bench_tokenize.py [--corpus DIR] [--repeats 3] [--vocab 8000]

Corpus: every ``*.jsonl`` of ``../shared/corpora`` (7 domains, Chinese included), else ``data/demo-corpus``.  The
encode runs alternate 1 and 2 workers ``--repeats`` times and keep the best of each (other jobs share the machine);
both outputs must be identical.  Writes ``benchmarks/results/tokenize.json`` and caches the token ids in
``.cache/bench/`` for ``bench_mindrecord.py``.

On a busy 2-core machine two workers compete with everything else, so the scaling can also be measured on a quiet
host that has only numpy, sentencepiece and PyYAML: ``--export DIR`` writes the model and texts there, and
``--encode-only DIR --workers 1,2,4`` runs just the scaling part.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import platform
import shutil
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pipeline.tokenizer import run as tokenizer  # noqa: E402
from pipeline.tokenizer.config import TokenizerConfig  # noqa: E402

CACHE = REPO / ".cache" / "bench"
RESULTS = REPO / "benchmarks" / "results"
DEFAULT_CORPORA = (REPO.parent / "shared" / "corpora", REPO / "data" / "demo-corpus")


def load_corpus(corpus: Path | None) -> tuple[Path, dict[str, list[dict]]]:
    for folder in ([corpus] if corpus else DEFAULT_CORPORA):
        files = sorted(folder.glob("*.jsonl")) if folder and folder.is_dir() else []
        if files:
            return folder, {f.stem: [json.loads(x) for x in f.read_text(encoding="utf-8").splitlines()] for f in files}
    sys.exit("no corpus: pass --corpus DIR with <domain>.jsonl files (or run `make corpus`)")


def machine() -> dict:
    load = os.getloadavg()
    return {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
            "load_avg_1m_at_start": round(load[0], 2)}


def prepare(records: dict[str, list[dict]], vocab: int) -> tuple[Path, dict, list[str], list[str], float]:
    """Quality-stage shards in a cache folder and a tokenizer trained on their stratified sample."""
    import pyarrow as pa

    from pipeline.io import write_parquet

    key = hashlib.sha256(json.dumps([vocab, {d: [r["id"] for r in rs] for d, rs in records.items()}],
                                    sort_keys=True).encode()).hexdigest()[:12]
    rdir = CACHE / f"tok-{key}"
    shards, texts, domains = [], [], []
    for dom, recs in sorted(records.items()):
        name = f"{dom}-00000"
        shards.append(name)
        texts += [r["text"] for r in recs]
        domains += [dom] * len(recs)
        path = rdir / "quality" / f"{name}.parquet"
        if not path.exists():
            write_parquet(pa.table({"doc_id": [r["id"] for r in recs], "domain": [dom] * len(recs),
                                    "text": [r["text"] for r in recs],
                                    "n_chars": pa.array([len(r["text"]) for r in recs], pa.int64())}), path)
    cached = (rdir / "tokenizer" / "spm.model.done").exists()
    t0 = time.perf_counter()
    info = tokenizer.train_tokenizer(TokenizerConfig(vocab_size=vocab, sample_chars=3_000_000), rdir, shards, 1234)
    return rdir, info, texts, domains, None if cached else round(time.perf_counter() - t0, 2)


def corpus_tokens(corpus: Path | None = None, vocab: int = 8000) -> dict:
    """Token ids of the whole corpus (flat int32, lengths, domain per document), cached."""
    _, records = load_corpus(corpus)
    rdir, info, texts, domains, _ = prepare(records, vocab)
    cache = rdir / "tokens.npz"
    if not cache.exists():
        flat, lens = tokenizer.encode_texts(info["model"], texts, workers=os.cpu_count() or 1)
        np.savez(cache, flat=flat, lens=lens, domains=np.asarray(domains))
    z = np.load(cache)
    return {"flat": z["flat"], "lens": z["lens"], "domains": z["domains"].tolist(), "tokenizer": info}


def scaling(model: str, texts: list[str], repeats: int, workers: tuple[int, ...] = (1, 2),
            chunk_chars: int = tokenizer.CHUNK_CHARS) -> dict:
    """Alternate the worker counts ``repeats`` times; best time per count, identical outputs required."""
    nbytes = sum(len(t.encode("utf-8")) for t in texts)
    tokenizer.encode_texts(model, texts[:50], workers=2)          # warm: page cache, imports
    times: dict[int, list[float]] = {w: [] for w in workers}
    outputs = {}
    for _ in range(repeats):
        for w in workers:
            t0 = time.perf_counter()
            outputs[w] = tokenizer.encode_texts(model, texts, workers=w, chunk_chars=chunk_chars)
            times[w].append(time.perf_counter() - t0)
    same = all((outputs[w][i] == outputs[1][i]).all() for w in workers for i in (0, 1))
    t0 = time.perf_counter()
    tokenizer.encode_texts(model, texts[:2], workers=2, chunk_chars=1)
    pool_start = time.perf_counter() - t0
    best = {w: min(ts) for w, ts in times.items()}
    n_tok = int(outputs[1][1].sum())
    return {"text_mb": round(nbytes / 1e6, 2), "tokens": n_tok, "chunk_chars": chunk_chars,
            "encode_s": {str(w): [round(t, 3) for t in ts] for w, ts in times.items()},
            "encode_mb_per_s": {str(w): round(nbytes / 1e6 / t, 2) for w, t in best.items()},
            "encode_tokens_per_s": {str(w): round(n_tok / t) for w, t in best.items()},
            "speedup_1_to_2_processes": round(best[1] / best[2], 3), "target_speedup": 1.8,
            "speedup_1_to_2_median": round(statistics.median(times[1]) / statistics.median(times[2]), 3)
            if 2 in times else None,
            "speedup_vs_1": {str(w): round(best[1] / t, 3) for w, t in best.items()},
            "pool_start_s": round(pool_start, 3), "outputs_identical": bool(same), "_outputs": outputs[1]}


def write_result(result: dict, out: Path) -> int:
    """Write and print ``result``; exit status 1 when the worker counts' outputs differ."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(result, indent=1))
    return 0 if result["outputs_identical"] else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", type=Path)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--vocab", type=int, default=8000)
    ap.add_argument("--export", type=Path, help="write model + texts (texts.json.gz) here for --encode-only elsewhere")
    ap.add_argument("--encode-only", type=Path, help="folder from --export: only the scaling runs (no pyarrow)")
    ap.add_argument("--workers", default="1,2", help="worker counts to compare (default 1,2)")
    ap.add_argument("--chunk-chars", type=int, default=tokenizer.CHUNK_CHARS, help="characters per encode task")
    ap.add_argument("--scale", type=int, default=1, help="encode the texts this many times over (bigger shard)")
    ap.add_argument("--out", type=Path, default=RESULTS / "tokenize.json")
    args = ap.parse_args(argv)
    env = machine()
    workers = tuple(int(w) for w in args.workers.split(","))
    command = "benchmarks/bench_tokenize.py " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.encode_only:
        data = json.loads(gzip.decompress((args.encode_only / "texts.json.gz").read_bytes()))
        res = scaling(str(args.encode_only / "spm.model"), data["texts"] * args.scale, args.repeats, workers,
                      args.chunk_chars)
        res.pop("_outputs")
        result = {"command": command, "machine": env, "corpus": data["corpus"], "docs": len(data["texts"]), **res,
                  "load_avg_1m_at_end": round(os.getloadavg()[0], 2)}
        return write_result(result, args.out)
    folder, records = load_corpus(args.corpus)
    rdir, info, texts, domains, train_s = prepare(records, args.vocab)
    if args.export:
        args.export.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(info["model"], args.export / "spm.model")
        (args.export / "texts.json.gz").write_bytes(gzip.compress(json.dumps(
            {"corpus": str(folder), "texts": texts, "domains": domains}).encode(), 6))
        return 0
    res = scaling(info["model"], texts * args.scale, args.repeats, workers, args.chunk_chars)
    flat, lens = res.pop("_outputs")
    flat, lens = flat[:int(lens[:len(texts)].sum())], lens[:len(texts)]
    sp = tokenizer.load(info["model"])
    is_byte = tokenizer.byte_piece_table(sp)
    ends = np.cumsum(lens)
    per_domain = {}
    for dom in sorted(set(domains)):
        idx = [i for i, d in enumerate(domains) if d == dom]
        b = sum(len(texts[i].encode("utf-8")) for i in idx)
        toks = np.concatenate([flat[ends[i] - lens[i]:ends[i]] for i in idx])
        per_domain[dom] = {"docs": len(idx), "bytes": b, "tokens": int(len(toks)),
                           "bytes_per_token": round(b / len(toks), 3),
                           "byte_fallback_share": round(float(is_byte[toks].mean()), 4)}
    result = {"command": command, "machine": env, "corpus": str(folder), "docs": len(texts),
              "vocab_size": info["vocab_size"], "train_tokenizer_s": train_s, **res, "per_domain": per_domain,
              "load_avg_1m_at_end": round(os.getloadavg()[0], 2)}
    return write_result(result, args.out)


if __name__ == "__main__":
    sys.exit(main())
