"""``run_training(job)``: one resumable pretraining stage on MindRecord tokens, ending with an evaluation.

Contract with the orchestrator (all under ``job.out_dir``, written by rank 0 only unless noted):

* ``status.json`` (atomic): ``{"state": RUNNING|SUCCEEDED|FAILED, "step", "pid", "loss", "error", ...}``
* ``metrics.jsonl``: one JSON object per step (step, loss, lr, grad_norm, loss_scale, skipped, tokens_per_s, mfu,
  step_time_s, data_sha1, ...) through ``metrics.MetricLogger``; on resume lines past the restored step are dropped.
* ``checkpoints/step_XXXXXXXX.weights.ckpt`` (weights) and ``step_XXXXXXXX.ckpt`` (optimizer and training state),
  each with a ``.sha256`` (``checkpoint.py``; every rank its own under ``ranks/`` when state is sharded, weights by
  data-parallel rank 0 only) and ``step_XXXXXXXX.commit.json`` once every rank's files are written (``commit.py``),
  every ``checkpoint_every`` steps and at the last step, newest ``keep_checkpoints`` committed steps kept;
  ``summary.json``'s ``checkpoint`` is rank 0's state file (``checkpoint.load_file`` adds the weights beside it).
* ``eval.json``: held-out loss / perplexity per domain of the final weights (``evaluate.py``).
* ``ranks/rank_NNNNN.json`` (every rank, when data parallel): sha256 of its parameters after the last step, so
  "all ranks hold identical weights" is checkable from files.
* ``summary.json`` at the end (incl. ``"eval"``), also the return value.

Restart policy (``resume.py``): newest committed step in out_dir whose files verify on every rank (weights +
optimizer + scaler + RNG + data position; every rank falls back to an older one when one rank's file is corrupt) >
``init_from``, normally the previous stage's commit marker (``init_mode="weights"``: this rank's slice of the
weights, fresh optimizer, data from the start; ``"continue"``: this rank's own file with Adam moments and the data
position, fresh step count and LR schedule) > fresh init. Rerunning a finished stage is therefore a cheap no-op
that rewrites the summary.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import math
import os
import time

import mindspore as ms
import numpy as np

from pipeline.io import write_json

from . import testing_hooks
from .checkpoint import checkpoint as ckpt
from .checkpoint import commit, resume
from .data import DataPosition, TokenBatches
from .documents import rows_over_document_cap
from .evaluate import evaluate, make_scorer
from .job import TrainJob
from .jobs import fenced
from .jobs.cpu_dispatch import cpu_dispatch_inline, host_dispatch
from .jobs.lease import Lease, LeaseLost, env_job_id, new_job_id
from .jobs.metrics import JsonlLogger, NullLogger, StatusFile, mfu, read_jsonl
from .model.config import ModelConfig
from .model.layout import RankLayout
from .model.memory_plan import MemoryPlan, job_layout, require_fit
from .model.model import CausalLMLoss, attention_impl, count_cell_params
from .model.parallel import create_groups
from .model.parallel_setup import build_parallel, grad_bytes, param_bytes
from .optim.optim import TrainStep, apply_precision, build_scaler
from .pending_steps import PendingSteps, is_sync_point
from .repack import stage_data

log = logging.getLogger("mindloom.train")

_THREADS_SET = False


def _setup_context(job: TrainJob) -> None:
    global _THREADS_SET
    if job.device == "CPU":
        cpu_dispatch_inline()
    ms.set_context(mode=ms.GRAPH_MODE if job.mode == "graph" else ms.PYNATIVE_MODE)
    try:
        ms.set_device(job.device)
    except RuntimeError:  # runtime already started in this process (tests, notebooks): fine if it is the same device
        if ms.get_context("device_target") != job.device:
            raise
    if job.device == "CPU" and not _THREADS_SET:
        from mindspore.device_context.cpu.op_tuning import threads_num

        try:
            threads_num(job.threads)  # may be set only once per process
        except RuntimeError as e:
            log.debug("threads_num not changed: %s", e)
        _THREADS_SET = True


def _distributed(tp: int = 1) -> tuple[int, int]:
    """(rank, world). Launched by msrun / MS_ROLE env -> mccl (CPU) / hccl (Ascend) via ``init()``."""
    if os.environ.get("MS_ROLE") == "MS_WORKER" or int(os.environ.get("RANK_SIZE", "1")) > 1:
        from mindspore.communication import get_group_size, get_rank, init

        init()
        rank, world = get_rank(), get_group_size()
        if world > 1 and tp == 1:  # tensor parallel runs in stand-alone mode with explicit collectives
            ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
        return rank, world
    return int(os.environ.get("RANK_ID", "0")), 1


def run_training(job: TrainJob) -> dict:
    """Train ``job.steps`` steps (resuming if possible), evaluate; returns the summary also in summary.json.

    Rank 0 first takes the stage folder's lease (``lease.py``): a second trainer in the same folder fails here with
    ``StageBusy`` before it writes anything.  Every rank knows the job id (``MINDLOOM_JOB_ID``) and fences each
    status, metrics and checkpoint write with ``lease.fence()``: a job that lost the lease stops (``LeaseLost``)
    without another write.  A cancel request or the stall timeout stops every rank.
    """
    _setup_context(job)
    rank, world = _distributed(job.tensor_parallel)
    job_id = env_job_id() or (new_job_id() if rank == 0 else None)  # None on ranks > 0: adopt rank 0's
    lease = Lease(job.out_dir, job_id=job_id, rank=rank, stall_timeout_s=job.stall_timeout_min * 60, ranks=world)
    status = StatusFile(job, enabled=rank == 0, job_id=job_id, fence=lease.fence, generation=lambda: lease.generation)
    lease.on_stall = lambda msg: status.write("FAILED", status.last_step, status.last_loss, error=msg)
    with lease:
        logger = JsonlLogger(os.path.join(job.out_dir, "metrics.jsonl"), job_id=job_id, fence=lease.fence,
                             generation=lambda: lease.generation) \
            if rank == 0 else NullLogger()
        if rank == 0:
            lease.fence()
            job.to_json(os.path.join(job.out_dir, "job.json"))  # provenance: what produced this out_dir
            ckpt.remove_stale_tmp(job.out_dir)
        try:
            status.write("RUNNING", 0)
            return _train(job, rank, world, status, logger, lease)
        except LeaseLost:
            raise                                   # the folder is another job's now: write nothing
        except BaseException as e:
            with contextlib.suppress(LeaseLost):
                status.write("FAILED", status.last_step, status.last_loss, error=f"{type(e).__name__}: {e}")
            raise
        finally:
            logger.close()


def _train(job: TrainJob, rank: int, world: int, status: StatusFile, logger, lease: Lease | None = None) -> dict:
    """The stage on this rank, in four phases: build (:func:`_build`: model, optimizer, data, resume point), the
    training steps (:func:`_run_steps`), every rank's digest and the evaluation, then rank 0's summary
    (:func:`_summary`)."""
    t_start = time.time()
    b = _build(job, rank, world, logger)
    step, last_ckpt, times = b.start_step, None, []
    if b.start_step < job.steps:
        step, last_ckpt, times = _run_steps(job, b, rank, status, logger, lease)
    elif rank == 0:
        last_ckpt = ckpt.ckpt_path(job.out_dir, step)
    if b.lay.tp * b.lay.dp > 1:
        _fence(lease)
        _write_rank_digest(job, b, rank, step)
    ev = None
    if b.lay.tp > 1:      # the TP forward is collective: every rank scores the same rows, rank 0 keeps the result
        ev = _evaluation(job, b.net, b.cfg, b.seq_len, last_ckpt, lease, keep=rank == 0, collective=True)
    if rank != 0:
        return {"stage": job.stage, "state": "SUCCEEDED", "rank": rank, "steps": step}

    _fence(lease)
    if ev is None:
        ev = _evaluation(job, b.net, b.cfg, b.seq_len, last_ckpt, lease)
    summary = _summary(job, b, logger.path, step=step, last_ckpt=last_ckpt, times=times, ev=ev, t_start=t_start)
    fenced.write_json(os.path.join(job.out_dir, "summary.json"), summary, lease.fence if lease else fenced.no_fence)
    status.write("SUCCEEDED", step, summary["final_loss"])
    return summary


@dataclasses.dataclass
class _Built:
    """What :func:`_build` made for this rank: the model, its optimizer, the data and where training resumes."""

    cfg: ModelConfig
    lay: RankLayout
    mplan: MemoryPlan
    net: object
    opt: object
    norm_fn: object             # the TP-aware gradient norm (None: the plain one)
    loss_net: object
    scaler: object              # fp16's loss scaler, else None
    data_dir: str
    data_info: dict
    seq_len: int
    world: int                  # data-parallel ranks
    start_step: int
    position: DataPosition
    resumed_from: int | None
    params: int                 # the whole model's, for MFU
    g: int                      # global batch (sequences per step)
    accum_bytes: int = 0        # the training step's fp32 accumulation buffers (set when it is built)


def _build(job: TrainJob, rank: int, world: int, logger) -> _Built:
    """Phase 1: seeds, memory plan, model and optimizer for this rank's slice, the stage's data, and the restored
    checkpoint (metrics past it dropped)."""
    if job.world_size and job.world_size != world:
        raise ValueError(f"TrainJob.world_size={job.world_size}: the job was planned for {job.world_size} ranks "
                         f"but the launcher started {world}")
    cfg = job.model_config()
    ms.set_seed(job.seed)  # same initial weights on every rank and on every fresh start
    ms.manual_seed(job.seed)
    np.random.seed(job.seed % 2**32)
    lay = job.layout(world).rank(rank)
    mplan = require_fit(cfg, job_layout(job, world, job.seq_len or cfg.max_seq_len, cfg.recompute),
                        job.device_memory_gb)
    log.info("memory plan (tp=%d dp=%d zero=%s): %s", lay.tp, lay.dp, job.zero, mplan.describe())
    create_groups(lay)
    net, opt, norm_fn = build_parallel(cfg, job, lay)
    apply_precision(net, job.precision)
    loss_net = CausalLMLoss(net)
    scaler = build_scaler(job)
    data_dir, data_info = stage_data(job.data_dir, job.seq_len, job.out_dir, rank)
    seq_len = data_info["seq_len"]
    world = lay.dp  # from here on: data-parallel ranks
    start_step, position, resumed_from = resume.restore(job, net, opt, scaler, lay, rank, seq_len)
    if isinstance(logger, JsonlLogger):
        logger.truncate_after(start_step)
    if start_step > job.steps:
        raise ValueError(f"TrainJob.steps={job.steps}: out_dir already holds a checkpoint at step {start_step}")
    params = count_cell_params(net) if lay.tp == 1 else cfg.num_params()  # whole model, for MFU
    g = job.global_batch(world)
    log.info("stage %s: %s params, mode=%s, precision=%s, attention=%s, rank %d/%d, global batch %d x %d tokens, "
             "steps %d..%d", job.stage, f"{params:,}", job.mode, job.precision, attention_impl(), rank, world, g,
             seq_len, start_step + 1, job.steps)
    return _Built(cfg=cfg, lay=lay, mplan=mplan, net=net, opt=opt, norm_fn=norm_fn, loss_net=loss_net, scaler=scaler,
                  data_dir=data_dir, data_info=data_info, seq_len=seq_len, world=world, start_step=start_step,
                  position=position, resumed_from=resumed_from, params=params, g=g)


def _run_steps(job: TrainJob, b: _Built, rank: int, status: StatusFile, logger,
               lease: Lease | None) -> tuple[int, str | None, list[tuple[float, int]]]:
    """Phase 2: the steps from ``b.start_step`` to ``job.steps``, launched without a host sync and fetched at the
    sync points, where metrics, checkpoints, status and the lease heartbeat are written. Returns (last step, last
    checkpoint or None, (seconds, tokens) of every fetched step)."""
    lay, seq_len, g, scaler, start_step = b.lay, b.seq_len, b.g, b.scaler, b.start_step
    step, last_ckpt, times = start_step, None, []
    step_fn = TrainStep(b.loss_net, b.opt, grad_clip=job.grad_clip, world=b.world, grad_accum=job.grad_accum,
                        scaler=scaler, jit=job.mode == "graph", group=lay.dp_group, norm_fn=b.norm_fn,
                        devices=lay.tp * lay.dp, grad_reduce=job.grad_reduce)
    b.accum_bytes = step_fn.accum_bytes
    batches = TokenBatches(b.data_dir, job.micro_batch, job.seed, rank=lay.dp_rank, world=b.world,
                           grad_accum=job.grad_accum, start=b.position, extra_files=job.replay_files)
    if job.replay_files:
        b.data_info["replay"] = batches.replay_info()
    window, last_sync = PendingSteps(), start_step
    # flash attention's variable-length form keeps max_documents_per_row - 1 document ends per row: count the rest
    capped, over_cap = b.cfg.eod_id >= 0 and attention_impl() == "flash", 0
    t_data = time.time()
    if lease is not None:
        lease.compiling()  # the stall timer starts here: the host build and resume do not count
    for micro, pos in batches.steps(job.steps - start_step):
        if step == start_step:
            _check_batch(micro[0], b.cfg, seq_len)
        if capped:
            over_cap += sum(rows_over_document_cap(m[:, :-1], b.cfg.eod_id, b.cfg.max_documents_per_row)
                            for m in micro)
        data_s = time.time() - t_data
        step += 1
        t0 = time.time()
        window.add(step, step_fn.launch(micro), data_s, pos, _digest(micro), t0)  # no host sync here
        t_data = time.time()
        if not is_sync_point(job, step, start_step):
            continue
        for st, out, dt, data_s, pos, digest in window.fetch(step_fn.fetch):  # waits for the device
            times.append((dt, g * seq_len))
            _check_finite(out, st, scaler)
            tok_s = g * seq_len / dt
            row = {"loss": out["loss"], "lr": out["lr"], "grad_norm": _finite_or_none(out["grad_norm"]),
                   "loss_scale": out["loss_scale"], "skipped": not out["applied"], "tokens_per_s": tok_s,
                   "mfu": mfu(b.params, tok_s, job.peak_flops, lay.tp * lay.dp), "step_time_s": dt,
                   "data_time_s": data_s,
                   "tokens": st * g * seq_len, "epoch": pos.epoch, "data_sha1": digest, "time": time.time()}
            logger.log(row, st)
        status.last_step, status.last_loss = step, out["loss"]
        if step % job.checkpoint_every == 0 or step == job.steps:
            _fence(lease)  # a job that lost its lease writes no checkpoint (checked again before the renames)
            last_ckpt = resume.save(job, b.opt, scaler, step, pos, lay, rank, seq_len,
                                    fence=None if lease is None else testing_hooks.fence_of(job, step, lease),
                                    owner=None if lease is None else (lease.job_id, lease.generation))
        status.write("RUNNING", step, out["loss"])  # every sync point (log_every steps at the most)
        if step // job.log_every > last_sync // job.log_every or step == job.steps:
            log.info("step %d/%d loss %.4f gnorm %.3f scale %g %.0f tok/s", step, job.steps, out["loss"],
                     out["grad_norm"], out["loss_scale"], tok_s)
        last_sync = step
        testing_hooks.after_step(job, step)  # fail_at_step: tests of the resume path
        if lease is not None:
            lease.step_done(step)  # heartbeat progress; raises JobCancelled on a cancel request
    if capped:
        b.data_info["rows_over_document_cap"] = over_cap
        if over_cap:
            log.warning("%d rows held more than model.max_documents_per_row=%d documents: their last documents "
                        "attended to each other", over_cap, b.cfg.max_documents_per_row)
    if step < job.steps:
        raise RuntimeError(f"data ended after step {step} of {job.steps}")
    return step, last_ckpt, times


def _summary(job: TrainJob, b: _Built, metrics_path: str, *, step: int, last_ckpt: str | None,
             times: list[tuple[float, int]], ev: dict | None, t_start: float) -> dict:
    """Phase 4 (rank 0): the stage's ``summary.json``, from the committed metric rows and the steady steps' speed."""
    lay, net, opt, cfg, seq_len, g = b.lay, b.net, b.opt, b.cfg, b.seq_len, b.g
    rows = commit.valid_rows(job.out_dir, read_jsonl(metrics_path)) if os.path.exists(metrics_path) else []
    losses = [r["loss"] for r in rows]
    steady = times[1:] or times  # the first step of a process includes the GRAPH compile
    tok_s = (sum(n for _, n in steady) / sum(t for t, _ in steady)) if steady else None
    return {
        "stage": job.stage, "state": "SUCCEEDED", "steps": step, "start_step": b.start_step,
        "resumed_from": b.resumed_from, "init_from": job.init_from if b.resumed_from is None else None,
        "init_mode": job.init_mode, "first_loss": losses[0] if losses else None,
        "final_loss": losses[-1] if losses else None, "min_loss": min(losses) if losses else None,
        "skipped_steps": sum(1 for r in rows if r.get("skipped")), "tokens": step * g * seq_len,
        "tokens_per_s": tok_s, "mfu": mfu(b.params, tok_s or 0.0, job.peak_flops, lay.tp * lay.dp),
        "first_step_s": times[0][0] if times else None, "wall_s": time.time() - t_start, "params": b.params,
        "checkpoint": last_ckpt, "commit": _commit_of(job.out_dir, step), "attention_impl": attention_impl(),
        "mode": job.mode, "precision": job.precision,
        "device": job.device, "world_size": b.world, "global_batch": g, "grad_accum": job.grad_accum,
        "seq_len": seq_len, "data": b.data_info, "recompute": cfg.recompute, "model": cfg.to_dict(), "eval": ev,
        "tensor_parallel": lay.tp, "zero": job.zero, "memory_plan": b.mplan.to_dict(),
        "param_bytes_per_rank": param_bytes(net), "optimizer_bytes_per_rank": opt.state_bytes(),
        "gradient_bytes_per_rank": grad_bytes(net, b.accum_bytes),
        "peak_rss_bytes": _peak_rss(), "grad_reduce": job.grad_reduce,
        "distributed_optimizer": job.distributed_optimizer,
        "host_dispatch": host_dispatch(),
    }


def _fence(lease: Lease | None) -> None:
    if lease is not None:
        lease.fence()


def _finite_or_none(x: float) -> float | None:
    """JSON has no NaN/Infinity: an overflowing (skipped) fp16 step logs grad_norm null."""
    return x if math.isfinite(x) else None


def _check_finite(out: dict, step: int, scaler) -> None:
    """fp16 overflow is expected now and then (the step was skipped); anything else non-finite is a failure."""
    if scaler is not None and not out["applied"]:
        if out["loss_scale"] <= 1.0:
            raise FloatingPointError(f"step {step}: gradients not finite even at loss scale 1 (diverged)")
        return
    if not (math.isfinite(out["loss"]) and math.isfinite(out["grad_norm"])):
        raise FloatingPointError(f"loss {out['loss']}, grad norm {out['grad_norm']} at step {step}")


def _evaluation(job: TrainJob, net, cfg, seq_len: int, checkpoint: str | None, lease: Lease | None = None,
                keep: bool = True, collective: bool = False) -> dict:
    """Evaluate the final weights on ``job.eval_data`` (reused from eval.json when it scored the same checkpoint).

    ``collective`` (tensor parallel): every rank runs this with its shard of the model, in step (the forward's
    all-reduces and the vocab-parallel loss span the TP group), so no rank may take the reuse shortcut alone and
    none resets the parallel context; only the rank with ``keep`` writes eval.json."""
    path = os.path.join(job.out_dir, "eval.json")
    if not job.eval_data or job.eval_tokens == 0:
        return {"per_domain": {}, "skipped": "no validation sets (TrainJob.eval_data) or eval_tokens=0"}
    if os.path.exists(path) and not collective:
        with open(path, encoding="utf-8") as f:
            old = json.load(f)
        if old.get("checkpoint") == checkpoint and old.get("eval_data") == job.eval_data:
            return old
    t0 = time.time()
    if not collective:
        ms.reset_auto_parallel_context()  # rank 0 alone scores: a plain forward graph, no collectives
    score = make_scorer(CausalLMLoss(net, reduction="sum"), jit=job.mode == "graph")
    ev = evaluate(score, job.eval_data, seq_len=seq_len, batch_size=job.micro_batch, max_tokens=job.eval_tokens,
                  pad_id=cfg.pad_id)
    ev.update(checkpoint=checkpoint, eval_data=job.eval_data, seconds=round(time.time() - t0, 3),
              job_id=lease.job_id if lease else None, generation=lease.generation if lease else None,
              tensor_parallel=net.tp.size if collective else 1)
    if not keep:
        return ev
    fenced.write_json(path, ev, lease.fence if lease else fenced.no_fence)  # after a long evaluation: fenced
    log.info("eval %s: %s", job.stage, {d: round(v["loss"], 4) if v["loss"] is not None else None
                                        for d, v in ev["per_domain"].items()})
    return ev


def _commit_of(out_dir: str, step: int) -> str | None:
    """The commit marker of the final step: what a following stage starts from (``previous_checkpoint``)."""
    path = commit.commit_file(out_dir, step)
    return path if os.path.exists(path) else None


def _digest(micro: list[np.ndarray]) -> str:
    """sha1 of this rank's token ids of the step: proves a resumed run consumed the same samples."""
    h = hashlib.sha1()
    for mb in micro:
        h.update(mb.tobytes())
    return h.hexdigest()[:16]


