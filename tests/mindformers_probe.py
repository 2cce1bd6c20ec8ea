"""Runs INSIDE the mindformers venv (tests/mindformers_venv.py): mindformers itself loads a mindloom export.

    python mindformers_probe.py EXPORT_DIR ROWS.npy OUT.npz [--batches N]

From the export's ``pretrain.yaml`` alone: builds ``LlamaConfig`` + ``LlamaForCausalLM``, loads ``load_checkpoint``
(every parameter must load), writes the logits of ``ROWS[:, :-1]`` (predict mode) and mindformers' training loss
of ``ROWS`` (its own pad masking), and reads the first N batches of ``train_dataset_task`` through
``CausalLanguageModelDataset`` with shuffling off. Imports nothing from mindloom.
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
    np.savez(args.out, logits=logits.asnumpy().reshape(rows.shape[0], rows.shape[1] - 1, -1),
             loss=np.float64(loss.asnumpy()), batches=np.stack(batches))
    print(json.dumps({"not_loaded": list(not_loaded), "unused": list(unused), "params": len(params),
                      "dataset_size": data.get_dataset_size(), "batch_shape": list(batches[0].shape),
                      "model_config": {k: model_cfg[k] for k in ("theta", "extend_method", "seq_length",
                                                                 "pad_token_id", "intermediate_size")}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
