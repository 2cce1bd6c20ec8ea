"""Initial weights per parameter and per shard (pipeline/train/model/shard_init.py): every TP degree draws the same
full tensors, a rank holds its shard plus one chunk while drawing, and the spreads are the model's."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from pipeline.train.model import shard_init
from pipeline.train.model.parallel import split_axis, take_shard


@pytest.mark.parametrize("name, shape", [("layers.0.attention.wq.weight", (96, 40)),   # column-parallel: rows
                                         ("layers.3.feed_forward.w2.weight", (40, 96)),  # row-parallel: columns
                                         ("tok_embeddings.embedding_table", (96, 8))])
def test_every_tp_degree_draws_the_same_full_tensor(monkeypatch, name, shape):
    monkeypatch.setattr(shard_init, "CHUNK_ELEMS", 7 * shape[1] + 3)  # chunks of 7 rows: never a shard boundary
    axis = split_axis(name)
    full = shard_init.draw_shard(name, shape, 0.02, seed=5)
    assert full.dtype == np.float32 and abs(float(full.std()) - 0.02) < 0.004
    for tp in (2, 4, 8):
        for r in range(tp):
            part = take_shard(full, axis, tp, r)
            got = shard_init.draw_shard(name, part.shape, 0.02, seed=5, tp=tp, tp_rank=r, axis=axis)
            assert np.array_equal(got, part), (tp, r)
    assert not np.array_equal(shard_init.draw_shard(name, shape, 0.02, seed=6), full)  # the seed matters
    other = name.replace("0", "1") if "0" in name else name + "x"
    assert not np.array_equal(shard_init.draw_shard(other, shape, 0.02, seed=5), full)  # and so does the name


def test_a_rank_holds_its_shard_and_one_chunk_while_drawing():
    """A row-parallel shard (all chunks visited) and a column-parallel one (its rows only) of a 125m-sized
    embedding: the peak above the result is at most one 4 MiB chunk plus its slice."""
    chunk = shard_init.CHUNK_ELEMS * 4
    for name, shard, axis in (("tok_embeddings.embedding_table", (16000, 768), 0),
                              ("layers.0.feed_forward.w2.weight", (768, 1024), 1)):
        tracemalloc.start()
        out = shard_init.draw_shard(name, shard, 0.02, seed=1, tp=2, tp_rank=1, axis=axis)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert peak - out.nbytes <= 2 * chunk + (64 << 10), (name, peak - out.nbytes)


def test_spreads_follow_the_model_and_norm_gains_are_ones():
    pytest.importorskip("mindspore")
    from pipeline.train.model.config import ModelConfig
    from pipeline.train.model.model import Transformer

    cfg = ModelConfig.from_preset("debug", n_layers=2)
    net = Transformer(cfg)
    built = {p.name: p.asnumpy() for p in net.trainable_params()}
    largest = shard_init.init_rank_weights(net, cfg, seed=3)
    drawn = {p.name: p.asnumpy() for p in net.trainable_params()}
    assert largest == max(v.nbytes for v in drawn.values())
    for name, was in built.items():
        now = drawn[name]
        assert now.shape == was.shape and now.dtype == was.dtype
        if "norm" in name:
            assert np.array_equal(now, was) and np.all(now == 1.0), name
        else:
            assert abs(float(now.std()) / float(was.std()) - 1) < 0.05, name  # MindSpore's Normal(std) draws
            assert abs(float(now.mean())) < 0.002, name


@pytest.mark.parametrize("prev_tp, tp", [(1, 2), (2, 1), (2, 4), (4, 2), (8, 2), (2, 8)])
def test_a_tp_change_reslices_from_the_overlapping_shards_only(prev_tp, tp):
    """``tp_merge.reslice`` equals merge-then-slice for every rank, and reads only the previous ranks whose slice
    overlaps (never the whole model when the degree goes down... or up)."""
    from pipeline.train.checkpoint.tp_merge import reslice
    from pipeline.train.model.parallel import merge_tp

    rng = np.random.default_rng(0)
    full = {"layers.0.attention.wq.weight": rng.normal(size=(16, 6)), "layers.0.feed_forward.w2.weight":
            rng.normal(size=(6, 16)), "norm.weight": rng.normal(size=(6,)), "output.weight": rng.normal(size=(32, 6))}
    prev = [{k: take_shard(v, split_axis(k), prev_tp, r) for k, v in full.items()} for r in range(prev_tp)]
    assert all(np.array_equal(merge_tp(prev)[k], full[k]) for k in full)
    for rank in range(tp):
        read: list[int] = []

        def load(r, _read=read):
            _read.append(r)
            return prev[r]

        got = reslice(load, prev_tp, tp, rank)
        for k, v in full.items():
            assert np.array_equal(got[k], take_shard(v, split_axis(k), tp, rank)), (k, rank)
        assert len(read) == max(1, prev_tp // tp), read
