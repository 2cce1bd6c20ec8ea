"""MindRecord sink benchmark: write throughput against ``numpy.tofile`` and read throughput against training.

    .venv/bin/python benchmarks/bench_mindrecord.py [--corpus DIR] [--repeats 3] [--seq-lens 128,2048]

Tokens: the real token ids of the whole corpus (``bench_tokenize.corpus_tokens``: every ``*.jsonl`` of
``../shared/corpora``, vocab 8000), packed into rows of ``seq_len + 1``.  For each row length:

* write: ``ndarray.tofile`` of the rows (page cache; and with ``fsync``) against the sink as the corpus chain
  runs it (``mindrecord.write_token_set``: pack, 2 shard files, domain_id field, content hash, sha256 of the
  files, manifest) in 1 and 2 processes, and against a bare ``FileWriter`` of the same rows;
* read: ``MindDataset`` over the written set, plain (shuffle off) and as the trainer reads it (global shuffle,
  ``batch(8)``), against a numpy memmap of the same rows; headroom = read tokens/s over what the training job
  consumes (median ``tokens_per_s`` of ``data/train/*/main/metrics.jsonl``, else the debug model's ~2,000).

Writes ``benchmarks/results/mindrecord.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_tokenize import RESULTS, corpus_tokens, machine  # noqa: E402

from pipeline.sink import mindrecord, packing  # noqa: E402

DEBUG_MODEL_TOKENS_PER_S = 2000.0


def best_of(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def training_tokens_per_s() -> tuple[float, str]:
    rates = []
    for f in sorted((REPO / "data" / "train").glob("*/main/metrics.jsonl")):
        rows = [json.loads(x) for x in f.read_text().splitlines() if x.strip()]
        rates += [r["tokens_per_s"] for r in rows[1:] if r.get("tokens_per_s")]    # step 1 compiles
    if rates:
        return statistics.median(rates), f"median of {len(rates)} steps in data/train/*/main/metrics.jsonl"
    return DEBUG_MODEL_TOKENS_PER_S, "debug model on this machine (no metrics.jsonl found; run `make demo`)"


def bare_filewriter(path: Path, rows) -> None:
    from mindspore.mindrecord import FileWriter

    w = FileWriter(str(path), shard_num=1, overwrite=True)
    w.set_page_size(1 << 22)
    w.set_header_size(1 << 20)
    w.add_schema({"input_ids": {"type": "int32", "shape": [rows.shape[1]]}}, "bench")
    for s in range(0, len(rows), 1000):
        w.write_raw_data([{"input_ids": r} for r in rows[s:s + 1000]])
    w.commit()


def filewriter_batched(path: Path, rows, batch: int) -> None:
    """MindSpore's own writer in its fastest plain use: one shard, big pages, ``write_raw_data`` of ``batch`` rows."""
    from mindspore.mindrecord import FileWriter

    w = FileWriter(str(path), shard_num=1, overwrite=True)
    w.set_page_size(1 << 26)
    w.set_header_size(1 << 22)
    w.add_schema({"input_ids": {"type": "int32", "shape": [rows.shape[1]]}}, "bench")
    for s in range(0, len(rows), batch):
        w.write_raw_data([{"input_ids": r} for r in rows[s:s + batch]])
    w.commit()


def compare_writers(rows, work: Path, repeats: int, batches: tuple[int, ...] = (1000, 8192)) -> dict:
    """Our ``pipeline.sink.writer.write_shard`` (one shard, manifest entry: content and file sha256) against
    ``FileWriter`` batched (best batch size of ``batches``) and ``ndarray.tofile`` on the same rows, interleaved,
    best of ``repeats``.  Ratios are throughput ÷ throughput (> 1: ours faster)."""
    from pipeline.sink.writer import write_shard

    seq_len = rows.shape[1] - 1
    mb = rows.nbytes / 1e6

    def clean(name):
        for f in work.glob(name + "*"):
            f.unlink()

    cases = {"numpy_tofile": lambda: rows.tofile(work / "rows.bin"),
             "write_shard": lambda: (clean("ours.mindrecord"),
                                     write_shard(str(work / "ours.mindrecord"), seq_len, rows))}
    for b in batches:
        cases[f"filewriter_batch{b}"] = lambda b=b: filewriter_batched(work / f"fw{b}.mindrecord", rows, b)
    write_shard(str(work / "warm.mindrecord"), seq_len, rows[:2])      # imports (MindSpore) outside the timings
    filewriter_batched(work / "warm-fw.mindrecord", rows[:2], 2)
    times: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(repeats):
        for k, fn in cases.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    best = {k: min(v) for k, v in times.items()}
    fw = min((k for k in best if k.startswith("filewriter")), key=best.get)
    return {"rows": int(len(rows)), "seq_len": int(seq_len), "payload_mb": round(mb, 2),
            "seconds": {k: [round(x, 3) for x in v] for k, v in times.items()},
            "mb_per_s": {k: round(mb / t, 1) for k, t in best.items()}, "filewriter_best": fw,
            "ratio_vs_filewriter": round(best[fw] / best["write_shard"], 3),
            "ratio_vs_tofile": round(best["numpy_tofile"] / best["write_shard"], 4),
            "filewriter_vs_tofile": round(best["numpy_tofile"] / best[fw], 4)}


