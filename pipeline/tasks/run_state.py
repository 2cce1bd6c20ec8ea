"""What every corpus task reads first: the run's frozen configuration, its output shards, its profile wrapper.

Shared by :mod:`pipeline.tasks.corpus` (the chain's entry points) and :mod:`pipeline.tasks.sink_steps` (the sink's
tasks), so neither imports the other's internals.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.config import MindloomConfig, config_from_dict
from pipeline.ingest import output as ingest_output
from pipeline.io import read_json
from pipeline.profile import measured
from pipeline.tasks import batches


def load_run_config(rdir: str | Path) -> MindloomConfig:
    return config_from_dict(read_json(Path(rdir) / "config.json"))


def run_of(items: list[dict]) -> tuple[Path, list[str]]:
    """The run folder and every output shard of ingest, in plan order, from batch handles or any item with
    ``run_dir``: the plan shards from the compact shard index (not ``plan.json``), each expanded into the output
    shards its ingest marker lists (a plan shard may have given several: ``pipeline.ingest.output``)."""
    rdir = Path(items[0]["run_dir"])
    return rdir, [p for s in batches.shard_names(rdir) for p in ingest_output.output_shards(rdir, s)]


def profiled(stage: str):
    """Profile a task that takes the run's specs (or one band/partition spec) under ``profile/<stage>/``."""
    import functools

    def deco(fn):
        @functools.wraps(fn)
        def wrapper(first, *args, **kwargs):
            ref = first[0] if isinstance(first, list) else first
            unit = "all" if isinstance(first, list) else next(
                (str(ref[k]) for k in ("band", "partition", "task") if k in ref), "all")
            with measured(ref["run_dir"], stage, f"{unit}"):
                return fn(first, *args, **kwargs)
        return wrapper
    return deco

