"""PyTorch mirror of ``pipeline.train.model.model`` (same parameter names and shapes, same math) for bench_train.py.

Only the benchmark imports it, from the PyTorch venv (``.cache/bench-venvs/torch``); the project venv has no torch.
"""

from __future__ import annotations

import math

import numpy as np


def torch_model(cfg):
    import torch
    from torch import nn

    from pipeline.train.model.config import causal_mask, rope_tables

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(cfg.dim))

        def forward(self, x):
            return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + cfg.norm_eps) * self.weight

    def rotate_half(x):
        h = x.shape[-1] // 2
        return torch.cat((-x[..., h:], x[..., :h]), -1)

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            hd = cfg.head_dim
            self.wq = nn.Linear(cfg.dim, cfg.n_heads * hd, bias=False)
            self.wk = nn.Linear(cfg.dim, cfg.n_kv_heads * hd, bias=False)
            self.wv = nn.Linear(cfg.dim, cfg.n_kv_heads * hd, bias=False)
            self.wo = nn.Linear(cfg.n_heads * hd, cfg.dim, bias=False)

        def forward(self, x, cos, sin, mask):
            b, s, _ = x.shape
            hd, rep = cfg.head_dim, cfg.n_heads // cfg.n_kv_heads
            q = self.wq(x).view(b, s, cfg.n_heads, hd).transpose(1, 2)
            k = self.wk(x).view(b, s, cfg.n_kv_heads, hd).transpose(1, 2)
            v = self.wv(x).view(b, s, cfg.n_kv_heads, hd).transpose(1, 2)
            q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
            k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
            probs = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hd) + mask, -1)
            return self.wo((probs @ v).transpose(1, 2).reshape(b, s, -1))

    class FeedForward(nn.Module):
        def __init__(self):
            super().__init__()
            self.w1 = nn.Linear(cfg.dim, cfg.ffn_hidden, bias=False)
            self.w3 = nn.Linear(cfg.dim, cfg.ffn_hidden, bias=False)
            self.w2 = nn.Linear(cfg.ffn_hidden, cfg.dim, bias=False)

        def forward(self, x):
            return self.w2(torch.nn.functional.silu(self.w1(x)) * self.w3(x))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.attention_norm, self.attention = RMSNorm(), Attention()
            self.ffn_norm, self.feed_forward = RMSNorm(), FeedForward()

        def forward(self, x, cos, sin, mask):
            x = x + self.attention(self.attention_norm(x), cos, sin, mask)
            return x + self.feed_forward(self.ffn_norm(x))

    class Transformer(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
            self.layers = nn.ModuleList(Block() for _ in range(cfg.n_layers))
            self.norm = RMSNorm()
            self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
            cos, sin = rope_tables(cfg)
            self.register_buffer("cos", torch.from_numpy(cos))
            self.register_buffer("sin", torch.from_numpy(sin))
            self.register_buffer("mask", torch.from_numpy(causal_mask(cfg.max_seq_len)))

        def forward(self, tokens):
            s = tokens.shape[1]
            h = self.tok_embeddings(tokens)
            for blk in self.layers:
                h = blk(h, self.cos[:s], self.sin[:s], self.mask[:s, :s])
            return self.output(self.norm(h))

    return Transformer()


def torch_step_fn(model):
    import torch

    decay = [p for n, p in model.named_parameters() if p.ndim == 2 and "embedding" not in n]
    rest = [p for n, p in model.named_parameters() if not (p.ndim == 2 and "embedding" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                            lr=3e-4 / 2, betas=(0.9, 0.95), eps=1e-8)  # = the MindSpore table's first LR

    def step(tokens: np.ndarray) -> float:
        t = torch.from_numpy(tokens).long()
        model.train()
        logits = model(t[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), t[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return float(loss.detach())

    return step


def copy_weights(ms_net, model) -> None:
    import torch

    src = {p.name.replace("tok_embeddings.embedding_table", "tok_embeddings.weight"): p.asnumpy()
           for p in ms_net.trainable_params()}
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.from_numpy(src[name]))


