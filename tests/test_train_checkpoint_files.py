"""Checkpoint files (pipeline/train/checkpoint/checkpoint.py, ckpt_write.py): weights and per-rank state apart, digests
taken while writing, each file read once on a load (hashed and parsed from the same bytes), and what a data-parallel
rank > 0 reads when it resumes.

The read tests measure bytes with the kernel's own counter (``rchar`` of ``/proc/self/io``: every byte this
process read through read(2)), so a reader that opens another rank's state file, a save that reads its file back
to hash it, or a load that hashes a file and then parses it from disk again, fails the test whichever function
does the reading.
"""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np
import pytest

from pipeline.train.checkpoint import commit

ms = pytest.importorskip("mindspore")

STEP, N = 4, 256  # weights of 2 x 256 x 256 fp32 = 512 KiB per file: far above the noise of the counter
LAYOUT = {"tensor_parallel": 1, "data_parallel": 2, "zero_shards": 2}


def _rchar() -> int:
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))


def _opt(seed: int):
    from mindspore import Parameter, Tensor

    from pipeline.train.optim.adamw import AdamW

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
    from pipeline.train.checkpoint import ckpt_write

    opt = _opt(0)
    extra = {"step": 7, "loss_scale_value": 2.5, "ms_rng_state": ms.get_rng_state()}
    ms.save_checkpoint(opt, str(tmp_path / "ms.ckpt"), append_dict=dict(extra))
    digest, size = ckpt_write.write(str(tmp_path / "ours.ckpt"), [*ckpt_write.cell_entries(opt), *extra.items()])
    ours = (tmp_path / "ours.ckpt").read_bytes()
    assert ours == (tmp_path / "ms.ckpt").read_bytes()
    assert (digest, size) == (hashlib.sha256(ours).hexdigest(), len(ours))


def test_a_save_splits_weights_from_state_and_never_reads_its_files_back(tmp_path):
    from pipeline.io import sha256_file
    from pipeline.train.checkpoint import checkpoint as ckpt

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
    from pipeline.train.checkpoint import checkpoint as ckpt

    opts = [_opt(0), _opt(1)]
    for r, opt in enumerate(opts):
        ckpt.save(opt, commit.rank_dir(str(out), r), STEP, _meta(r), weights=r == 0)
    commit.write_marker(str(out), STEP, LAYOUT, 2)
    return opts, commit.read_marker(commit.commit_file(str(out), STEP))


def _resume_rank1(marker) -> tuple[dict, int]:
    from pipeline.train.checkpoint import resume
    from pipeline.train.model.parallel import rank_layout

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
    # each file it needs is read once (hashed for the marker's digest and parsed from the same bytes); rank 0's
    # state never. Before #50's one-read load: 2 * need (3,158,224 bytes, digest then parse)
    assert need <= read < need + 64 * 1024 < need + min(size.values()), (read, size)
    own, rank0 = opts[1].parameters_dict(), opts[0].parameters_dict()
    assert np.array_equal(pd["adam_m.model.layers.0.w"].asnumpy(), own["adam_m.model.layers.0.w"].asnumpy())
    assert np.array_equal(pd["model.layers.0.w"].asnumpy(), rank0["model.layers.0.w"].asnumpy())


def test_a_marker_from_before_weights_files_still_resumes(tmp_path):
    """The older layout: rank 0's one file holds weights and its state, rank 1's its state; no ``weights`` entry."""
    from pipeline.io import sha256_file
    from pipeline.train.checkpoint import checkpoint as ckpt

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
    assert read >= os.path.getsize(commit.rank_file(str(out), 0, STEP))  # the whole of rank 0's file
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


