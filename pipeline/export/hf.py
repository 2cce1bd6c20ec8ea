"""``--format hf``: ``model.safetensors`` + ``config.json`` for transformers' ``LlamaForCausalLM`` and the tokenizer.

The tokenizer is the corpus' own SentencePiece model (``tokenizer.model``) with a ``tokenizer_config.json`` for
``LlamaTokenizer``: ``legacy: true`` (plain ``SentencePieceProcessor.encode``, which is how the corpus was
tokenized), and a ``tokenizer.json`` for the fast tokenizer (see :func:`fast_tokenizer_json`); the special tokens and
pad read from the model, ``add_bos_token`` as the corpus packer did (``pack.add_bos``). A NTK long-context stage is
exported with its pre-scaled theta as ``rope_theta`` (mindloom raises theta by ``f ** (d / (d - 2))``, which no
transformers ``rope_type`` reproduces); linear scaling is transformers' ``linear`` rope type.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from pipeline.io import read_json

from .names import hf_name
from .source import StageSource


def effective_theta(model) -> float:
    """The RoPE base mindloom actually uses (``pipeline.train.model.config.rope_tables``)."""
    if model.rope_scaling_type == "ntk":
        d = model.head_dim
        return float(model.rope_theta * model.rope_scaling_factor ** (d / (d - 2)))
    return float(model.rope_theta)


def special_tokens(tokenizer: Path) -> dict:
    """unk/bos/eos/pad ids and pieces, plus the control symbols after them, read from the SentencePiece model."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(tokenizer))
    out = {}
    for role in ("unk", "bos", "eos", "pad"):
        i = getattr(sp, f"{role}_id")()
        out[role] = {"id": i, "piece": sp.id_to_piece(i) if i >= 0 else None}
    out["control"] = [{"id": i, "piece": sp.id_to_piece(i)} for i in range(sp.get_piece_size())
                      if sp.is_control(i) and i not in {out[r]["id"] for r in ("unk", "bos", "eos", "pad")}]
    out["vocab_size"] = sp.get_piece_size()
    return out


def corpus_add_bos(run_dir: Path | None) -> bool:
    """Whether the corpus put BOS before every document (its run's ``pack.add_bos``)."""
    from pipeline.sink.config import PackConfig

    cfg = run_dir / "config.json" if run_dir else None
    if cfg and cfg.is_file():
        return bool((read_json(cfg).get("pack") or {}).get("add_bos", PackConfig().add_bos))
    return PackConfig().add_bos


def hf_config(src: StageSource, tok: dict | None) -> dict:
    m = src.model
    ids = {r: (tok[r]["id"] if tok else None) for r in ("bos", "eos", "pad")}
    pad = m.pad_id if m.pad_id >= 0 else ids["pad"]
    rope_scaling = {"rope_type": "linear", "factor": float(m.rope_scaling_factor)} \
        if m.rope_scaling_type == "linear" else None
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": m.vocab_size,
            "hidden_size": m.dim, "intermediate_size": m.ffn_hidden, "num_hidden_layers": m.n_layers,
            "num_attention_heads": m.n_heads, "num_key_value_heads": m.n_kv_heads, "head_dim": m.head_dim,
            "hidden_act": "silu", "max_position_embeddings": m.max_seq_len, "initializer_range": m.init_std,
            "rms_norm_eps": m.norm_eps, "rope_theta": effective_theta(m), "rope_scaling": rope_scaling,
            "attention_bias": False, "attention_dropout": 0.0, "mlp_bias": False, "pretraining_tp": 1,
            "tie_word_embeddings": m.tie_embeddings, "use_cache": True, "torch_dtype": "float32",
            "bos_token_id": ids["bos"], "eos_token_id": ids["eos"], "pad_token_id": pad}


def tokenizer_files(tok: dict, add_bos: bool, max_len: int) -> dict[str, dict]:
    """``tokenizer_config.json`` and ``special_tokens_map.json`` for ``LlamaTokenizer(Fast)``."""
    roles = {f"{r}_token": tok[r]["piece"] for r in ("unk", "bos", "eos", "pad") if tok[r]["piece"]}
    extra = [c["piece"] for c in tok["control"]]
    decoder = {str(t["id"]): {"content": t["piece"], "lstrip": False, "normalized": False, "rstrip": False,
                              "single_word": False, "special": True}
               for t in sorted([tok[r] for r in ("unk", "bos", "eos", "pad") if tok[r]["id"] >= 0] + tok["control"],
                               key=lambda t: t["id"])}
    config = {"tokenizer_class": "LlamaTokenizer", **roles, "additional_special_tokens": extra,
              "add_bos_token": add_bos, "add_eos_token": False, "legacy": True,
              "clean_up_tokenization_spaces": False, "spaces_between_special_tokens": False,
              "model_max_length": max_len, "sp_model_kwargs": {}, "added_tokens_decoder": decoder}
    return {"tokenizer_config.json": config,
            "special_tokens_map.json": {**roles, "additional_special_tokens": extra}}


def fast_tokenizer_json(folder: Path) -> dict | None:
    """``tokenizer.json`` for ``LlamaTokenizerFast`` (None when transformers is not installed: the fast tokenizer is
    then converted at load time).

    Why written here and not left to the load-time conversion: transformers turns the SentencePiece user-defined
    pieces (newline and tab) into added tokens, which split the text before its normalizer prepends the dummy
    prefix, so every line after a newline gains a spurious leading "\u2581" and the ids differ from the corpus'.
    Without those added tokens the BPE model keeps newline and tab as single pieces anyway (no merge contains them),
    and the ids equal ``SentencePieceProcessor.encode`` (checked by ``tests/test_export_hf.py``).
    """
    try:
        from transformers import LlamaTokenizer
        from transformers.convert_slow_tokenizer import convert_slow_tokenizer
    except ImportError:
        return None
    backend = json.loads(convert_slow_tokenizer(LlamaTokenizer.from_pretrained(str(folder))).to_str())
    backend["added_tokens"] = [t for t in backend["added_tokens"] if t["special"]]
    return backend


def write_hf(src: StageSource, weights: dict[str, np.ndarray], out: Path) -> None:
    """Write the Hugging Face model folder into ``out`` (an empty folder)."""
    from safetensors.numpy import save_file

    tok = special_tokens(src.tokenizer) if src.tokenizer else None
    if tok and tok["vocab_size"] > src.model.vocab_size:
        raise ValueError(f"{src.tokenizer}: {tok['vocab_size']} pieces do not fit the model's vocab_size "
                         f"{src.model.vocab_size}")
    save_file({hf_name(k): v for k, v in sorted(weights.items())}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    cfg = hf_config(src, tok)
    _dump(out / "config.json", cfg)
    _dump(out / "generation_config.json", {k: cfg[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")})
    if tok:
        shutil.copyfile(src.tokenizer, out / "tokenizer.model")
        for name, body in tokenizer_files(tok, corpus_add_bos(src.corpus_run_dir), src.model.max_seq_len).items():
            _dump(out / name, body)
        fast = fast_tokenizer_json(out)
        if fast is not None:
            _dump(out / "tokenizer.json", fast)


def _dump(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8")
