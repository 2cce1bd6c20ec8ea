"""What an export starts from: a finished stage's final committed checkpoint, its model config and its corpus.

Everything is read from the stage folder (``<data_root>/train/<run id>/<stage>``), so the CLI, the DAG task and a
test find the same files: ``summary.json`` names the final checkpoint and holds the model config the stage trained
with; ``job.json`` names the corpus' MindRecord folder, whose run folder holds ``tokenizer/spm.model`` and
``corpus_summary.json``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.io import read_json
from pipeline.train.model.config import ModelConfig

from .names import model_params


@dataclass
class StageSource:
    stage_dir: Path
    stage: str
    step: int
    checkpoint: str                  # rank 0's weights file of the final step
    shards: list[str]                # one weights file per tensor-parallel rank (rank 0 first)
    sha256: list[str]                # the digests the commit marker recorded for ``shards``
    model: ModelConfig
    device: str                      # the device the stage trained on
    data_dir: str                    # the MindRecord folder the stage trained on (re-packed for another seq_len)
    corpus_dir: str                  # the corpus' own MindRecord folder (its manifest.json, Megatron .bin/.idx)
    corpus_run_dir: Path | None      # the corpus run folder (tokenizer, corpus_summary.json), when known
    tokenizer: Path | None


def final_checkpoint(stage_dir: str | Path) -> dict:
    """The final committed checkpoint of a finished stage: ``{"step", "path", "shards", "sha256",
    "tensor_parallel"}``.

    The one lookup every export goes through: the stage finished (``summary.json``, written after its last save)
    and its final step has a commit marker (``pipeline.train.checkpoint.commit``: every rank wrote and verified its
    file); ``shards`` are the weights files of tensor-parallel ranks ``0..t-1`` (an older marker: their one file each),
    as the marker lists them with their digests (each verified again when loaded); no optimizer state is read.
    """
    from pipeline.train.checkpoint import commit

    stage_dir = Path(stage_dir)
    summary_path = stage_dir / "summary.json"
    if not summary_path.is_file():
        raise FileNotFoundError(f"{summary_path}: stage {stage_dir.name!r} has not finished (no summary.json); "
                                f"export needs a finished stage")
    summary = read_json(summary_path)
    step = int(summary["steps"])
    marker_file = commit.commit_file(str(stage_dir), step)
    if not os.path.isfile(marker_file):
        raise FileNotFoundError(f"{marker_file}: the final step {step} of stage {stage_dir.name!r} has no commit "
                                f"marker (not every rank wrote its checkpoint)")
    marker = commit.read_marker(marker_file)
    tp = int(marker["layout"].get("tensor_parallel") or 1)
    shards, digests = zip(*(commit.weights_of(marker, r) for r in range(tp)), strict=True)
    for path in shards:
        if not Path(path).is_file() or not Path(path + ".sha256").is_file():
            raise FileNotFoundError(f"{path}: tensor-parallel shard of the final checkpoint (or its .sha256) is "
                                    f"missing")
    return {"step": step, "path": shards[0], "shards": list(shards), "sha256": list(digests), "tensor_parallel": tp}


def stage_source(stage_dir: str | Path) -> StageSource:
    """Everything an export needs to know about a finished stage, without loading any tensor."""
    stage_dir = Path(stage_dir)
    final = final_checkpoint(stage_dir)
    summary = read_json(stage_dir / "summary.json")
    job = read_json(stage_dir / "job.json") if (stage_dir / "job.json").is_file() else {}
    model = ModelConfig(**summary["model"])
    data_dir = (summary.get("data") or {}).get("dir") or job.get("data_dir", "")
    corpus_dir = job.get("data_dir")
    run_dir = Path(corpus_dir).parent if corpus_dir else None
    tok = run_dir / "tokenizer" / "spm.model" if run_dir else None
    return StageSource(stage_dir=stage_dir, stage=summary.get("stage") or stage_dir.name, step=final["step"],
                       checkpoint=final["path"], shards=final["shards"], sha256=final["sha256"], model=model,
                       device=summary.get("device") or "CPU", data_dir=data_dir, corpus_dir=corpus_dir or "",
                       corpus_run_dir=run_dir if run_dir and run_dir.is_dir() else None,
                       tokenizer=tok if tok and tok.is_file() else None)


def load_weights(src: StageSource) -> dict[str, np.ndarray]:
    """The model's weights at the final step, tensor-parallel shards merged, exactly the model's parameters.

    Each shard is verified against the digest its commit marker recorded; only weights files are read.
    """
    from pipeline.train.checkpoint import checkpoint as ckpt
    from pipeline.train.model.parallel import merge_tp

    want = model_params(src.model)
    shards = []
    for path, digest in zip(src.shards, src.sha256, strict=True):
        raw, _meta = ckpt.load_verified(path, digest)
        missing = [n for n in want if n not in raw]
        if missing:
            raise ValueError(f"{path}: lacks {len(missing)} model parameters, e.g. {missing[:3]}")
        shards.append({n: raw[n].asnumpy() for n in want})
    weights = merge_tp(shards)
    for name, shape in want.items():
        if tuple(weights[name].shape) != shape:
            raise ValueError(f"{src.checkpoint}: {name} has shape {tuple(weights[name].shape)}, the stage's model "
                             f"config expects {shape}")
        weights[name] = np.ascontiguousarray(weights[name], dtype=np.float32)
    return weights
