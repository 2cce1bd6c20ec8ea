"""MindRecord token sets of the corpus and validation split, and their verification against the manifest.

:func:`write_mindrecord` runs the corpus sink in one process (scatter into key-range buckets, one writer per file
dealt its consecutive rows of the one packed stream, the set assembled: :mod:`pipeline.sink.scatter`,
:mod:`pipeline.sink.shards`); :func:`write_token_set` packs documents already in order (validation sets, tests)
and deals the rows round-robin, through the one writer (:mod:`pipeline.sink.writer`).

Row schema: ``input_ids`` int32 ``[seq_len + 1]``; optionally ``domain_id`` int32 (index into the manifest's
``domains``: the domain of the row's first token; an index field, so ``MindPage`` can list rows per domain) and
``segment_starts`` int32 ``[-1]`` (positions where a document begins inside the row, 0 always listed: tokens attend
only within ``[starts[i], starts[i+1])`` when a long-context stage resets attention at document boundaries).

Verification lives in :mod:`pipeline.sink.verify` (re-exported here): each corpus writer fully verifies the file
it wrote, later steps check sizes only, ``mindloom verify`` re-reads everything.
"""

from __future__ import annotations

import hashlib
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

from pipeline.io import read_json, read_parquet, write_json
from pipeline.sink import scatter
from pipeline.sink import shards as shards_mod
from pipeline.sink.packing import pack
from pipeline.sink.verify import VERIFY_MEM_MB as VERIFY_MEM_MB
from pipeline.sink.verify import ShardError as ShardError
from pipeline.sink.verify import rank_split as rank_split
from pipeline.sink.verify import verify
from pipeline.sink.writer import MANIFEST, set_manifest, shard_names, write_shard

FILE_PAD = -100          # pad value when the tokenizer has no pad piece (the trainer's default ignored label)


# ------------------------------------------------------------------------------------------------ writing


def write_token_set(out_dir: Path, doc_domains: list[str], doc_tokens: list, *, seq_len: int, shard_num: int,
                    name: str, eos_id: int, bos_id: int | None, pad_id: int | None, remainder: str = "drop",
                    domain_field: bool = True, boundaries: bool = False, domains: list[str] | None = None,
                    extra: dict | None = None, workers: int = 1) -> dict:
    """Pack documents already in their final order and write ``out_dir`` (shards + manifest); return the manifest.

    ``doc_tokens`` is a list of int32 arrays, or ``(flat, starts, lens, order)`` from :func:`write_mindrecord`.
    Writes in place: callers write into a temporary folder and rename it.
    """
    import numpy as np

    domains = sorted(set(doc_domains)) if domains is None else domains
    index = {d: i for i, d in enumerate(domains)}
    dom = np.asarray([index[d] for d in doc_domains], np.int32)
    if isinstance(doc_tokens, tuple):
        flat, starts, lens, order = doc_tokens
    else:
        lens = np.asarray([len(t) for t in doc_tokens], np.int64)
        starts = np.cumsum(lens) - lens
        flat = np.concatenate(doc_tokens).astype(np.int32) if doc_tokens else np.zeros(0, np.int32)
        order = np.arange(len(doc_tokens))
    pad = FILE_PAD if pad_id is None or pad_id < 0 else pad_id
    packed = pack(flat, starts, lens, dom, order, seq_len=seq_len, eos_id=eos_id, bos_id=bos_id, pad_id=pad,
                  remainder=remainder, boundaries=boundaries)
    rows = packed["rows"]
    if len(rows) < shard_num:
        raise ValueError(f"pack.shard_num: {shard_num} shards need at least as many rows of {seq_len + 1} tokens, "
                         f"but {name} packs into {len(rows)}")
    out_dir.mkdir(parents=True, exist_ok=True)
    jobs = [(str(out_dir / fname), seq_len, rows[s::shard_num],
             packed["row_domain"][s::shard_num] if domain_field else None,
             packed["row_starts"][s::shard_num] if boundaries else None)
            for s, fname in enumerate(shard_names(name, shard_num))]
    if workers > 1 and shard_num > 1:
        with ProcessPoolExecutor(min(workers, shard_num), mp_context=get_context("spawn")) as pool:
            files = list(pool.map(write_shard, *zip(*jobs, strict=True)))
    else:
        files = [write_shard(*args) for args in jobs]
    per_domain = {d: int(packed["tokens_per_domain"][i]) if i < len(packed["tokens_per_domain"]) else 0
                  for d, i in index.items()}
    manifest = set_manifest(files, seq_len=seq_len, domain_field=domain_field, boundaries=boundaries,
                            rows_sha256=hashlib.sha256(np.ascontiguousarray(rows).tobytes()).hexdigest(), extra={
        "domains": domains, "tokens_per_domain": per_domain,
        "token_share": {d: n / max(sum(per_domain.values()), 1) for d, n in per_domain.items()},
        "remainder": remainder, "dropped_tail_tokens": packed["dropped_tail_tokens"],
        "padded_tokens": packed["padded_tokens"], "documents": int(len(order)),
        "eos_id": eos_id, "bos_id": bos_id, "pad_id": pad, **(extra or {})})
    write_json(out_dir / MANIFEST, manifest)
    return manifest


