"""Parameter names and shapes of mindloom's model and of the two clients it is exported to.

Why a table and not a regex over whatever the checkpoint holds: the expected names come from the model config, so
an export that misses a tensor, or carries one with the wrong shape, fails naming it; and optimizer moments and
training-state scalars are left out by construction (they are not model parameters).

mindformers' ``LlamaForCausalLM`` uses mindloom's names except three (checked against mindformers 1.9.0); Hugging
Face's ``LlamaForCausalLM`` renames every module. Both use the half-split ``rotate_half`` RoPE layout mindloom
uses (``pipeline/train/model/model.py``), and both store Dense/Linear weights as ``[out, in]``, so no tensor is
permuted or transposed: every export is a rename.
"""

from __future__ import annotations

from pipeline.train.model.config import ModelConfig

#: mindloom name -> mindformers 1.9.0 name, where they differ.
MINDFORMERS_RENAMES = {"model.tok_embeddings.embedding_table": "model.tok_embeddings.embedding_weight",
                       "model.norm.weight": "model.norm_out.weight",
                       "model.output.weight": "lm_head.weight"}

_HF_LAYER = {"attention.wq": "self_attn.q_proj", "attention.wk": "self_attn.k_proj",
             "attention.wv": "self_attn.v_proj", "attention.wo": "self_attn.o_proj",
             "feed_forward.w1": "mlp.gate_proj", "feed_forward.w3": "mlp.up_proj", "feed_forward.w2": "mlp.down_proj",
             "attention_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}


def model_params(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every trainable parameter of ``Transformer(cfg)`` wrapped in the loss cell (the checkpoint's names)."""
    d, hd, f = cfg.dim, cfg.head_dim, cfg.ffn_hidden
    out = {"model.tok_embeddings.embedding_table": (cfg.vocab_size, d)}
    for i in range(cfg.n_layers):
        p = f"model.layers.{i}."
        out.update({p + "attention_norm.weight": (d,), p + "attention.wq.weight": (cfg.n_heads * hd, d),
                    p + "attention.wk.weight": (cfg.n_kv_heads * hd, d),
                    p + "attention.wv.weight": (cfg.n_kv_heads * hd, d),
                    p + "attention.wo.weight": (d, cfg.n_heads * hd), p + "ffn_norm.weight": (d,),
                    p + "feed_forward.w1.weight": (f, d), p + "feed_forward.w3.weight": (f, d),
                    p + "feed_forward.w2.weight": (d, f)})
    out["model.norm.weight"] = (d,)
    if not cfg.tie_embeddings:
        out["model.output.weight"] = (cfg.vocab_size, d)
    return out


def mindformers_name(name: str) -> str:
    return MINDFORMERS_RENAMES.get(name, name)


def hf_name(name: str) -> str:
    """``model.layers.3.attention.wq.weight`` -> ``model.layers.3.self_attn.q_proj.weight`` etc."""
    if name == "model.tok_embeddings.embedding_table":
        return "model.embed_tokens.weight"
    if name == "model.output.weight":
        return "lm_head.weight"
    if name == "model.norm.weight":
        return name
    prefix, _, rest = name.partition(".layers.")
    idx, _, tail = rest.partition(".")
    module = tail.removesuffix(".weight")
    if prefix != "model" or module not in _HF_LAYER:
        raise ValueError(f"no Hugging Face name for mindloom parameter {name!r}")
    return f"model.layers.{idx}.{_HF_LAYER[module]}.weight"
