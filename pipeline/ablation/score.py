"""Score one proxy checkpoint on the held-out references: nats summed per document, and its bytes.

Run as its own process (``python -m pipeline.ablation.score``), so MindSpore stays out of the Airflow worker and
the CLI. Each reference document is encoded with the arm's own tokenizer, preceded by the end-of-document token
(how a document starts inside a packed row), cut into rows of ``seq_len + 1`` tokens that overlap by one, and
scored with the training loss summed; padding is masked by label. Bits per byte is then tokenizer-free:
nats / bytes / ln 2 (:mod:`pipeline.ablation.stats`).

Also a **last-word cloze** (LAMBADA's task as a 4-way choice, :func:`cloze_items`): the last word of a line of
prose, after everything before it in the document, against three other last words of the same domain's references
with as many letters, in the same position. The model picks the candidate with the lowest loss (the context's loss
is the same in all four rows); chance is 25 %. Distractors matched in position and length replace the earlier
continuation task, whose true endings sat at document openings and distractors anywhere.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

import numpy as np

PUNCT = ".,;:!?\"')]}»”’"
MIN_WORDS = 6          # a line of at least this many words ends in a cloze item


def doc_rows(ids: list[int], seq_len: int, pad_id: int) -> np.ndarray:
    """``[n, seq_len + 1]`` rows covering ``ids``: each row predicts ``seq_len`` tokens, the next row starts at the
    last token of the previous one, the last row is padded."""
    n = max(1, -(-(len(ids) - 1) // seq_len))
    rows = np.full((n, seq_len + 1), pad_id, np.int32)
    for r in range(n):
        piece = ids[r * seq_len: r * seq_len + seq_len + 1]
        rows[r, :len(piece)] = piece
    return rows


def last_words(text: str, limit: int) -> list[tuple[str, str]]:
    """Up to ``limit`` ``(prefix, word)`` pairs of ``text``, the last qualifying lines first: ``word`` is the last
    word of a line of at least ``MIN_WORDS`` words (trailing punctuation dropped), 3+ letters; ``prefix`` is the
    text before it, without the space."""
    found, pos = [], 0
    for line in text.splitlines(keepends=True):
        words = line.split()
        if len(words) >= MIN_WORDS:
            word = words[-1].rstrip(PUNCT)
            at = line.rstrip().rfind(words[-1])
            if len(word) >= 3 and word.isalpha() and word.isascii() and at > 0 and line[at - 1] == " ":
                found.append((text[:pos + at - 1], word))
        pos += len(line)
    return found[::-1][:limit] if limit else []


def cloze_items(refs: list[dict], sp, eos: int, seq_len: int, per_doc: int) -> list[dict]:
    """Per reference document up to ``per_doc`` items ``{doc, domain, rows: [true, d1, d2, d3]}``: each row the
    document's tokens before the word (its last ``seq_len`` minus the word's) followed by a candidate's tokens.
    Distractors: last words of other items of the same domain with as many letters (not tokens: every arm trains
    its own tokenizer, and the items must be the same for every arm), drawn by a hash of the item, so every
    checkpoint answers the same items; the lowest summed loss over a word's bytes picks the answer."""
    raw = []
    for ref in refs:
        for prefix, word in last_words(ref["text"], per_doc):
            raw.append({"doc": ref["id"], "domain": ref["domain"], "prefix": prefix, "word": word,
                        "ids": sp.encode(word)})
    pools: dict[tuple, list[str]] = {}
    for it in raw:
        pool = pools.setdefault((it["domain"], len(it["word"])), [])
        if it["word"] not in pool:
            pool.append(it["word"])
    items = []
    for it in raw:
        others = sorted(w for w in pools[(it["domain"], len(it["word"]))] if w != it["word"])
        if len(others) < 3:
            continue
        key = f"{it['doc']}/{len(it['prefix'])}".encode()
        others.sort(key=lambda w: hashlib.sha256(key + w.encode()).hexdigest())
        cands = [it["ids"], *(sp.encode(w) for w in others[:3])]
        room = seq_len + 1 - max(len(c) for c in cands)        # the context the longest candidate leaves
        if room < 2:
            continue
        ctx = ([eos] + sp.encode(it["prefix"]))[-room:]
        items.append({"doc": it["doc"], "domain": it["domain"], "rows": [ctx + c for c in cands]})
    return items


def score_references(job_path: str, tokenizer_model: str, references: str, batch_rows: int = 8,
                     cloze_per_doc: int = 4) -> list[dict]:
    """``[{doc, source, domain, nats, bytes, tokens, cloze: [items, correct]}]`` for every reference document, in
    file order."""
    import mindspore as ms
    import sentencepiece as spm

    from pipeline.train.checkpoint import checkpoint
    from pipeline.train.evaluate import make_scorer
    from pipeline.train.job import TrainJob
    from pipeline.train.model.model import CausalLMLoss, Transformer

    job = TrainJob.from_json(job_path)
    summary = json.loads((Path(job.out_dir) / "summary.json").read_text(encoding="utf-8"))
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device(job.device)
    cfg = job.model_config()
    net = Transformer(cfg)
    checkpoint.load_weights(net, summary["checkpoint"])
    score = make_scorer(CausalLMLoss(net, reduction="sum"), jit=True)
    sp = spm.SentencePieceProcessor(model_file=tokenizer_model)
    eos = sp.eos_id() if sp.eos_id() >= 0 else cfg.pad_id
    out = []
    refs = [json.loads(line) for path in sorted(Path(references).glob("*.jsonl"))
            for line in path.read_text(encoding="utf-8").splitlines()]
    cloze: dict[str, list[int]] = {}
    for item in cloze_items(refs, sp, eos, cfg.max_seq_len, cloze_per_doc):
        losses = []
        for row in item["rows"]:                 # one row per call: each candidate's summed loss on its own
            batch = np.full((1, cfg.max_seq_len + 1), cfg.pad_id, np.int32)
            batch[0, :len(row)] = row
            losses.append(score(batch)[0])
        got = cloze.setdefault(item["doc"], [0, 0])
        got[0] += 1
        got[1] += int(losses[0] < min(losses[1:]))
    for ref in refs:
        ids = [eos] + sp.encode(ref["text"])
        rows = doc_rows(ids, cfg.max_seq_len, cfg.pad_id)
        nats = tokens = 0.0
        for i in range(0, len(rows), batch_rows):
            batch = np.full((batch_rows, rows.shape[1]), cfg.pad_id, np.int32)
            batch[:len(rows[i:i + batch_rows])] = rows[i:i + batch_rows]
            s, n = score(batch)
            nats, tokens = nats + s, tokens + n
        out.append({"doc": ref["id"], "source": ref["source"], "domain": ref["domain"], "nats": nats,
                    "bytes": len(ref["text"].encode("utf-8")), "tokens": int(tokens),
                    "cloze": cloze.get(ref["id"], [0, 0])})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--job", required=True, help="the training run's job.json")
    ap.add_argument("--tokenizer", required=True, help="the arm's SentencePiece model")
    ap.add_argument("--references", required=True, help="folder of <domain>.jsonl references")
    ap.add_argument("--out", required=True, help="scores JSON to write")
    ap.add_argument("--cloze-items", type=int, default=4, help="last-word cloze items per document (0: none)")
    args = ap.parse_args(argv)
    from pipeline.io import write_json

    t0 = time.time()
    docs = score_references(args.job, args.tokenizer, args.references, cloze_per_doc=args.cloze_items)
    write_json(args.out, {"job": args.job, "docs": docs, "seconds": round(time.time() - t0, 3)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
