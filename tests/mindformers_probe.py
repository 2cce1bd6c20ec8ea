"""Runs INSIDE the mindformers venv (tests/mindformers_venv.py): mindformers itself loads a mindloom export.

    python mindformers_probe.py EXPORT_DIR ROWS.npy OUT.npz [--batches N]

From the export's ``pretrain.yaml`` alone: builds ``LlamaConfig`` + ``LlamaForCausalLM``, loads ``load_checkpoint``
(every parameter must load), writes the logits of ``ROWS[:, :-1]`` (predict mode) and mindformers' training loss
of ``ROWS`` (its own pad masking), and reads the first N batches of ``train_dataset_task`` through
``CausalLanguageModelDataset`` with shuffling off. Imports nothing from mindloom.

When the export also holds ``pretrain_megatron.yaml`` (the mindformers 2.x config), a second ``LlamaForCausalLM``
built from it loads the safetensors folder through mindformers' own ``load_safetensors_checkpoint`` (its
``load_ckpt_format: safetensors`` path, with the Hugging Face name conversion; the same code in 2.1.0), and its
parameters, logits and loss on the pad-free rows are written beside the ``.ckpt`` ones.
"""

from __future__ import annotations

import argparse
import json
import sys


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("export_dir")
    ap.add_argument("rows")
    ap.add_argument("out")
    ap.add_argument("--batches", type=int, default=2)
    args = ap.parse_args()

    import mindspore as ms
    import numpy as np
    from mindformers import LlamaConfig, LlamaForCausalLM, MindFormerConfig
    from mindformers.dataset import CausalLanguageModelDataset

    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    cfg = MindFormerConfig(f"{args.export_dir}/pretrain.yaml")
    model_cfg = {k: v for k, v in cfg.model.model_config.items() if k != "type"}
    net = LlamaForCausalLM(LlamaConfig(**model_cfg))
    params = ms.load_checkpoint(cfg.load_checkpoint)
    not_loaded, unused = ms.load_param_into_net(net, params)
    rows = np.load(args.rows).astype(np.int32)
    net.set_train(False)
    logits, _, _ = net(ms.Tensor(rows[:, :-1]))
    net.set_train(True)
    loss = net(ms.Tensor(rows))

    dcfg = cfg.train_dataset_task.dataset_config
    dcfg.data_loader.shuffle = False
    data = CausalLanguageModelDataset(dcfg)
    batches = []
    for i, (ids,) in enumerate(data.create_tuple_iterator(output_numpy=True, num_epochs=1)):
        if i >= args.batches:
            break
        batches.append(ids)
    sf, extra = safetensors_net(args.export_dir, net, rows, cfg.model.model_config.pad_token_id)
    np.savez(args.out, logits=logits.asnumpy().reshape(rows.shape[0], rows.shape[1] - 1, -1),
             loss=np.float64(loss.asnumpy()), batches=np.stack(batches), **extra)
    print(json.dumps({"not_loaded": list(not_loaded), "unused": list(unused), "params": len(params), "safetensors": sf,
                      "dataset_size": data.get_dataset_size(), "batch_shape": list(batches[0].shape),
                      "model_config": {k: model_cfg[k] for k in ("theta", "extend_method", "seq_length",
                                                                 "pad_token_id", "intermediate_size")}}))
    return 0


def safetensors_net(export_dir: str, ref_net, rows, pad: int) -> tuple[dict | None, dict]:
    """The mindformers 2.x path: ``pretrain_megatron.yaml``'s model, loaded by ``load_safetensors_checkpoint``."""
    import glob
    import os

    import mindspore as ms
    import numpy as np
    from mindformers import LlamaConfig, LlamaForCausalLM, MindFormerConfig
    from mindformers.utils import is_hf_safetensors_dir
    from mindformers.utils.load_checkpoint_utils import load_safetensors_checkpoint

    path = os.path.join(export_dir, "pretrain_megatron.yaml")
    if not os.path.exists(path):
        return None, {}
    cfg = MindFormerConfig(path)
    ms.set_seed(99)                                     # other random weights than the first net
    net = LlamaForCausalLM(LlamaConfig(**{k: v for k, v in cfg.model.model_config.items() if k != "type"}))
    folder = cfg.load_checkpoint
    files = sorted(glob.glob(os.path.join(folder, f"*.{cfg.load_ckpt_format}")))   # its multi-file folder mode
    is_hf = is_hf_safetensors_dir(folder, net)
    load_safetensors_checkpoint(cfg, files, net, None, folder, None)
    ref = {p.name: p.asnumpy() for p in ref_net.get_parameters()}
    got = {p.name: p.asnumpy() for p in net.get_parameters()}
    net.set_train(False)
    logits, _, _ = net(ms.Tensor(rows[:, :-1]))
    net.set_train(True)
    clean = rows[~(rows == pad).any(1)]
    loss = net(ms.Tensor(clean))
    info = {"files": [os.path.basename(f) for f in files], "is_hf": bool(is_hf), "params": len(got),
            "differ": sorted(n for n in ref if n not in got or not np.array_equal(ref[n], got[n])),
            "clean_rows": len(clean), "input_sliced_sig": bool(cfg.model.model_config.input_sliced_sig)}
    return info, {"sf_logits": logits.asnumpy().reshape(rows.shape[0], rows.shape[1] - 1, -1),
                  "sf_loss_clean": np.float64(loss.asnumpy())}


if __name__ == "__main__":
    sys.exit(main())
