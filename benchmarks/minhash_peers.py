"""The peers' side of ``bench_minhash.py``: datatrove 0.10.1 and rensa 0.5.0, each in its own venv under
``.cache/bench-venvs/`` (``ensure_venv``, with ``common.PEERS``' pins), and the worker functions that run inside
those venvs (``bench_minhash.py --worker``: signatures with rensa and with datatrove's ``MinhashDedupSignature``,
datatrove's four MinHash stages).  ``parquet_texts`` reads the documents every signature worker hashes.

Split out of ``bench_minhash.py`` (issue 35), which keeps mindloom's workers, the inputs and the orchestration.
Only the standard library and ``common`` at module level; everything else is imported inside the workers, so any
venv can load this file.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

from common import REPO


def parquet_texts(path: str) -> list[str]:
    import pyarrow.parquet as pq

    return pq.read_table(path, columns=["text"]).column(0).to_pylist()


def mindloom_shingles():
    """``pipeline.dedup.minhash.shingles.shingles``, importable in a peer venv (no mindloom installed there).

    The peers hash exactly the shingles mindloom's signature stage hashes, so only the hashing is compared.  The
    module can no longer be loaded alone by file path (it imports ``pipeline.charclass``), so the repository root
    goes on ``sys.path`` and the package is imported normally.  That import stays light: ``pipeline/__init__.py``
    and ``pipeline/dedup/__init__.py`` are empty of imports, ``pipeline/dedup/minhash/__init__.py`` loads only its
    ``config`` (stdlib + ``pipeline.configkit``, itself stdlib) and loads the stages lazily, and ``charclass``
    needs numpy, which every peer venv that uses this has (``common.PEERS``).  First on the path, as in mindloom's
    own workers, so ``pipeline`` is always this repository's; the only other package the root adds is
    ``operators`` (Airflow), which no peer imports.  Used by ``w_sig_rensa`` and ``topics.w_datasketch``;
    tests/test_bench_peer_shingles.py checks what the import loads.
    """
    sys.path.insert(0, str(REPO))
    from pipeline.dedup.minhash.shingles import shingles

    return shingles


def w_sig_rensa(a: dict) -> dict:
    from rensa import RMinHash

    shingles = mindloom_shingles()
    texts = parquet_texts(a["texts"])
    t0 = time.perf_counter()
    for t in texts:
        m = RMinHash(num_perm=112, seed=1)
        m.update(shingles(t, "word", 5))
        m.digest()
    return {"seconds": time.perf_counter() - t0}


def _dt_signer(folder: str, tokenizer: str):
    from datatrove.pipeline.dedup.minhash import MinhashConfig, MinhashDedupSignature

    step = MinhashDedupSignature(folder, MinhashConfig(n_grams=5, num_buckets=14, hashes_per_bucket=8, seed=1))
    if tokenizer == "whitespace":
        class _Split:
            def word_tokenize(self, text):
                return text.split()
        step.word_tokenizer = _Split()
    return step


def w_sig_datatrove(a: dict) -> dict:
    texts = parquet_texts(a["texts"])
    step = _dt_signer(tempfile.mkdtemp(), a["tokenizer"])
    step.get_shingles("warm up the word tokenizer with a few words")
    t0 = time.perf_counter()
    for t in texts:
        sh = step.get_shingles(t)
        if sh.size:
            step.get_signature(sh)
    return {"seconds": time.perf_counter() - t0}


def w_stages_datatrove(a: dict) -> dict:
    t0 = time.perf_counter()
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.dedup.minhash import (
        MinhashConfig,
        MinhashDedupBuckets,
        MinhashDedupCluster,
        MinhashDedupFilter,
    )
    from datatrove.pipeline.readers import ParquetReader
    from datatrove.pipeline.writers import ParquetWriter

    work, n = Path(a["work"]), a["tasks"]
    cfg = MinhashConfig(n_grams=5, num_buckets=14, hashes_per_bucket=8, seed=1)

    def reader():
        return ParquetReader(a["input"], text_key="text", id_key="doc_id", glob_pattern="*.parquet")

    times = {}
    for name, pipeline, tasks in (
        ("signatures", [reader(), _dt_signer(str(work / "sigs"), a["tokenizer"])], n),
        ("buckets", [MinhashDedupBuckets(str(work / "sigs"), str(work / "buckets"), config=cfg)], 14),
        ("clusters", [MinhashDedupCluster(str(work / "buckets"), str(work / "remove"), config=cfg)], 1),
        ("removal", [reader(), MinhashDedupFilter(str(work / "remove")),
                     ParquetWriter(str(work / "out"))], n),
    ):
        t = time.perf_counter()
        LocalPipelineExecutor(pipeline, tasks=tasks, workers=1, logging_dir=str(work / "logs" / name)).run()
        times[name] = time.perf_counter() - t
    removed = sum(os.path.getsize(p) // 4 for p in (work / "remove").glob("*.remove"))
    return {"seconds": time.perf_counter() - t0, "stages": times, "removed": removed}


def ensure_venv(name: str) -> Path:
    """The peer's python (``common.peer``: its venv made with its pins when missing)."""
    from common import peer

    return peer(name)
