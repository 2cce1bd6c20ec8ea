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

_CONFIGS: dict[str, tuple[tuple[int, int], MindloomConfig]] = {}     # path -> ((mtime_ns, size), config)


class NothingToShip(Exception):  # noqa: N818 - an outcome, not an error
    """An incremental refresh (``minhash.use_index``) whose sources brought nothing new, or too little to fill one
    training row: the run ends skipped with this one line, publishes no corpus and starts no training.  Raised by
    the first task that finds it; the DAG turns it into Airflow's skip (``operators.skips``), the CLI into one line
    and exit 0.  A build without the index that keeps nothing is an error instead."""


def load_run_config(rdir: str | Path) -> MindloomConfig:
    """The run's frozen configuration (``config.json``), as a copy the caller may change.

    Every task and every shard of a task reads it: building the typed config from JSON (type hints, checks) is
    not free, and paid once per shard of every stage it added up over a run.  A process keeps the built config per
    file (checked against its mtime and size) and hands out deep copies, which cost far less.
    """
    import copy
    import os

    path = str(Path(rdir) / "config.json")
    st = os.stat(path)
    key = (st.st_mtime_ns, st.st_size)
    hit = _CONFIGS.get(path)
    if hit is None or hit[0] != key:
        hit = _CONFIGS[path] = (key, config_from_dict(read_json(path)))
        if len(_CONFIGS) > 8:                         # a long-lived worker sees many runs: keep the latest few
            _CONFIGS.pop(next(iter(_CONFIGS)))
    return copy.deepcopy(hit[1])


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

