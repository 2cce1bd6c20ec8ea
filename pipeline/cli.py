"""``mindloom``: run the same stages as the DAGs, locally and without Airflow.

    mindloom demo-corpus --out data/demo-corpus          build the demo corpus from PyPI + the stdlib
    mindloom corpus [--config F] [--set k=v ...]          the whole corpus chain, with progress bars
    mindloom train  [--config F] [--set k=v ...]          one training stage over the latest corpus
    mindloom ablation [--config F] [--set k=v ...]        the ablation DAG's steps: arms, seeds, scores, report
    mindloom verify DIR [--ranks N] [--config F]          check MindRecord shards against their manifest
    mindloom export --run-id R --format mindformers|hf    a stage's final checkpoint for mindformers / transformers
    mindloom summary [--config F]                         what the latest corpus and training runs produced

Errors in the configuration or the input end with one line naming the field or file (exit 2), never a traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from pipeline.config import load_config
from pipeline.configkit import ConfigError
from pipeline.form import PARAM_FIELDS


def _overrides(pairs: list[str]) -> dict:
    """``--set train.steps=50`` / ``--set seq_len=256`` (a form-field name works too); values parsed as YAML."""
    import yaml

    out = {}
    for pair in pairs:
        if "=" not in pair:
            raise ConfigError(f"--set {pair}: expected FIELD=VALUE")
        key, raw = pair.split("=", 1)
        out[PARAM_FIELDS.get(key, key)] = yaml.safe_load(raw)
    return out


def _run_id(given: str | None) -> str:
    return given or "cli__" + datetime.now(UTC).strftime("%Y%m%dT%H%M%S")


def cmd_corpus(args) -> int:
    from pipeline.io import write_json
    from pipeline.tasks.corpus import run_all
    from pipeline.tasks.run_state import NothingToShip

    cfg = load_config(args.config, _overrides(args.set))
    try:
        summary = run_all(cfg, _run_id(args.run_id))
    except NothingToShip as skip:                    # an incremental refresh with nothing new: not an error
        print(f"mindloom: skipped: {skip}")
        return 0
    write_json(Path(cfg.data_root) / "cli" / "last_corpus.json", summary)
    print(json.dumps(summary, indent=1))
    return 0


def cmd_train(args) -> int:
    """One stage (``--stage NAME``) or every configured stage in order (``--stage all``), each as its own job;
    stages of one run share ``--run-id`` (a later stage starts from the previous stage's final checkpoint)."""
    from pipeline.tasks.corpus_choice import resolve_corpus
    from pipeline.tasks.pretrain import stage_names

    cfg = load_config(args.config, _overrides(args.set))
    names = stage_names(cfg)
    if args.stage != "all" and args.stage not in names:
        print(f"mindloom: error: --stage {args.stage!r}: not in train.stages {names} (or 'all')", file=sys.stderr)
        return 2
    corpus = resolve_corpus({}, cfg=cfg, manifest_path=args.corpus or None)
    run_id = _run_id(args.run_id)
    results = {}
    for name in names if args.stage == "all" else [args.stage]:
        result = _train_stage(cfg, corpus, run_id, name)
        if result is None:
            return 1
        results[name] = result
    print(json.dumps(results if len(results) > 1 else next(iter(results.values())), indent=1))
    return 0


def _train_stage(cfg, corpus: dict, run_id: str, stage: str) -> dict | None:
    """One stage of ``mindloom train``: its data, its job (started, or the one an earlier call left running), a
    progress bar until the job ends; the stage's result, or None after printing why it failed."""
    from pipeline.tasks.pretrain import build_job, job_state, prepare_stage_data, stage_dir, stage_result
    from pipeline.tasks.submit import start_or_reattach, stop_stage_job

    out_dir = stage_dir(cfg.data_root, run_id, stage)
    try:
        prepare_stage_data(cfg, corpus, out_dir, stage)       # the DAG's repack_<stage> task
        ext, proc, what = start_or_reattach(cfg, lambda: build_job(cfg, corpus, out_dir, stage=stage), out_dir,
                                            "launcher.cli.log")
    except (ValueError, FileNotFoundError, RuntimeError) as exc:
        print(f"mindloom: error: stage {stage}: {exc}", file=sys.stderr)
        return None
    total = json.loads((out_dir / "job.json").read_text(encoding="utf-8"))["steps"]
    log_path = ext["log"]
    where = f"Slurm job {ext['slurm_job_id']}" if ext.get("slurm_job_id") else f"pid {ext['pid']}"
    if what == "reattached":
        print(f"reconnecting to {where} of stage {stage}, which an earlier mindloom train started: not "
              f"submitting a second one", file=sys.stderr)
    print(f"training stage {stage} (run id {run_id}, {where})\n  log: {log_path}", file=sys.stderr)
    try:
        seen = _follow_stage(out_dir, ext, proc, total, stage)
    except KeyboardInterrupt:  # the job runs detached: stop it as the operator's on_kill does
        for msg in stop_stage_job(out_dir, ext, "mindloom train was interrupted"):
            print(f"mindloom: {msg}", file=sys.stderr)
        raise
    state = job_state(out_dir, job_id=ext["job_id"], seen=seen)
    if state["state"] == "LOST" and ext.get("slurm_job_id"):      # it may still hold its nodes
        for msg in stop_stage_job(out_dir, ext, f"stage {stage} was LOST"):
            print(f"mindloom: {msg}", file=sys.stderr)
    if state["state"] != "SUCCEEDED":
        print(f"mindloom: error: training {state['state']}: {state.get('error')} (log: {log_path})",
              file=sys.stderr)
        return None
    return stage_result(out_dir)


def _follow_stage(out_dir: Path, ext: dict, proc, total: int, stage: str):
    """The progress bar of one stage's job until it ends (its process exits, or its Slurm job reaches a terminal
    state); returns the last ``observed`` mark of the job state, for the final read."""
    from tqdm import tqdm

    from pipeline.tasks.pretrain import TERMINAL, job_state, read_metrics

    line, seen = 0, None
    with tqdm(total=total, desc=f"train {stage}", unit="step") as bar:
        while True:
            rows, line = read_metrics(out_dir, line)
            for r in rows:
                bar.n = r["step"]
                bar.set_postfix(loss=f"{r['loss']:.3f}", tok_s=f"{r.get('tokens_per_s', 0):.0f}")
            bar.refresh()
            if proc is not None:
                if proc.poll() is not None:
                    break
            else:  # Slurm: the job's own state, as the operator reads it
                state = job_state(out_dir, job_id=ext["job_id"], seen=seen)
                seen = state.get("observed")
                if state["state"] in TERMINAL:
                    break
            time.sleep(0.5)
    return seen


def cmd_ablation(args) -> int:
    """The ``ablation`` DAG's steps in order (``pipeline.tasks.ablation.run_all``); prints the report table."""
    from pipeline.tasks.ablation import run_all

    cfg = load_config(args.config, _overrides(args.set))
    out = run_all(cfg, _run_id(args.run_id))
    print(Path(out["report"]).with_suffix(".md").read_text(encoding="utf-8"))
    print(f"report: {out['report']}")
    return 0


def cmd_verify(args) -> int:
    """The explicit full check: every file hashed and every row re-read (the pipeline itself checks sizes only)."""
    from pipeline.sink.mindrecord import verify

    mem = load_config(args.config).pack.verify_mem_mb      # the reader's address-space limit
    print(json.dumps(verify(args.dir, full_read=True, num_shards=args.ranks, mem_limit_mb=mem), indent=1))
    return 0


def cmd_export(args) -> int:
    """``--stage-dir DIR``, or ``--run-id`` (+ ``--stage``, default the last configured stage) under data_root."""
    from pipeline.export.run import export_stage
    from pipeline.tasks.pretrain import stage_dir, stage_names

    if args.stage_dir:
        folder = Path(args.stage_dir)
    elif args.run_id:
        cfg = load_config(args.config)
        folder = stage_dir(cfg.data_root, args.run_id, args.stage or stage_names(cfg)[-1])
    else:
        raise ConfigError("export: give --run-id RUN (and --stage NAME) or --stage-dir DIR")
    print(json.dumps(export_stage(folder, args.format, out=args.out, device=args.device), indent=1))
    return 0


def cmd_demo_corpus(args) -> int:
    from pipeline.democorpus import main as democorpus_main

    argv = ["--out", args.out, "--cache", args.cache] + (["--domains", args.domains] if args.domains else [])
    return democorpus_main(argv) or 0


def cmd_summary(args) -> int:
    from pipeline.report.summary import render_summary

    print(render_summary(load_config(args.config).data_root))
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="mindloom", description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("-v", "--verbose", action="store_true")
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name, fn in (("corpus", cmd_corpus), ("train", cmd_train), ("ablation", cmd_ablation)):
        p = sub.add_parser(name)
        p.add_argument("--config", help="YAML config (default: $MINDLOOM_CONFIG or configs/default.yaml)")
        p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="override a config field")
        p.add_argument("--run-id", help="run id (default: cli__<UTC time>)")
        if name == "train":
            p.add_argument("--stage", default="all", help="stage name, or all (every stage in order)")
            p.add_argument("--corpus", help="corpus_summary.json to train on (default: the latest)")
        p.set_defaults(fn=fn)
    p = sub.add_parser("verify")
    p.add_argument("dir", help="MindRecord folder with manifest.json")
    p.add_argument("--ranks", type=int, default=None, help="also read as N data-parallel ranks")
    p.add_argument("--config", help="YAML config whose pack.verify_mem_mb limits the reader (default: "
                                    "$MINDLOOM_CONFIG or configs/default.yaml)")
    p.set_defaults(fn=cmd_verify)
    p = sub.add_parser("export")
    p.add_argument("--format", required=True, choices=("mindformers", "hf"))
    p.add_argument("--run-id", help="training run id (its folder under <data_root>/train)")
    p.add_argument("--stage", help="stage name (default: the last of train.stages)")
    p.add_argument("--stage-dir", help="a finished stage folder, instead of --run-id/--stage")
    p.add_argument("--out", help="output folder (default: <stage folder>/export/<format>)")
    p.add_argument("--device", default="", choices=("", "CPU", "GPU", "Ascend"),
                   help="mindformers: device the model YAML is for (default: the stage's own)")
    p.add_argument("--config")
    p.set_defaults(fn=cmd_export)
    p = sub.add_parser("demo-corpus")
    p.add_argument("--out", default="data/demo-corpus")
    p.add_argument("--cache", default=".cache/demo-sources")
    p.add_argument("--domains", default="", help="comma-separated subset")
    p.set_defaults(fn=cmd_demo_corpus)
    p = sub.add_parser("summary")
    p.add_argument("--config")
    p.set_defaults(fn=cmd_summary)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    from pipeline.ingest.run import IngestError
    from pipeline.sink.mindrecord import ShardError

    try:
        return args.fn(args)
    except (ConfigError, IngestError, ShardError, FileNotFoundError, ValueError) as exc:
        print(f"mindloom: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
