"""What each rank of a stage loads when it starts, and how it saves a step so that every rank agrees on it.

Restart policy (every rank takes the same branch and the same step; see ``commit.py`` for the protocol):

1. the stage's own newest committed step whose files verify on every rank: full state of THIS rank's file
   (weights, moments, scaler, RNG, data position); every rank must be looking at the same step (else refused),
   and when markers exist but none verifies the stage fails naming them: never a silent fresh start over them;
2. else ``init_from``, normally the commit marker of the previous stage's final step (``previous_checkpoint``):
   * ``continue``: this rank's own file of that step (weights + Adam moments + data position); the layout (TP
     degree, ZeRO shards, rank count) must equal this stage's, else it is refused in one line;
   * ``weights``: this rank's slice of the weights; with the same TP degree straight from the file of this TP rank,
     with another TP degree from the previous shards that overlap its slice (``tp_merge.resliced_weights``);
   * a plain ``.ckpt`` path (a TP=1 checkpoint or a ``tp_merge`` output) also works; a TP shard given as a plain
     path is refused (it cannot say which slice the other ranks need);
3. else fresh weights.

Why here and not in ``trainer.py``: the stage loop stays about steps; this module is about files and ranks.
"""

from __future__ import annotations

import logging

import mindspore as ms
import numpy as np
from mindspore import Tensor

from .. import testing_hooks
from ..data import DataPosition
from ..model.parallel import RankLayout, split_axis, take_shard
from ..model.parallel_setup import ckpt_root, expected_file_layout, layout_meta, saves_weights, writers
from . import checkpoint as ckpt
from . import commit

log = logging.getLogger("mindloom.train")


def check_same_layout(job, meta: dict, dp: int, seq_len: int, what: str) -> None:
    """Refuse a data position that cannot be continued exactly (see data.py for why the global batch suffices)."""
    if "data_epoch" not in meta:
        raise ValueError(f"{what} has no global data position (written by an older trainer); start a new stage "
                         f"with init_from=<it> instead")
    g = job.global_batch(dp)
    if meta["global_batch"] != g:
        raise ValueError(f"TrainJob.micro_batch: {what} was written with global batch {meta['global_batch']} "
                         f"({meta['micro_batch']} rows x grad_accum {meta['grad_accum']} x {meta['world_size']} "
                         f"ranks), this run has {g} ({job.micro_batch} x {job.grad_accum} x {dp} ranks); keep "
                         f"batch_size x grad_accum x ranks equal to continue its data stream exactly")
    if meta["seq_len"] != seq_len:
        raise ValueError(f"TrainJob.seq_len: {what} was trained on rows of seq_len {meta['seq_len']}, this run "
                         f"reads {seq_len}; its data position does not apply (use init_mode='weights')")


def check_marker_layout(marker: dict, lay: RankLayout, zero: bool, what: str, hint: str) -> None:
    """Full state (moments per shard) only loads into the layout that wrote it: one line naming marker and field.
    (A TP marker from before one copy of replicated state listed every rank's file: tp x dp, also accepted.)"""
    have = marker["layout"]
    older = lay.tp * lay.dp if lay.tp > 1 and not zero else None
    for field, got, want in (("tensor_parallel", have["tensor_parallel"], lay.tp),
                             ("zero_shards", have["zero_shards"], lay.dp if zero else 1),
                             ("ranks", marker["ranks"], writers(lay, zero))):
        if got != want and not (field == "ranks" and got == older):
            raise commit.LayoutMismatch(f"{what} {marker['marker']}: written with {field}={got}, this run has "
                                        f"{field}={want}; {hint}")


