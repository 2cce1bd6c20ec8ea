"""The pretrain DAG's ``export`` task: the last stage's final checkpoint in every format of ``export.formats``.

The result is also written to ``<data_root>/models/LATEST.json`` (the ``mindloom_model`` Asset's URI), so the newest
exported model can be found without Airflow, as the newest corpus is from ``corpus/LATEST.json``.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.io import write_json


def latest_model_path(data_root: str | Path) -> Path:
    return Path(data_root) / "models" / "LATEST.json"


def export_run(params: dict, run_id: str, stage: str | None = None) -> dict:
    """Export ``stage`` (default: the last configured one) of training run ``run_id``; returns the paths."""
    from pipeline.export.run import export_stage
    from pipeline.form import config_from_params
    from pipeline.tasks.pretrain import stage_dir, stage_names

    cfg = config_from_params(params)
    stage = stage or stage_names(cfg)[-1]
    folder = stage_dir(cfg.data_root, run_id, stage)
    formats = {}
    for fmt in cfg.export.formats:
        m = export_stage(folder, fmt, device=cfg.export.device)
        formats[fmt] = {"dir": m["dir"], "step": m["step"], "checkpoint": m["checkpoint"],
                        "files": sorted(m["files"])}
    result = {"run_id": run_id, "stage": stage, "formats": formats}
    if formats:
        write_json(latest_model_path(cfg.data_root), result)
    return result
