"""Data order of the training stream: independent of the rank count, exact on resume, refused when it cannot be.

Rows are ``[i, i, ...]`` so every batch says which rows it holds. The ranks of a data-parallel job are simulated by
building one ``TokenBatches`` per rank in this process (what each msrun worker builds).
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("mindspore")

from bytes_data import write_mindrecord  # noqa: E402

from pipeline.train.data import DataPosition, TokenBatches  # noqa: E402

N_ROWS, WIDTH, SEED = 37, 5, 11


@pytest.fixture(scope="module")
def ids_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("ids")
    write_mindrecord(np.repeat(np.arange(N_ROWS, dtype=np.int32)[:, None], WIDTH, axis=1), str(d), shards=3)
    return str(d)


def _global_steps(data_dir, n_steps, micro, world, accum=1, start=None):
    """Per global step: sorted row ids over all ranks and micro-batches; plus the final position."""
    per_rank = []
    for rank in range(world):
        tb = TokenBatches(data_dir, micro, SEED, rank=rank, world=world, grad_accum=accum, start=start)
        per_rank.append(list(tb.steps(n_steps)))
    steps = []
    for t in range(n_steps):
        ids = [int(r[0]) for rank in range(world) for mb in per_rank[rank][t][0] for r in mb]
        assert len({per_rank[rank][t][1] for rank in range(world)}) == 1  # every rank agrees on the position
        steps.append(sorted(ids))
    return steps, per_rank[0][-1][1]


def test_rank_count_and_micro_split_do_not_change_the_samples(ids_dir):
    single, end = _global_steps(ids_dir, 10, micro=8, world=1)  # 37 // 8 = 4 steps per epoch: crosses 2 epochs
    assert end == DataPosition(epoch=2, sample=16, consumed=80)
    assert _global_steps(ids_dir, 10, micro=4, world=2)[0] == single
    assert _global_steps(ids_dir, 10, micro=2, world=2, accum=2)[0] == single
    assert _global_steps(ids_dir, 10, micro=1, world=4, accum=2)[0] == single
    for epoch in range(2):  # an epoch is a permutation: 32 distinct rows of 37 (tail < one global batch unused)
        rows = [i for step in single[epoch * 4:(epoch + 1) * 4] for i in step]
        assert len(rows) == len(set(rows)) == 32
    assert single[:4] != single[4:8]  # reshuffled per epoch


@pytest.mark.parametrize("split_at", [3, 5])  # mid-epoch 0, and mid-epoch 1 (after the reshuffle)
def test_resume_with_another_rank_count_is_exact(ids_dir, split_at):
    uninterrupted, _ = _global_steps(ids_dir, 10, micro=8, world=1)
    first, pos = _global_steps(ids_dir, split_at, micro=4, world=2)  # 2 ranks ...
    rest, _ = _global_steps(ids_dir, 10 - split_at, micro=2, world=4, start=pos)  # ... resumed on 4
    assert first + rest == uninterrupted


def test_position_round_trips_through_checkpoint_meta():
    pos = DataPosition(epoch=3, sample=48, consumed=500)
    assert DataPosition.from_meta(pos.to_meta()) == pos


def test_too_few_rows_and_misaligned_position_are_refused(ids_dir):
    with pytest.raises(ValueError, match="fewer than one global batch of 40"):
        TokenBatches(ids_dir, 20, SEED, world=2)
    with pytest.raises(ValueError, match="not a multiple of the 4 ranks"):
        TokenBatches(ids_dir, 2, SEED, rank=0, world=4, start=DataPosition(0, 6, 6))


def test_changed_global_batch_is_refused_naming_the_field():
    from pipeline.train.checkpoint.resume import check_same_layout
    from pipeline.train.job import TrainJob

    job = TrainJob(stage="s", data_dir="d", out_dir="o", micro_batch=4, grad_accum=1)
    meta = {"global_batch": 8, "micro_batch": 4, "grad_accum": 1, "world_size": 2, "seq_len": 32,
            **DataPosition(0, 16, 16).to_meta()}
    check_same_layout(job, meta, dp=2, seq_len=32, what="ckpt")  # same global batch: fine
    check_same_layout(job.__class__(**{**job.to_dict(), "micro_batch": 2, "grad_accum": 2}), meta, dp=2,
                       seq_len=32, what="ckpt")  # other split, same global batch: fine
    with pytest.raises(ValueError, match=r"TrainJob\.micro_batch: ckpt was written with global batch 8 .* this run "
                                         r"has 12"):
        check_same_layout(job, meta, dp=3, seq_len=32, what="ckpt")
    with pytest.raises(ValueError, match=r"TrainJob\.seq_len"):
        check_same_layout(job, meta, dp=2, seq_len=64, what="ckpt")
    with pytest.raises(ValueError, match="no global data position"):
        check_same_layout(job, {"step": 3, "global_batch": 8}, dp=2, seq_len=32, what="ckpt")


def _bytes_read() -> int:
    """Bytes this process read through read(2) and friends, page cache or not (``rchar``, Linux)."""
    with open("/proc/self/io") as f:
        return int(next(ln for ln in f if ln.startswith("rchar")).split()[1])


@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/io"), reason="needs Linux /proc/self/io")
def test_a_resume_at_row_100000_reads_no_consumed_rows(tmp_path):
    """#50: resuming at row 10^5 of an epoch reads what a fresh start reads (the sampler moves past the consumed
    positions), where ``skip()`` read them all; and it yields the rows the uninterrupted stream yields there."""
    n, micro = 120_000, 8
    rows = np.repeat(np.arange(n, dtype=np.int32)[:, None], WIDTH, axis=1)
    write_mindrecord(rows, str(tmp_path), shards=2)
    at = DataPosition(0, 100_000, 100_000)

    def first_batch(start):
        before = _bytes_read()
        tb = TokenBatches(str(tmp_path), micro, SEED, start=start)
        (micro_batches, pos), = list(tb.steps(1))
        return [int(r[0]) for r in micro_batches[0]], pos, _bytes_read() - before

    _, _, fresh = first_batch(None)
    got, pos, resumed = first_batch(at)
    assert pos == DataPosition(0, 100_000 + micro, 100_000 + micro)
    stream = TokenBatches(str(tmp_path), micro, SEED)._epoch_dataset(0, 0).create_tuple_iterator(
        num_epochs=1, output_numpy=True)
    for _ in range(100_000 // micro):
        next(stream)
    assert got == [int(r[0]) for r in next(stream)[0]]  # the same rows as the uninterrupted stream
    import mindspore.dataset as ds

    ds.config.set_seed(0)
    before = _bytes_read()
    skipped = ds.MindDataset(TokenBatches(str(tmp_path), micro, SEED).files, columns_list=["input_ids"],
                             shuffle=True).skip(100_000).batch(micro)
    next(skipped.create_tuple_iterator(num_epochs=1, output_numpy=True))
    by_skip = _bytes_read() - before
    print(f"\nbytes read to the first batch: fresh {fresh}, resumed at row 1e5 {resumed}, skip() {by_skip}")
    assert resumed < 1.1 * fresh
    assert by_skip > resumed + 100_000 * WIDTH * 4  # skip() reads at least the consumed rows' tokens
