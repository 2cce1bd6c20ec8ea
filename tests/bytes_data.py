"""Byte-level MindRecord sets from real text, for tests and smoke runs without a tokenizer.

Why: the trainer's tests must run on real (learnable, non-random) text in seconds, with no tokenizer model to ship.
Bytes map to ids 0..255, BOS=256, EOS=257 (vocab 258; ``BYTE_VOCAB``), documents are concatenated BOS doc EOS and cut
into rows of exactly ``seq_len + 1`` ids (short tail dropped), the same layout the real data stage writes.
"""

from __future__ import annotations

import os

import numpy as np

BOS, EOS = 256, 257
BYTE_VOCAB = 258


def pack_bytes(docs: list[str], seq_len: int) -> np.ndarray:
    """``[rows, seq_len + 1]`` int32 ids of the concatenated documents."""
    ids = []
    for doc in docs:
        ids.append(BOS)
        ids.extend(doc.encode("utf-8"))
        ids.append(EOS)
    arr = np.asarray(ids, dtype=np.int32)
    n = len(arr) // (seq_len + 1)
    if n == 0:
        raise ValueError(f"text too short for one row of {seq_len + 1} ids")
    return arr[: n * (seq_len + 1)].reshape(n, seq_len + 1)


def write_mindrecord(rows: np.ndarray, out_dir: str, name: str = "corpus", shards: int = 2) -> list[str]:
    """Write rows as ``out_dir/<name>-0000i-of-0000N.mindrecord`` (+ ``.db``, + ``manifest.json``), column
    ``input_ids`` int32, rows dealt round-robin like the corpus packer; returns the data files."""
    from pipeline.train.repack import write_rows

    m = write_rows(list(rows), out_dir, shards, name=name)
    return [os.path.join(out_dir, s["file"]) for s in m["shards"]]


def stdlib_text(*modules: str) -> list[str]:
    """Source code of stdlib modules: real, structured text that a tiny model visibly learns from."""
    import importlib
    import inspect

    return [inspect.getsource(importlib.import_module(m)) for m in modules]


def stdlib_paragraphs(*modules: str) -> list[str]:
    """The same source cut at blank lines: many short documents, so packed rows hold several (document masks)."""
    return [p for src in stdlib_text(*modules) for p in src.split("\n\n") if p.strip()]
