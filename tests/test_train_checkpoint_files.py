"""Checkpoint files (pipeline/train/checkpoint.py, ckpt_write.py): weights and per-rank state apart, digests taken
while writing, and what a data-parallel rank > 0 reads when it resumes.

The resume test measures bytes with the kernel's own counter (``rchar`` of ``/proc/self/io``: every byte this
process read through read(2)), so a reader that opens another rank's state file, or a save that reads its file back
to hash it, fails the test whichever function does the reading.
"""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np
import pytest

from pipeline.train import commit

ms = pytest.importorskip("mindspore")

STEP, N = 4, 256  # weights of 2 x 256 x 256 fp32 = 512 KiB per file: far above the noise of the counter
LAYOUT = {"tensor_parallel": 1, "data_parallel": 2, "zero_shards": 2}


def _rchar() -> int:
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))


def _opt(seed: int):
    from mindspore import Parameter, Tensor

    from pipeline.train.adamw import AdamW

    rng = np.random.default_rng(seed)
    ps = [Parameter(Tensor(rng.normal(size=(N, N)).astype(np.float32)), name=f"model.layers.{i}.w")
          for i in range(2)]
    opt = AdamW([{"params": ps, "weight_decay": 0.0}], Tensor(np.full(8, 1e-3, np.float32)))
    for p in opt.parameters_dict().values():  # moments that differ per rank
        if p.name.startswith(("adam_m.", "adam_v.")):
            p.set_data(Tensor(rng.normal(size=p.shape).astype(np.float32)))
    return opt


def _meta(dp_rank: int) -> dict:
    return {"step": STEP, "tensor_parallel": 1, "tp_rank": 0, "data_parallel": 2, "dp_rank": dp_rank,
            "zero_shards": 2, "world_size": 2, "global_batch": 2, "micro_batch": 1, "grad_accum": 1, "seq_len": 8,
            "data_epoch": 0, "data_sample": 8, "data_consumed": 8}


def test_the_writer_writes_mindspores_bytes_and_hashes_them_on_the_way(tmp_path):
    from pipeline.train import ckpt_write

    opt = _opt(0)
    extra = {"step": 7, "loss_scale_value": 2.5, "ms_rng_state": ms.get_rng_state()}
    ms.save_checkpoint(opt, str(tmp_path / "ms.ckpt"), append_dict=dict(extra))
    digest, size = ckpt_write.write(str(tmp_path / "ours.ckpt"), [*ckpt_write.cell_entries(opt), *extra.items()])
    ours = (tmp_path / "ours.ckpt").read_bytes()
    assert ours == (tmp_path / "ms.ckpt").read_bytes()
    assert (digest, size) == (hashlib.sha256(ours).hexdigest(), len(ours))


def test_a_save_splits_weights_from_state_and_never_reads_its_files_back(tmp_path):
    from pipeline.io import sha256_file
    from pipeline.train import checkpoint as ckpt

    opt = _opt(0)
    before = _rchar()
    state = ckpt.save(opt, str(tmp_path), STEP, _meta(0))
    read = _rchar() - before
    weights = ckpt.weights_path(state)
    sizes = os.path.getsize(state) + os.path.getsize(weights)
    assert read < 64 * 1024 < sizes, (read, sizes)  # hashing by reading back would read `sizes` bytes again
    for path in (state, weights):
        assert open(path + ".sha256").read() == f"{sha256_file(path)}  {os.path.basename(path)}\n"
    w, s = ms.load_checkpoint(weights), ms.load_checkpoint(state)
    assert sorted(w) == ["data_parallel", "dp_rank", "model.layers.0.w", "model.layers.1.w", "step",
                         "tensor_parallel", "tp_rank", "zero_shards"]
    assert not ckpt.weights_only(s) and {"adam_m.model.layers.0.w", "adam_v.model.layers.1.w", "global_step",
                                         "adam_step", "ms_rng_state", "data_sample"} <= set(s)
    assert sorted(os.listdir(tmp_path / "checkpoints")) == [  # no temp file left
        "step_00000004.ckpt", "step_00000004.ckpt.sha256", "step_00000004.weights.ckpt",
        "step_00000004.weights.ckpt.sha256"]
    pd, meta = ckpt.load_file(state)  # a plain path: the state file brings the weights beside it
    assert meta["dp_rank"] == 0 and np.array_equal(pd["model.layers.1.w"].asnumpy(),
                                                   opt.parameters_dict()["model.layers.1.w"].asnumpy())


