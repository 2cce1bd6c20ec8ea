"""A small trained model for the export tests: the real corpus chain (SentencePiece tokenizer, MindRecord and
Megatron files, held-out sets) over stdlib text, then two stages, ``main`` and a NTK ``long_context`` at 4x the
context.

Built once per test session (both export test modules share it; about 1.5 min on 2 cores), plus mindloom's own
logits from the trainer's own checkpoint loader, which the clients' logits are compared with.
"""

from __future__ import annotations

import glob
from pathlib import Path

import numpy as np

SEQ = 32
STAGES = [{"name": "main"},
          {"name": "long_context", "seq_len": 4 * SEQ, "overrides": {"steps": 2, "batch_size": 2, "warmup_steps": 1},
           "model_overrides": {"rope_scaling_type": "ntk", "rope_scaling_factor": 4.0}}]
_BUILT: dict = {}


def build(tmp_path_factory) -> dict:
    """``{"config": path, "cfg", "corpus": summary, "run_id", "stages": {name: stage dir}}``."""
    if _BUILT:
        return _BUILT
    import yaml
    from conftest import tiny_config

    from pipeline.config import load_config
    from pipeline.tasks.corpus import run_all
    from pipeline.tasks.pretrain import build_job, stage_dir
    from pipeline.train.job import TrainJob
    from pipeline.train.trainer import run_training

    tmp = tmp_path_factory.mktemp("export_chain")
    path = tiny_config(tmp)
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    data["train"].update({"steps": 6, "warmup_steps": 2, "checkpoint_every": 3, "eval_tokens": 0, "stages": STAGES})
    data["pack"]["formats"] = ["mindrecord", "megatron"]   # the mindformers 2.x YAML reads the Megatron files
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    cfg = load_config(path)
    corpus = run_all(cfg, "corpus1", progress=False)
    stages = {}
    for st in ("main", "long_context"):
        stages[st] = stage_dir(cfg.data_root, "run1", st)
        run_training(TrainJob.from_json(build_job(cfg, corpus, stages[st], stage=st)))
    _BUILT.update(config=path, cfg=cfg, corpus=corpus, run_id="run1", stages=stages)
    return _BUILT


def validation_rows(corpus: dict, seq_len: int, per_domain: int = 2) -> np.ndarray:
    """The first held-out rows of every domain at ``seq_len`` (+1 label), as the stage evaluation reads them."""
    from pipeline.train.evaluate import eval_rows

    sets = sorted(p for p in Path(corpus["val_mindrecord_dir"]).iterdir() if p.is_dir())
    return np.concatenate([eval_rows(str(d), seq_len, per_domain * seq_len) for d in sets])


def mindloom_logits(stage_dir: Path, rows: np.ndarray) -> np.ndarray:
    """Logits of ``rows[:, :-1]`` from the stage's final checkpoint, loaded by the trainer's own loader."""
    import mindspore as ms

    from pipeline.io import read_json
    from pipeline.train.checkpoint.checkpoint import load_weights
    from pipeline.train.model.config import ModelConfig
    from pipeline.train.model.model import Transformer

    summary = read_json(stage_dir / "summary.json")
    net = Transformer(ModelConfig(**summary["model"]))
    load_weights(net, summary["checkpoint"])
    return net(ms.Tensor(rows[:, :-1])).asnumpy()


def mindloom_loss(stage_dir: Path, rows: np.ndarray) -> float:
    """mindloom's training loss of ``rows`` (pad masked where the label is pad)."""
    import mindspore as ms

    from pipeline.io import read_json
    from pipeline.train.checkpoint.checkpoint import load_weights
    from pipeline.train.model.config import ModelConfig
    from pipeline.train.model.model import CausalLMLoss, Transformer

    summary = read_json(stage_dir / "summary.json")
    net = Transformer(ModelConfig(**summary["model"]))
    load_weights(net, summary["checkpoint"])
    return float(CausalLMLoss(net)(ms.Tensor(rows)).asnumpy())


def mindrecord_rows(folder: str) -> np.ndarray:
    """Every row of a MindRecord folder, files in name order, as a plain ``MindDataset`` read gives them."""
    import mindspore.dataset as ds

    files = sorted(f for f in glob.glob(f"{folder}/*.mindrecord*") if not f.endswith(".db"))
    return np.stack([r for (r,) in ds.MindDataset(files, columns_list=["input_ids"], shuffle=False)
                     .create_tuple_iterator(output_numpy=True, num_epochs=1)])
