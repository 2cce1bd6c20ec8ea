"""The ablation's evaluation on the reference texts held out before ingest: loss per domain, and a multiple-choice
continuation task scored by log-likelihood (HellaSwag-style), plus the confidence intervals over seeds.

Why apart from ``ablation.py``: one worker process scores a checkpoint (it imports MindSpore; the driver does not),
and the report reads the statistics without importing the driver.

* Loss: each domain's reference documents, tokenized with the shared tokenizer, joined with EOS and cut into rows of
  ``seq_len + 1`` tokens, at most ``max_tokens`` per domain; nats per token.
* Multiple choice: each reference document is cut into windows of ``seq_len`` tokens (at most ``WINDOWS_PER_DOC``
  per document); an item is a window's first half as context and four candidate second halves: its own, and three
  from windows of *other* reference documents of the same domain, at a seeded random position. The model picks the
  candidate with the lowest loss over the whole row; the context is the same in all four rows, so that is the
  candidate with the highest log-likelihood given the context. Every candidate has the same length in tokens, so
  no length normalisation is needed. Chance is 25 %.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import numpy as np

WINDOWS_PER_DOC, MC_ITEMS_PER_DOMAIN, CHOICES = 8, 48, 4
# two-sided 95 % Student t quantiles by degrees of freedom (3 seeds: 2)
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def mean_ci(values: list[float]) -> dict:
    """Mean and the half-width of its 95 % t interval over ``values`` (seeds); ``ci`` is None for one value."""
    vals = [v for v in values if v is not None]
    if not vals:
        return {"mean": None, "ci": None, "n": 0}
    m = sum(vals) / len(vals)
    if len(vals) < 2:
        return {"mean": m, "ci": None, "n": 1}
    sd = math.sqrt(sum((v - m) ** 2 for v in vals) / (len(vals) - 1))
    return {"mean": m, "ci": T95.get(len(vals) - 1, 1.96) * sd / math.sqrt(len(vals)), "n": len(vals)}


def build_items(heldout_dir: Path, spm_model: str, out: Path, *, seq_len: int, max_tokens: int, eos_id: int,
                pad_id: int, seed: int) -> dict:
    """Write ``out/<domain>.npz`` (loss rows, MC rows and answers) for every reference file; return a summary."""
    from pipeline.tokenizer import run as tokenizer

    out.mkdir(parents=True, exist_ok=True)
    summary = {}
    half = seq_len // 2
    for f in sorted(heldout_dir.glob("*.jsonl")):
        domain = f.stem
        texts = [json.loads(ln)["text"] for ln in f.read_text(encoding="utf-8").splitlines() if ln.strip()]
        flat, lens = tokenizer.encode_texts(spm_model, texts, workers=1)
        starts = np.cumsum(lens) - lens
        docs = [np.asarray(flat[s:s + n], np.int32) for s, n in zip(starts, lens, strict=True)]
        joined = np.concatenate([np.append(d, eos_id) for d in docs]).astype(np.int32)[:max_tokens + 1]
        n_rows = max(1, -(-(len(joined) - 1) // seq_len))
        rows = np.full((n_rows, seq_len + 1), pad_id, np.int32)
        for r in range(n_rows):
            piece = joined[r * seq_len: r * seq_len + seq_len + 1]
            rows[r, :len(piece)] = piece
        windows = [(i, w, d[w * seq_len:(w + 1) * seq_len]) for i, d in enumerate(docs)
                   for w in range(min(WINDOWS_PER_DOC, len(d) // seq_len))]
        # items round-robin over documents (window 0 of every document first), so no long document dominates
        order = sorted(range(len(windows)), key=lambda k: (windows[k][1], windows[k][0]))
        rng = np.random.default_rng(int.from_bytes(hashlib.sha256(f"{seed}/{domain}".encode()).digest()[:8], "little"))
        mc_rows, answers = [], []
        for k in order[:MC_ITEMS_PER_DOMAIN]:
            doc, _, win = windows[k]
            others = [j for j, (d, _, _) in enumerate(windows) if d != doc]
            if len(others) < CHOICES - 1:
                continue
            picks = rng.choice(len(others), CHOICES - 1, replace=False)
            conts = [windows[others[p]][2][half:] for p in picks]
            answer = int(rng.integers(CHOICES))
            conts.insert(answer, win[half:])
            for c in conts:
                mc_rows.append(np.concatenate([win[:half], c, [pad_id]]).astype(np.int32))
            answers.append(answer)
        mc = np.stack(mc_rows) if mc_rows else np.zeros((0, seq_len + 1), np.int32)
        np.savez(out / f"{domain}.npz", rows=rows, mc=mc, answers=np.asarray(answers, np.int32))
        summary[domain] = {"docs": len(docs), "tokens": int(sum(lens)), "loss_tokens": int(min(len(joined) - 1,
                                                                                               max_tokens)),
                           "mc_items": len(answers)}
    return summary


def eval_worker(spec: dict) -> dict:
    """Score one checkpoint: ``{"loss": {domain: nats/token, "all": pooled}, "mc": {domain: accuracy, "all"}}``."""
    import mindspore as ms

    from pipeline.train import checkpoint
    from pipeline.train.config import ModelConfig
    from pipeline.train.evaluate import make_scorer
    from pipeline.train.model import CausalLMLoss, Transformer

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    cfg = ModelConfig.from_preset(spec["preset"], **{**spec["model"], "max_seq_len": spec["seq_len"]})
    net = Transformer(cfg)
    checkpoint.load_weights(net, spec["checkpoint"])
    score = make_scorer(CausalLMLoss(net, reduction="sum"), jit=True)
    loss, mc, tot = {}, {}, [0.0, 0.0, 0, 0]
    batch = spec["batch_rows"]
    for f in sorted(Path(spec["items"]).glob("*.npz")):
        data = np.load(f)
        s_sum = n_sum = 0.0
        rows = data["rows"]
        for i in range(0, len(rows), batch):
            b = rows[i:i + batch]
            if len(b) < batch:
                b = np.concatenate([b, np.full((batch - len(b), rows.shape[1]), cfg.pad_id, np.int32)])
            s, n = score(b)
            s_sum, n_sum = s_sum + s, n_sum + n
        loss[f.stem] = s_sum / n_sum if n_sum else None
        right = 0
        for k, answer in enumerate(data["answers"]):
            nll = [score(data["mc"][(k * CHOICES + c):(k * CHOICES + c + 1)])[0] for c in range(CHOICES)]
            right += int(int(np.argmin(nll)) == int(answer))
        mc[f.stem] = right / len(data["answers"]) if len(data["answers"]) else None
        tot = [tot[0] + s_sum, tot[1] + n_sum, tot[2] + right, tot[3] + len(data["answers"])]
    loss["all"] = tot[0] / tot[1] if tot[1] else None
    mc["all"] = tot[2] / tot[3] if tot[3] else None
    return {"loss": loss, "mc": mc}
