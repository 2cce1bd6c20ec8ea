"""MinHash near-duplicate removal in four restartable stages, plus an index for incremental refreshes.

DAG wiring (each task body is one call; ``cfg`` is the run's frozen :class:`MinhashConfig`)::

    signatures  = run_signatures_shard(rdir, shard, cfg)        mapped over shards   (stage 1)
    band_specs  = build_manifest(rdir, shards, cfg, data_root)  one task; returns [{"run_dir", "band"}, ...]
    bands       = run_band(rdir, band, cfg)                     mapped over bands    (stage 2)
    items       = clusters.plan_tasks(rdir, cfg, parallelism)   one task; returns T <= parallelism items
    clusters    = clusters.run_step(step, item, cfg)            each of clusters.STEPS mapped over the items
                                                                (stage 3; ``finish`` runs once)
    removal     = run_removal_shard(rdir, shard, cfg)           mapped over shards   (stage 4)
    report      = write_report(rdir, cfg)                       one task, after stage 4
    add_release(rdir, cfg, data_root, release, kept_stage)      at publish: index what shipped

Every stage skips work whose completion marker matches the config, writes atomically, and refuses inputs that
changed since stage 1 (manifest).  :func:`run_minhash` runs the whole chain in-process (CLI, tests, benchmarks).
"""

from __future__ import annotations

from pathlib import Path

from pipeline.dedup.minhash.config import (
    PRESETS,
    REASON_NEAR_DUP,
    REASON_PREVIOUS,
    MinhashConfig,
    ShingleRule,
    candidate_probability,
    check_config,
    minhash_config_from_dict,
    s_curve,
)

# The stages load lazily (PEP 562): ``pipeline.config`` imports this package for ``MinhashConfig``, and every task
# process imports ``pipeline.config``; numpy, the kernels and the index are only loaded by what uses them.
_LAZY = {"run_band": "buckets", "run_clusters": "clusters", "DedupIndex": "index", "add_release": "release",
         "MinhashError": "layout", "write_manifest": "layout", "run_removal_shard": "removal",
         "write_report": "report", "SignatureEngine": "signatures", "run_signatures_shard": "signatures",
         "to_minhash": "signatures"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def build_manifest(rdir: str | Path, shards: list[str], cfg: MinhashConfig, data_root: str | Path,
                   release: str | None = None, input_stage: str = "exact_dedup") -> list[dict]:
    """Record the stage-1 shard layout and the index releases to compare with; return one spec per band.

    ``release`` (this run's own release name, if it was indexed before, e.g. on a retry after publish) is left
    out of the comparison so a run never removes documents because of itself.
    """
    from pipeline.dedup.minhash.index import DedupIndex
    from pipeline.dedup.minhash.layout import write_manifest

    cfg = check_config(cfg)
    if not cfg.enabled:                    # the same tasks run, as no-ops, so the DAG keeps one shape
        return [{"run_dir": str(rdir), "band": b} for b in range(cfg.bands)]
    index = DedupIndex.open(data_root, cfg) if cfg.use_index else DedupIndex(None, [])
    write_manifest(Path(rdir), list(shards), cfg.digest(), cfg.fingerprint(), input_stage,
                   index.snapshot(exclude=release))
    return [{"run_dir": str(rdir), "band": b} for b in range(cfg.bands)]


def run_minhash(rdir: str | Path, shards: list[str], cfg: MinhashConfig, data_root: str | Path,
                release: str | None = None, input_stage: str = "exact_dedup", quality=None,
                parallelism: int = 1) -> dict:
    """All four stages and the report, in order, in this process; returns the report.  ``parallelism`` caps the
    clustering tasks as in the DAG (their count also depends on the candidate edges)."""
    from pipeline.dedup.minhash.buckets import run_band
    from pipeline.dedup.minhash.clusters import run_clusters
    from pipeline.dedup.minhash.removal import run_removal_shard
    from pipeline.dedup.minhash.report import write_report
    from pipeline.dedup.minhash.signatures import run_signatures_shard

    rdir = Path(rdir)
    cfg = check_config(cfg)
    for shard in shards:
        run_signatures_shard(rdir, shard, cfg, input_stage, quality)
    for spec in build_manifest(rdir, shards, cfg, data_root, release, input_stage):
        run_band(rdir, spec["band"], cfg)
    run_clusters(rdir, cfg, parallelism)
    for shard in shards:
        run_removal_shard(rdir, shard, cfg)
    return write_report(rdir, cfg)


__all__ = ["PRESETS", "REASON_NEAR_DUP", "REASON_PREVIOUS", "DedupIndex", "MinhashConfig", "MinhashError",
           "ShingleRule", "SignatureEngine", "add_release", "build_manifest", "candidate_probability",
           "check_config", "minhash_config_from_dict", "run_band", "run_clusters", "run_minhash",
           "run_removal_shard", "run_signatures_shard", "s_curve", "to_minhash", "write_report"]
