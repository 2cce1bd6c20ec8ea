"""Data ablation: the ``debug`` model trained for the same token budget on (a) the raw ingested corpus and (b)
mindloom's output, scored on the same clean held-out set per domain; and the long-context stage, scored at 4× the
base context, with and without it.

    .venv/bin/python benchmarks/ablation.py [--steps 300] [--long-steps 50] [--quick]     (make ablation)

1. The corpus chain (``pipeline.tasks.corpus.run_all``, configs/default.yaml, sources = ``../shared/corpora``, else the
   demo corpus) writes (b): exact + MinHash dedup, quality chains, natural proportions, and the held-out validation
   sets ``<run>/mindrecord_val/<domain>/`` (5 % of each domain's surviving documents, at least 8).
2. (a) is built from the chain's own ingest output — every document, no dedup, no filters, natural proportions —
   with the chain's tokenizer and packing, minus the held-out documents, their exact copies (same text hash) and
   the near-duplicates MinHash clustered with them: without that, (a) would train on copies of the evaluation
   text and its held-out loss would measure leakage, not data quality.
3. Both train from the same initial weights with the same recipe and token budget (``--steps`` × 8 rows × 128
   tokens), through ``pipeline.tasks.pretrain.build_job`` + ``python -m pipeline.train``; the stage's own evaluation
   scores the same held-out tokens of each domain.
4. Long context (on (b)): from (b)'s checkpoint, four variants scored at 4 × 128 = 512 tokens (and at 128):
   plain RoPE without further training; NTK-scaled RoPE without training; the ``long_context`` stage (512-token
   rows re-packed from the corpus, NTK factor 4, ``--long-steps``); and, as the control for the extra tokens, the
   same number of tokens more at 128 with plain RoPE.  One evaluation worker scores them all (same code path).

One seed, a 2-million-parameter model, a few hundred thousand tokens: differences of a few hundredths of a nat are
within run-to-run noise, and the held-out sets come from the curated side's distribution (they are what survives
the filters), which favours (b) by construction; the table says what was measured, including where (b) loses.
Writes ``benchmarks/results/ablation.json``, ``ablation_eval.svg``, ``ablation_loss.svg``, then merges into
``benchmarks/results.json`` and regenerates BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ablation_report import markdown  # noqa: E402
from common import REPO, RESULTS_DIR, PeakSampler, machine, source_corpus  # noqa: E402

BASE_SEQ, LONG_FACTOR, BATCH = 128, 4, 8


def chain_config(corpus: Path, data_root: Path, steps: int, long_steps: int, eval_tokens: int) -> dict:
    from pipeline.config import load_config

    d = load_config(REPO / "configs" / "default.yaml").to_dict()
    d["sources"] = [{"domain": f.stem, "reader": "jsonl", "paths": [str(f)], **({"lang": "code"} if f.stem == "code"
                                                                                  else {})}
                    for f in sorted(corpus.glob("*.jsonl"))]
    d["data_root"] = str(data_root)
    d["pack"].update(seq_len=BASE_SEQ, shard_num=2)
    d["mixture"].update(weights={}, val_fraction=0.05, val_min_docs=8)
    lr = {"lr": 3e-4, "min_lr": 3e-5, "warmup_steps": 2, "checkpoint_every": 10**6}
    d["train"].update(preset="debug", batch_size=BATCH, eval_tokens=eval_tokens, checkpoint_every=10**6, stages=[
        {"name": "main", "overrides": {"steps": steps, "warmup_steps": max(1, steps // 20)}},
        {"name": "long_context", "seq_len": BASE_SEQ * LONG_FACTOR, "init": "previous",
         "overrides": {"steps": long_steps, "batch_size": BATCH // LONG_FACTOR, **lr},
         "model_overrides": {"rope_scaling_type": "ntk", "rope_scaling_factor": float(LONG_FACTOR)}},
        {"name": "more_base", "init": "previous", "overrides": {"steps": long_steps, **lr}}])
    return d


# ------------------------------------------------------------------------------------------------------------
# (a): the raw ingested corpus with the held-out documents (and their copies) taken out


def raw_token_set(rdir: Path, out: Path, seed: int) -> dict:
    """Tokenize every ingested document except the held-out ones and their exact / near copies; write MindRecord."""
    import numpy as np
    import pyarrow.parquet as pq

    from pipeline.io import read_json
    from pipeline.sink import mindrecord, packing
    from pipeline.tokenizer import run as tokenizer

    if (out / mindrecord.MANIFEST).exists():
        return read_json(out / mindrecord.MANIFEST)
    held = set(pq.read_table(rdir / "mixture" / "heldout.parquet", columns=["doc_id"]).column(0).to_pylist())
    near = set()
    for f in sorted((rdir / "minhash" / "clusters").glob("*.parquet")):
        t = pq.read_table(f)
        if {"doc_id", "kept_doc_id"} <= set(t.column_names):
            near |= {d for d, k in zip(t.column("doc_id").to_pylist(), t.column("kept_doc_id").to_pylist(),
                                       strict=True) if k in held}
    docs = [r for f in sorted((rdir / "ingest").glob("*.parquet"))
            for r in pq.read_table(f, columns=["doc_id", "domain", "text", "text_hash"]).to_pylist()]
    banned_hashes = {r["text_hash"] for r in docs if r["doc_id"] in held or r["doc_id"] in near}
    keep = [r for r in docs if r["text_hash"] not in banned_hashes]
    info = read_json(rdir / "tokenizer" / "spm.model.done")["info"]
    flat, lens = tokenizer.encode_texts(info["model"], [r["text"] for r in keep], workers=os.cpu_count() or 1)
    ids = [r["doc_id"] for r in keep]
    idx, keys = packing.order_keys(seed, ids, np.ones(len(ids), np.int64))
    order = idx[np.argsort(keys, kind="stable")]
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    manifest = mindrecord.write_token_set(
        tmp, [r["domain"] for r in keep], (flat, np.cumsum(lens) - lens, lens, order), seq_len=BASE_SEQ, shard_num=2,
        name="corpus", eos_id=info.get("eos_id", tokenizer.EOS_ID), bos_id=None,
        pad_id=info.get("pad_id", tokenizer.PAD_ID), extra={
            "vocab_size": info["vocab_size"], "tokenizer_sha256": info["sha256"], "ingested_docs": len(docs),
            "excluded": {"heldout": len(held), "near_duplicates_of_heldout": len(near),
                         "all_with_their_text_hashes": len(docs) - len(keep)}})
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return manifest


# ------------------------------------------------------------------------------------------------------------
# Training (python -m pipeline.train) and evaluation at other context lengths (a worker process)


def train(cfg, corpus: dict, out_dir: Path, stage: str, log: Path, init_from: str | None = None) -> dict:
    from pipeline.tasks.pretrain import build_job, stage_result

    job = build_job(cfg, corpus, out_dir, stage=stage, init_from=init_from)
    with open(log, "ab") as fh:
        p = subprocess.run([sys.executable, "-m", "pipeline.train", "--job", str(job)], cwd=REPO, stdout=fh,
                           stderr=subprocess.STDOUT)
    if p.returncode:
        raise RuntimeError(f"training {out_dir} failed (rc {p.returncode}); see {log}")
    return stage_result(out_dir)


def eval_worker(spec: dict) -> dict:
    """Score one checkpoint at several context lengths; the model config may differ from training (RoPE)."""
    import mindspore as ms

    from pipeline.train import checkpoint
    from pipeline.train.config import ModelConfig
    from pipeline.train.evaluate import evaluate, make_scorer
    from pipeline.train.model import CausalLMLoss, Transformer

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    out = {}
    for seq in spec["seq_lens"]:
        cfg = ModelConfig.from_preset("debug", **{**spec["model"], "max_seq_len": seq})
        net = Transformer(cfg)
        checkpoint.load_weights(net, spec["checkpoint"])
        score = make_scorer(CausalLMLoss(net, reduction="sum"), jit=True)
        ev = evaluate(score, spec["eval_data"], seq_len=seq, batch_size=max(1, spec["batch_rows"] // (seq // BASE_SEQ)),
                      max_tokens=spec["eval_tokens"], pad_id=cfg.pad_id)
        out[str(seq)] = {"all": ev["all"]["loss"], **{d: v["loss"] for d, v in ev["per_domain"].items()}}
    return out


def evaluate_at(checkpoint: str, model: dict, eval_data: dict, eval_tokens: int, log: Path) -> dict:
    spec = {"checkpoint": checkpoint, "model": model, "eval_data": eval_data, "eval_tokens": eval_tokens,
            "seq_lens": [BASE_SEQ, BASE_SEQ * LONG_FACTOR], "batch_rows": BATCH}
    with open(log, "ab") as fh:
        p = subprocess.run([sys.executable, __file__, "--eval-worker", json.dumps(spec)], cwd=REPO,
                           stdout=subprocess.PIPE, stderr=fh, text=True)
    if p.returncode:
        raise RuntimeError(f"evaluation of {checkpoint} failed; see {log}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def _model_of(summary: dict) -> dict:
    m = dict(summary["model"])
    m.pop("max_seq_len", None)
    return m


def _losses(summary: dict) -> dict:
    ev = summary["eval"]
    return {"all": ev["all"]["loss"], **{d: v["loss"] for d, v in ev["per_domain"].items()}}


# ------------------------------------------------------------------------------------------------------------


def run(args) -> dict:
    from pipeline.config import config_from_dict
    from pipeline.io import read_json
    from pipeline.tasks import corpus as chain
    from pipeline.tasks.pretrain import find_eval_sets

    work = args.work
    log = work / "ablation.log"
    src = args.corpus or source_corpus()
    if src is None:
        subprocess.run([sys.executable, "-m", "pipeline.democorpus", "--out", str(REPO / "data" / "demo-corpus")],
                       check=True, cwd=REPO)
        src = source_corpus()
    cfg = config_from_dict(chain_config(src, work / "data", args.steps, args.long_steps, args.eval_tokens))
    # the chain output and the raw set are reused by later runs with the same data settings (not train.*)
    data_key = hashlib.sha256(json.dumps({k: v for k, v in cfg.to_dict().items() if k != "train"},
                                         sort_keys=True, default=str).encode()).hexdigest()[:12]
    run_id, raw_dir = f"ablation-{data_key}", work / f"raw-{data_key}"
    t = {"chain_reused": (Path(cfg.data_root) / "runs" / run_id / "corpus_summary.json").exists()}
    t0 = time.time()
    summary = chain.run_all(cfg, run_id, progress=False)
    t["chain_s"] = round(time.time() - t0, 1)
    rdir = Path(summary["run_dir"])
    t0 = time.time()
    raw = raw_token_set(rdir, raw_dir, cfg.seed)
    t["raw_set_s"] = round(time.time() - t0, 1)
    curated = read_json(rdir / "mindrecord" / "manifest.json")
    corpus_b = {k: v for k, v in summary.items() if k != "stats"}
    corpus_a = {**corpus_b, "mindrecord_dir": str(raw_dir), "run_dir": str(rdir)}
    res = {"command": " ".join(["benchmarks/ablation.py", *sys.argv[1:]]), "machine": machine(), "corpus": str(src),
           "budget": {"steps": args.steps, "rows_per_step": BATCH, "seq_len": BASE_SEQ,
                      "tokens": args.steps * BATCH * BASE_SEQ, "long_steps": args.long_steps,
                      "long_seq_len": BASE_SEQ * LONG_FACTOR, "eval_tokens_per_domain": args.eval_tokens},
           "data": {"raw": _set_info(raw), "curated": _set_info(curated)},
           "eval_sets": read_json(rdir / "mindrecord_val" / "manifest.json")["sets"], "timings": t}
    runs = {}
    for name, corpus in (("raw", corpus_a), ("curated", corpus_b)):
        t0 = time.time()
        s = train(cfg, corpus, work / "train" / name / "main", "main", log)
        t[f"train_{name}_s"] = round(time.time() - t0, 1)
        runs[name] = {"first_loss": s["first_loss"], "final_loss": s["final_loss"], "tokens": s["tokens"],
                      "tokens_per_s": s["tokens_per_s"], "eval": _losses(s), "eval_seq_len": s["eval"]["seq_len"],
                      "curve": _curve(_metrics(work / "train" / name / "main"))}
    res["runs"] = runs
    eval_data = find_eval_sets(corpus_b)
    main_b = read_json(work / "train" / "curated" / "main" / "summary.json")
    t0 = time.time()
    long_s = train(cfg, corpus_b, work / "train" / "curated" / "long_context", "long_context", log)
    # the control continues from main (not from long_context, which precedes it in the stage list)
    more_s = train(cfg, corpus_b, work / "train" / "curated" / "more_base", "more_base", log,
                   init_from=main_b["checkpoint"])
    t["long_and_control_train_s"] = round(time.time() - t0, 1)
    t0 = time.time()
    plain = _model_of(main_b)
    ntk = {**plain, "rope_scaling_type": "ntk", "rope_scaling_factor": float(LONG_FACTOR)}
    variants = {
        "no long-context stage, plain RoPE": (main_b["checkpoint"], plain, 0),
        "no long-context stage, NTK RoPE at inference": (main_b["checkpoint"], ntk, 0),
        f"long_context stage ({args.long_steps} steps at 512, NTK ×{LONG_FACTOR})": (long_s["checkpoint"],
                                                                                   _model_of(long_s), args.long_steps),
        f"control: {args.long_steps} more steps at 128, plain RoPE": (more_s["checkpoint"], _model_of(more_s),
                                                                      args.long_steps)}
    res["long_context"] = {name: {"extra_steps": steps, "loss": evaluate_at(ck, model, eval_data, args.eval_tokens,
                                                                            log)}
                           for name, (ck, model, steps) in variants.items()}
    res["long_context_stage_own_eval"] = _losses(long_s)
    t["long_eval_s"] = round(time.time() - t0, 1)
    res["plots"] = write_plots(res, args.out_dir)
    res["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    return res


def _set_info(manifest: dict) -> dict:
    return {"rows": manifest["samples"], "tokens": manifest["tokens"], "documents": manifest.get("documents"),
            "token_share": {d: round(v, 4) for d, v in manifest.get("token_share", {}).items()},
            "excluded": manifest.get("excluded")}


def _curve(rows: list[dict], points: int = 100) -> list[tuple[int, float]]:
    """(step, mean loss of the steps since the previous point): at most ``points`` points for the plot."""
    every = max(1, -(-len(rows) // points))
    return [(rows[min(i + every, len(rows)) - 1]["step"],
             round(sum(r["loss"] for r in rows[i:i + every]) / len(rows[i:i + every]), 4))
            for i in range(0, len(rows), every)]


def _metrics(out_dir: Path) -> list[dict]:
    path = out_dir / "metrics.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def write_plots(res: dict, out_dir: Path) -> dict:
    sys.path.insert(0, str(REPO))
    from pipeline.report.plots import bar_chart, line_chart

    runs = res["runs"]
    doms = [d for d in runs["curated"]["eval"] if runs["raw"]["eval"].get(d) is not None]
    eval_svg = bar_chart({d: {"(a) raw": runs["raw"]["eval"][d], "(b) mindloom": runs["curated"]["eval"][d]}
                          for d in doms}, "Held-out loss per domain (lower is better)", "loss (nats/token)",
                         width=max(520, 70 * len(doms)))
    smooth = {f"({'a' if n == 'raw' else 'b'}) {n}": _smooth(runs[n]["curve"], 3) for n in ("raw", "curated")}
    loss_svg = line_chart(smooth, "Training loss, each on its own data (moving average)", "step", "loss")
    paths = {"eval": out_dir / "ablation_eval.svg", "loss": out_dir / "ablation_loss.svg"}
    out_dir.mkdir(parents=True, exist_ok=True)
    for key, svg in (("eval", eval_svg), ("loss", loss_svg)):
        paths[key].write_text(svg + "\n", encoding="utf-8")
    return {k: str(p.relative_to(REPO)) if p.is_relative_to(REPO) else str(p) for k, p in paths.items()}


def _smooth(curve: list, k: int = 10) -> list[tuple[float, float]]:
    out = []
    for i in range(len(curve)):
        window = [c[1] for c in curve[max(0, i - k + 1): i + 1]]
        out.append((curve[i][0], sum(window) / len(window)))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300, help="optimizer steps of each model (8 rows x 128 tokens)")
    ap.add_argument("--long-steps", type=int, default=50, help="steps of the long-context stage and its control")
    ap.add_argument("--eval-tokens", type=int, default=16384, help="held-out tokens per domain")
    ap.add_argument("--quick", action="store_true", help="20 steps, 4 long steps, 2048 eval tokens, results kept in "
                    "--work (smoke)")
    ap.add_argument("--corpus", type=Path)
    ap.add_argument("--work", type=Path, default=REPO / ".cache" / "bench" / "ablation")
    ap.add_argument("--no-report", action="store_true", help="do not touch results.json / BENCHMARKS.md")
    ap.add_argument("--eval-worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.eval_worker:
        print(json.dumps(eval_worker(json.loads(args.eval_worker))))
        return 0
    sys.path.insert(0, str(REPO))
    if args.quick:                 # a smoke run: its results stay in the work folder
        args.steps, args.long_steps, args.eval_tokens, args.no_report = 20, 4, 2048, True
    args.out_dir = args.work if args.quick else RESULTS_DIR
    shutil.rmtree(args.work / "train", ignore_errors=True)          # the chain output is reused, training is not
    args.work.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    with PeakSampler(interval=0.2) as peak:
        res = run(args)
    res["wall_s"] = round(time.time() - t0, 1)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "ablation.json").write_text(json.dumps(res, indent=1) + "\n", encoding="utf-8")
    print("\n".join(markdown(res)))
    if not args.no_report:
        import run_all
        from common import RESULTS_JSON, now

        record = {"title": "Ablation: raw vs curated data, and the long-context stage", "issue": 10,
                  "commands": [".venv/bin/python " + res["command"]], "wall_s": [res["wall_s"]],
                  "peak_rss_mb": [peak.peak_mb], "cpu_s": [], "load_avg_before": [res["machine"]["load_avg_start"][0]],
                  "status": "ok", "date": now()}
        results = run_all.load_results(RESULTS_JSON)
        run_all.merge_topic(results, "ablation", record, [{"ablation.json": res}],
                            run_all.topic_metrics("ablation", [{"ablation.json": res}]))
        run_all.save_results(results, RESULTS_JSON, REPO / "BENCHMARKS.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
