"""Megatron-LM's indexed dataset (``.bin`` + ``.idx``, the ``MMIDIDX`` format) beside each MindRecord file.

Why: mindformers 2.x's pretraining template, Megatron-LM and NeMo read this format (``GPTDataset`` through
``BlendedMegatronDatasetDataLoader``); datatrove and NeMo Curator write it. It is written by the same sink task and
pass as the MindRecord file: no second read of the tokens.

What goes in: the **documents, unpacked**, each one sequence of ``[BOS] tokens EOS`` (the same tokens, in the same
seeded order, as the MindRecord stream that is cut into rows), one Megatron document per sequence. Not the packed
rows: ``GPTDataset`` builds its own samples of ``seq_length + 1`` tokens from the document stream with one token of
overlap, so rows of exactly ``seq_len + 1`` would drift by one token per sample, and Megatron's own shuffling and
epoch logic want document boundaries. A document belongs to the output file its first token falls in, so every
copy of every document is in exactly one ``.bin``. The file's rows and the Megatron file's tokens agree: the
concatenated documents, cut into rows of ``seq_len + 1``, are the MindRecord rows (the dropped tail aside).

Layout of the ``.idx`` (``megatron/core/datasets/indexed_dataset.py``): ``MMIDIDX\\x00\\x00``, version ``<Q`` 1, dtype
code ``<B``, sequence count ``<Q``, document count ``<Q`` (sequences + 1), then int32 sequence lengths, int64 byte
pointers into the ``.bin``, int64 document indices (``0, 1, ..., n``). Tokens are the smallest dtype that holds the
vocabulary: uint16 below 65,536, else int32.
"""

from __future__ import annotations

import hashlib
import os
import struct
from pathlib import Path

import numpy as np

HEADER = b"MMIDIDX\x00\x00"
DTYPE_CODES = {"uint8": 1, "int8": 2, "int16": 3, "int32": 4, "int64": 5, "float64": 6, "float32": 7, "uint16": 8}


def token_dtype(vocab_size: int) -> str:
    return "uint16" if vocab_size < 65536 else "int32"


def prefix_of(mindrecord_name: str) -> str:
    """``corpus-00000-of-00004.mindrecord`` -> ``corpus-00000-of-00004`` (the ``.bin``/``.idx`` prefix)."""
    return mindrecord_name.removesuffix(".mindrecord")


class IndexedWriter:
    """Appends documents to ``<prefix>.bin`` as they come; :meth:`close` writes ``<prefix>.idx``."""

    def __init__(self, prefix: str | Path, dtype: str, *, eos_id: int, bos_id: int | None):
        self.prefix, self.dtype = str(prefix), np.dtype(dtype)
        self.eos_id, self.bos_id = eos_id, bos_id
        self._bin = open(self.prefix + ".bin", "wb")  # noqa: SIM115 - closed in close()
        self._hash = hashlib.sha256()
        self._lengths: list[np.ndarray] = []
        self.tokens = 0

    def add(self, flat: np.ndarray, starts: np.ndarray, lens: np.ndarray) -> None:
        """Documents ``flat[starts[i]:starts[i] + lens[i]]``, each written as ``[BOS] tokens EOS``."""
        if not len(lens):
            return
        extra = 2 if self.bos_id is not None else 1
        out_len = lens.astype(np.int64) + extra
        out = np.empty(int(out_len.sum()), self.dtype)
        ends = np.cumsum(out_len)
        begin = ends - out_len
        body = begin + (1 if self.bos_id is not None else 0)
        if self.bos_id is not None:
            out[begin] = self.bos_id
        out[ends - 1] = self.eos_id
        ramp = np.arange(int(lens.sum()), dtype=np.int64) - np.repeat(np.cumsum(lens) - lens, lens)
        out[np.repeat(body, lens) + ramp] = flat[np.repeat(starts.astype(np.int64), lens) + ramp]
        data = out.tobytes()
        self._bin.write(data)
        self._hash.update(data)
        self._lengths.append(out_len.astype(np.int32))
        self.tokens += len(out)

    def close(self) -> dict:
        self._bin.close()
        lengths = np.concatenate(self._lengths) if self._lengths else np.zeros(0, np.int32)
        n = len(lengths)
        pointers = np.zeros(n, np.int64)
        if n:
            pointers[1:] = np.cumsum(lengths[:-1].astype(np.int64)) * self.dtype.itemsize
        idx = b"".join([HEADER, struct.pack("<Q", 1), struct.pack("<B", DTYPE_CODES[self.dtype.name]),
                        struct.pack("<Q", n), struct.pack("<Q", n + 1), lengths.tobytes(), pointers.tobytes(),
                        np.arange(n + 1, dtype=np.int64).tobytes()])
        with open(self.prefix + ".idx", "wb") as f:
            f.write(idx)
        for suffix in (".bin", ".idx"):
            os.chmod(self.prefix + suffix, 0o644)
        name = os.path.basename(self.prefix)
        return {"prefix": name, "bin_sha256": self._hash.hexdigest(), "idx_sha256": hashlib.sha256(idx).hexdigest(),
                "documents": n, "tokens": self.tokens, "dtype": self.dtype.name,
                "bin_bytes": self.tokens * self.dtype.itemsize}


def read_documents(prefix: str | Path) -> list[np.ndarray]:
    """Every document of ``<prefix>.bin/.idx`` (this project's own reader, for checks; tests also use
    megatron-core's ``IndexedDataset``)."""
    raw = Path(str(prefix) + ".idx").read_bytes()
    if raw[:9] != HEADER:
        raise ValueError(f"{prefix}.idx: not an MMIDIDX index (header {raw[:9]!r})")
    (code,) = struct.unpack("<B", raw[17:18])
    n, _ = struct.unpack("<QQ", raw[18:34])
    dtype = np.dtype(next(k for k, v in DTYPE_CODES.items() if v == code))
    lengths = np.frombuffer(raw, np.int32, n, 34)
    pointers = np.frombuffer(raw, np.int64, n, 34 + 4 * n)
    data = np.memmap(str(prefix) + ".bin", dtype=dtype, mode="r")
    return [np.asarray(data[p // dtype.itemsize: p // dtype.itemsize + ln]) for p, ln in zip(pointers, lengths,
                                                                                            strict=True)]


def data_path(files: list[dict], folder: str | Path) -> list:
    """``BlendedMegatronDatasetDataLoader``'s ``data_path``: ``[weight, prefix, weight, prefix, ...]``, each
    file's share of the tokens. The domain mixture is already in the document copies (the manifest's
    ``token_share``), so the files are weighted by size, which samples every copy equally."""
    total = sum(f["megatron"]["tokens"] for f in files) or 1
    out: list = []
    for f in files:
        out += [round(f["megatron"]["tokens"] / total, 12), str(Path(folder) / f["megatron"]["prefix"])]
    return out
