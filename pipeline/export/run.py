"""Export one finished training stage for a client: ``mindformers`` or ``hf`` (Hugging Face transformers).

The output folder (default ``<stage dir>/export/<format>``) is written under a temporary name and renamed into
place, with ``export.json`` (source checkpoint, step, sha256 of every file) written last inside it; the same stage
exported again gives byte-identical files.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from pipeline.io import read_json, sha256_file, write_json

from .config import FORMATS
from .source import load_weights, stage_source

MANIFEST = "export.json"


def export_dir(stage_dir: str | Path, fmt: str) -> Path:
    return Path(stage_dir) / "export" / fmt


def export_stage(stage_dir: str | Path, fmt: str, out: str | Path | None = None, device: str = "") -> dict:
    """Export the final committed checkpoint of ``stage_dir`` as ``fmt`` into ``out``; returns the manifest.

    ``device`` (mindformers only) is the device the model YAML is written for; empty: the stage's own.
    """
    if fmt not in FORMATS:
        raise ValueError(f"export format {fmt!r}: choose one of {', '.join(FORMATS)}")
    src = stage_source(stage_dir)
    if fmt == "hf" and src.tokenizer is None:
        raise FileNotFoundError(f"stage {src.stage!r}: the corpus tokenizer (<corpus run>/tokenizer/spm.model) "
                                f"was not found from {Path(stage_dir) / 'job.json'}; the hf export ships it")
    final = Path(out).resolve() if out else export_dir(stage_dir, fmt)
    weights = load_weights(src)
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    try:
        device = device or src.device
        if fmt == "hf":
            from .hf import write_hf

            write_hf(src, weights, tmp)
        else:
            from .mindformers import write_mindformers

            summary = read_json(src.stage_dir / "summary.json")
            job = read_json(src.stage_dir / "job.json") if (src.stage_dir / "job.json").is_file() else {}
            write_mindformers(src, weights, tmp, final, device, precision=summary.get("precision", "fp32"),
                              batch_size=int(summary.get("global_batch") or 8), seed=int(job.get("seed", 1234)))
        for p in tmp.iterdir():
            os.chmod(p, 0o644)            # mindspore writes checkpoints read-only for the owner alone
        manifest = {"format": fmt, "stage": src.stage, "step": src.step, "checkpoint": src.checkpoint,
                    "checkpoint_sha256": src.sha256[0], "tensor_parallel": len(src.shards),
                    "device": device if fmt == "mindformers" else None, "dir": str(final),
                    "tokenizer": str(src.tokenizer) if src.tokenizer else None,
                    "data_dir": src.data_dir, "tensors": len(weights),
                    "files": {p.name: sha256_file(p) for p in sorted(tmp.iterdir())}}
        write_json(tmp / MANIFEST, manifest)
        if final.exists():
            old = final.with_name(f".{final.name}.old-{os.getpid()}")
            os.replace(final, old)
            shutil.rmtree(old)
        os.replace(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return manifest
