"""Held-out loss and perplexity per domain, at the end of every stage.

Interface (deliberately small, so the validation sets can come from anywhere): ``eval_data`` maps a domain name to a
folder of MindRecord files whose ``input_ids`` rows are int32 ``[stored_seq_len + 1]`` (e.g. the corpus DAG's
``<run_dir>/mindrecord_val/<domain>/``; how the bridge finds them: ``pipeline.tasks.corpus_choice.find_eval_sets``).

What is measured, and why:

* The first ``eval_tokens`` tokens of each domain in packed-stream order (``repack.stream_rows``), re-grouped to the
  stage's ``seq_len``. Every stage of a run therefore scores the *same tokens* of each domain, so the numbers are
  comparable across stages; a long-context stage scores them with longer context.
* Token-weighted mean next-token NLL (labels equal to the model's ``pad_id`` excluded) and ``ppl = exp(loss)``; the
  ``all`` entry pools every domain's tokens.
* Fixed batch shape: the last partial batch is filled with rows of ``pad_id``, which the loss ignores, so GRAPH mode
  compiles once and the sums are exact.
"""

from __future__ import annotations

import math

import numpy as np

from .repack import regroup, stored_seq_len, stream_rows


def eval_rows(data_dir: str, seq_len: int, max_tokens: int) -> np.ndarray:
    """``[n, seq_len + 1]`` int32: the domain's first rows in stream order, at most ``max_tokens`` tokens."""
    stored = stored_seq_len(data_dir)
    want = max(0, max_tokens // seq_len)
    out = []
    if want:
        for row in regroup(stream_rows(data_dir), stored, seq_len):
            out.append(row)
            if len(out) >= want:
                break
    return np.asarray(out, dtype=np.int32).reshape(len(out), seq_len + 1)


def make_scorer(loss_sum_net, jit: bool):
    """``score(tokens) -> (nll_sum, n_tokens)`` floats; ``loss_sum_net`` is ``CausalLMLoss(net, reduction="sum")``."""
    import mindspore as ms
    from mindspore import Tensor

    def fwd(tokens):
        return loss_sum_net(tokens)

    fn = ms.jit(fwd) if jit else fwd

    def score(tokens: np.ndarray) -> tuple[float, float]:
        s, n = fn(Tensor(tokens))
        return float(s.asnumpy()), float(n.asnumpy())

    return score


def evaluate(score, eval_data: dict[str, str], *, seq_len: int, batch_size: int, max_tokens: int,
             pad_id: int) -> dict:
    """``{"per_domain": {d: {"loss", "ppl", "tokens", "rows"}}, "all": {...}, "seq_len", "tokens_per_domain_cap"}``."""
    per_domain: dict[str, dict] = {}
    tot_s, tot_n = 0.0, 0.0
    for domain in sorted(eval_data):
        rows = eval_rows(eval_data[domain], seq_len, max_tokens)
        s_sum, n_sum = 0.0, 0.0
        for i in range(0, len(rows), batch_size):
            batch = rows[i: i + batch_size]
            if len(batch) < batch_size:
                fill = np.full((batch_size - len(batch), seq_len + 1), pad_id, dtype=np.int32)
                batch = np.concatenate([batch, fill])
            s, n = score(batch)
            s_sum += s
            n_sum += n
        per_domain[domain] = _entry(s_sum, n_sum, len(rows))
        tot_s, tot_n = tot_s + s_sum, tot_n + n_sum
    return {"per_domain": per_domain, "all": _entry(tot_s, tot_n, sum(d["rows"] for d in per_domain.values())),
            "seq_len": seq_len, "tokens_per_domain_cap": max_tokens}


def _entry(s: float, n: float, rows: int) -> dict:
    if n <= 0:
        return {"loss": None, "ppl": None, "tokens": 0, "rows": rows}
    loss = s / n
    return {"loss": loss, "ppl": math.exp(min(loss, 700.0)), "tokens": int(n), "rows": rows}
