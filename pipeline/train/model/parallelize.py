"""Tensor parallel applied to a plain model in one step, as torchtitan's ``parallelize_llama`` does.

``model.py`` describes one process's LLaMA and knows nothing of ranks. :func:`parallelize` takes such a
``Transformer`` (built under ``no_init_parameters``, so nothing was drawn) and this rank's ``TPGroup``, and swaps
in Megatron's split (``tp_layers.py``) module by module:

* attention: wq/wk/wv column-parallel (this rank's ``n_heads/t`` query heads and ``n_kv_heads/t`` KV heads), wo
  row-parallel with its partial sums all-reduced ("g"), the input through "f";
* feed-forward: w1/w3 column-parallel, w2 row-parallel, the same "f"/"g" pair;
* the embedding table and the LM head split by vocabulary block, the head's input through "f";
* RMSNorm gains stay replicated.

Which axis each parameter is split along is ``parallel.split_axis`` (the names do not change), so checkpoints,
``shard_init`` and ``tp_merge`` agree with what this builds. The weights are then drawn by
``shard_init.init_rank_weights``.
"""

from __future__ import annotations

from mindspore import nn
from mindspore.common.initializer import Normal

from .tp_layers import CopyToTP, ReduceFromTP, TPGroup, VocabParallelEmbedding


def _dense(n_in: int, n_out: int) -> nn.Dense:
    return nn.Dense(n_in, n_out, has_bias=False, weight_init=Normal(0.02))  # drawn again by shard_init


def parallelize(model, tp: TPGroup):
    """Make ``model`` (a ``model.Transformer``) this rank's tensor-parallel shard; returns it. TP 1: unchanged."""
    if tp.size == 1:
        return model
    cfg, t = model.cfg, tp.size
    for blk in model.layers:
        att, ffn = blk.attention, blk.feed_forward
        att.n_heads, att.n_kv, att.tp = cfg.n_heads // t, cfg.n_kv_heads // t, t
        att.wq = _dense(cfg.dim, att.n_heads * att.hd)
        att.wk = _dense(cfg.dim, att.n_kv * att.hd)
        att.wv = _dense(cfg.dim, att.n_kv * att.hd)
        att.wo = _dense(att.n_heads * att.hd, cfg.dim)
        att.copy_in, att.reduce_out = CopyToTP(tp), ReduceFromTP(tp)
        hidden = cfg.ffn_hidden // t
        ffn.tp = t
        ffn.w1, ffn.w3, ffn.w2 = _dense(cfg.dim, hidden), _dense(cfg.dim, hidden), _dense(hidden, cfg.dim)
        ffn.copy_in, ffn.reduce_out = CopyToTP(tp), ReduceFromTP(tp)
        if cfg.recompute:
            blk.recompute()  # the swapped-in cells join the block's recompute scope
    model.tok_embeddings = VocabParallelEmbedding(cfg.vocab_size, cfg.dim, tp, Normal(cfg.init_std))
    model.copy_to_head = CopyToTP(tp)
    if not cfg.tie_embeddings:
        model.output = _dense(cfg.dim, cfg.vocab_size // t)
    model.tp = tp
    for name, p in model.parameters_and_names():  # swapped-in cells' parameters get their place in the tree
        p.name = name
    return model
