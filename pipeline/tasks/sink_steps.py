"""The sink's tasks: mixture plan, scatter into key ranges, one writer task per batch of output files, the
training set's manifest, and the held-out validation sets.

Each is one call of the ``corpus_build`` DAG (and of ``mindloom corpus``), through
:func:`pipeline.tasks.corpus.run_step`.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.io import read_json
from pipeline.profile import measured
from pipeline.sink import megatron, mindrecord, mixture, scatter, validation
from pipeline.sink import shards as sink_files
from pipeline.tasks import batches
from pipeline.tasks.run_state import load_run_config, profiled, run_of
from pipeline.tokenizer import run as tokenizer


@profiled("plan_mixture")
def plan_mixture(specs: list[dict]) -> dict:
    """Held-out split and per-document copies for the target domain mixture; returns target vs achieved."""
    rdir, shards = run_of(specs)
    cfg = load_run_config(rdir)
    return mixture.plan_mixture(cfg.mixture, rdir, shards, cfg.seed)


def _tokenizer_info(rdir: Path) -> dict:
    return read_json(rdir / "tokenizer" / "spm.model.done")["info"]


def _sink_final(rdir: Path) -> dict | None:
    """The run's finished MindRecord set when it was written with the run's current config (a rerun skips the
    sink; a Clear after a config change writes it again)."""
    path = rdir / "mindrecord" / mindrecord.MANIFEST
    if not path.exists():
        return None
    manifest = read_json(path)
    return manifest if manifest.get("config_sha256") == load_run_config(rdir).digest() else None


def sink_scatter_batch(batch: dict, specs: list[dict]) -> dict:
    """Sink step 1 (per shard batch): put its shards' training copies into the key-range buckets, merged into the
    batch's one scatter part."""
    rdir = Path(batch["run_dir"])
    if _sink_final(rdir):
        return {"part": None, "skipped": "the MindRecord set is final"}
    layout = _sink_layout(rdir)
    cfg = load_run_config(rdir)
    return scatter.run_scatter_part(rdir, scatter.part_name(batch["task"], batch["of"]), [s["shard"] for s in specs],
                                    seed=cfg.seed, n_files=layout["n_files"], domains=layout["domains"])


def scatter_parts(rdir: Path) -> list[str]:
    """The scatter parts of the run, one per shard batch (as :func:`pipeline.tasks.corpus.plan_tasks` cut them)."""
    handles = batches.plan_batches(rdir, len(batches.shard_names(rdir)), load_run_config(rdir).parallelism)
    return [scatter.part_name(h["task"], h["of"]) for h in handles]


def _sink_layout(rdir: Path) -> dict:
    p = load_run_config(rdir).pack
    return mindrecord.sink_layout(rdir, seq_len=p.seq_len, shard_mb=p.shard_mb, shard_num=p.shard_num,
                                  add_bos=p.add_bos, remainder=p.remainder)


def _write_args(rdir: Path) -> dict:
    cfg = load_run_config(rdir)
    tok = _tokenizer_info(rdir)
    p = cfg.pack
    pad = tok.get("pad_id", tokenizer.PAD_ID)
    return dict(seq_len=p.seq_len, eos_id=tok.get("eos_id", tokenizer.EOS_ID),
                bos_id=tok.get("bos_id", tokenizer.BOS_ID) if p.add_bos else None,
                pad_id=mindrecord.FILE_PAD if pad is None or pad < 0 else pad, remainder=p.remainder,
                domain_field=p.domain_field, boundaries=p.boundaries,
                n_domains=len(_sink_layout(rdir)["domains"]),
                megatron_dtype=megatron.token_dtype(tok["vocab_size"]) if "megatron" in p.formats else None)


@profiled("sink_files")
def sink_file_batches(specs: list[dict]) -> list[dict]:
    """The writer tasks: ``parallelism`` handles over the output files (after every shard is scattered)."""
    rdir = Path(specs[0]["run_dir"])
    return batches.plan_batches(rdir, _sink_layout(rdir)["n_files"], load_run_config(rdir).parallelism, "files")


