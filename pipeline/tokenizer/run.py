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
``n_chars`` are read for the choice, streamed one shard at a time into a bounded heap per domain; text is read for
the chosen documents only.  Training uses ``train_threads`` (0: every core for BPE, whose model bytes are the same
for any thread count; one thread for unigram, whose model changes with the thread count).

Encoding runs in ``encode_workers`` processes (0: every core; this one and forkserver workers that a task's
shards share, :class:`Encoder`) over chunks of about 1 MB of text (order preserved), each with a single-threaded
SentencePiece that sees only the chunk's whitespace segments it has not met before (:mod:`pipeline.tokenizer.segments`:
the same ids as encoding whole texts, for a fraction of the CPU); per-shard stats count tokens, bytes and
byte-fallback tokens per domain.

Memory:

- Training sample: O(``sample_chars``), independent of the corpus: a heap per domain of at most its budget plus
  one document (about 200 bytes per entry: key, doc id, shard name), one shard's three small columns at a time,
  then the chosen text and its lines.  Measured with ``tracemalloc`` (Python objects; fixed sample size,
  synthetic shards): the same for 8 k, 32 k and 128 k documents, where the former tuple-per-document selection
  grew with the document count (``tests/test_tokenizer.py`` checks 1× against 4×).
- Tokenize (per shard): the shard is read, encoded and written ``BATCH_CHARS`` (16 M) characters at a time, so a
  task holds one batch — its Arrow rows and Python strings, about 13 bytes per token while encoding (SentencePiece's
  id lists, the int32 ids and their copy when chunks are joined) — plus the Parquet row group being read (1,024
  rows of the quality shard).  Measured as the rise of peak RSS of a fresh process (one encoding process, shards
  cut from the shared sample corpora), it levels off as the shard grows, where the former whole-shard encoding
  grew with the shard's text.  Each extra encoding process holds the model and up to two queued 1 MB chunks with
  their ids (not measured separately).  Every encoding process also keeps its segment cache, at most about 42 MB
  (:mod:`pipeline.tokenizer.segments`).
"""

from __future__ import annotations

import io
import logging
import shutil
from pathlib import Path

from pipeline.configkit import ConfigError
from pipeline.io import (
    atomic_path,
    completed,
    config_digest,
    new_stats,
    read_marker,
    read_parquet,
    settings,
    sha256_file,
    write_marker,
    write_stats,
)
from pipeline.sink.validation import heldout_key
from pipeline.tokenizer.config import TokenizerConfig
from pipeline.tokenizer.encode import CHUNK_CHARS, Encoder, encode_texts  # noqa: F401  (the stage's API)

log = logging.getLogger(__name__)

UNK_ID, BOS_ID, EOS_ID, PAD_ID = 0, 1, 2, 3
MAX_SENTENCE_CHARS = 2000
BATCH_CHARS = 16 << 20      # characters of a shard read, encoded and written at a time


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


class _Worst:
    """Heap entry ordered backwards, so ``heapq``'s smallest is the entry that comes *last* in sample order."""

    __slots__ = ("order", "n")

    def __init__(self, order: tuple, n: int):
        self.order, self.n = order, n

    def __lt__(self, other: _Worst) -> bool:
        return self.order > other.order


def _domain_chars(rdir: Path, shards: list[str]) -> dict[str, int]:
    """Pass 1: characters per domain, from the ``domain`` and ``n_chars`` columns only (no per-row Python)."""
    chars: dict[str, int] = {}
    for shard in sorted(shards):
        t = read_parquet(rdir / "quality" / f"{shard}.parquet", columns=["domain", "n_chars"])
        for row in t.group_by("domain").aggregate([("n_chars", "sum")]).to_pylist():
            chars[row["domain"]] = chars.get(row["domain"], 0) + int(row["n_chars_sum"] or 0)
    return chars


