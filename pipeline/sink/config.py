"""Settings of the sink: packing token ids into MindRecord rows, and the domain mixture with its held-out split."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.configkit import ConfigError, _f


@dataclass
class PackConfig:
    seq_len: int = _f(128, desc="Training context; rows hold seq_len + 1 tokens (mindformers convention).",
                      ge=8, le=1_048_576)
    add_bos: bool = _f(False, desc="Put BOS before every document (EOS always follows every document).")
    shard_num: int = _f(2, desc="MindRecord files: at least this many and always a multiple of it (make it a "
                        "multiple of the data-parallel world size).", ge=1, le=1000)
    shard_mb: int = _f(256, desc="Largest MindRecord file in MiB of row tokens; more data gives more files, never "
                       "larger ones (a writer task holds one file's tokens: about 2x this in memory).",
                       ge=1, le=65536)
    remainder: str = _f("drop", desc="Tail shorter than a row: drop it (mindformers) or pad it with pad_id.",
                        choices=("drop", "pad"))
    domain_field: bool = _f(True, desc="Write a domain_id column (domain of each row's first token, indexed).")
    boundaries: bool = _f(False, desc="Write a segment_starts column (positions where a document starts in the "
                          "row, 0 always listed) so attention can be reset at document boundaries.")
    formats: list[str] = _f(factory=lambda: ["mindrecord"], desc="Formats the sink writes, in the same task and "
                            "pass: mindrecord (what this project's trainer reads; always written) and megatron "
                            "(Megatron-LM's indexed dataset, .bin/.idx per output file, the documents unpacked: "
                            "what mindformers 2.x, Megatron-LM and NeMo read).")
    write_workers: int = _f(1, desc="Processes writing MindRecord files in parallel inside one writer task (0: "
                            "every core of the worker). Files are also written in parallel by the mapped writer "
                            "tasks; each process holds MindSpore (~0.4 GB) and one file's tokens (~2x shard_mb).",
                            ge=0, le=256)
    verify_mem_mb: int = _f(6144, desc="Address-space limit (MiB) of the child process that re-reads every row of a "
                            "MindRecord file in a full check (each writer on the file it wrote, the validation "
                            "sets, mindloom verify): a damaged shard has made MindDataset allocate 23 GB, so the "
                            "check fails instead of the worker. Reading starts MindSpore (about 0.4 GB).",
                            ge=512, le=262_144)

    def __post_init__(self):
        bad = [f for f in self.formats if f not in ("mindrecord", "megatron")]
        if bad:
            raise ConfigError(f"pack.formats: {bad[0]!r} is not a format (mindrecord, megatron)")
        if "mindrecord" not in self.formats:
            raise ConfigError("pack.formats: must include mindrecord (the format this project's trainer reads)")


@dataclass
class MixtureConfig:
    """Domain mixture and the held-out validation split, both decided by hashes of (doc id, seed, domain)."""

    weights: dict = _f(factory=dict, desc="Target share per domain ({code: 0.3, zh: 0.1, ...}, normalised); "
                       "empty: the natural proportions. Every domain needs a weight; 0 drops it.")
    unit: str = _f("tokens", desc="What the weights measure.", choices=("tokens", "chars"))
    max_epochs: float = _f(4.0, desc="Upsampling cap: no domain is repeated more often than this.", ge=1, le=100)
    total_tokens: int = _f(0, desc="Training budget in `unit`; 0: the largest budget <= the corpus that meets "
                           "every weight within max_epochs.", ge=0)
    matched: bool = _f(False, desc="Every domain gets exactly its weight of total_tokens, or the run fails naming "
                       "the domain that would exceed max_epochs (no deficit passed to the others): the same tokens "
                       "per domain in every arm of an ablation. Needs weights and total_tokens.")
    matched_tolerance: float = _f(0.05, desc="With matched: the largest relative miss of a domain's target the "
                                  "selection may make (it selects whole documents, so a domain of a few large "
                                  "documents cannot meet its target closely); a larger miss fails naming the "
                                  "domain.", ge=0.0, le=1.0)
    val_fraction: float = _f(0.01, desc="Share of each domain's documents held out for validation.", ge=0, le=0.5)
    val_min_docs: int = _f(2, desc="At least this many held-out documents per domain (never over half of it).",
                           ge=0)
    val_max_docs: int = _f(1000, desc="At most this many held-out documents per domain.", ge=0)
    heldout_ngram: int = _f(13, desc="Tokens per run for the held-out overlap check: a training document that "
                            "shares runs of this many tokens with a held-out document is measured against "
                            "heldout_overlap (13, as GPT-3 and DCLM decontaminate with 13-grams); 0: only the "
                            "exact-text check.", ge=0, le=1024)
    heldout_overlap: float = _f(0.5, desc="A training document is dropped (overlaps_heldout) when this share of "
                                "its heldout_ngram runs is in held-out documents, or when it holds this share of "
                                "one held-out document's distinct runs. Lower catches shared boilerplate too "
                                "(licence headers, LaTeX preambles).", ge=0.01, le=1)

    def __post_init__(self):
        for name, w in self.weights.items():
            if not isinstance(name, str) or isinstance(w, bool) or not isinstance(w, int | float) or w < 0:
                raise ConfigError(f"mixture.weights.{name}: expected a number >= 0, got {w!r}")
        if self.weights and not any(self.weights.values()):
            raise ConfigError("mixture.weights: at least one weight must be > 0")
        if self.matched and not (self.weights and self.total_tokens):
            raise ConfigError("mixture.matched: needs mixture.weights and mixture.total_tokens > 0 (a matched "
                              "mixture fixes the tokens of every domain)")
        if self.val_min_docs > self.val_max_docs:
            raise ConfigError(f"mixture.val_min_docs: must be <= mixture.val_max_docs ({self.val_max_docs})")