def write_file_batch(batch: dict) -> dict:
    """Sink step 2 (per output file): pack and write the batch's MindRecord files (their rows of the corpus stream),
    ``pack.write_workers`` at once; each writer verifies its own file."""
    rdir = Path(batch["run_dir"])
    if _sink_final(rdir):
        return {"task": batch["task"], "of": batch["of"], "files": 0, "samples": 0,
                "skipped": "the MindRecord set is final"}
    n_files = _sink_layout(rdir)["n_files"]
    files = list(range(batch["first"], batch["last"] + 1))
    pack = load_run_config(rdir).pack
    workers = batches.pool_size(pack.write_workers, len(files))
    parts = scatter_parts(rdir)
    jobs = [(rdir, k, n_files, parts, {**_write_args(rdir), "verify_mem_mb": pack.verify_mem_mb}) for k in files]
    with measured(rdir, "sink_write", batches.batch_unit(batch)) as prof:
        if workers > 1:
            from concurrent.futures import ProcessPoolExecutor
            from multiprocessing import get_context

            with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
                entries = list(pool.map(mindrecord.write_file_job, jobs))
        else:
            entries = [mindrecord.write_file_job(j) for j in jobs]
        prof.update(files=len(files), samples=sum(e["samples"] for e in entries), workers=workers)
    return {"task": batch["task"], "of": batch["of"], "files": len(files),
            "samples": sum(e["samples"] for e in entries)}


@profiled("sink_finalize")
def finalize_mindrecord(specs: list[dict]) -> dict:
    """Sink step 3: assemble the training MindRecord set from the writers' markers; return a summary.

    Reads no MindRecord data: each writer verified its own file; this step checks the markers, the row deal and
    the split over ``train.workers`` ranks (``mindloom verify`` re-reads everything on request).
    """
    rdir, _ = run_of(specs)
    cfg = load_run_config(rdir)
    tok = _tokenizer_info(rdir)
    layout = _sink_layout(rdir)
    args = _write_args(rdir)
    manifest = sink_files.finalize_set(
        rdir, layout["n_files"], scatter_parts(rdir), seq_len=cfg.pack.seq_len, domains=layout["domains"],
        domain_field=cfg.pack.domain_field, boundaries=cfg.pack.boundaries, num_shards=cfg.train.workers,
        extra=mindrecord.set_extra(rdir, layout, seed=cfg.seed, vocab_size=tok["vocab_size"],
                                   tokenizer_sha256=tok["sha256"], config_sha256=cfg.digest(), mixture=True,
                                   extends_release=_extends(tok), **args))
    return manifest_summary(rdir, manifest)


def _extends(tok: dict) -> dict | None:
    """The release an incremental refresh extends, as the manifest records it (None for any other run)."""
    if not tok.get("extends_release"):
        return None
    return {"name": tok["extends_release"], "tokenizer_sha256": tok["release_tokenizer_sha256"]}


@profiled("write_validation")
def write_validation(specs: list[dict]) -> dict:
    """Write the held-out MindRecord sets, one per domain (``mindrecord_val/<domain>/``), verified as written.

    Written in a spawned process and verified from this one: MindSpore's MindRecord writer adds MindSpore's memory
    to the process that imports it, and a worker that runs task after task (``airflow dags test``, the CLI) kept it
    for every later task (the scatter tasks beside this one then peaked with it on top of their own); and the
    writer's process is gone before the verifying reader starts."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    rdir, _ = run_of(specs)
    done = validation.finished(rdir)
    if done is not None:
        return done
    cfg = load_run_config(rdir)
    tok = _tokenizer_info(rdir)
    with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool:
        tmp = pool.submit(
            validation.write_sets, rdir, seq_len=cfg.pack.seq_len, add_bos=cfg.pack.add_bos,
            eos_id=tok.get("eos_id", tokenizer.EOS_ID), bos_id=tok.get("bos_id", tokenizer.BOS_ID),
            pad_id=tok.get("pad_id", tokenizer.PAD_ID), vocab_size=tok["vocab_size"], tokenizer_sha256=tok["sha256"],
            config_sha256=cfg.digest(), domain_field=cfg.pack.domain_field, boundaries=cfg.pack.boundaries).result()
    return validation.commit_sets(rdir, tmp, mem_limit_mb=cfg.pack.verify_mem_mb)


def manifest_summary(rdir: Path, manifest: dict) -> dict:
    return {"run_dir": str(rdir), "mindrecord_dir": str(rdir / "mindrecord"),
            "manifest": str(rdir / "mindrecord" / mindrecord.MANIFEST), "samples": manifest["samples"],
            "tokens": manifest["tokens"], "shards": len(manifest["shards"]), "seq_len": manifest["seq_len"],
            "vocab_size": manifest["vocab_size"], "tokenizer": str(rdir / "tokenizer" / "spm.model"),
            "tokens_per_domain": manifest["tokens_per_domain"], "tokenizer_sha256": manifest["tokenizer_sha256"],
            "config_sha256": manifest["config_sha256"], "pad_id": manifest.get("pad_id"),
            "eos_id": manifest.get("eos_id"), "extends_release": manifest.get("extends_release"),
            "val_mindrecord_dir": str(rdir / validation.VAL_DIR),
            "mixture_report": str(rdir / "mixture" / "report.json")}
