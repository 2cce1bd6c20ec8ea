"""Settings of the tokenizer stage (SentencePiece training or an existing model)."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.configkit import _f


@dataclass
class TokenizerConfig:
    """SentencePiece: trained per run on a mixture-stratified sample, or an existing ``.model`` loaded as is."""

    model_path: str = _f("", desc="Existing SentencePiece .model to use instead of training one (empty: train).")
    vocab_size: int = _f(4000, desc="SentencePiece vocabulary size.", ge=300, le=262144)
    model_type: str = _f("bpe", desc="SentencePiece model type (byte fallback and split digits are always on).",
                         choices=("bpe", "unigram"))
    sample_chars: int = _f(3_000_000, desc="Characters of text sampled (stratified by domain) for training.",
                           ge=10_000)
    min_domain_share: float = _f(0.05, desc="Floor on each domain's share of the training sample, so a small "
                                 "domain (e.g. zh) still gets its characters into the vocabulary.", ge=0, le=0.5)
    character_coverage: float = _f(0.9995, desc="Share of characters covered; the rest fall back to bytes.",
                                   ge=0.9, le=1.0)
    special_tokens: list[str] = _f(factory=list, desc="Extra control tokens (e.g. <|im_start|>) with fixed ids "
                                   "after unk/bos/eos/pad; never produced from raw text.")
    train_threads: int = _f(0, desc="SentencePiece training threads (0: every core for bpe, whose model is the same "
                            "for any thread count; 1 for unigram, whose model changes with the thread count).",
                            ge=0, le=256)
    encode_workers: int = _f(0, desc="Processes that encode one shard in parallel (0: every core of the worker).",
                             ge=0, le=256)