def write_mindrecord(rdir: Path, shards: list[str], *, seq_len: int, shard_num: int, add_bos: bool, seed: int,
                     tokenizer_sha256: str, config_sha256: str, eos_id: int, bos_id: int, vocab_size: int,
                     pad_id: int | None = None, mixture: bool = False, remainder: str = "drop",
                     domain_field: bool = True, boundaries: bool = False, workers: int = 1,
                     shard_mb: int = 256, megatron_dtype: str | None = None) -> dict:
    """The whole sink in one process (CLI, tests): scatter every shard, write every file, assemble the set.

    With ``mixture`` the per-document decisions of :func:`pipeline.sink.mixture.plan_mixture` apply (``copies``
    per document: 0 for held-out and downsampled documents, more than 1 for upsampled ones); without it every
    document goes in once (a mixture of one copy each is written first).  The DAG runs the same three steps as
    mapped tasks (:mod:`pipeline.tasks.corpus`).
    """
    final = rdir / "mindrecord"
    if (final / MANIFEST).exists() and (manifest := read_json(final / MANIFEST)).get("config_sha256") == config_sha256:
        verify(final, full_read=False, hashes=False)
        return manifest
    if not mixture:
        write_single_copies(rdir, shards)
    layout = sink_layout(rdir, seq_len=seq_len, shard_mb=shard_mb, shard_num=shard_num, add_bos=add_bos,
                         remainder=remainder)
    parts = [scatter.part_name(0, 1)]          # one scatter task: every shard in one part
    scatter.run_scatter_part(rdir, parts[0], sorted(shards), seed=seed, n_files=layout["n_files"],
                             domains=layout["domains"])
    args = dict(seq_len=seq_len, eos_id=eos_id, bos_id=bos_id if add_bos else None,
                pad_id=FILE_PAD if pad_id is None or pad_id < 0 else pad_id, remainder=remainder,
                domain_field=domain_field, boundaries=boundaries, n_domains=len(layout["domains"]),
                megatron_dtype=megatron_dtype)
    ks = range(layout["n_files"])
    if workers > 1 and layout["n_files"] > 1:
        with ProcessPoolExecutor(min(workers, layout["n_files"]), mp_context=get_context("spawn")) as pool:
            list(pool.map(write_file_job, [(rdir, k, layout["n_files"], parts, args) for k in ks]))
    else:
        for k in ks:
            write_file_job((rdir, k, layout["n_files"], parts, args))
    return shards_mod.finalize_set(rdir, layout["n_files"], parts, seq_len=seq_len,
                                   domains=layout["domains"], domain_field=domain_field, boundaries=boundaries,
                                   extra=set_extra(rdir, layout, seed=seed, vocab_size=vocab_size,
                                                   tokenizer_sha256=tokenizer_sha256, config_sha256=config_sha256,
                                                   mixture=mixture, **args))


