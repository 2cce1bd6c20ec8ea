"""Per-code-point character classes as ``re`` defines them, for compiled text kernels.

The MinHash shingle kernel (:mod:`pipeline.dedup.minhash.kernels`) and the quality word kernel
(:mod:`pipeline.quality.filters.kernels`) read ``\\w``, ``\\d`` and ``\\s`` from this one table instead of
re-deriving Unicode properties, so they split text exactly where Python's ``re`` would.
"""

from __future__ import annotations

import functools
import os
import re

import numpy as np

CLS_WORD = 1      # letter or digit: [^\W_]   (``\w`` is this or '_')
CLS_DIGIT = 2     # decimal digit: \d
CLS_SPACE = 4     # whitespace: \s


@functools.lru_cache(maxsize=1)
def char_classes() -> np.ndarray:
    """uint8[0x110000]: CLS_* bits per code point, computed with the ``re`` classes themselves.

    Building it scans all 1.1M code points with ``re`` (too slow for every process), so the result is cached in this
    package's __pycache__, keyed by the Unicode database version ``re`` uses (a different Python rebuilds it).
    """
    import sys
    import unicodedata
    from pathlib import Path

    cache = Path(__file__).resolve().parent / "__pycache__" / (
        f"char_classes-{unicodedata.unidata_version}-py{sys.version_info[0]}{sys.version_info[1]}.npy")
    try:
        table = np.load(cache)
        if table.shape == (0x110000,) and table.dtype == np.uint8:
            return table
    except (OSError, ValueError):
        pass
    table = np.zeros(0x110000, dtype=np.uint8)
    everything = "".join(map(chr, range(0x110000)))
    for pattern, bit in ((r"[^\W_]+", CLS_WORD), (r"\d+", CLS_DIGIT), (r"\s+", CLS_SPACE)):
        for m in re.finditer(pattern, everything):
            table[m.start():m.end()] |= bit
    try:
        cache.parent.mkdir(exist_ok=True)
        tmp = cache.with_suffix(f".{os.getpid()}.tmp")
        with open(tmp, "wb") as fh:
            np.save(fh, table)
        os.replace(tmp, cache)
    except OSError:             # read-only install: rebuild per process
        pass
    return table

