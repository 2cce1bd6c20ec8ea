"""Deterministic, resumable MindRecord token stream.

Why it looks like this:

* Rows are ``input_ids`` int32 of length ``seq_len + 1`` (mindformers convention); the loss cell shifts inside.
* Order is a pure function of (seed, files, batch size, world size): ``ds.config.set_seed(seed)`` fixes the
  ``MindDataset`` global shuffle and every ``repeat`` epoch reshuffles deterministically. So the data position of a
  run is fully described by one number, the batches already consumed, and a resumed run ``skip``s exactly those
  (verified equal to an uninterrupted stream, also across epoch boundaries).
* Data parallel: ``num_shards``/``shard_id`` split each shuffled epoch into disjoint per-rank parts (rank r gets rows
  r, r+W, ... of the epoch's permutation). In epoch 0 the permutation equals the unsharded one, so W ranks x batch B
  reproduce 1 process x batch W*B exactly; later epochs use a different (still deterministic, still disjoint)
  permutation when sharded.
* ``drop_remainder=True`` keeps every step's shape identical, so GRAPH mode compiles once.
"""

from __future__ import annotations

import glob
import math
import os

import mindspore.dataset as ds
import numpy as np


def find_mindrecord_files(data_dir: str) -> list[str]:
    """Data files ``*.mindrecord*`` (not their ``.db`` index) in ``data_dir``; each needs its ``.db`` next to it."""
    if not os.path.isdir(data_dir):
        raise FileNotFoundError(f"data_dir {data_dir!r} does not exist or is not a directory")
    files = sorted(f for f in glob.glob(os.path.join(data_dir, "*.mindrecord*")) if not f.endswith((".db", ".tmp")))
    if not files:
        raise FileNotFoundError(f"no *.mindrecord* files in data_dir {data_dir!r}")
    missing = [f for f in files if not os.path.exists(f + ".db")]
    if missing:
        raise FileNotFoundError(f"MindRecord index missing: {missing[0]}.db")
    return files


class TokenBatches:
    """Batches ``[batch_size, seq_len + 1]`` int32 numpy arrays starting after ``start_batch`` consumed batches."""

    def __init__(self, data_dir: str, batch_size: int, seed: int, total_batches: int, start_batch: int = 0,
                 rank: int = 0, world: int = 1, workers: int = 1):
        self.files = find_mindrecord_files(data_dir)
        ds.config.set_seed(seed)
        shard = dict(num_shards=world, shard_id=rank) if world > 1 else {}
        d = ds.MindDataset(self.files, columns_list=["input_ids"], shuffle=True, num_parallel_workers=workers,
                           **shard)
        self.rows = d.get_dataset_size()  # rows of this rank
        d = d.batch(batch_size, drop_remainder=True)
        self.batches_per_epoch = d.get_dataset_size()
        if self.batches_per_epoch == 0:
            raise ValueError(f"data_dir has {self.rows} rows per rank, fewer than batch_size={batch_size}")
        epochs = max(1, math.ceil(total_batches / self.batches_per_epoch))
        d = d.repeat(epochs)
        if start_batch:
            d = d.skip(start_batch)
        self.remaining = total_batches - start_batch
        self._ds = d

    def __iter__(self):
        it = self._ds.create_tuple_iterator(num_epochs=1, output_numpy=True)
        for n, (tokens,) in enumerate(it):
            if n >= self.remaining:
                break
            yield np.ascontiguousarray(tokens, dtype=np.int32)