def read_rate(files: list[str], trainer_like: bool, limit_rows: int) -> float:
    import mindspore.dataset as ds

    ds.config.set_seed(1)
    d = ds.MindDataset(files, columns_list=["input_ids"], shuffle=trainer_like)
    if trainer_like:
        d = d.batch(8, drop_remainder=True)
    n_tok, t0 = 0, time.perf_counter()
    for (x,) in d.create_tuple_iterator(output_numpy=True, num_epochs=1):
        n_tok += x.size
        if n_tok >= limit_rows * x.shape[-1]:
            break
    return n_tok / (time.perf_counter() - t0)


def bench_seq_len(tokens: dict, seq_len: int, repeats: int, work: Path) -> dict:
    flat, lens = tokens["flat"], tokens["lens"]
    domains = sorted(set(tokens["domains"]))
    dom = np.asarray([domains.index(d) for d in tokens["domains"]], np.int32)
    starts = np.cumsum(lens) - lens
    rows = packing.pack(flat, starts, lens, dom, np.arange(len(lens)), seq_len=seq_len, eos_id=2, bos_id=None,
                           pad_id=3)["rows"]
    mb = rows.nbytes / 1e6
    raw = work / "rows.bin"

    def tofile_sync():
        with open(raw, "wb") as fh:
            rows.tofile(fh)
            fh.flush()
            os.fsync(fh.fileno())

    t_tofile = best_of(lambda: rows.tofile(raw), repeats)
    t_tofile_sync = best_of(tofile_sync, repeats)
    t_bare = best_of(lambda: bare_filewriter(work / "bare.mindrecord", rows), repeats)

    def sink(workers):
        out = work / f"sink{workers}"
        shutil.rmtree(out, ignore_errors=True)
        return mindrecord.write_token_set(out, tokens["domains"], (flat, starts, lens, np.arange(len(lens))),
                                          seq_len=seq_len, shard_num=2, name="bench", eos_id=2, bos_id=None,
                                          pad_id=3, workers=workers)

    t_sink = {w: best_of(lambda w=w: sink(w), repeats) for w in (1, 2)}

    def megatron_docs():          # pack.formats [mindrecord, megatron]: the same documents as .bin/.idx (issue 36)
        from pipeline.sink.megatron import IndexedWriter, token_dtype

        w = IndexedWriter(work / "megatron", token_dtype(int(flat.max()) + 1 if len(flat) else 2), eos_id=2,
                          bos_id=None)
        w.add(flat, starts, lens)
        return w.close()

    t_megatron = best_of(megatron_docs, repeats)
    manifest = sink(1)
    files = mindrecord.dataset_files(work / "sink1")
    on_disk = sum(os.path.getsize(f) for f in files)
    limit = min(len(rows), max(2000, 4_000_000 // (seq_len + 1)))
    plain = max(read_rate(files, False, limit) for _ in range(repeats))
    trainer = max(read_rate(files, True, limit) for _ in range(repeats))
    mm = np.memmap(raw, dtype=np.int32, mode="r", shape=rows.shape)
    t_mm = best_of(lambda: int(np.asarray(mm[np.random.default_rng(0).permutation(len(rows))[:limit]]).sum()), 3)
    train_rate, train_src = training_tokens_per_s()
    return {
        "seq_len": seq_len, "rows": int(len(rows)), "payload_mb": round(mb, 2), "mindrecord_mb_on_disk": round(
            on_disk / 1e6, 2), "samples_written": manifest["samples"],
        "write_mb_per_s": {"numpy_tofile": round(mb / t_tofile, 1), "numpy_tofile_fsync": round(mb / t_tofile_sync, 1),
                           "filewriter_bare": round(mb / t_bare, 1), "sink_1_process": round(mb / t_sink[1], 1),
                           "sink_2_processes": round(mb / t_sink[2], 1),
                           "megatron_indexed_same_documents": round(mb / t_megatron, 1)},
        "megatron_share_of_sink": round(t_megatron / t_sink[1], 4),
        "write_ratio_vs_tofile": {"sink_1_process": round(t_tofile / t_sink[1], 4),
                                  "sink_2_processes": round(t_tofile / t_sink[2], 4),
                                  "sink_1_process_vs_tofile_fsync": round(t_tofile_sync / t_sink[1], 4),
                                  "filewriter_bare": round(t_tofile / t_bare, 4)},
        "write_target_ratio": 0.5,
        "read_tokens_per_s": {"minddataset_plain": round(plain), "minddataset_trainer_like": round(trainer),
                              "numpy_memmap_random_rows": round(limit * (seq_len + 1) / t_mm)},
        "training_tokens_per_s": round(train_rate, 1), "training_rate_source": train_src,
        "read_headroom_vs_training": round(trainer / train_rate, 1), "read_target_headroom": 20,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", type=Path)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seq-lens", default="128,2048")
    args = ap.parse_args(argv)
    env = machine()
    tokens = corpus_tokens(args.corpus)
    results = []
    with tempfile.TemporaryDirectory(prefix="bench_mr_", dir=REPO / ".cache") as tmp:
        for seq_len in (int(x) for x in args.seq_lens.split(",")):
            results.append(bench_seq_len(tokens, seq_len, args.repeats, Path(tmp)))
            print(json.dumps(results[-1], indent=1), flush=True)
    out = {"command": "benchmarks/bench_mindrecord.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "machine": env, "tokens": int(tokens["lens"].sum()), "vocab_size": tokens["tokenizer"]["vocab_size"],
           "results": results, "load_avg_1m_at_end": round(os.getloadavg()[0], 2)}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "mindrecord.json").write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
