"""``--format mindformers``: the weights twice (a ``.ckpt`` for mindformers 1.9, safetensors for 2.x), the model
YAML and pretraining YAMLs.

* ``mindloom.ckpt`` + ``pretrain.yaml``: mindformers 1.9.0 (mindspore 2.9), the release that installs and runs on
  CPU; MindRecord data.
* ``model.safetensors`` + ``config.json`` (+ tokenizer files): the Hugging Face folder of ``--format hf``, written by
  the same code (:func:`pipeline.export.hf.write_hf`) into the same folder, so the export folder is what mindformers
  2.x loads with ``load_ckpt_format: safetensors`` and ``load_checkpoint: <folder>``. In 2.x (checked in the 2.1.0
  wheel) a LLaMA-shaped model is still the *legacy* ``mindformers.models.llama.LlamaForCausalLM`` (``use_legacy:
  True``; no mcore class takes ``model_type: llama``), whose ``convert_name`` maps the Hugging Face names to its own
  when the folder holds Hugging Face names. Its ``llama.py`` is byte-identical to 1.9.0's, which the tests run.
* ``pretrain_megatron.yaml`` (only when the corpus wrote Megatron files, ``pack.formats: [mindrecord, megatron]``):
  mindformers 2.x, that safetensors folder, and ``BlendedMegatronDatasetDataLoader`` over the corpus' ``.bin/.idx``
  with the manifest's ``data_path`` blend.

See ``docs/export.md``. Choices, each checked against mindformers by ``tests/test_export_mindformers.py``:

* ``intermediate_size`` is always written: mindformers derives the FFN size from ``multiple_of`` /
  ``ffn_dim_multiplier`` differently from mindloom, so leaving it out silently changes the shapes.
* A NTK stage is written as the theta mindloom really uses, ``theta * f ** (d / (d - 2))``, with
  ``extend_method: "None"``: mindformers' own ``NTK`` multiplies theta by ``f`` only.
* Linear (position-interpolation) stages are refused: mindformers' ``PI`` has not been checked against mindloom.
* ``use_flash_attention`` only on Ascend (no CPU/GPU kernel); on CPU ``use_rope_slice: true``, because the default
  rotary path uses a broadcasting BatchMatMul that has no CPU kernel (same maths).
* Padding: mindformers masks the loss where the *input* token is pad; mindloom where the *label* is (see
  ``pipeline/train/model/model.py``). The pretraining YAML keeps mindformers' rule; with packed rows the two differ
  only at the one position per padded row that predicts the first pad.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.io import read_json

from .hf import effective_theta, special_tokens, write_hf
from .names import mindformers_name
from .source import StageSource

CKPT_NAME = "mindloom.ckpt"
MEGATRON_YAML = "pretrain_megatron.yaml"
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


def megatron_blend(src: StageSource) -> list | None:
    """``data_path`` for ``BlendedMegatronDatasetDataLoader``: the corpus manifest's blend with absolute prefixes;
    None when the corpus wrote no Megatron files. Every ``.bin``/``.idx`` it names must exist."""
    manifest = Path(src.corpus_dir) / "manifest.json" if src.corpus_dir else None
    if manifest is None or not manifest.is_file():
        return None
    mega = read_json(manifest).get("megatron")
    if not mega:
        return None
    blend = mega.get("data_path")
    if not isinstance(blend, list) or not blend or len(blend) % 2:
        raise ValueError(f"{manifest}: megatron.data_path must be a non-empty [weight, prefix, ...] list, "
                         f"got {blend!r}")
    out: list = []
    for i in range(0, len(blend), 2):
        weight, prefix = blend[i], Path(src.corpus_dir) / str(blend[i + 1])
        if not isinstance(weight, (int, float)) or weight < 0:
            raise ValueError(f"{manifest}: megatron.data_path[{i}] must be a weight >= 0, got {weight!r}")
        for suffix in (".bin", ".idx"):
            if not Path(f"{prefix}{suffix}").is_file():
                raise FileNotFoundError(f"{prefix}{suffix}: named by {manifest} (megatron.data_path[{i + 1}]) but "
                                        f"missing")
        out += [float(weight), str(prefix)]
    return out


def megatron_pretrain_config(src: StageSource, model: dict, folder: Path, blend: list, batch_size: int,
                             seed: int) -> dict:
    """mindformers 2.x pretraining config: the legacy ``LlamaForCausalLM`` from this folder's safetensors, and
    ``GPTDataset`` samples of ``seq_length + 1`` tokens cut from the corpus' Megatron documents.

    Why these values: mindformers refuses the Megatron loader with a legacy model unless ``input_sliced_sig`` is
    true (the dataset gives ``input_ids``/``labels`` already shifted); ``create_attention_mask: false`` leaves the
    causal mask to the model and gives mindformers' four default columns for this loader (so a continued run in
    mindformers attends across documents, where mindloom's ``train.document_attention`` masks by document; that
    loader's ``reset_attention_mask`` is not tried here; ``reset_position_ids`` follows ``train.reset_positions``);
    ``eod``/``pad`` are the corpus' EOS and pad, so ``loss_mask`` drops positions whose *label* is pad, as mindloom
    does. ``sizes[0]`` is the stage's sample count (steps x batch).
    """
    cfg = dict(model["model_config"], input_sliced_sig=True)
    columns = ["input_ids", "labels", "loss_mask", "position_ids"]
    loader = {"type": "BlendedMegatronDatasetDataLoader", "datasets_type": "GPTDataset",
              "sizes": [int(src.step * batch_size), 0, 0],
              "config": {"seed": seed, "split": "1, 0, 0", "seq_length": cfg["seq_length"], "eod_mask_loss": False,
                         "reset_position_ids": src.model.reset_positions, "reset_attention_mask": False,
                         "create_attention_mask": False,
                         "create_compressed_eod_mask": False, "eod": cfg["eos_token_id"], "pad": cfg["pad_token_id"],
                         "data_path": blend}}
    dataset = {"data_loader": loader, "input_columns": columns, "construct_args_key": columns,
               "num_parallel_workers": 1, "python_multiprocessing": False, "drop_remainder": True,
               "batch_size": batch_size, "repeat": 1, "numa_enable": False, "prefetch_size": 1, "seed": seed}
    return {"seed": seed, "run_mode": "train", "output_dir": "./output", "use_legacy": True, "use_parallel": False,
            "load_checkpoint": str(folder), "load_ckpt_format": "safetensors", "auto_trans_ckpt": False,
            "resume_training": False, "only_save_strategy": False,
            "trainer": {"type": "CausalLanguageModelingTrainer", "model_name": f"mindloom_{src.stage}"},
            "runner_config": {"epochs": 1, "batch_size": batch_size, "sink_mode": True, "sink_size": 1},
            "train_dataset": dataset,
            "train_dataset_task": {"type": "CausalLanguageModelDataset", "dataset_config": dataset},
            "model": {"model_config": cfg, "arch": model["arch"]}}


def write_mindformers(src: StageSource, weights: dict[str, np.ndarray], out: Path, final: Path, device: str,
                      precision: str = "fp32", batch_size: int = 8, seed: int = 1234) -> None:
    """Write ``mindloom.ckpt``, ``model.yaml``, ``pretrain.yaml``, the Hugging Face folder (``model.safetensors``,
    ``config.json``, tokenizer) and, with Megatron corpus files, ``pretrain_megatron.yaml`` into ``out``, a
    temporary folder that becomes ``final``."""
    import shutil

    import mindspore as ms
    import yaml

    model = model_section(src, device, precision)
    blend = megatron_blend(src)              # checked before anything is written
    ckpt = out / CKPT_NAME
    ms.save_checkpoint([{"name": mindformers_name(k), "data": ms.Tensor(v)} for k, v in sorted(weights.items())],
                       str(ckpt))
    write_hf(src, weights, out)              # full (tensor-parallel merged) tensors, Hugging Face names
    dump = {"default_flow_style": False, "sort_keys": False}
    (out / "model.yaml").write_text(yaml.safe_dump({"model": model}, **dump), encoding="utf-8")
    text = yaml.safe_dump(pretrain_config(src, model, final / CKPT_NAME, batch_size, seed), **dump)
    (out / "pretrain.yaml").write_text(text, encoding="utf-8")
    if blend is not None:
        text = yaml.safe_dump(megatron_pretrain_config(src, model, final, blend, batch_size, seed), **dump)
        (out / MEGATRON_YAML).write_text(text, encoding="utf-8")
    if src.tokenizer:
        shutil.copyfile(src.tokenizer, out / "tokenizer.model")
