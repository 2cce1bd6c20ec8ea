"""Data ablation: the same ``debug`` model, for the same token budget and with 3 seeds, trained on (a) the raw
ingested corpus, (b) the shipped chain's output (dedup + heuristic filters), (c) (b) plus the quality classifier and
(d) dedup + the classifier alone; scored on reference texts held out per domain *before ingest*, which no arm and no
filter ever saw; and the long-context stage, scored at 4x the base context, with and without it.

    .venv/bin/python benchmarks/ablation.py [--steps 400] [--seeds 3] [--quick]     (make ablation)

1. ``ablation_data.split_sources`` holds out up to 40 documents per domain of ``../shared/corpora`` (else the demo
   corpus) before anything reads them; they are also every filtered arm's decontamination set, and the raw arm drops
   the same overlapping documents, so no arm trains on a reference text.
2. The corpus chain (``pipeline.tasks.corpus.run_all``, configs/default.yaml with those sources) runs once per
   filtered arm; (b) trains the tokenizer, the other arms and the evaluation load it.
3. Every arm trains from the same initial weights per seed (the seed sets initialisation and data order), through
   ``pipeline.tasks.pretrain.build_job`` + ``python -m pipeline.train``, for ``--steps`` x 8 rows x 128 tokens.
4. ``ablation_eval`` scores every checkpoint on the references: loss per domain, and a 4-way multiple-choice
   continuation task (HellaSwag-style, chance 25 %). The report gives mean +- 95 % t interval over seeds, per arm and
   per domain, and of the paired differences between arms (same seed, same items).
5. Long context (on (b), first seed): plain RoPE, NTK-scaled RoPE without training, the ``long_context`` stage, and
   the same extra tokens at 128 as control, scored by one worker on the chain's validation sets.

The model (about 2 M parameters) and budget (a few hundred thousand tokens) are small-model proxies, far below the
published ones (DCLM's smallest scale: 412 M parameters, 8.2 B tokens; FineWeb's ablations: 1.82 B parameters, 28 B
tokens, several seeds): their absolute numbers say nothing about a large model, and only differences whose interval
excludes zero are read as differences. Writes ``benchmarks/results/ablation.json`` and two SVGs, then merges into
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

import ablation_data  # noqa: E402
import ablation_eval  # noqa: E402
from ablation_report import markdown  # noqa: E402
from common import REPO, RESULTS_DIR, PeakSampler, machine, source_corpus  # noqa: E402

BASE_SEQ, LONG_FACTOR, BATCH = 128, 4, 8
SPLIT_SEED, FIRST_SEED = 7, 1234


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
    return _worker("--eval-worker", spec, log)


def _worker(flag: str, spec: dict, log: Path) -> dict:
    """Run this script's ``flag`` worker on ``spec`` in its own process (MindSpore stays out of the driver)."""
    with open(log, "ab") as fh:
        p = subprocess.run([sys.executable, __file__, flag, json.dumps(spec)], cwd=REPO,
                           stdout=subprocess.PIPE, stderr=fh, text=True)
    if p.returncode:
        raise RuntimeError(f"{flag.strip('-')} of {spec['checkpoint']} failed; see {log}")
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
    from dataclasses import replace

    from pipeline.config import config_from_dict
    from pipeline.io import read_json
    from pipeline.tasks import corpus as chain

    work = args.work
    log = work / "ablation.log"
    src = args.corpus or source_corpus()
    if src is None:
        subprocess.run([sys.executable, "-m", "pipeline.democorpus", "--out", str(REPO / "data" / "demo-corpus")],
                       check=True, cwd=REPO)
        src = source_corpus()
    t: dict = {}
    t0 = time.time()
    split = ablation_data.split_sources(src, work / "sources", SPLIT_SEED)
    heldout = sorted(str(p) for p in (work / "sources" / "heldout").glob("*.jsonl"))
    base = chain_config(work / "sources" / "train", work / "data", args.steps, args.long_steps, args.eval_tokens)
    summaries, cfgs, spm = {}, {}, None
    for arm in ("heuristics", "classifier", "classifier_only"):
        cfg = config_from_dict(ablation_data.arm_config(base, arm, heldout, spm))
        # a chain output is reused by later runs with the same data settings (not train.*)
        key = hashlib.sha256(json.dumps({k: v for k, v in cfg.to_dict().items() if k != "train"}, sort_keys=True,
                                        default=str).encode()).hexdigest()[:12]
        summaries[arm], cfgs[arm] = chain.run_all(cfg, f"ablation-{arm}-{key}", progress=False), cfg
        if spm is None:
            spm = read_json(Path(summaries[arm]["run_dir"]) / "tokenizer" / "spm.model.done")["info"]["model"]
    rdir_b = Path(summaries["heuristics"]["run_dir"])
    raw = ablation_data.raw_token_set(rdir_b, work / f"raw-{rdir_b.name}", cfgs["heuristics"].seed, BASE_SEQ)
    corpora = {arm: {k: v for k, v in s.items() if k != "stats"} for arm, s in summaries.items()}
    corpora["raw"] = {**corpora["heuristics"], "mindrecord_dir": str(work / f"raw-{rdir_b.name}")}
    info = read_json(rdir_b / "tokenizer" / "spm.model.done")["info"]
    items = work / "eval_items"
    shutil.rmtree(items, ignore_errors=True)
    ref = ablation_eval.build_items(work / "sources" / "heldout", spm, items, seq_len=BASE_SEQ,
                                    max_tokens=args.eval_tokens, eos_id=info["eos_id"], pad_id=info["pad_id"],
                                    seed=SPLIT_SEED)
    t["data_s"] = round(time.time() - t0, 1)
    data = {"raw": _set_info(raw)}
    for arm, s in summaries.items():
        rdir = Path(s["run_dir"])
        data[arm] = {**_set_info(read_json(rdir / "mindrecord" / "manifest.json")),
                     "decontaminated": ablation_data.decontaminated_per_domain(rdir)}
    seeds = [FIRST_SEED + i for i in range(args.seeds)]
    res = {"command": " ".join(["benchmarks/ablation.py", *sys.argv[1:]]), "machine": machine(), "corpus": str(src),
           "budget": {"steps": args.steps, "rows_per_step": BATCH, "seq_len": BASE_SEQ,
                      "tokens": args.steps * BATCH * BASE_SEQ, "long_steps": args.long_steps,
                      "long_seq_len": BASE_SEQ * LONG_FACTOR, "eval_tokens_per_domain": args.eval_tokens},
           "seeds": seeds, "split": split, "reference": ref, "data": data, "timings": t, "arms": {}}
    t0 = time.time()
    for arm in ablation_data.ARMS:
        runs = []
        for seed in seeds:
            out = work / "train" / arm / f"seed{seed}"
            s = train(replace(cfgs["heuristics"], seed=seed), corpora[arm], out, "main", log)
            ev = evaluate_reference(s, items, log)
            runs.append({"seed": seed, "first_loss": s["first_loss"], "final_loss": s["final_loss"],
                         "tokens": s["tokens"], "tokens_per_s": s["tokens_per_s"], **ev,
                         **({"curve": _curve(_metrics(out))} if seed == seeds[0] else {})})
            print(f"ablation: {arm} seed {seed}: loss {ev['loss']['all']:.4f} mc {ev['mc']['all']:.3f}", flush=True)
        res["arms"][arm] = runs
    t["train_and_eval_s"] = round(time.time() - t0, 1)
    if args.long_steps:
        t0 = time.time()
        res.update(long_context(cfgs["heuristics"], corpora["heuristics"],
                                work / "train" / "heuristics" / f"seed{seeds[0]}", args, log))
        t["long_context_s"] = round(time.time() - t0, 1)
    res["eval_sets"] = read_json(rdir_b / "mindrecord_val" / "manifest.json")["sets"]
    res["plots"] = write_plots(res, args.out_dir)
    res["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    return res


def evaluate_reference(summary: dict, items: Path, log: Path) -> dict:
    """Score a checkpoint on the reference texts (``ablation_eval.eval_worker`` in its own process)."""
    spec = {"checkpoint": summary["checkpoint"], "preset": "debug", "model": _model_of(summary),
            "seq_len": BASE_SEQ, "items": str(items), "batch_rows": BATCH}
    return _worker("--reference-worker", spec, log)


def long_context(cfg, corpus: dict, main_dir: Path, args, log: Path) -> dict:
    """The long-context stage and its control from (b)'s first-seed checkpoint, scored at 128 and 512 tokens."""
    from pipeline.io import read_json
    from pipeline.tasks.corpus_choice import find_eval_sets

    main_b = read_json(main_dir / "summary.json")
    base = main_dir.parent / "long"
    long_s = train(cfg, corpus, base / "long_context", "long_context", log, init_from=main_b["checkpoint"])
    more_s = train(cfg, corpus, base / "more_base", "more_base", log, init_from=main_b["checkpoint"])
    plain = _model_of(main_b)
    ntk = {**plain, "rope_scaling_type": "ntk", "rope_scaling_factor": float(LONG_FACTOR)}
    variants = {
        "no long-context stage, plain RoPE": (main_b["checkpoint"], plain, 0),
        "no long-context stage, NTK RoPE at inference": (main_b["checkpoint"], ntk, 0),
        f"long_context stage ({args.long_steps} steps at 512, NTK ×{LONG_FACTOR})": (long_s["checkpoint"],
                                                                                   _model_of(long_s), args.long_steps),
        f"control: {args.long_steps} more steps at 128, plain RoPE": (more_s["checkpoint"], _model_of(more_s),
                                                                      args.long_steps)}
    eval_data = find_eval_sets(corpus)
    return {"long_context": {name: {"extra_steps": steps, "loss": evaluate_at(ck, model, eval_data, args.eval_tokens,
                                                                              log)}
                             for name, (ck, model, steps) in variants.items()},
            "long_context_stage_own_eval": _losses(long_s)}


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

    arms = res["arms"]
    doms = list(arms["heuristics"][0]["loss"])
    eval_svg = bar_chart({d: {ablation_data.ARMS[a]: ablation_eval.mean_ci([r["loss"][d] for r in runs])["mean"]
                              for a, runs in arms.items()} for d in doms},
                         f"Reference-text loss per domain, mean of {len(res['seeds'])} seeds (lower is better)",
                         "loss (nats/token)", width=max(560, 90 * len(doms)))
    smooth = {ablation_data.ARMS[a]: _smooth(runs[0]["curve"], 3) for a, runs in arms.items()}
    loss_svg = line_chart(smooth, "Training loss, first seed, each arm on its own data (moving average)", "step", "loss")
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
    ap.add_argument("--steps", type=int, default=400, help="optimizer steps of each model (8 rows x 128 tokens)")
    ap.add_argument("--seeds", type=int, default=3, help="seeds per arm (initialisation and data order)")
    ap.add_argument("--long-steps", type=int, default=50, help="steps of the long-context stage and its control")
    ap.add_argument("--eval-tokens", type=int, default=16384, help="held-out tokens per domain")
    ap.add_argument("--quick", action="store_true", help="20 steps, 2 seeds, 4 long steps, 2048 eval tokens, results "
                    "kept in --work (smoke)")
    ap.add_argument("--corpus", type=Path)
    ap.add_argument("--work", type=Path, default=REPO / ".cache" / "bench" / "ablation")
    ap.add_argument("--no-report", action="store_true", help="do not touch results.json / BENCHMARKS.md")
    ap.add_argument("--eval-worker", help=argparse.SUPPRESS)
    ap.add_argument("--reference-worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.eval_worker:
        print(json.dumps(eval_worker(json.loads(args.eval_worker))))
        return 0
    if args.reference_worker:
        sys.path.insert(0, str(REPO))
        print(json.dumps(ablation_eval.eval_worker(json.loads(args.reference_worker))))
        return 0
    sys.path.insert(0, str(REPO))
    if args.quick:                 # a smoke run: its results stay in the work folder
        args.steps, args.seeds, args.long_steps, args.eval_tokens, args.no_report = 20, 2, 4, 2048, True
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

        record = {"title": "Ablation: raw, heuristics, classifier (3 seeds, reference texts held out before ingest), "
                  "and the long-context stage", "issue": 34,
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