def write_file_job(job: tuple) -> dict:
    """One output file from a picklable ``(rdir, k, n_files, scatter parts, args)`` (what writer pools map over)."""
    rdir, k, n, parts, args = job
    return shards_mod.write_output_file(rdir, k, n, parts, **args)


def sink_layout(rdir: Path, *, seq_len: int, shard_mb: int, shard_num: int,
                add_bos: bool, remainder: str = "drop") -> dict:
    """Output files and the domain list, from the mixture report: written once to ``sink/layout.json``, so every
    task of the run uses the same (the report is final once the mixture task has finished).

    Rows are dealt to files (:mod:`pipeline.sink.shards`), so any corpus with at least as many rows as files fills
    every file; one with fewer fails here, before any scatter, with one line naming ``pack.shard_num``.
    """
    import json

    from pipeline.io import config_digest

    path = rdir / "sink" / "layout.json"
    raw = (rdir / "mixture" / "report.json").read_bytes()
    key = config_digest("sink_layout", seq_len, shard_mb, shard_num, add_bos, remainder,
                        hashlib.sha256(raw).hexdigest())
    if path.exists() and (layout := read_json(path)).get("key") == key:
        return layout
    report = json.loads(raw)
    tokens = scatter.stream_tokens(report, add_bos)
    n_files = scatter.n_output_files(tokens, shard_mb, shard_num)
    shards_mod.check_rows(shards_mod.total_rows(tokens, seq_len, remainder), n_files, seq_len, shard_num)
    layout = {"n_files": n_files, "domains": sorted(report["domains"]), "stream_tokens": tokens,
              "shard_mb": shard_mb, "shard_num": shard_num, "key": key}
    write_json(path, layout)
    return layout


def set_extra(rdir: Path, layout: dict, *, seed: int, vocab_size: int, tokenizer_sha256: str, config_sha256: str,
              remainder: str, mixture: bool, eos_id: int, bos_id: int | None, pad_id: int,
              extends_release: dict | None = None, **_) -> dict:
    """The corpus manifest's keys beyond the files: tokenizer, config, mixture report, packing settings, and for
    an incremental refresh the release it extends (its name and tokenizer digest)."""
    return {"remainder": remainder, "eos_id": eos_id, "bos_id": bos_id, "pad_id": pad_id, "vocab_size": vocab_size,
            "tokenizer_sha256": tokenizer_sha256, "config_sha256": config_sha256, "seed": seed,
            "shard_mb": layout["shard_mb"],
            "mixture": read_json(rdir / "mixture" / "report.json") if mixture else None,
            **({"extends_release": extends_release} if extends_release else {})}


def write_single_copies(rdir: Path, shards: list[str]) -> None:
    """Without a mixture plan every document trains once: write those decisions and a minimal report."""
    import pyarrow as pa

    from pipeline.io import write_parquet

    totals = {"total_selected_tokens": 0, "total_selected_docs": 0, "domains": {}}
    for shard in shards:
        t = read_parquet(rdir / "tokenize" / f"{shard}.parquet", columns=["doc_id", "domain", "n_tokens"])
        write_parquet(pa.table({"doc_id": t.column("doc_id"), "copies": pa.array([1] * t.num_rows, pa.int32())}),
                      rdir / "mixture" / f"{shard}.parquet")
        totals["total_selected_tokens"] += sum(t.column("n_tokens").to_pylist())
        totals["total_selected_docs"] += t.num_rows
        for d in set(t.column("domain").to_pylist()):
            totals["domains"][d] = {}
    write_json(rdir / "mixture" / "report.json", totals)


def dataset_files(mr_dir: str | Path) -> list[str]:
    """The shard files listed in the manifest, in order (what ``MindDataset(dataset_files=...)`` takes)."""
    mr_dir = Path(mr_dir)
    return [str(mr_dir / s["file"]) for s in read_json(mr_dir / MANIFEST)["shards"]]
