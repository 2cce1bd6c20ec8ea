"""SentencePiece: train on a mixture-stratified sample (or load an existing model), then encode every shard.

Training settings keep text exact: ``identity`` normalization and no whitespace folding (code indentation and
Chinese full-width punctuation survive a round trip), byte fallback (no ``<unk>`` for rare characters), digits
split, and newline/tab as user-defined pieces, because SentencePiece trains on lines and would otherwise never see
them.  Ids: unk 0, bos 1, eos 2, pad 3, then ``special_tokens`` as control symbols (reachable only by id, so raw
text can never produce them), then newline and tab.

Sample: each domain gets ``sample_chars * share`` characters, the share being its mixture weight (equal shares
when no weights are set), floored at ``min_domain_share`` so a small domain such as Chinese still gets its
characters into the vocabulary.  Within a domain documents are taken in descending ``heldout_key`` order, the
opposite end from the validation split, so held-out text stays out of the tokenizer.  Only ``doc_id``/``domain``/
``n_chars`` are read for the choice; text is read for the chosen documents only.

Encoding runs in ``encode_workers`` processes (this one and spawned children) over chunks of about 1 MB of text
(order preserved), each with a single-threaded SentencePiece; per-shard stats count tokens, bytes and
byte-fallback tokens per domain.
"""

from __future__ import annotations

import io
import logging
import shutil
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from multiprocessing import get_context
from pathlib import Path

from pipeline.configkit import ConfigError
from pipeline.io import (
    atomic_path,
    completed,
    new_stats,
    read_parquet,
    sha256_file,
    write_marker,
    write_parquet,
    write_stats,
)
from pipeline.sink.validation import heldout_key
from pipeline.tokenizer.config import TokenizerConfig

log = logging.getLogger(__name__)

UNK_ID, BOS_ID, EOS_ID, PAD_ID = 0, 1, 2, 3
MAX_SENTENCE_CHARS = 2000
CHUNK_CHARS = 1 << 20


