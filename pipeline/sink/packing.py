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
    the rows, and the tail dropped or padded.  The whole set in one call (validation sets, tests); the corpus sink
    feeds :class:`StreamPacker` chunk by chunk instead, which gives the same rows.
    """
    import numpy as np

    packer = StreamPacker(seq_len=seq_len, eos_id=eos_id, bos_id=bos_id, pad_id=pad_id, boundaries=boundaries,
                          n_domains=int(dom.max()) + 1 if len(dom) else 0)
    parts = list(packer.feed(flat, starts, lens, dom, order))
    parts += list(packer.finish(remainder))
    width = seq_len + 1
    rows = np.concatenate([p[0] for p in parts]) if parts else np.zeros((0, width), np.int32)
    return {"rows": rows,
            "row_domain": np.concatenate([p[1] for p in parts]) if parts else np.zeros(0, np.int32),
            "tokens_per_domain": packer.tokens_per_domain, "dropped_tail_tokens": packer.dropped_tail_tokens,
            "padded_tokens": packer.padded_tokens,
            "row_starts": [s for p in parts for s in p[2]] if boundaries else None}


class StreamPacker:
    """Packs a document stream into rows chunk by chunk, carrying the partial row from one chunk to the next.

    :meth:`feed` takes documents in their final order (indices into ``starts``/``lens``/``dom`` over ``flat``)
    and yields ``(rows, row_domain, row_starts)`` for every complete row; :meth:`finish` applies the remainder
    policy to the carried tail.  Feeding a stream in any chunking gives the same rows as feeding it at once, so
    memory is bounded by the chunk (about 30 bytes per token of the chunk for the index arithmetic) plus the
    carried partial row.  ``tokens_per_domain`` counts the real tokens of emitted rows per domain index.

    A writer of one slice of a longer stream gives ``rows=(first, stop)`` (global row indices it keeps) and calls
    :meth:`align` with the stream position of the first token it feeds: rows outside the window are cut the same
    way but neither yielded nor counted.
    """

    def __init__(self, *, seq_len: int, eos_id: int, bos_id: int | None, pad_id: int, boundaries: bool = False,
                 n_domains: int = 0, rows: tuple[int, int | None] = (0, None)):
        import numpy as np

        self.width = seq_len + 1
        self.next_row = 0                          # global index of the next row cut
        self.first_row, self.stop_row = rows
        self.eos_id, self.bos_id, self.pad_id, self.boundaries = eos_id, bos_id, pad_id, boundaries
        self.tail = np.zeros(0, np.int32)         # tokens of the partial row
        self.tail_owner = np.zeros(0, np.int32)   # their domain index
        self.tail_starts = np.zeros(0, np.int64)  # document starts inside the partial row
        self.tokens_per_domain = np.zeros(n_domains, np.int64)
        self.dropped_tail_tokens = self.padded_tokens = 0

    def _count(self, owner) -> None:
        import numpy as np

        real = owner[owner >= 0]
        counts = np.bincount(real, minlength=len(self.tokens_per_domain))
        if len(counts) > len(self.tokens_per_domain):
            self.tokens_per_domain = np.concatenate(
                [self.tokens_per_domain, np.zeros(len(counts) - len(self.tokens_per_domain), np.int64)])
        self.tokens_per_domain[: len(counts)] += counts

    def align(self, offset: int) -> None:
        """The next token fed is token ``offset`` of the whole stream (a writer starting mid-stream)."""
        import numpy as np

        if len(self.tail) or self.next_row:
            raise RuntimeError("StreamPacker.align: only before the first feed")
        fill = offset % self.width                 # placeholder tokens of the row the stream enters mid-way
        self.tail = np.full(fill, self.pad_id, np.int32)
        self.tail_owner = np.full(fill, -1, np.int32)
        self.next_row = offset // self.width

    def _emit(self, stream, owner, seg_start, n_rows: int):
        import numpy as np

        first = self.next_row
        self.next_row += n_rows
        a = max(self.first_row - first, 0)
        b = n_rows if self.stop_row is None else min(self.stop_row - first, n_rows)
        if b <= a:
            return None
        w = self.width
        rows = stream[a * w:b * w].reshape(b - a, w)
        self._count(owner[a * w:b * w])
        row_starts = []
        if self.boundaries:
            s = seg_start[(seg_start >= a * w) & (seg_start < b * w)]
            row_of = s // w
            cuts = np.searchsorted(row_of, np.arange(a, b + 1))
            row_starts = [_with_zero((s[cuts[r - a]:cuts[r - a + 1]] - r * w).astype(np.int32))
                          for r in range(a, b)]
        return rows, owner[a * w:b * w:w].copy(), row_starts

    def feed(self, flat, starts, lens, dom, order):
        """Append documents ``order`` to the stream; yield the complete rows (one tuple per call, if any)."""
        import numpy as np

        pre = 0 if self.bos_id is None else 1
        n = lens[order].astype(np.int64)
        src = starts[order].astype(np.int64)
        seg = n + 1 + pre
        carry = len(self.tail)
        seg_start = np.cumsum(seg) - seg + carry
        total = carry + int(seg.sum())
        stream = np.empty(total, np.int32)
        stream[:carry] = self.tail
        if pre:
            stream[seg_start] = self.bos_id
        stream[seg_start + pre + n] = self.eos_id
        n_tok = int(n.sum())
        if n_tok:
            before = np.cumsum(n) - n
            ramp = np.arange(n_tok, dtype=np.int64)
            stream[np.repeat(seg_start + pre - before, n) + ramp] = flat[np.repeat(src - before, n) + ramp]
        owner = np.concatenate([self.tail_owner, np.repeat(dom[order].astype(np.int32), seg)])
        seg_start = np.concatenate([self.tail_starts, seg_start])
        n_rows = total // self.width
        used = n_rows * self.width
        if n_rows and (part := self._emit(stream, owner, seg_start, n_rows)) is not None:
            yield part
        self.tail, self.tail_owner = stream[used:].copy(), owner[used:].copy()
        self.tail_starts = seg_start[seg_start >= used] - used

    def finish(self, remainder: str = "drop"):
        """The carried tail: padded with ``pad_id`` into one last row (``remainder="pad"``), or dropped."""
        import numpy as np

        tail = len(self.tail)
        if tail and remainder == "pad":
            self.padded_tokens = self.width - tail
            stream = np.concatenate([self.tail, np.full(self.padded_tokens, self.pad_id, np.int32)])
            owner = np.concatenate([self.tail_owner, np.full(self.padded_tokens, -1, np.int32)])
            if (part := self._emit(stream, owner, self.tail_starts, 1)) is not None:
                yield part
        else:
            self.dropped_tail_tokens = tail
        self.tail = self.tail[:0]


def _with_zero(pos):
    import numpy as np

    return pos if len(pos) and pos[0] == 0 else np.concatenate([np.zeros(1, np.int32), pos])