def _select_sample(rdir: Path, shards: list[str], budgets: dict[str, int], seed: int) -> dict[str, list[tuple]]:
    """Pass 2: per domain, the documents that fill its budget in descending ``heldout_key`` order.

    Each domain keeps a heap of its best entries so far and drops the worst one while the others alone still fill
    the budget, so a domain never holds more than its budget plus one document's characters (an entry is about
    200 bytes: key, doc id, shard name).  An entry that is dropped has at least a budget's worth of better
    entries ahead of it, so it would never have been taken: the result equals sorting the whole domain and taking
    documents while fewer than ``budget`` characters are taken (the last one cut to fit).  Empty documents add no
    text and are skipped.  Returns ``{domain: [(-key, doc_id, shard, n_chars), ...]}`` in sample order.
    """
    import heapq

    heaps: dict[str, list[_Worst]] = {d: [] for d in budgets}
    held: dict[str, int] = dict.fromkeys(budgets, 0)
    for shard in sorted(shards):
        t = read_parquet(rdir / "quality" / f"{shard}.parquet", columns=["doc_id", "domain", "n_chars"])
        for did, dom, n in zip(*(t.column(c).to_pylist() for c in ("doc_id", "domain", "n_chars")), strict=True):
            if n <= 0:
                continue
            heap = heaps[dom]
            heapq.heappush(heap, _Worst((-heldout_key(seed, dom, did), did, shard, n), n))
            held[dom] += n
            while heap and held[dom] - heap[0].n >= budgets[dom]:
                held[dom] -= heapq.heappop(heap).n
    return {dom: sorted(e.order for e in heap) for dom, heap in heaps.items()}


def _sample_lines(rdir: Path, shards: list[str], budget: int, seed: int, weights: dict,
                  min_share: float) -> tuple[list[str], dict]:
    """The training sample as lines (at most ``MAX_SENTENCE_CHARS`` each), and the characters budgeted per domain.

    Memory: O(sample_chars), independent of the corpus: two streamed passes over the quality shards (pass 1 the
    ``domain``/``n_chars`` columns, pass 2 ``doc_id`` too, one shard at a time) and a bounded heap per domain
    (:func:`_select_sample`); text is read only for the chosen documents.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    chars = _domain_chars(rdir, shards)
    if not chars:
        raise ValueError("tokenizer: no documents left after filtering; nothing to train on")
    budgets = sample_budgets(chars, budget, weights, min_share)
    take: dict[str, dict[str, int]] = {}   # shard -> doc_id -> chars to take
    order: list[str] = []
    for dom, chosen in sorted(_select_sample(rdir, shards, budgets, seed).items()):
        used = 0
        for _, did, shard, n in chosen:
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
        for line in texts.pop(did).split("\n"):
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


def _keep_release(tc: TokenizerConfig, out: Path, release: dict) -> dict:
    """Copy the tokenizer of the release this refresh extends; refuse a ``tokenizer.model_path`` (or a release
    file) whose digest is not the one the release recorded, naming both."""
    name, src, want = release["name"], release.get("tokenizer"), release.get("tokenizer_sha256")
    if not src or not Path(src).is_file():
        raise ConfigError(f"minhash.use_index: release {name} that this refresh extends has no tokenizer "
                          f"({src or 'none recorded'}); an incremental refresh keeps its release's tokenizer. "
                          "Publish a full run first, or set minhash.use_index: false")
    got = sha256_file(Path(src))
    if want and got != want:
        raise ConfigError(f"minhash.use_index: release {name}'s tokenizer {src} has sha256 {got[:12]}, not the "
                          f"{want[:12]} it was published with; the release's run folder was changed")
    if tc.model_path and (mine := sha256_file(Path(tc.model_path))) != got:
        raise ConfigError(f"tokenizer.model_path: {tc.model_path} (sha256 {mine[:12]}) is not the tokenizer of "
                          f"release {name} that this incremental refresh extends ({src}, sha256 {got[:12]}); "
                          "its token ids would not match the model trained on that release. Unset "
                          "tokenizer.model_path, or build a new corpus with minhash.use_index: false")
    with atomic_path(out) as tmp:
        shutil.copyfile(src, tmp)
    return model_info(out, source=str(Path(src).resolve()), trained=False, extends_release=name,
                      release_tokenizer_sha256=got)


def train_threads(tc: TokenizerConfig) -> int:
    """SentencePiece training threads: ``tc.train_threads``, or when 0 every core for BPE and 1 for unigram.

    Measured (SentencePiece 0.2.3, 1 M and 3 M character samples, 1/2/4 threads): BPE learns the same pieces and
    scores for any thread count (only ``trainer_spec.num_threads`` in the model differs, and :func:`_thread_free`
    resets it), whereas unigram's pieces and scores change with the thread count (each count repeats itself).
    """
    if tc.train_threads:
        return tc.train_threads
    if tc.model_type != "bpe":
        return 1
    try:
        import google.protobuf  # noqa: F401  (_thread_free needs it; without it one thread gives the same model)
    except ImportError:
        return 1
    from pipeline.ingest.run import worker_count

    return worker_count(0)


def _thread_free(model: bytes) -> bytes:
    """The model with ``trainer_spec.num_threads`` set to 1, so a BPE model's bytes do not depend on the cores."""
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(model)
    if proto.trainer_spec.num_threads == 1:
        return model
    proto.trainer_spec.num_threads = 1
    return proto.SerializeToString()


