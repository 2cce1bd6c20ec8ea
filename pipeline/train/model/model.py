"""LLaMA-style decoder for MindSpore that runs on CPU (tests) and Ascend (real runs).

Why hand-written instead of mindformers: mindformers cannot be installed from PyPI against mindspore 2.10 and its
LLaMA uses fused kernels (RmsNorm, RotaryPositionEmbedding, FlashAttentionScore, Swiglu) that have no CPU kernels.
So every block here uses classic ``ops``/``nn`` that work on CPU in both GRAPH and PYNATIVE mode:

* RMSNorm is computed manually in fp32;
* RoPE cos/sin tables are precomputed in numpy (NTK / linear scaling applied there), applied as
  ``x*cos + rotate_half(x)*sin``;
* attention is the math path ``softmax(QK^T*scale + mask) V`` with GQA by repeating K/V heads; on Ascend
  ``attention_impl()`` switches to ``ops.flash_attention_score``, which takes GQA as it is (no repeat);
* the mask is causal, or with ``eod_id >= 0`` also block-diagonal by document: a document ends at its ``eod_id``
  token, so the mask follows the tokens through any re-pack (Megatron's ``reset_attention_mask``, mindformers'
  ``use_eod_attn_mask_compression``). RoPE scores depend on the distance only, so a document packed after another
  gets its logits alone. The math path adds an fp32 ``[B, 1, S, S]`` mask; flash attention takes its
  variable-length form instead (TND layout, ``actual_seq_qlen`` = the documents' cumulative ends, no ``[S, S]``
  mask). ``reset_positions`` restarts RoPE's positions in each document (Megatron's ``reset_position_ids``);
* SwiGLU is ``w2(silu(w1 x) * w3 x)``.

The model takes ``[B, S]`` int32 token ids and returns fp32 logits ``[B, S, vocab]``. ``CausalLMLoss`` takes rows of
``seq_len + 1`` tokens (the mindformers MindRecord convention) and shifts inside.
"""

from __future__ import annotations

import math

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops
from mindspore.common.initializer import Normal

from ..documents import FLASH_MASK_SIDE
from .attention_masks import document_ends, document_positions
from .config import PRESETS, ModelConfig, causal_mask, llama_ffn_hidden, rope_tables
from .tp_layers import NO_TP, VocabParallelNLL

__all__ = ["PRESETS", "ModelConfig", "Transformer", "CausalLMLoss", "attention_impl", "count_cell_params",
           "rope_tables", "causal_mask", "llama_ffn_hidden"]


def attention_impl() -> str:
    """'flash' on Ascend (fused FlashAttentionScore kernel), else 'math' (the only path with CPU/GPU kernels)."""
    return "flash" if ms.get_context("device_target") == "Ascend" else "math"