def _two_rank_step(out) -> tuple:
    """A committed ZeRO step of two data-parallel ranks, written by checkpoint.save as the trainer does."""
    from pipeline.train import checkpoint as ckpt

    opts = [_opt(0), _opt(1)]
    for r, opt in enumerate(opts):
        ckpt.save(opt, commit.rank_dir(str(out), r), STEP, _meta(r), weights=r == 0)
    commit.write_marker(str(out), STEP, LAYOUT, 2)
    return opts, commit.read_marker(commit.commit_file(str(out), STEP))


def _resume_rank1(marker) -> tuple[dict, int]:
    from pipeline.train import resume
    from pipeline.train.parallel import rank_layout

    load = resume._full_state_loader(rank_layout(1, 2, 1), True, 1)
    load(marker)  # warm: lazy imports read files once
    before = _rchar()
    _, pd, _ = load(marker)
    return pd, _rchar() - before


def test_a_data_parallel_rank_reads_its_own_state_and_the_weights_file_only(tmp_path):
    opts, marker = _two_rank_step(tmp_path / "s")
    assert [sorted(f) for f in marker["files"]] == [["path", "rank", "sha256", "weights"], ["path", "rank", "sha256"]]
    assert marker["files"][0]["weights"]["path"] == "checkpoints/step_00000004.weights.ckpt"
    pd, read = _resume_rank1(marker)
    size = {k: os.path.getsize(p) for k, p in (
        ("weights", commit.weights_file(str(tmp_path / "s"), 0, STEP)),
        ("state0", commit.rank_file(str(tmp_path / "s"), 0, STEP)),
        ("state1", commit.rank_file(str(tmp_path / "s"), 1, STEP)))}
    need = size["weights"] + size["state1"]
    # each file it needs is read twice (checked against the marker's digest, then parsed); rank 0's state never
    assert 2 * need <= read < 2 * need + 64 * 1024 < 2 * need + size["state0"], (read, size)
    own, rank0 = opts[1].parameters_dict(), opts[0].parameters_dict()
    assert np.array_equal(pd["adam_m.model.layers.0.w"].asnumpy(), own["adam_m.model.layers.0.w"].asnumpy())
    assert np.array_equal(pd["model.layers.0.w"].asnumpy(), rank0["model.layers.0.w"].asnumpy())


def test_a_marker_from_before_weights_files_still_resumes(tmp_path):
    """The older layout: rank 0's one file holds weights and its state, rank 1's its state; no ``weights`` entry."""
    from pipeline.io import sha256_file
    from pipeline.train import checkpoint as ckpt

    out = tmp_path / "s"
    opts = [_opt(0), _opt(1)]
    files = []
    for r, opt in enumerate(opts):
        path = commit.rank_file(str(out), r, STEP)
        os.makedirs(os.path.dirname(path))
        keep = None if r == 0 else (lambda name: not ckpt.is_weight(name))
        ms.save_checkpoint(opt, path, append_dict={**_meta(r), **ckpt.rng_state()}, choice_func=keep)
        files.append({"rank": r, "path": os.path.relpath(path, out), "sha256": sha256_file(path)})
    with open(commit.commit_file(str(out), STEP), "w") as f:
        json.dump({"step": STEP, "ranks": 2, "layout": LAYOUT, "files": files}, f)
    marker = commit.read_marker(commit.commit_file(str(out), STEP))
    pd, read = _resume_rank1(marker)
    assert read >= 2 * (os.path.getsize(commit.rank_file(str(out), 0, STEP)))  # the whole of rank 0's file
    assert np.array_equal(pd["model.layers.1.w"].asnumpy(), opts[0].parameters_dict()["model.layers.1.w"].asnumpy())
    assert np.array_equal(pd["adam_v.model.layers.1.w"].asnumpy(),
                          opts[1].parameters_dict()["adam_v.model.layers.1.w"].asnumpy())


def test_a_marker_entry_with_a_malformed_weights_field_is_refused(tmp_path):
    _two_rank_step(tmp_path / "s")
    path = commit.commit_file(str(tmp_path / "s"), STEP)
    m = json.load(open(path))
    m["files"][0]["weights"] = {"path": "checkpoints/step_00000004.weights.ckpt"}
    with open(path, "w") as f:
        json.dump(m, f)
    with pytest.raises(ValueError, match=r"step_00000004\.commit\.json: rank 0's 'weights' must be \{path, sha256\}"):
        commit.read_marker(path)