def sample_budgets(chars: dict[str, int], budget: int, weights: dict, min_share: float) -> dict[str, int]:
    """Characters to sample per domain: its mixture weight (equal when none), but at least ``min_share``.

    Domains under the floor get exactly the floor; the others share the rest in proportion to their weights.
    """
    domains = sorted(chars)
    raw = {d: float(weights.get(d, 0.0)) for d in domains} if weights else {d: 1.0 for d in domains}
    if min_share * len(domains) >= 1 or not any(raw.values()):
        return {d: budget // len(domains) for d in domains}
    low: set[str] = set()
    while True:
        rest = 1.0 - min_share * len(low)
        wsum = sum(raw[d] for d in domains if d not in low) or 1.0
        share = {d: min_share if d in low else rest * raw[d] / wsum for d in domains}
        new_low = {d for d in domains if share[d] < min_share} - low
        if not new_low:
            return {d: int(budget * share[d] + 1e-9) for d in domains}
        low |= new_low


def _sample_lines(rdir: Path, shards: list[str], budget: int, seed: int, weights: dict,
                  min_share: float) -> tuple[list[str], dict]:
    import pyarrow as pa
    import pyarrow.compute as pc

    docs: dict[str, list[tuple[float, str, str, int]]] = {}
    for shard in sorted(shards):
        t = read_parquet(rdir / "quality" / f"{shard}.parquet", columns=["doc_id", "domain", "n_chars"])
        for did, dom, n in zip(*(t.column(c).to_pylist() for c in ("doc_id", "domain", "n_chars")), strict=True):
            docs.setdefault(dom, []).append((-heldout_key(seed, dom, did), did, shard, n))
    if not docs:
        raise ValueError("tokenizer: no documents left after filtering; nothing to train on")
    budgets = sample_budgets({d: sum(x[3] for x in v) for d, v in docs.items()}, budget, weights, min_share)
    take: dict[str, dict[str, int]] = {}   # shard -> doc_id -> chars to take
    order: list[str] = []
    for dom in sorted(docs):
        used = 0
        for _, did, shard, n in sorted(docs[dom]):
            if used >= budgets[dom]:
                break
            take.setdefault(shard, {})[did] = min(n, budgets[dom] - used)
            order.append(did)
            used += n
    texts: dict[str, str] = {}
    for shard, want in sorted(take.items()):
        t = read_parquet(rdir / "quality" / f"{shard}.parquet", columns=["doc_id", "text"])
        t = t.filter(pc.is_in(t.column("doc_id"), value_set=pa.array(sorted(want))))
        for did, text in zip(t.column("doc_id").to_pylist(), t.column("text").to_pylist(), strict=True):
            texts[did] = text[:want[did]]
    lines: list[str] = []
    for did in order:
        for line in texts[did].split("\n"):
            for i in range(0, len(line), MAX_SENTENCE_CHARS):
                piece = line[i:i + MAX_SENTENCE_CHARS]
                if piece.strip():
                    lines.append(piece)
    return lines, budgets


def _effective_coverage(lines: list[str], vocab_size: int, wanted: float) -> float:
    """Lower the character coverage when the sample has more distinct characters than half the vocabulary.

    SentencePiece refuses to train when the characters needed for ``character_coverage`` outnumber the
    vocabulary (Chinese alone has thousands); with byte fallback the rarest characters simply become bytes.
    """
    from collections import Counter

    counts = Counter()
    for line in lines:
        counts.update(line)
    counts.pop(" ", None)
    total = sum(counts.values())
    if not total:
        return wanted
    budget = max(vocab_size // 2, 1)
    top = sum(c for _, c in counts.most_common(budget)) / total
    return round(min(wanted, top - 1e-6), 6) if len(counts) > budget else wanted


def model_info(path: Path, **extra) -> dict:
    sp = load(path)
    ids = {"unk_id": sp.unk_id(), "bos_id": sp.bos_id(), "eos_id": sp.eos_id(), "pad_id": sp.pad_id()}
    return {"model": str(path), "sha256": sha256_file(path), "vocab_size": sp.get_piece_size(), **ids, **extra}


def _use_existing(tc: TokenizerConfig, out: Path) -> dict:
    src = Path(tc.model_path)
    if not src.is_file():
        raise ConfigError(f"tokenizer.model_path: {src} is not a file")
    try:
        load(src)
    except (RuntimeError, OSError) as exc:
        raise ConfigError(f"tokenizer.model_path: {src} is not a SentencePiece model ({exc})") from None
    with atomic_path(out) as tmp:
        shutil.copyfile(src, tmp)
    info = model_info(out, source=str(src.resolve()), trained=False)
    if info["eos_id"] < 0:
        raise ConfigError(f"tokenizer.model_path: {src} has no EOS piece; packing separates documents with EOS")
    return info


def train_tokenizer(tc: TokenizerConfig, rdir: Path, shards: list[str], seed: int,
                    weights: dict | None = None) -> dict:
    """Write ``tokenizer/spm.model`` (trained, or copied from ``tc.model_path``); return its info.

    Info: model, sha256, vocab_size, unk/bos/eos/pad ids, special token ids, and for a trained model the sample
    size and characters per domain and the character coverage used.
    """
    import sentencepiece as spm

    out = rdir / "tokenizer" / "spm.model"
    if done := completed(out):
        return done["info"]
    if tc.model_path:
        info = _use_existing(tc, out)
        write_marker(out, {"info": info})
        return info
    lines, budgets = _sample_lines(rdir, shards, tc.sample_chars, seed, weights or {}, tc.min_domain_share)
    sample = rdir / "tokenizer" / "sample.txt"
    with atomic_path(sample) as tmp:
        tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    coverage = _effective_coverage(lines, tc.vocab_size, tc.character_coverage)
    # Lines in and bytes out (no input path or model prefix): the model proto records those, and a path
    # under the run folder would make the same tokenizer hash differently in every run.
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, model_type=tc.model_type, vocab_size=tc.vocab_size,
        character_coverage=coverage, byte_fallback=True, split_digits=True,
        normalization_rule_name="identity", remove_extra_whitespaces=False, allow_whitespace_only_pieces=True,
        split_by_whitespace=True, max_sentence_length=MAX_SENTENCE_CHARS * 4, hard_vocab_limit=False,
        control_symbols=list(tc.special_tokens), user_defined_symbols=["\n", "\t"], unk_id=UNK_ID, bos_id=BOS_ID,
        eos_id=EOS_ID, pad_id=PAD_ID, num_threads=1, shuffle_input_sentence=False, minloglevel=2)
    with atomic_path(out) as tmp:
        tmp.write_bytes(model.getvalue())
    sp = load(out)
    info = model_info(out, trained=True, sample_lines=len(lines), sample_chars=sum(len(x) for x in lines),
                      sample_chars_per_domain=budgets, character_coverage=coverage,
                      special_ids={t: sp.piece_to_id(t) for t in tc.special_tokens})
    write_marker(out, {"info": info})
    return info


def load(model_path: str | Path):
    import sentencepiece as spm

    return spm.SentencePieceProcessor(model_file=str(model_path))


_WORKER_SP = None


def _init_worker(model_path: str) -> None:
    global _WORKER_SP
    _WORKER_SP = load(model_path)


def _encode_chunk(texts: list[str]):
    """Token ids of ``texts`` as (flat int32, lengths int64): compact to pickle back from a worker."""
    import numpy as np

    ids = _WORKER_SP.encode(texts, num_threads=1)
    lens = np.fromiter((len(x) for x in ids), np.int64, count=len(ids))
    flat = np.fromiter((t for x in ids for t in x), np.int32, count=int(lens.sum()))
    return flat, lens


def _chunks(texts: list[str], chunk_chars: int) -> list[list[str]]:
    out, cur, size = [], [], 0
    for t in texts:
        cur.append(t)
        size += len(t)
        if size >= chunk_chars:
            out.append(cur)
            cur, size = [], 0
    return out + ([cur] if cur else [])


def encode_texts(model_path: str | Path, texts: list[str], workers: int = 1, chunk_chars: int = CHUNK_CHARS):
    """Encode with ``workers`` processes: this one plus ``workers - 1`` spawned; return (flat int32, lengths int64).

    Chunks of about ``chunk_chars`` characters are dealt dynamically: each child keeps two chunks queued and this
    process encodes the next unassigned chunk in between, so the children's start-up is hidden behind useful work
    and nobody idles at the end.  Results are reassembled in input order.
    """
    import numpy as np

    chunks = _chunks(texts, chunk_chars)
    _init_worker(str(model_path))
    results: list = [None] * len(chunks)
    if workers <= 1 or len(chunks) <= 1:
        results = [_encode_chunk(c) for c in chunks]
    else:
        with ProcessPoolExecutor(workers - 1, mp_context=get_context("spawn"), initializer=_init_worker,
                                 initargs=(str(model_path),)) as pool:
            pending: dict = {}
            nxt = 0
            while nxt < len(chunks) or pending:
                while nxt < len(chunks) and len(pending) < 2 * (workers - 1):
                    pending[pool.submit(_encode_chunk, chunks[nxt])] = nxt
                    nxt += 1
                if nxt < len(chunks):
                    results[nxt] = _encode_chunk(chunks[nxt])
                    nxt += 1
                    done = [f for f in pending if f.done()]
                else:
                    done = wait(pending, return_when=FIRST_COMPLETED).done
                for f in done:
                    results[pending.pop(f)] = f.result()
    if not results:
        return np.zeros(0, np.int32), np.zeros(0, np.int64)
    return np.concatenate([r[0] for r in results]), np.concatenate([r[1] for r in results])


def byte_piece_table(sp):
    """Boolean lookup: is id a byte-fallback piece (<0x00>..<0xFF>)?"""
    import numpy as np

    return np.array([sp.is_byte(i) for i in range(sp.get_piece_size())], dtype=bool)


def run_tokenize_shard(rdir: Path, shard: str, workers: int = 1) -> dict:
    """Encode a filtered shard into ``tokenize/<shard>.parquet``.

    Columns: doc_id, domain, n_chars, n_bytes (UTF-8), n_tokens, text_hash, tokens (list<int32>).  Stats add
    tokens, byte-fallback tokens and bytes per token; documents whose text SentencePiece cannot reproduce exactly
    (a literal U+2581 decodes as a space) are counted as ``lossy_docs``, not dropped.
    """
    import numpy as np
    import pyarrow as pa

    out = rdir / "tokenize" / f"{shard}.parquet"
    if done := completed(out):
        return done["stats"]
    model = rdir / "tokenizer" / "spm.model"
    sp = load(model)
    table = read_parquet(rdir / "quality" / f"{shard}.parquet", columns=["doc_id", "domain", "text", "text_hash"])
    texts = table.column("text").to_pylist()
    flat, lens = encode_texts(model, texts, workers)
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    domain = table.column("domain")[0].as_py() if table.num_rows else shard.rsplit("-", 1)[0]
    n_bytes = [len(t.encode("utf-8")) for t in texts]
    lossy = sum(1 for i, t in enumerate(texts)
                if "\u2581" in t and sp.decode(flat[offsets[i]:offsets[i + 1]].tolist()) != t)
    nbytes = sum(n_bytes)
    stats = new_stats(domain)
    stats.update(in_docs=len(texts), in_bytes=nbytes, kept_docs=len(texts), kept_bytes=nbytes,
                 tokens=int(lens.sum()), byte_fallback_tokens=int(byte_piece_table(sp)[flat].sum()),
                 bytes_per_token=nbytes / int(lens.sum()) if lens.sum() else None, lossy_docs=lossy)
    out_table = pa.table({
        "doc_id": table.column("doc_id"), "domain": table.column("domain"),
        "n_chars": pa.array([len(t) for t in texts], pa.int64()), "n_bytes": pa.array(n_bytes, pa.int64()),
        "n_tokens": pa.array(lens, pa.int64()), "text_hash": table.column("text_hash"),
        "tokens": pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat, pa.int32())),
    })
    write_parquet(out_table, out)
    stats = write_stats(rdir, "tokenize", shard, stats)
    write_marker(out, {"stats": stats})
    return stats
