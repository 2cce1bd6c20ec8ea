"""SentencePiece: train on a domain-stratified sample, then encode every shard.

Training settings keep text exact: ``identity`` normalization and no whitespace folding (code indentation and
Chinese full-width punctuation survive a round trip), byte fallback (no ``<unk>`` for rare characters), digits
split, and newline/tab as user-defined pieces, because SentencePiece trains on lines and would otherwise never see
them.  The sample takes an equal character budget per domain so a small domain such as Chinese still gets
its characters into the vocabulary.
"""

from __future__ import annotations

import hashlib
import io
import logging
from pathlib import Path

from pipeline.config import TokenizerConfig
from pipeline.io import atomic_path, completed, new_stats, read_parquet, sha256_file, write_marker, write_parquet, \
    write_stats

log = logging.getLogger(__name__)

UNK_ID, BOS_ID, EOS_ID, PAD_ID = 0, 1, 2, 3
MAX_SENTENCE_CHARS = 2000


def _rank(seed: int, doc_id: str) -> str:
    return hashlib.sha1(f"{seed}\x00{doc_id}".encode()).hexdigest()


def _sample_lines(rdir: Path, shards: list[str], budget: int, seed: int) -> list[str]:
    by_domain: dict[str, list[tuple[str, str]]] = {}
    for shard in sorted(shards):
        t = read_parquet(rdir / "quality" / f"{shard}.parquet", columns=["doc_id", "domain", "text"])
        for did, dom, text in zip(*(t.column(c).to_pylist() for c in ("doc_id", "domain", "text")), strict=True):
            by_domain.setdefault(dom, []).append((_rank(seed, did), text))
    if not by_domain:
        raise ValueError("tokenizer: no documents left after filtering; nothing to train on")
    per_domain = budget // len(by_domain)
    lines: list[str] = []
    for dom in sorted(by_domain):
        used = 0
        for _, text in sorted(by_domain[dom]):
            if used >= per_domain:
                break
            for line in text.split("\n"):
                for i in range(0, len(line), MAX_SENTENCE_CHARS):
                    piece = line[i:i + MAX_SENTENCE_CHARS]
                    if piece.strip():
                        lines.append(piece)
            used += len(text)
    return lines


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


def train_tokenizer(tc: TokenizerConfig, rdir: Path, shards: list[str], seed: int) -> dict:
    """Train ``tokenizer/spm.model``; return {model, sha256, vocab_size, sample_lines}."""
    import sentencepiece as spm

    out = rdir / "tokenizer" / "spm.model"
    if done := completed(out):
        return done["info"]
    lines = _sample_lines(rdir, shards, tc.sample_chars, seed)
    sample = rdir / "tokenizer" / "sample.txt"
    with atomic_path(sample) as tmp:
        tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    coverage = _effective_coverage(lines, tc.vocab_size, tc.character_coverage)
    # Train from an iterator into memory: a file input would record its path (which contains the run id) in
    # the model's trainer spec, and the same corpus would give a different tokenizer sha256 in every run.
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, model_type=tc.model_type, vocab_size=tc.vocab_size,
        character_coverage=coverage, byte_fallback=True, split_digits=True,
        normalization_rule_name="identity", remove_extra_whitespaces=False, allow_whitespace_only_pieces=True,
        split_by_whitespace=True, max_sentence_length=MAX_SENTENCE_CHARS * 4, hard_vocab_limit=False,
        user_defined_symbols=["\n", "\t"], unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID, pad_id=PAD_ID,
        num_threads=1, shuffle_input_sentence=False, minloglevel=2)
    with atomic_path(out) as tmp:
        tmp.write_bytes(model.getvalue())
    sp = spm.SentencePieceProcessor(model_file=str(out))
    info = {"model": str(out), "sha256": sha256_file(out), "vocab_size": sp.get_piece_size(),
            "sample_lines": len(lines), "character_coverage": coverage, "sample_chars": sum(len(x) for x in lines)}
    write_marker(out, {"info": info})
    return info


def load(model_path: str | Path):
    import sentencepiece as spm

    return spm.SentencePieceProcessor(model_file=str(model_path))


def run_tokenize_shard(rdir: Path, shard: str) -> dict:
    """Encode a filtered shard into ``tokenize/<shard>.parquet`` (doc_id, domain, n_chars, tokens int32)."""
    import pyarrow as pa

    out = rdir / "tokenize" / f"{shard}.parquet"
    if done := completed(out):
        return done["stats"]
    sp = load(rdir / "tokenizer" / "spm.model")
    table = read_parquet(rdir / "quality" / f"{shard}.parquet", columns=["doc_id", "domain", "text"])
    texts = table.column("text").to_pylist()
    ids = sp.encode(texts) if texts else []
    domain = table.column("domain")[0].as_py() if table.num_rows else shard.rsplit("-", 1)[0]
    nbytes = sum(len(t.encode("utf-8")) for t in texts)
    stats = new_stats(domain)
    stats.update(in_docs=len(texts), in_bytes=nbytes, kept_docs=len(texts), kept_bytes=nbytes,
                 tokens=int(sum(len(x) for x in ids)))
    out_table = pa.table({
        "doc_id": table.column("doc_id"), "domain": table.column("domain"),
        "n_chars": pa.array([len(t) for t in texts], pa.int64()),
        "tokens": pa.array(ids, pa.list_(pa.int32())),
    })
    write_parquet(out_table, out)
    stats = write_stats(rdir, "tokenize", shard, stats)
    write_marker(out, {"stats": stats})
    return stats