def train_tokenizer(tc: TokenizerConfig, rdir: Path, shards: list[str], seed: int,
                    weights: dict | None = None, release: dict | None = None) -> dict:
    """Write ``tokenizer/spm.model`` (trained, copied from ``tc.model_path``, or kept from ``release``); return
    its info.

    ``release`` is the dedup index's entry of the release an incremental refresh extends: its tokenizer is kept,
    so the refresh's token ids are the ids the model trained on that release knows (:func:`_keep_release`).

    Info: model, sha256, vocab_size, unk/bos/eos/pad ids, special token ids, and for a trained model the sample
    size and characters per domain and the character coverage used.
    """
    import sentencepiece as spm

    out = rdir / "tokenizer" / "spm.model"
    extends = {k: release.get(k) for k in ("name", "tokenizer_sha256")} if release else None
    digest = config_digest("tokenizer", settings(tc, "encode_workers"), seed, weights,
                           [_input_sha(rdir, s) for s in sorted(shards)], *([extends] if extends else []))
    if done := completed(out, digest):
        return done["info"]
    if release:
        info = _keep_release(tc, out, release)
        write_marker(out, {"info": info}, config=digest, sha256=info["sha256"])
        return info
    if tc.model_path:
        info = _use_existing(tc, out)
        write_marker(out, {"info": info}, config=digest, sha256=info["sha256"])
        return info
    lines, budgets = _sample_lines(rdir, shards, tc.sample_chars, seed, weights or {}, tc.min_domain_share)
    sample = rdir / "tokenizer" / "sample.txt"
    with atomic_path(sample) as tmp:
        tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    coverage = _effective_coverage(lines, tc.vocab_size, tc.character_coverage)
    threads = train_threads(tc)
    # Lines in and bytes out (no input path or model prefix): the model proto records those, and a path
    # under the run folder would make the same tokenizer hash differently in every run.
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, model_type=tc.model_type, vocab_size=tc.vocab_size,
        character_coverage=coverage, byte_fallback=True, split_digits=True,
        normalization_rule_name="identity", remove_extra_whitespaces=False, allow_whitespace_only_pieces=True,
        split_by_whitespace=True, max_sentence_length=MAX_SENTENCE_CHARS * 4, hard_vocab_limit=False,
        control_symbols=list(tc.special_tokens), user_defined_symbols=["\n", "\t"], unk_id=UNK_ID, bos_id=BOS_ID,
        eos_id=EOS_ID, pad_id=PAD_ID, num_threads=threads, shuffle_input_sentence=False, minloglevel=2)
    with atomic_path(out) as tmp:
        tmp.write_bytes(_thread_free(model.getvalue()) if tc.model_type == "bpe" else model.getvalue())
    sp = load(out)
    info = model_info(out, trained=True, sample_lines=len(lines), sample_chars=sum(len(x) for x in lines),
                      sample_chars_per_domain=budgets, character_coverage=coverage, train_threads=threads,
                      special_ids={t: sp.piece_to_id(t) for t in tc.special_tokens})
    write_marker(out, {"info": info}, config=digest, sha256=info["sha256"])
    return info


def _input_sha(rdir: Path, shard: str) -> str | None:
    """The digest a filtered shard's marker recorded (None for a shard written without one); its data is not read."""
    return (read_marker(rdir / "quality" / f"{shard}.parquet") or {}).get("sha256")


def load(model_path: str | Path):
    import sentencepiece as spm

    return spm.SentencePieceProcessor(model_file=str(model_path))


def byte_piece_table(sp):
    """Boolean lookup: is id a byte-fallback piece (<0x00>..<0xFF>)?"""
    import numpy as np

    return np.array([sp.is_byte(i) for i in range(sp.get_piece_size())], dtype=bool)


