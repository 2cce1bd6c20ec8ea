"""Score one proxy checkpoint on the held-out references: nats summed per document, and its bytes.

Run as its own process (``python -m pipeline.ablation.score``), so MindSpore stays out of the Airflow worker and
the CLI. Each reference document is encoded with the arm's own tokenizer, preceded by the end-of-document token
(how a document starts inside a packed row), cut into rows of ``seq_len + 1`` tokens that overlap by one, and
scored with the training loss summed; padding is masked by label. Bits per byte is then tokenizer-free:
nats / bytes / ln 2 (:mod:`pipeline.ablation.stats`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np


def doc_rows(ids: list[int], seq_len: int, pad_id: int) -> np.ndarray:
    """``[n, seq_len + 1]`` rows covering ``ids``: each row predicts ``seq_len`` tokens, the next row starts at the
    last token of the previous one, the last row is padded."""
    n = max(1, -(-(len(ids) - 1) // seq_len))
    rows = np.full((n, seq_len + 1), pad_id, np.int32)
    for r in range(n):
        piece = ids[r * seq_len: r * seq_len + seq_len + 1]
        rows[r, :len(piece)] = piece
    return rows


def score_references(job_path: str, tokenizer_model: str, references: str, batch_rows: int = 8) -> list[dict]:
    """``[{doc, source, domain, nats, bytes, tokens}]`` for every reference document, in file order."""
    import mindspore as ms
    import sentencepiece as spm

    from pipeline.train import checkpoint
    from pipeline.train.evaluate import make_scorer
    from pipeline.train.job import TrainJob
    from pipeline.train.model import CausalLMLoss, Transformer

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
    for path in sorted(Path(references).glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            ref = json.loads(line)
            ids = [eos] + sp.encode(ref["text"])
            rows = doc_rows(ids, cfg.max_seq_len, cfg.pad_id)
            nats = tokens = 0.0
            for i in range(0, len(rows), batch_rows):
                batch = np.full((batch_rows, rows.shape[1]), cfg.pad_id, np.int32)
                batch[:len(rows[i:i + batch_rows])] = rows[i:i + batch_rows]
                s, n = score(batch)
                nats, tokens = nats + s, tokens + n
            out.append({"doc": ref["id"], "source": ref["source"], "domain": ref["domain"], "nats": nats,
                        "bytes": len(ref["text"].encode("utf-8")), "tokens": int(tokens)})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--job", required=True, help="the training run's job.json")
    ap.add_argument("--tokenizer", required=True, help="the arm's SentencePiece model")
    ap.add_argument("--references", required=True, help="folder of <domain>.jsonl references")
    ap.add_argument("--out", required=True, help="scores JSON to write")
    args = ap.parse_args(argv)
    from pipeline.io import write_json

    t0 = time.time()
    docs = score_references(args.job, args.tokenizer, args.references)
    write_json(args.out, {"job": args.job, "docs": docs, "seconds": round(time.time() - t0, 3)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
