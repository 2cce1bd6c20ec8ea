"""``run_training(job)``: one resumable pretraining stage on MindRecord tokens.

Contract with the orchestrator (all under ``job.out_dir``, written by rank 0 only):

* ``status.json`` (atomic): ``{"state": RUNNING|SUCCEEDED|FAILED, "step", "pid", "loss", "error", ...}``
* ``metrics.jsonl``: one JSON object per step (step, loss, lr, grad_norm, tokens_per_s, step_time_s, ...); on resume
  lines past the restored step are dropped, so each step appears once.
* ``checkpoints/step_XXXXXXXX.ckpt`` + ``.sha256`` (see ``checkpoint.py``), every ``checkpoint_every`` steps and at
  the last step, newest ``keep_checkpoints`` kept.
* ``summary.json`` at the end, also the return value.

Restart policy: newest valid checkpoint in out_dir (weights + optimizer + data position; falls back to older ones
when the newest is corrupt) > ``init_from`` (weights only, new optimizer, data from the start) > fresh init. Rerunning a
finished stage is therefore a cheap no-op that rewrites the summary.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time

import mindspore as ms
import numpy as np
from mindspore import Tensor

from . import checkpoint as ckpt
from .data import TokenBatches
from .job import TrainJob, write_json_atomic
from .model import CausalLMLoss, Transformer, attention_impl, count_cell_params
from .optim import build_optimizer, lr_at, make_train_step

log = logging.getLogger("mindloom.train")

_THREADS_SET = False


class SimulatedCrash(RuntimeError):
    """Raised by ``fail_at_step`` (tests of the resume path)."""


def _setup_context(job: TrainJob) -> None:
    global _THREADS_SET
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


def _distributed() -> tuple[int, int, bool]:
    """(rank, world, initialised). Launched by msrun / MS_ROLE env -> mccl (CPU) / hccl (Ascend) via ``init()``."""
    if os.environ.get("MS_ROLE") == "MS_WORKER" or int(os.environ.get("RANK_SIZE", "1")) > 1:
        from mindspore.communication import get_group_size, get_rank, init

        init()
        rank, world = get_rank(), get_group_size()
        if world > 1:
            ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
        return rank, world, True
    return int(os.environ.get("RANK_ID", "0")), 1, False


class _Writer:
    """Rank-0 file output; other ranks get a writer whose methods do nothing."""

    def __init__(self, job: TrainJob, enabled: bool):
        self.job, self.enabled = job, enabled
        self.metrics_path = os.path.join(job.out_dir, "metrics.jsonl")
        self._metrics = None
        self.last_step, self.last_loss = 0, None  # progress, for the FAILED status of an exception

    def status(self, state: str, step: int, loss: float | None = None, error: str | None = None) -> None:
        self.last_step, self.last_loss = step, loss if loss is not None else self.last_loss
        if self.enabled:
            write_json_atomic(os.path.join(self.job.out_dir, "status.json"), {
                "state": state, "step": step, "total_steps": self.job.steps, "pid": os.getpid(), "loss": loss,
                "error": error, "stage": self.job.stage, "updated_at": time.time()})

    def truncate_metrics(self, last_step: int) -> None:
        """Drop lines of steps > last_step (written after the checkpoint we resume from)."""
        if not self.enabled or not os.path.exists(self.metrics_path):
            return
        keep = [ln for ln in _read_jsonl(self.metrics_path) if ln.get("step", 0) <= last_step]
        tmp = self.metrics_path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in keep)
        os.replace(tmp, self.metrics_path)

    def metric(self, row: dict) -> None:
        self.last_step, self.last_loss = row["step"], row["loss"]
        if self.enabled:
            if self._metrics is None:
                self._metrics = open(self.metrics_path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
            self._metrics.write(json.dumps(row) + "\n")
            self._metrics.flush()  # the Airflow operator tails this file

    def close(self) -> None:
        if self._metrics is not None:
            self._metrics.close()
            self._metrics = None


def _read_jsonl(path: str) -> list[dict]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for ln in f:
            ln = ln.strip()
            if ln:
                try:
                    rows.append(json.loads(ln))
                except json.JSONDecodeError:  # torn last line of a killed run
                    pass
    return rows


def run_training(job: TrainJob) -> dict:
    """Train ``job.steps`` steps (resuming if possible); returns the summary dict also written to summary.json."""
    _setup_context(job)
    rank, world, _ = _distributed()
    writer = _Writer(job, enabled=rank == 0)
    if rank == 0:
        os.makedirs(job.out_dir, exist_ok=True)
        job.to_json(os.path.join(job.out_dir, "job.json"))  # provenance: what produced this out_dir
        ckpt.remove_stale_tmp(job.out_dir)
    try:
        writer.status("RUNNING", 0)
        return _train(job, rank, world, writer)
    except BaseException as e:
        writer.status("FAILED", writer.last_step, writer.last_loss, error=f"{type(e).__name__}: {e}")
        raise
    finally:
        writer.close()


def _train(job: TrainJob, rank: int, world: int, writer: _Writer) -> dict:
    t_start = time.time()
    cfg = job.model_config()
    ms.set_seed(job.seed)  # same initial weights on every rank and on every fresh start
    net = Transformer(cfg)
    loss_net = CausalLMLoss(net)
    opt = build_optimizer(net, job)

    # ---- restore -------------------------------------------------------------------------------------------
    start_step, batches_done, resumed_from = 0, 0, None
    found = ckpt.load_latest(job.out_dir)
    if found is not None:
        path, pd, meta = found
        ckpt.restore_full(opt, pd)
        start_step = resumed_from = meta["step"]
        batches_done = meta.get("batches_consumed", start_step)
        if meta.get("world_size", world) != world:  # keep the sample position, re-express it in batches
            batches_done = meta.get("samples_consumed", 0) // (job.batch_size * world)
        log.info("resumed from %s (step %d, %d batches consumed)", path, start_step, batches_done)
    elif ckpt.list_checkpoints(job.out_dir):
        log.warning("no usable checkpoint in %s: training restarts from scratch", job.out_dir)
    if found is None and job.init_from:
        n = ckpt.load_weights(net, job.init_from)
        log.info("initialised %d tensors from %s (weights only)", n, job.init_from)
    writer.truncate_metrics(start_step)
    if start_step > job.steps:
        raise ValueError(f"TrainJob.steps={job.steps}: out_dir already holds a checkpoint at step {start_step}")

    step_fn = make_train_step(loss_net, opt, job.grad_clip, world, jit=job.mode == "graph")
    params = count_cell_params(net)
    log.info("stage %s: %s params, mode=%s, attention=%s, rank %d/%d, steps %d..%d", job.stage, f"{params:,}",
             job.mode, attention_impl(), rank, world, start_step + 1, job.steps)

    # ---- loop ---------------------------------------------------------------------------------------------
    step, loss_v, seq_len, last_ckpt = start_step, None, None, None
    times: list[tuple[float, int]] = []
    if start_step < job.steps:
        batches = TokenBatches(job.data_dir, job.batch_size, job.seed, start_batch=batches_done,
                               total_batches=batches_done + job.steps - start_step, rank=rank, world=world)
        t_data = time.time()
        for tokens in batches:
            seq_len = _check_batch(tokens, cfg)
            data_s = time.time() - t_data
            t0 = time.time()
            loss, gnorm = step_fn(Tensor(tokens))
            loss_v, gnorm_v = float(loss.asnumpy()), float(gnorm.asnumpy())  # asnumpy syncs: honest step time
            dt = time.time() - t0
            step += 1
            batches_done += 1
            ntok = world * job.batch_size * seq_len
            times.append((dt, ntok))
            if not math.isfinite(loss_v):
                raise FloatingPointError(f"loss is {loss_v} at step {step}")
            writer.metric({"step": step, "loss": loss_v, "lr": lr_at(step - 1, job.lr, job.min_lr, job.warmup_steps,
                                                                      job.steps),
                           "grad_norm": gnorm_v, "tokens_per_s": ntok / dt, "step_time_s": dt, "data_time_s": data_s,
                           "tokens": step * ntok, "epoch": (batches_done - 1) // batches.batches_per_epoch,
                           "time": time.time()})
            if step % job.checkpoint_every == 0 or step == job.steps:
                last_ckpt = _save(job, opt, step, batches_done, world, rank)
            if step % job.log_every == 0 or step == job.steps:
                writer.status("RUNNING", step, loss_v)
                log.info("step %d/%d loss %.4f gnorm %.3f %.0f tok/s", step, job.steps, loss_v, gnorm_v, ntok / dt)
            if job.fail_at_step is not None and step == job.fail_at_step:
                raise SimulatedCrash(f"fail_at_step={step}: simulated crash after checkpoint")
            t_data = time.time()
        if step < job.steps:
            raise RuntimeError(f"data ended after step {step} of {job.steps}")
    elif rank == 0:
        last_ckpt = ckpt.ckpt_path(job.out_dir, step)

    # ---- summary ------------------------------------------------------------------------------------------
    rows = _read_jsonl(writer.metrics_path) if rank == 0 and os.path.exists(writer.metrics_path) else []
    losses = [r["loss"] for r in rows]
    steady = times[1:] or times  # the first step of a process includes the GRAPH compile
    summary = {
        "stage": job.stage, "state": "SUCCEEDED", "steps": step, "start_step": start_step,
        "resumed_from": resumed_from, "init_from": job.init_from if resumed_from is None else None,
        "first_loss": losses[0] if losses else None, "final_loss": losses[-1] if losses else loss_v,
        "min_loss": min(losses) if losses else loss_v,
        "tokens": step * world * job.batch_size * (seq_len or _seq_len_from(rows, world, job)),
        "tokens_per_s": (sum(n for _, n in steady) / sum(t for t, _ in steady)) if steady else None,
        "first_step_s": times[0][0] if times else None, "wall_s": time.time() - t_start,
        "params": params, "checkpoint": last_ckpt, "attention_impl": attention_impl(), "mode": job.mode,
        "device": job.device, "world_size": world, "model": cfg.to_dict(),
    }
    if rank == 0:
        write_json_atomic(os.path.join(job.out_dir, "summary.json"), summary)
    writer.status("SUCCEEDED", step, summary["final_loss"])
    return summary


def _save(job: TrainJob, opt, step: int, batches_done: int, world: int, rank: int) -> str | None:
    if rank != 0:
        return None
    meta = {"step": step, "batches_consumed": batches_done, "world_size": world,
            "samples_consumed": batches_done * job.batch_size * world}
    return ckpt.save(opt, job.out_dir, step, meta, job.keep_checkpoints)


def _check_batch(tokens: np.ndarray, cfg) -> int:
    """Validate the first batch (shape, id range) so a data/config mismatch fails with a clear message."""
    if tokens.ndim != 2 or tokens.shape[1] < 2:
        raise ValueError(f"input_ids rows must be 1-D of length seq_len + 1 >= 2, got batch shape {tokens.shape}")
    seq_len = tokens.shape[1] - 1
    if seq_len > cfg.max_seq_len:
        raise ValueError(f"ModelConfig.max_seq_len={cfg.max_seq_len}: data rows hold seq_len={seq_len} tokens")
    if tokens.max() >= cfg.vocab_size:
        raise ValueError(f"ModelConfig.vocab_size={cfg.vocab_size}: data contains token id {int(tokens.max())}")
    return seq_len


def _seq_len_from(rows: list[dict], world: int, job: TrainJob) -> int:
    """seq_len when no step ran in this process (finished stage re-run): recover it from the metrics."""
    if rows and rows[-1].get("tokens") and rows[-1].get("step"):
        return rows[-1]["tokens"] // (rows[-1]["step"] * world * job.batch_size)
    return 0