def _text_batches(path: Path, columns: list[str], batch_chars: int):
    """The shard's rows as (Arrow table without text, texts), cut after ``batch_chars`` characters (row order kept)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pending, texts, size = [], [], 0
    for rb in pq.ParquetFile(path).iter_batches(batch_size=256, columns=columns):
        part, rest, start = rb.column("text").to_pylist(), rb.drop_columns(["text"]), 0
        for i, text in enumerate(part):
            size += len(text)
            if size >= batch_chars:
                pending.append(rest.slice(start, i + 1 - start))
                texts += part[start:i + 1]
                yield pa.Table.from_batches(pending), texts
                pending, texts, size, start = [], [], 0, i + 1
        if start < len(part):
            pending.append(rest.slice(start))
            texts += part[start:]
    if pending:
        yield pa.Table.from_batches(pending), texts


def run_tokenize_shard(rdir: Path, shard: str, workers: int = 0, batch_chars: int = BATCH_CHARS) -> dict:
    """Encode a filtered shard into ``tokenize/<shard>.parquet`` with ``workers`` processes (0: every core).

    Columns: doc_id, domain, n_chars, n_bytes (UTF-8), n_tokens, text_hash, tokens (list<int32>).  Stats add
    tokens, byte-fallback tokens and bytes per token; documents whose text SentencePiece cannot reproduce exactly
    (a literal U+2581 decodes as a space) are counted as ``lossy_docs``, not dropped.  The shard is read, encoded
    and written ``batch_chars`` characters at a time (see the module docstring's memory note).
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = rdir / "tokenize" / f"{shard}.parquet"
    model = rdir / "tokenizer" / "spm.model"
    digest = config_digest("tokenize", batch_chars, (read_marker(model) or {}).get("sha256"), _input_sha(rdir, shard))
    if done := completed(out, digest):
        return done["stats"]
    sp = load(model)
    is_byte = byte_piece_table(sp)
    src = rdir / "quality" / f"{shard}.parquet"
    columns = ["doc_id", "domain", "text", "text_hash"]
    types = pq.read_schema(src)
    schema = pa.schema([("doc_id", types.field("doc_id").type), ("domain", types.field("domain").type),
                        ("n_chars", pa.int64()), ("n_bytes", pa.int64()), ("n_tokens", pa.int64()),
                        ("text_hash", types.field("text_hash").type), ("tokens", pa.list_(pa.int32()))])
    domain = None
    docs = nbytes = tokens = byte_tokens = lossy = 0
    with Encoder(model, workers) as enc, atomic_path(out) as tmp, \
            pq.ParquetWriter(tmp, schema, compression="zstd") as writer:
        for table, texts in _text_batches(src, columns, batch_chars):
            flat, lens = enc.encode(texts)
            offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
            if domain is None and table.num_rows:
                domain = table.column("domain")[0].as_py()
            n_bytes = [len(t.encode("utf-8")) for t in texts]
            lossy += sum(1 for i, t in enumerate(texts)
                         if "\u2581" in t and sp.decode(flat[offsets[i]:offsets[i + 1]].tolist()) != t)
            docs += len(texts)
            nbytes += sum(n_bytes)
            tokens += int(lens.sum())
            byte_tokens += int(is_byte[flat].sum())
            writer.write_table(pa.table({
                "doc_id": table.column("doc_id"), "domain": table.column("domain"),
                "n_chars": pa.array([len(t) for t in texts], pa.int64()), "n_bytes": pa.array(n_bytes, pa.int64()),
                "n_tokens": pa.array(lens, pa.int64()), "text_hash": table.column("text_hash"),
                "tokens": pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat, pa.int32())),
            }, schema=schema), row_group_size=1024)
            del table, texts, flat, lens, offsets
    stats = new_stats(domain if domain is not None else shard.rsplit("-", 1)[0])
    stats.update(in_docs=docs, in_bytes=nbytes, kept_docs=docs, kept_bytes=nbytes, tokens=tokens,
                 byte_fallback_tokens=byte_tokens, bytes_per_token=nbytes / tokens if tokens else None,
                 lossy_docs=lossy)
    stats = write_stats(rdir, "tokenize", shard, stats)
    write_marker(out, {"stats": stats}, config=digest)
    return stats