def _write_rank_digest(job: TrainJob, b: _Built, rank: int, step: int) -> None:
    net, opt, resumed_from = b.net, b.opt, b.resumed_from
    h = hashlib.sha256()
    for p in sorted(net.trainable_params(), key=lambda p: p.name):
        h.update(p.name.encode())
        h.update(np.ascontiguousarray(p.asnumpy()).tobytes())
    write_json(os.path.join(job.out_dir, "ranks", f"rank_{rank:05d}.json"),
               {"rank": rank, "step": step, "params_sha256": h.hexdigest(), "pid": os.getpid(),
                "param_bytes": param_bytes(net), "optimizer_bytes": opt.state_bytes(), "resumed_from": resumed_from,
                "gradient_bytes": grad_bytes(net, b.accum_bytes),
                "peak_rss_bytes": _peak_rss()})


def _peak_rss() -> int:
    """Peak resident set of this rank's own process, in bytes: the CPU stand-in for device peak memory."""
    from pipeline.profile import own_peak_rss_mb

    return int(own_peak_rss_mb() * 2**20)


def _check_batch(tokens: np.ndarray, cfg, seq_len: int) -> None:
    """Validate the first batch (shape, id range) so a data/config mismatch fails with a clear message."""
    if tokens.ndim != 2 or tokens.shape[1] != seq_len + 1:
        raise ValueError(f"input_ids rows must be 1-D of length seq_len + 1 = {seq_len + 1}, got batch shape "
                         f"{tokens.shape}")
    if seq_len > cfg.max_seq_len:
        raise ValueError(f"ModelConfig.max_seq_len={cfg.max_seq_len}: data rows hold seq_len={seq_len} tokens")
    if tokens.max() >= cfg.vocab_size:
        raise ValueError(f"ModelConfig.vocab_size={cfg.vocab_size}: data contains token id {int(tokens.max())}")