def restore(job, net, opt, scaler, lay: RankLayout, rank: int, seq_len: int) -> tuple[int, DataPosition, int | None]:
    """(start_step, data position, resumed_from step or None) for this rank; loads what the policy says."""
    world = lay.tp * lay.dp
    markers = commit.committed(job.out_dir)
    commit.same_view(markers, world, f"resume of {job.out_dir}")
    if markers:
        for m in markers:
            check_marker_layout(m, lay, job.zero, "checkpoint", "resume this stage with its own layout (workers, "
                                "tensor_parallel, zero) or train it again in a new folder")
        m, (path, pd, meta) = commit.agree_or_explain(markers, _full_state_loader(lay, job.zero, rank), world,
                                                      f"resume of {job.out_dir}")
        check_same_layout(job, meta, lay.dp, seq_len, f"checkpoint {path}")
        _apply_full(opt, scaler, pd, meta)
        ckpt.restore_rng(meta)
        log.info("rank %d resumed from %s (committed step %d, data %s)", rank, path, m["step"],
                 DataPosition.from_meta(meta))
        return m["step"], DataPosition.from_meta(meta), m["step"]
    if steps := commit.committed_steps(job.out_dir):  # markers exist, none readable (each was logged)
        raise ValueError(f"resume of {job.out_dir}: its {len(steps)} commit marker(s) "
                         f"{[commit.commit_file(job.out_dir, s) for s in steps]} are all malformed or stale (see the "
                         f"warnings); repair them or move the checkpoints folder aside to train this stage again "
                         f"from its start")
    if ckpt.list_checkpoints(ckpt_root(job.out_dir, rank, lay, job.zero)):
        log.warning("%s holds checkpoint files but no commit marker: training restarts from %s", job.out_dir,
                    job.init_from or "scratch")
    if not job.init_from:
        return 0, DataPosition(), None
    if job.init_from.endswith(".commit.json"):
        return _init_from_marker(job, net, opt, scaler, lay, rank, seq_len)
    return _init_from_file(job, net, opt, scaler, lay, seq_len)


def _full_state_loader(lay: RankLayout, zero: bool, rank: int):
    want = expected_file_layout(lay, zero)

    def load(marker: dict):
        path, digest = commit.file_of(marker, rank)
        pd, meta = ckpt.load_verified(path, digest)
        ckpt.check_file_layout(path, meta, want)
        if meta.get("step") != marker["step"]:
            raise ValueError(f"checkpoint {path}: holds step {meta.get('step')}, its marker says {marker['step']}")
        if not ckpt.weights_only(pd):  # a state file: the weights are in the weights file of this TP rank
            pd.update(_weights(marker, lay.tp, lay.tp_rank))
        return path, pd, meta

    return load


def _weights(marker: dict, tp: int, tp_rank: int) -> dict:
    """The weights of TP rank ``tp_rank`` of committed step ``marker``: its weights file (an older marker: the one
    file of that rank in the first data-parallel replica), checked against the marker and its layout."""
    path, digest = commit.weights_of(marker, tp_rank)
    pd, meta = ckpt.load_verified(path, digest)
    ckpt.check_file_layout(path, meta, {"tensor_parallel": tp, "tp_rank": tp_rank, "dp_rank": 0})
    if meta.get("step", marker["step"]) != marker["step"]:
        raise ValueError(f"checkpoint {path}: holds step {meta['step']}, its marker says {marker['step']}")
    return ckpt.weights_only(pd)


def _apply_full(opt, scaler, pd: dict, meta: dict) -> None:
    ckpt.restore_full(opt, pd)
    if scaler is not None and "loss_scale_value" in meta:
        scaler.scale_value.set_data(Tensor(meta["loss_scale_value"], ms.float32))
        scaler.counter.set_data(Tensor(meta["loss_scale_counter"], ms.int32))


def _continue(job, opt, scaler, lay, seq_len, path: str, pd: dict, meta: dict):
    check_same_layout(job, meta, lay.dp, seq_len, f"init_from {path}")
    _apply_full(opt, scaler, pd, meta)
    # a new stage runs its own LR schedule (global_step indexes it); Adam's bias correction keeps counting the
    # updates the restored moments have seen (adam_step), so the first update is the uninterrupted one's
    opt.global_step.set_data(Tensor(np.zeros(opt.global_step.shape, np.int32)))
    log.info("continuing from %s: weights, Adam moments, data position %s", path, DataPosition.from_meta(meta))
    return 0, DataPosition.from_meta(meta), None


def _only(candidate, try_load, world: int):
    """``try_load(candidate)`` on every rank; any rank's failure is raised on every rank."""
    return commit.agree([candidate], try_load, world, "init_from", last_word=True)[1]


