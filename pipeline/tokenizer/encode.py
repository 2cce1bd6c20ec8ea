"""Encoding texts to token ids: this process plus a task's shared pool of forkserver workers, each with a
:class:`~pipeline.tokenizer.segments.SegmentEncoder` (its cache of segments kept from shard to shard).  Used by the
tokenize stage (:func:`pipeline.tokenizer.run.run_tokenize_shard`) and the benchmarks."""

from __future__ import annotations

from concurrent.futures import FIRST_COMPLETED, wait
from pathlib import Path

CHUNK_CHARS = 1 << 20


_WORKER: dict = {}


def _init_worker(model_path: str) -> None:
    """This process's encoder for the model; kept while the model's bytes stay the same, so its segment cache
    carries over from shard to shard (:mod:`pipeline.tokenizer.segments`)."""
    from pipeline.tokenizer.segments import SegmentEncoder

    proto = Path(model_path).read_bytes()
    if _WORKER.get("proto") != proto:
        import sentencepiece as spm

        _WORKER.update(proto=proto, encoder=SegmentEncoder(spm.SentencePieceProcessor(model_proto=proto), proto))


def _encode_chunk(texts: list[str]):
    """Token ids of ``texts`` as (flat int32, lengths int64): compact to pickle back from a worker."""
    return _WORKER["encoder"].encode(texts)


def _chunks(texts: list[str], chunk_chars: int) -> list[list[str]]:
    out, cur, size = [], [], 0
    for t in texts:
        cur.append(t)
        size += len(t)
        if size >= chunk_chars:
            out.append(cur)
            cur, size = [], 0
    return out + ([cur] if cur else [])


class Encoder:
    """Encodes lists of texts in order with ``workers`` processes: this one plus ``workers - 1`` pool workers,
    started on the first list that has more than one chunk and reused for every later list.

    The pool comes from :func:`pipeline.pools.task_executor`: forkserver workers that fork from a server which has
    already imported this module, and inside a task one pool for all its shards (each kept its segment cache);
    a spawned pool per shard cost more CPU to start than encoding a small shard did.

    Chunks of about ``chunk_chars`` characters are dealt dynamically: each worker keeps two chunks queued and this
    process encodes the next unassigned chunk in between, so the workers' start-up is hidden behind useful work
    and nobody idles at the end.  Results are reassembled in input order.
    """

    def __init__(self, model_path: str | Path, workers: int = 0, chunk_chars: int = CHUNK_CHARS):
        from pipeline.ingest.run import worker_count

        self.model_path, self.workers, self.chunk_chars = str(model_path), worker_count(workers), chunk_chars
        self._pool, self._owned = None, False
        _init_worker(self.model_path)

    def __enter__(self) -> Encoder:
        return self

    def __exit__(self, exc_type, *exc) -> None:
        from pipeline import pools

        pool, self._pool = self._pool, None
        if pool is not None and self._owned:
            pool.shutdown(cancel_futures=True)
        elif pool is not None and exc_type is not None:         # a shared pool may hold abandoned work
            pools._discard(pool)

    def encode(self, texts: list[str]):
        """(flat int32 token ids, int64 lengths) of ``texts``."""
        import numpy as np

        chunks = _chunks(texts, self.chunk_chars)
        if self.workers <= 1 or len(chunks) <= 1:
            results = [_encode_chunk(c) for c in chunks]
        else:
            results = self._encode_parallel(chunks)
        if not results:
            return np.zeros(0, np.int32), np.zeros(0, np.int64)
        return np.concatenate([r[0] for r in results]), np.concatenate([r[1] for r in results])

    def _encode_parallel(self, chunks: list) -> list:
        if self._pool is None:
            from pipeline.pools import task_executor

            self._pool, self._owned = task_executor(self.workers - 1, __name__, _init_worker, (self.model_path,))
        results: list = [None] * len(chunks)
        pending: dict = {}
        nxt = 0
        while nxt < len(chunks) or pending:
            while nxt < len(chunks) and len(pending) < 2 * (self.workers - 1):
                pending[self._pool.submit(_encode_chunk, chunks[nxt])] = nxt
                nxt += 1
            if nxt < len(chunks):
                results[nxt] = _encode_chunk(chunks[nxt])
                nxt += 1
                done = [f for f in pending if f.done()]
            else:
                done = wait(pending, return_when=FIRST_COMPLETED).done
            for f in done:
                results[pending.pop(f)] = f.result()
        return results


def encode_texts(model_path: str | Path, texts: list[str], workers: int = 0, chunk_chars: int = CHUNK_CHARS):
    """Encode with ``workers`` processes (0: every core; see :class:`Encoder`); return (flat int32, lengths int64)."""
    with Encoder(model_path, workers, chunk_chars) as enc:
        return enc.encode(texts)
