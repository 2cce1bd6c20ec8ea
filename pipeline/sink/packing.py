"""Packing documents into rows of exactly ``seq_len + 1`` tokens, in a seeded order that depends on no process RNG.

Documents in a seeded order (a hash of seed, doc id and copy number, so it mixes domains, spreads the repeats of an
upsampled document apart) are concatenated with EOS after each one (BOS before each when configured) and cut into
rows of exactly ``seq_len + 1`` tokens, the mindformers pretraining convention (the model shifts inside).
Remainder policy: the tail that does not fill a row is dropped and counted as ``dropped_tail_tokens``
(``remainder="drop"``, mindformers), or padded with ``pad_id`` to one last row (``remainder="pad"``, used for
validation so every held-out token is scored; the trainer must then ignore ``pad_id`` labels).  Documents are never
split across the drop: only the stream's last partial row goes.  :mod:`pipeline.sink.mindrecord` writes the rows.
"""

from __future__ import annotations

import hashlib


def order_keys(seed: int, doc_ids: list[str], copies) -> tuple:
    """(document index, uint64 sort key) for every copy of every document: sorting by key gives the order."""
    import numpy as np

    idx, keys = [], []
    for i, (did, c) in enumerate(zip(doc_ids, copies, strict=True)):
        for k in range(int(c)):
            idx.append(i)
            keys.append(int.from_bytes(hashlib.blake2b(f"pack\x00{seed}\x00{did}\x00{k}".encode(),
                                                       digest_size=8).digest(), "big"))
    return np.asarray(idx, np.int64), np.asarray(keys, np.uint64)


def pack(flat, starts, lens, dom, order, *, seq_len: int, eos_id: int, bos_id: int | None, pad_id: int,
         remainder: str = "drop", boundaries: bool = False) -> dict:
    """Concatenate documents ``order`` (indices into ``starts``/``lens``/``dom``) and cut ``seq_len + 1`` rows.

    ``flat`` holds every document's tokens back to back.  Returns rows int32 ``[n, seq_len + 1]``, the domain index
    of each row's first token, per-row segment starts (when ``boundaries``), token counts per domain index in
    the rows, and the tail dropped or padded.
    """
    import numpy as np

    width = seq_len + 1
    pre = 0 if bos_id is None else 1
    n = lens[order].astype(np.int64)
    src = starts[order].astype(np.int64)
    seg = n + 1 + pre
    seg_start = np.cumsum(seg) - seg
    total = int(seg.sum())
    stream = np.empty(total, np.int32)
    if pre:
        stream[seg_start] = bos_id
    stream[seg_start + pre + n] = eos_id
    n_tok = int(n.sum())
    if n_tok:
        before = np.cumsum(n) - n
        ramp = np.arange(n_tok, dtype=np.int64)
        stream[np.repeat(seg_start + pre - before, n) + ramp] = flat[np.repeat(src - before, n) + ramp]
    owner = np.repeat(dom[order].astype(np.int32), seg)
    n_rows, tail = divmod(total, width)
    padded = dropped = 0
    if tail and remainder == "pad":
        padded = width - tail
        stream = np.concatenate([stream, np.full(padded, pad_id, np.int32)])
        owner = np.concatenate([owner, np.full(padded, -1, np.int32)])
        n_rows += 1
    else:
        dropped = tail
    used = n_rows * width
    rows = stream[:used].reshape(n_rows, width)
    real = owner[:used]
    counts = np.bincount(real[real >= 0], minlength=int(dom.max()) + 1 if len(dom) else 0)
    out = {"rows": rows, "row_domain": owner[:used:width].copy() if n_rows else np.zeros(0, np.int32),
           "tokens_per_domain": counts, "dropped_tail_tokens": int(dropped), "padded_tokens": int(padded),
           "row_starts": None}
    if boundaries:
        s = seg_start[seg_start < used]
        row_of = s // width
        cuts = np.searchsorted(row_of, np.arange(n_rows + 1))
        out["row_starts"] = [_with_zero((s[cuts[r]:cuts[r + 1]] - r * width).astype(np.int32))
                             for r in range(n_rows)]
    return out


def _with_zero(pos):
    import numpy as np

    return pos if len(pos) and pos[0] == 0 else np.concatenate([np.zeros(1, np.int32), pos])