def _init_from_marker(job, net, opt, scaler, lay, rank, seq_len):
    marker = commit.read_marker(job.init_from)
    world, prev_tp = lay.tp * lay.dp, marker["layout"]["tensor_parallel"]
    if job.init_mode == "continue":
        check_marker_layout(marker, lay, job.zero, "init_from", "'continue' keeps each rank's Adam moments, so it "
                            "needs the previous stage's layout (init: previous merges the weights and re-slices them)")
        path, pd, meta = _only(marker, _full_state_loader(lay, job.zero, rank), world)
        return _continue(job, opt, scaler, lay, seq_len, path, pd, meta)

    def load(m: dict) -> dict:
        if prev_tp == lay.tp:  # the weights file of this TP rank (no optimizer state is read)
            return _weights(m, lay.tp, lay.tp_rank)
        from .tp_merge import resliced_weights

        return resliced_weights(m, lay.tp, lay.tp_rank)

    raw = _only(marker, load, world)
    n = ckpt.assign_weights(net, raw, job.init_from)
    log.info("initialised %d tensors from %s (weights only, TP %d -> %d, TP rank %d)", n, job.init_from, prev_tp,
             lay.tp, lay.tp_rank)
    return 0, DataPosition(), None


def _init_from_file(job, net, opt, scaler, lay, seq_len):
    """A single checkpoint file: TP=1 state (or this rank's matching layout when continuing)."""
    path, world = job.init_from, lay.tp * lay.dp
    if job.init_mode == "continue":
        def load(p):
            pd, meta = ckpt.load_file(p)
            ckpt.check_file_layout(p, meta, expected_file_layout(lay, job.zero))
            return pd, meta

        pd, meta = _only(path, load, world)
        return _continue(job, opt, scaler, lay, seq_len, path, pd, meta)

    def load_weights(p):
        pd, meta = ckpt.load_file(p, need_sidecar=False)
        if meta.get("tensor_parallel", 1) != 1:
            raise commit.LayoutMismatch(f"init_from {p}: written with tensor_parallel={meta['tensor_parallel']} (one "
                                        f"TP shard); pass its step's commit marker (step_XXXXXXXX.commit.json) so "
                                        f"every rank gets its own slice")
        return {k: take_shard(v.asnumpy(), split_axis(k), lay.tp, lay.tp_rank)
                for k, v in ckpt.weights_only(pd).items()}

    n = ckpt.assign_weights(net, _only(path, load_weights, world), repr(path))
    log.info("initialised %d tensors from %s (weights only)", n, path)
    return 0, DataPosition(), None


def save(job, opt, scaler, step: int, pos: DataPosition, lay: RankLayout, rank: int, seq_len: int,
         fence=None, owner: tuple | None = None) -> str | None:
    """Write this rank's file of ``step`` (if it writes one), then commit it across ranks (``commit.py``).
    Returns this rank's file (None on a rank that does not write).  ``fence`` (the lease's check, raising
    ``LeaseLost``) runs right before the file is renamed into place and before the commit marker is written, so a
    job that lost its lease mid-save publishes neither; every rank then fails through the barrier."""
    root, n_writers, world = ckpt_root(job.out_dir, rank, lay, job.zero), writers(lay, job.zero), lay.tp * lay.dp
    path, err = None, None
    if rank < n_writers:
        g = job.global_batch(lay.dp)
        meta = {"step": step, "samples_consumed": step * g, "world_size": lay.dp, "global_batch": g,
                "micro_batch": job.micro_batch, "grad_accum": job.grad_accum, "seq_len": seq_len, "seed": job.seed,
                **pos.to_meta(), **layout_meta(lay, job.zero)}
        if scaler is not None:
            meta.update(loss_scale_value=float(scaler.scale_value.asnumpy()),
                        loss_scale_counter=int(scaler.counter.asnumpy()))
        testing_hooks.before_save(job, step, rank, n_writers)
        try:
            path = ckpt.save(opt, root, step, meta, fence=fence, weights=saves_weights(lay))
        except Exception as e:  # noqa: BLE001 - reported to every rank through the barrier, then re-raised here
            err = e
    _barrier(err, world, f"checkpoint step {step}")
    if rank == 0:
        testing_hooks.before_commit(job, step, n_writers)
        try:
            job_id, generation = owner or (None, None)
            commit.write_marker(job.out_dir, step, layout_meta(lay, job.zero), n_writers, job_id=job_id,
                                generation=generation, fence=fence or (lambda: None))
        except Exception as e:  # noqa: BLE001
            err = e
    _barrier(err, world, f"commit of checkpoint step {step}")
    if rank < n_writers:
        commit.prune(root, job.out_dir, job.keep_checkpoints, rank, newest=step)
    return path


def _barrier(err: Exception | None, world: int, what: str) -> None:
    try:
        commit.barrier(err is None, world, what)
    except RuntimeError:
        if err is not None:
            raise err from None
        raise
