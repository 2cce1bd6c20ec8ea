"""``--format mindformers``: a weights-only checkpoint with mindformers' names, its model YAML and a pretraining YAML.

Written for mindformers 1.9.0 (mindspore 2.9), the release that installs and runs on CPU; see
``/README.md#export-to-mindformers-and-hugging-face``. Choices, each checked against mindformers by
``tests/test_export_mindformers.py``:

* ``intermediate_size`` is always written: mindformers derives the FFN size from ``multiple_of`` /
  ``ffn_dim_multiplier`` differently from mindloom, so leaving it out silently changes the shapes.
* A NTK stage is written as the theta mindloom really uses, ``theta * f ** (d / (d - 2))``, with
  ``extend_method: "None"``: mindformers' own ``NTK`` multiplies theta by ``f`` only.
* Linear (position-interpolation) stages are refused: mindformers' ``PI`` has not been checked against mindloom.
* ``use_flash_attention`` only on Ascend (no CPU/GPU kernel); on CPU ``use_rope_slice: true``, because the default
  rotary path uses a broadcasting BatchMatMul that has no CPU kernel (same maths).
* Padding: mindformers masks the loss where the *input* token is pad; mindloom where the *label* is (see
  ``pipeline/train/model.py``). The pretraining YAML keeps mindformers' rule; with packed rows the two differ only
  at the one position per padded row that predicts the first pad.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .hf import effective_theta, special_tokens
from .names import mindformers_name
from .source import StageSource

CKPT_NAME = "mindloom.ckpt"
_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def model_section(src: StageSource, device: str, precision: str = "fp32") -> dict:
    """The ``model:`` section of a mindformers YAML for this stage's model."""
    m = src.model
    if m.rope_scaling_type == "linear":
        raise ValueError(f"stage {src.stage!r}: linear RoPE scaling has no verified mindformers equivalent "
                         f"(model.rope_scaling_type='linear'); export it with --format hf")
    tok = special_tokens(src.tokenizer) if src.tokenizer else None
    ids = {r: (tok[r]["id"] if tok else d) for r, d in (("bos", 1), ("eos", 2), ("pad", 0))}
    pad = m.pad_id if m.pad_id >= 0 else ids["pad"]
    cfg = {"type": "LlamaConfig", "batch_size": 1, "seq_length": m.max_seq_len,
           "max_position_embedding": m.max_seq_len, "hidden_size": m.dim, "num_layers": m.n_layers,
           "num_heads": m.n_heads, "n_kv_heads": m.n_kv_heads, "intermediate_size": m.ffn_hidden,
           "vocab_size": m.vocab_size, "rms_norm_eps": m.norm_eps, "theta": effective_theta(m),
           "extend_method": "None", "scaling_factor": 1.0, "bos_token_id": ids["bos"], "eos_token_id": ids["eos"],
           "pad_token_id": pad, "ignore_token_id": -100, "compute_dtype": _DTYPES[precision],
           "layernorm_compute_type": "float32", "softmax_compute_type": "float32", "rotary_dtype": "float32",
           "param_init_type": "float32", "qkv_concat": False, "fused_rms_norm": False,
           "use_flash_attention": device == "Ascend", "use_rope_slice": device == "CPU", "use_past": False,
           "tie_word_embeddings": m.tie_embeddings, "init_method_std": m.init_std, "checkpoint_name_or_path": ""}
    return {"model_config": cfg, "arch": {"type": "LlamaForCausalLM"}}


def pretrain_config(src: StageSource, model: dict, ckpt: Path, batch_size: int, seed: int) -> dict:
    """A complete mindformers pretraining config: the model, its checkpoint, and the stage's MindRecord rows."""
    dataset = {"data_loader": {"type": "MindDataset", "dataset_dir": str(src.data_dir), "shuffle": True},
               "input_columns": ["input_ids"], "num_parallel_workers": 1, "python_multiprocessing": False,
               "drop_remainder": True, "batch_size": batch_size, "repeat": 1, "numa_enable": False,
               "prefetch_size": 1}
    return {"seed": seed, "run_mode": "train", "output_dir": "./output", "load_checkpoint": str(ckpt),
            "auto_trans_ckpt": False, "resume_training": False, "only_save_strategy": False,
            "trainer": {"type": "CausalLanguageModelingTrainer", "model_name": f"mindloom_{src.stage}"},
            "runner_config": {"epochs": 1, "batch_size": batch_size, "sink_mode": True, "sink_size": 1},
            "train_dataset": dataset,
            "train_dataset_task": {"type": "CausalLanguageModelDataset", "dataset_config": dataset},
            "model": model}


def write_mindformers(src: StageSource, weights: dict[str, np.ndarray], out: Path, final: Path, device: str,
                      precision: str = "fp32", batch_size: int = 8, seed: int = 1234) -> None:
    """Write ``mindloom.ckpt``, ``model.yaml`` and ``pretrain.yaml`` (and ``tokenizer.model``) into ``out``, a
    temporary folder that becomes ``final``."""
    import shutil

    import mindspore as ms
    import yaml

    model = model_section(src, device, precision)
    ckpt = out / CKPT_NAME
    ms.save_checkpoint([{"name": mindformers_name(k), "data": ms.Tensor(v)} for k, v in sorted(weights.items())],
                       str(ckpt))
    dump = {"default_flow_style": False, "sort_keys": False}
    (out / "model.yaml").write_text(yaml.safe_dump({"model": model}, **dump), encoding="utf-8")
    text = yaml.safe_dump(pretrain_config(src, model, final / CKPT_NAME, batch_size, seed), **dump)
    (out / "pretrain.yaml").write_text(text, encoding="utf-8")
    if src.tokenizer:
        shutil.copyfile(src.tokenizer, out / "tokenizer.model")
