"""The ablation's data: reference texts held out per domain before ingest, and one training set per arm.

Why apart from ``ablation.py``: the evaluation must be text no filter ever saw, and every arm must be built from
the same sources minus the same held-out documents, with one tokenizer, so that their losses are comparable.

* :func:`split_sources` holds out, per domain file, the documents with the smallest ``sha256(seed/domain/line)``
  (10 % of the lines, at most ``HOLDOUT_MAX_DOCS``, at least 2) *before ingest*. They go to
  ``heldout/<domain>.jsonl`` as ``{"id", "text"}``; every other line goes unchanged to ``train/<domain>.jsonl``.
* The held-out files are also the chain's decontamination set (``quality.decontamination.paths``): a training
  document that shares a 13-gram with a reference text (a copy or a quotation of it elsewhere in the sources) is
  removed with reason ``decontaminated`` in every filtered arm (n-grams that two references share, such as
  licence headers and navigation bars, are left out of the index: they are nobody's text), and :func:`raw_token_set` removes the same ones
  from the raw arm, so no arm is scored on text it trained on.
* Arms: (a) ``raw`` — every ingested document, no dedup, no filter; (b) ``heuristics`` — the shipped chain
  (exact + MinHash dedup, the default quality chains); (c) ``classifier`` — (b) plus the quality classifier;
  (d) ``classifier_only`` — dedup and the classifier, no heuristic rule. (b) trains the SentencePiece model; the
  other arms load it (``tokenizer.model_path``), so every arm and the evaluation share one vocabulary.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

HOLDOUT_MAX_DOCS, HOLDOUT_FRACTION, HOLDOUT_MIN_DOCS = 40, 0.10, 2
ARMS = {"raw": "(a) raw", "heuristics": "(b) heuristics", "classifier": "(c) heuristics + classifier",
        "classifier_only": "(d) classifier alone"}


def split_sources(src: Path, out: Path, seed: int) -> dict:
    """Hold out reference documents per ``<domain>.jsonl`` of ``src``; return the split's manifest (cached)."""
    settings = {"seed": seed, "max_docs": HOLDOUT_MAX_DOCS, "fraction": HOLDOUT_FRACTION,
                "files": {f.name: f.stat().st_size for f in sorted(src.glob("*.jsonl"))}}
    done = out / "split.json"
    if done.exists() and json.loads(done.read_text())["settings"] == settings:
        return json.loads(done.read_text())
    shutil.rmtree(out, ignore_errors=True)
    (out / "train").mkdir(parents=True)
    (out / "heldout").mkdir()
    domains = {}
    for f in sorted(src.glob("*.jsonl")):
        domain = f.stem
        lines = f.read_bytes().splitlines(keepends=True)
        k = max(HOLDOUT_MIN_DOCS, min(HOLDOUT_MAX_DOCS, int(len(lines) * HOLDOUT_FRACTION)))
        rank = sorted(range(len(lines)), key=lambda i: hashlib.sha256(f"{seed}/{domain}/{i}".encode()).digest())
        held, chars = set(), 0
        with open(out / "heldout" / f.name, "w", encoding="utf-8") as fh:
            for i in rank:
                if len(held) == k:
                    break
                try:
                    text = json.loads(lines[i])["text"]
                except (ValueError, KeyError, TypeError):
                    continue                    # not a document: it stays in the sources, where ingest reports it
                if not isinstance(text, str) or not text.strip():
                    continue
                held.add(i)
                chars += len(text)
                fh.write(json.dumps({"id": f"{domain}:{i + 1}", "text": text}, ensure_ascii=False) + "\n")
        with open(out / "train" / f.name, "wb") as fh:
            fh.writelines(ln for i, ln in enumerate(lines) if i not in held)
        domains[domain] = {"lines": len(lines), "heldout_docs": len(held), "heldout_chars": chars}
    manifest = {"settings": settings, "domains": domains}
    done.write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def arm_config(base: dict, arm: str, heldout: list[str], tokenizer_model: str | None) -> dict:
    """The chain config of a filtered arm: ``base`` (the shipped defaults) decontaminated against the references."""
    d = json.loads(json.dumps(base))
    # n-grams shared by two reference texts are boilerplate (licence headers, menus), not either text's own
    d["quality"]["decontamination"].update(enabled=True, paths=heldout, max_items_per_ngram=1)
    if tokenizer_model:
        d["tokenizer"]["model_path"] = tokenizer_model
    if arm in ("classifier", "classifier_only"):
        d["quality"]["classifier"]["enabled"] = True
    if arm == "classifier_only":
        d["quality"]["chains"] = [{"domain": "*", "filters": []}]
    return d


def raw_token_set(rdir: Path, out: Path, seed: int, seq_len: int) -> dict:
    """Arm (a): every document the (b) run ingested, minus those sharing an n-gram with a reference text (the
    decontamination index of that run), tokenized with its tokenizer, shuffled and packed like the chain's output."""
    import numpy as np
    import pyarrow.parquet as pq

    from pipeline.io import read_json
    from pipeline.quality import decontaminate
    from pipeline.sink import mindrecord, packing
    from pipeline.tokenizer import run as tokenizer

    if (out / mindrecord.MANIFEST).exists():
        return read_json(out / mindrecord.MANIFEST)
    cfg = read_json(rdir / "config.json")
    index = decontaminate.Decontaminator(decontaminate.index_dir(rdir), cfg["quality"]["decontamination"]["n"])
    docs = [r for f in sorted((rdir / "ingest").glob("*.parquet"))
            for r in pq.read_table(f, columns=["doc_id", "domain", "text"]).to_pylist()]
    keep, removed = [], {}
    for r in docs:
        if index.first_hit(r["text"]):
            removed[r["domain"]] = removed.get(r["domain"], 0) + 1
        else:
            keep.append(r)
    info = read_json(rdir / "tokenizer" / "spm.model.done")["info"]
    flat, lens = tokenizer.encode_texts(info["model"], [r["text"] for r in keep], workers=os.cpu_count() or 1)
    ids = [r["doc_id"] for r in keep]
    idx, keys = packing.order_keys(seed, ids, np.ones(len(ids), np.int64))
    order = idx[np.argsort(keys, kind="stable")]
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    manifest = mindrecord.write_token_set(
        tmp, [r["domain"] for r in keep], (flat, np.cumsum(lens) - lens, lens, order), seq_len=seq_len, shard_num=2,
        name="corpus", eos_id=info.get("eos_id", tokenizer.EOS_ID), bos_id=None,
        pad_id=info.get("pad_id", tokenizer.PAD_ID), extra={
            "vocab_size": info["vocab_size"], "tokenizer_sha256": info["sha256"], "ingested_docs": len(docs),
            "excluded": {"decontaminated": dict(sorted(removed.items()))}})
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return manifest


def decontaminated_per_domain(rdir: Path) -> dict:
    """Documents a filtered arm's quality stage removed as overlapping a reference text, per domain."""
    out: dict[str, int] = {}
    for f in sorted((rdir / "stats" / "quality").glob("*.json")):
        st = json.loads(f.read_text())
        n = st.get("removed", {}).get("decontaminated", {}).get("docs", 0)
        if n:
            out[st["domain"]] = out.get(st["domain"], 0) + n
    return dict(sorted(out.items()))