def test_the_reader_returns_what_ms_load_checkpoint_returns(tmp_path, monkeypatch):
    """``ckpt_write.read`` parses the bytes it hashed with MindSpore's own conversion: the same names, dtypes, shapes
    and values as ``ms.load_checkpoint`` for every kind of entry the trainer writes (fp32/fp16/bf16 tensors, int and
    float scalars, the RNG state), for a tensor split over several slices, and for a file with MindSpore's crc tail."""
    from mindspore import Parameter, Tensor

    from pipeline.train.checkpoint import ckpt_write

    rng = np.random.default_rng(3)
    entries = [("w32", Parameter(Tensor(rng.normal(size=(33, 7)).astype(np.float32)), name="w32")),
               ("w16", Tensor(rng.normal(size=(5, 4)).astype(np.float16))),
               ("wbf", Tensor(rng.normal(size=(6,)).astype(np.float32)).astype(ms.bfloat16)),
               ("ids", Tensor(np.arange(12, dtype=np.int32).reshape(3, 4))), ("step", 7),
               ("loss_scale_value", 2.5), ("ms_rng_state", ms.get_rng_state())]
    monkeypatch.setattr(ckpt_write, "SLICE_BYTES", 100)  # w32 (924 bytes) in 10 messages, as a > 512 MiB tensor
    digest, _ = ckpt_write.write(str(tmp_path / "a.ckpt"), entries)
    seen = []
    ms.save_checkpoint([{"name": "w", "data": entries[0][1]}], str(tmp_path / "crc.ckpt"), crc_check=True)
    for name in ("a.ckpt", "crc.ckpt"):
        path = str(tmp_path / name)
        want, got = ms.load_checkpoint(path), ckpt_write.read(path, seen.append)
        assert list(got) == list(want), name
        for k, v in want.items():
            assert isinstance(got[k], Parameter) and got[k].name == k
            assert (got[k].dtype, got[k].shape) == (v.dtype, v.shape), k
            assert np.array_equal(got[k].astype(ms.float32).asnumpy(), v.astype(ms.float32).asnumpy()), k
    assert seen[0] == digest == hashlib.sha256((tmp_path / "a.ckpt").read_bytes()).hexdigest()


def test_a_load_reads_each_file_once_and_refuses_a_torn_one_by_name(tmp_path):
    """Every load path (a committed step's file against its marker, a plain ``init_from`` file and its weights file
    against their sidecars, weights only) reads each file once. A truncated or rotten file fails on its digest
    with a message naming it, before anything is parsed."""
    from pipeline.train.checkpoint import checkpoint as ckpt

    opt = _opt(0)
    state = ckpt.save(opt, str(tmp_path / "s"), STEP, _meta(0))
    weights = ckpt.weights_path(state)
    sizes = {p: os.path.getsize(p) for p in (state, weights)}
    digest = {p: open(p + ".sha256").read().split()[0] for p in sizes}
    ckpt.load_verified(state, digest[state])  # warm: lazy imports read files once
    net = _net()

    def read_by(fn) -> int:
        before = _rchar()
        fn()
        return _rchar() - before

    for what, fn, files in (("marker", lambda: ckpt.load_verified(state, digest[state]), [state]),
                            ("init_from", lambda: ckpt.load_file(state), [state, weights]),
                            ("weights", lambda: ckpt.load_weights(net, state), [weights])):
        read = read_by(fn)
        need = sum(sizes[p] for p in files)
        # once: need plus sidecars and noise; twice (hash, then parse) would add need again
        assert need <= read < need + 16 * 1024 < 2 * need, (what, read, need)
    assert np.array_equal(net.w1.asnumpy(), opt.parameters_dict()["model.layers.1.w"].asnumpy())

    torn = str(tmp_path / "torn.ckpt")
    with open(state, "rb") as src, open(torn, "wb") as dst:
        dst.write(src.read()[: sizes[state] // 2])
    with open(torn + ".sha256", "w") as f:
        f.write(f"{digest[state]}  torn.ckpt\n")
    with pytest.raises(ValueError, match=r"checkpoint .*torn\.ckpt: sha256 [0-9a-f]{12}… does not match its commit"):
        ckpt.load_verified(torn, digest[state])
    with pytest.raises(ValueError, match=r"init_from checkpoint '.*torn\.ckpt' is not usable: sha256 mismatch"):
        ckpt.load_file(torn)
    os.remove(torn + ".sha256")  # no digest to check it against: the parser names it
    with pytest.raises(ValueError, match=r"checkpoint .*torn\.ckpt: not a readable \.ckpt file"):
        ckpt.load_file(torn, need_sidecar=False)


def _net():
    """A cell with the model weights of ``_opt`` (what ``load_weights`` loads into)."""
    from mindspore import Parameter, Tensor, nn

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.w0, self.w1 = (Parameter(Tensor(np.zeros((N, N), np.float32)), name=f"model.layers.{i}.w")
                                for i in range(2))

    return Net()