class RMSNorm(nn.Cell):
    """RMSNorm computed in fp32 (``ops.rms_norm`` has no CPU kernel; fp32 keeps it stable under AMP)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = Parameter(Tensor(np.ones(dim, np.float32)), name="weight")
        self.eps = eps

    def construct(self, x):
        x32 = x.astype(ms.float32)
        y = x32 * ops.rsqrt(ops.mean(x32 * x32, -1, True) + self.eps)
        return (y * self.weight).astype(x.dtype)


def rotate_half(x):
    half = x.shape[-1] // 2
    return ops.cat((-x[..., half:], x[..., :half]), -1)


class Attention(nn.Cell):
    """Causal self-attention with GQA and RoPE; math path or flash attention (see ``attention_impl``).

    ``parallelize.parallelize`` makes it a tensor-parallel shard (``tp > 1``: ``n_heads/t`` query heads and their
    ``n_kv_heads/t`` KV heads, column-parallel q/k/v, row-parallel ``wo`` with its partial sums all-reduced): it
    swaps the layers and the identity ``copy_in``/``reduce_out`` for Megatron's "f"/"g", so ``construct`` has no
    parallel branch."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.tp = 1
        self.copy_in, self.reduce_out = nn.Identity(), nn.Identity()
        self.n_heads, self.n_kv, self.hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.rep = cfg.n_heads // cfg.n_kv_heads
        self.scale = 1.0 / math.sqrt(self.hd)
        std, out_std = cfg.init_std, cfg.init_std / math.sqrt(2 * cfg.n_layers)  # GPT-2 style residual scaling
        self.wq = nn.Dense(cfg.dim, self.n_heads * self.hd, has_bias=False, weight_init=Normal(std))
        self.wk = nn.Dense(cfg.dim, self.n_kv * self.hd, has_bias=False, weight_init=Normal(std))
        self.wv = nn.Dense(cfg.dim, self.n_kv * self.hd, has_bias=False, weight_init=Normal(std))
        self.wo = nn.Dense(self.n_heads * self.hd, cfg.dim, has_bias=False, weight_init=Normal(out_std))
        self.use_flash = attention_impl() == "flash"
        self.by_document = cfg.eod_id >= 0
        if self.use_flash:  # the kernel's fixed compressed causal mask (sparse_mode 2 and 3), 1 = masked
            self.fa_mask = Tensor(np.triu(np.ones((FLASH_MASK_SIDE, FLASH_MASK_SIDE), np.uint8), k=1))

    def _repeat_kv(self, x):
        if self.rep == 1:
            return x
        b, h, s, d = x.shape
        x = ops.tile(ops.expand_dims(x, 2), (1, 1, self.rep, 1, 1))
        return x.reshape(b, h * self.rep, s, d)

    def construct(self, x, cos, sin, mask):
        b, s, _ = x.shape
        x = self.copy_in(x)
        q = self.wq(x).reshape(b, s, self.n_heads, self.hd).transpose(0, 2, 1, 3)  # [B, H, S, hd]
        k = self.wk(x).reshape(b, s, self.n_kv, self.hd).transpose(0, 2, 1, 3)
        v = self.wv(x).reshape(b, s, self.n_kv, self.hd).transpose(0, 2, 1, 3)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if self.use_flash and self.by_document:
            # Ascend only: the variable-length form. Every row's tokens on one axis (TND), ``mask`` holds the
            # documents' cumulative ends (actual_seq_qlen), sparse_mode=3 is causal within each; K/V keep n_kv heads.
            tq = q.transpose(0, 2, 1, 3).reshape(b * s, self.n_heads, self.hd)
            tk = k.transpose(0, 2, 1, 3).reshape(b * s, self.n_kv, self.hd)
            tv = v.transpose(0, 2, 1, 3).reshape(b * s, self.n_kv, self.hd)
            out = ops.flash_attention_score(tq, tk, tv, self.n_heads, attn_mask=self.fa_mask, actual_seq_qlen=mask,
                                            actual_seq_kvlen=mask, scalar_value=self.scale, next_tokens=0,
                                            input_layout="TND", sparse_mode=3)
            return self.reduce_out(self.wo(out.reshape(b, s, self.n_heads * self.hd)))
        if self.use_flash:
            # Ascend only: sparse_mode=2 (leftUpCausal) takes the fixed compressed 2048x2048 mask, 1 = masked.
            out = ops.flash_attention_score(q, k, v, self.n_heads, attn_mask=self.fa_mask, scalar_value=self.scale,
                                            input_layout="BNSD", sparse_mode=2)
        else:
            k, v = self._repeat_kv(k), self._repeat_kv(v)
            scores = ops.matmul(q, k.swapaxes(-1, -2)).astype(ms.float32) * self.scale + mask
            probs = ops.softmax(scores, -1).astype(v.dtype)
            out = ops.matmul(probs, v)
        out = out.transpose(0, 2, 1, 3).reshape(b, s, self.n_heads * self.hd)
        return self.reduce_out(self.wo(out))


class FeedForward(nn.Cell):
    """SwiGLU MLP: ``w2(silu(w1 x) * w3 x)`` (``ops.swiglu`` has no CPU kernel); under tensor parallel
    (``parallelize``) w1/w3 are column- and w2 row-parallel."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        std, out_std = cfg.init_std, cfg.init_std / math.sqrt(2 * cfg.n_layers)
        hidden, self.tp = cfg.ffn_hidden, 1
        self.copy_in, self.reduce_out = nn.Identity(), nn.Identity()  # parallelize: Megatron's "f" and "g"
        self.w1 = nn.Dense(cfg.dim, hidden, has_bias=False, weight_init=Normal(std))
        self.w3 = nn.Dense(cfg.dim, hidden, has_bias=False, weight_init=Normal(std))
        self.w2 = nn.Dense(hidden, cfg.dim, has_bias=False, weight_init=Normal(out_std))

    def construct(self, x):
        x = self.copy_in(x)
        return self.reduce_out(self.w2(ops.silu(self.w1(x)) * self.w3(x)))


class Block(nn.Cell):
    """Pre-norm transformer block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)  # norms replicated on every TP rank
        self.attention = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.feed_forward = FeedForward(cfg)

    def construct(self, x, cos, sin, mask):
        x = x + self.attention(self.attention_norm(x), cos, sin, mask)
        return x + self.feed_forward(self.ffn_norm(x))


class Transformer(nn.Cell):
    """Token ids ``[B, S]`` (S <= max_seq_len) -> fp32 logits ``[B, S, vocab]`` (``[B, S, vocab/t]``, this rank's
    vocabulary block, after ``parallelize.parallelize`` made it a tensor-parallel shard)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg, self.tp = cfg, NO_TP
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim, embedding_table=Normal(cfg.init_std))
        self.layers = nn.CellList([Block(cfg) for _ in range(cfg.n_layers)])
        if cfg.recompute:
            for blk in self.layers:
                blk.recompute()  # trade compute for activation memory (not on CPU GRAPH: docs/training.md)
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.copy_to_head = nn.Identity()  # parallelize: "f" before this rank's vocabulary block of the head
        self.tie = cfg.tie_embeddings
        if not self.tie:
            self.output = nn.Dense(cfg.dim, cfg.vocab_size, has_bias=False, weight_init=Normal(cfg.init_std))
        cos, sin = rope_tables(cfg)
        # Constants, not Parameters: they never enter checkpoints or the optimizer.
        self.cos, self.sin = Tensor(cos), Tensor(sin)
        self.flash, self.eod_id = attention_impl() == "flash", cfg.eod_id
        self.reset_positions, self.max_docs = cfg.reset_positions, cfg.max_documents_per_row
        # the math path's additive causal mask (flash attention takes its own, Attention.fa_mask)
        self.mask = None if self.flash else Tensor(causal_mask(cfg.max_seq_len))

    def _attention_mask(self, tokens, s):
        """Causal mask ``[S, S]`` (math path; None for flash), or with ``eod_id`` the per-row document mask:
        additive fp32 ``[B, 1, S, S]`` (math) or the documents' cumulative ends ``[B * k]`` (flash, TND)."""
        if self.eod_id < 0:
            return None if self.flash else self.mask[:s, :s]
        if self.flash:
            return document_ends(tokens, self.eod_id, self.max_docs)
        eod = (tokens == self.eod_id).astype(ms.float32)
        # documents begun before each position (pipeline.train.documents.document_segments)
        seg = ops.cumsum(eod, 1) - eod
        other = ops.expand_dims(seg, 2) != ops.expand_dims(seg, 1)  # [B, S, S]: key in another document
        return ops.expand_dims(other.astype(ms.float32) * -1e9 + self.mask[:s, :s], 1)

    def _rope(self, tokens, s):
        """cos/sin ``[S, hd]`` by position in the row, or ``[B, 1, S, hd]`` by position in the document."""
        if not self.reset_positions:
            return self.cos[:s], self.sin[:s]
        pos = document_positions(tokens, self.eod_id)
        return ops.expand_dims(ops.gather(self.cos, pos, 0), 1), ops.expand_dims(ops.gather(self.sin, pos, 0), 1)

    def construct(self, tokens):
        s = tokens.shape[1]
        h = self.tok_embeddings(tokens)
        (cos, sin), mask = self._rope(tokens, s), self._attention_mask(tokens, s)
        for blk in self.layers:
            h = blk(h, cos, sin, mask)
        h = self.copy_to_head(self.norm(h))
        if self.tie:
            logits = ops.matmul(h, self.tok_embeddings.embedding_table.T)
        else:
            logits = self.output(h)
        return logits.astype(ms.float32)


class TokenNLL(nn.Cell):
    """Per-token cross-entropy of whole-vocabulary logits ``[N, V]`` against labels ``[N]``."""

    def construct(self, logits, labels):
        return ops.cross_entropy(logits, labels, reduction="none")


class CausalLMLoss(nn.Cell):
    """Next-token cross-entropy over rows of ``seq_len + 1`` tokens; labels equal to ``pad_id`` are ignored.

    Masking by the *label* is deliberate (Hugging Face's ``-100`` convention): the model is never trained to emit pad
    after a document's end. mindformers masks by the *input* instead, one more position per padded row (README,
    "Export to mindformers and Hugging Face"; measured in ``tests/test_export_mindformers.py``).

    ``reduction="mean"`` (training) returns the mean over valid labels; ``"sum"`` (evaluation) returns
    ``(nll_sum, n_valid)`` so batches and domains can be pooled exactly. Negative ids in the input half (e.g. -100
    padding) are mapped to 0 so the embedding lookup stays in range; their predictions are still scored against the
    next label, which is what padding-at-the-end data needs.
    """

    def __init__(self, model: Transformer, pad_id: int | None = None, reduction: str = "mean"):
        super().__init__()
        if reduction not in ("mean", "sum"):
            raise ValueError(f"CausalLMLoss.reduction={reduction!r}: must be 'mean' or 'sum'")
        self.model = model
        self.pad_id = model.cfg.pad_id if pad_id is None else pad_id
        self.sum = reduction == "sum"
        # per-token NLL: of this rank's vocabulary block under tensor parallel, else of the whole logits
        self.nll = VocabParallelNLL(model.cfg.vocab_size, model.tp) if model.tp.size > 1 else TokenNLL()

    def construct(self, tokens):
        inputs = tokens[:, :-1]
        labels = tokens[:, 1:]
        inputs = ops.maximum(inputs, 0)
        logits = self.model(inputs)
        v = logits.shape[-1]
        labels = labels.reshape(-1)
        valid = (labels != self.pad_id).astype(ms.float32)
        safe = ops.where(labels == self.pad_id, ops.zeros_like(labels), labels)
        total = (self.nll(logits.reshape(-1, v), safe) * valid).sum()
        if self.sum:
            return total, valid.sum()
        return total / ops.maximum(valid.sum(), 1.0)


def count_cell_params(cell: nn.Cell) -> int:
    return int(sum(int(np.prod(p.shape)) for p in cell.trainable_params()))
