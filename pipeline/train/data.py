"""Deterministic, resumable MindRecord token stream whose order does not depend on the number of ranks.

Why it looks like this:

* Rows are ``input_ids`` int32 of length ``seq_len + 1`` (mindformers convention); the loss cell shifts inside.
* One ``MindDataset`` per epoch, built after ``ds.config.set_seed(epoch_seed(seed, epoch))``, with the global
  shuffle and ``num_shards``/``shard_id`` per rank. Measured (mindspore 2.10): the shuffled order of a freshly built
  dataset is the same permutation for every ``num_shards`` and rank ``r`` gets its positions ``r, r+W, r+2W, ...``;
  but ``repeat()``'s reshuffle of later epochs *depends on num_shards*. Building each epoch afresh therefore gives
  one global sample sequence per (seed, files), independent of the rank count.
* Global step ``t`` of an epoch consumes exactly the contiguous block ``[p + t*G, p + (t+1)*G)`` of that epoch's
  permutation (``G`` = micro_batch x world x grad_accum, ``p`` = the epoch position the stream started at): W ranks
  x B rows reproduce 1 process x W*B rows, and a checkpoint's data position is one pair (epoch, sample) of *global*
  numbers. Resuming with another rank count or micro-batch split of the same global batch is exact; the trainer
  refuses a different global batch.
* Each epoch yields ``rows // G`` steps (the tail smaller than a global batch is not used in that epoch, like
  ``drop_remainder``); MindDataset pads uneven rank shards by wrapping around, but those positions are never reached.
* Mid-epoch resume starts the epoch's batched dataset at its first unconsumed micro-batch
  (``Dataset.set_init_step`` with ``ds.config.set_fast_recovery(True)``): the sampler moves past the consumed
  positions of the rank's shard without reading their rows, where ``skip()`` read every one (a test counts the
  bytes read: the same as a fresh start). The order is the same either way.
"""

from __future__ import annotations

import glob
import hashlib
import os
from dataclasses import asdict, dataclass

import numpy as np

from pipeline.sink.writer import COLUMN


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


def epoch_seed(seed: int, epoch: int) -> int:
    """Shuffle seed of one epoch (uint32, well mixed so epochs of nearby seeds do not share orders)."""
    return int.from_bytes(hashlib.sha256(f"mindloom-data/{seed}/{epoch}".encode()).digest()[:4], "little")


def count_rows(files: list[str]) -> int:
    import mindspore.dataset as ds

    return ds.MindDataset(files, columns_list=[COLUMN], shuffle=False).get_dataset_size()


@dataclass(frozen=True)
class DataPosition:
    """Where the global sample stream stands: ``sample`` rows of ``epoch``'s permutation are used; ``consumed`` rows
    in total since the stream began (all epochs, all ranks)."""

    epoch: int = 0
    sample: int = 0
    consumed: int = 0

    def to_meta(self) -> dict:
        return {f"data_{k}": v for k, v in asdict(self).items()}

    @classmethod
    def from_meta(cls, meta: dict) -> DataPosition:
        return cls(meta["data_epoch"], meta["data_sample"], meta["data_consumed"])


class TokenBatches:
    """Per-rank micro-batches ``[micro_batch, seq_len + 1]`` int32, grouped ``grad_accum`` per global step."""

    def __init__(self, data_dir: str, micro_batch: int, seed: int, *, rank: int = 0, world: int = 1,
                 grad_accum: int = 1, start: DataPosition | None = None, workers: int = 1,
                 extra_files: list[str] | tuple[str, ...] = ()):
        missing = [f for f in extra_files if not (os.path.isfile(f) and os.path.isfile(f + ".db"))]
        if missing:
            raise FileNotFoundError(f"replay file {missing[0]} (or its .db) is missing; was an earlier release "
                                    f"deleted? Set train.replay_share: 0 to train on the delta alone")
        self.own_files, self.extra_files = find_mindrecord_files(data_dir), list(extra_files)
        self.files = self.own_files + self.extra_files  # one shuffled stream over both
        self.micro_batch, self.seed, self.rank, self.world = micro_batch, seed, rank, world
        self.grad_accum, self.workers = grad_accum, workers
        self.global_batch = micro_batch * world * grad_accum
        self.rows = count_rows(self.files)  # all ranks together
        self.steps_per_epoch = self.rows // self.global_batch
        if self.steps_per_epoch == 0:
            raise ValueError(f"data_dir {data_dir!r} has {self.rows} rows, fewer than one global batch of "
                             f"{self.global_batch} (batch_size {micro_batch} x grad_accum {grad_accum} x "
                             f"{world} ranks)")
        self.position = start or DataPosition()
        if self.position.sample % world:
            raise ValueError(f"data position {self.position} is not a multiple of the {world} ranks")

    def replay_info(self) -> dict:
        """Rows of the earlier releases mixed in (``extra_files``) and the share of the stream they make."""
        replay = count_rows(self.extra_files) if self.extra_files else 0
        return {"files": len(self.extra_files), "rows": replay, "own_rows": self.rows - replay,
                "share": round(replay / self.rows, 4)}

    def _epoch_dataset(self, epoch: int, skip_rows: int):
        import mindspore.dataset as ds

        ds.config.set_seed(epoch_seed(self.seed, epoch))
        shard = dict(num_shards=self.world, shard_id=self.rank) if self.world > 1 else {}
        d = ds.MindDataset(self.files, columns_list=[COLUMN], shuffle=True, num_parallel_workers=self.workers,
                           **shard)
        steps, rows = divmod(skip_rows, self.micro_batch)
        if rows:  # never from a checkpoint (positions are whole global batches); kept exact all the same
            d = d.skip(rows)
        d = d.batch(self.micro_batch, drop_remainder=True)
        if steps:
            ds.config.set_fast_recovery(True)  # no random transforms here: fast recovery changes nothing else
            d.set_init_step(steps)
        return d

    def steps(self, n_steps: int):
        """Yield ``(micro_batches, position_after_step)`` for ``n_steps`` global steps, crossing epochs as needed."""
        pos = self.position
        done = 0
        while done < n_steps:
            usable = self.steps_per_epoch * self.global_batch
            left = (usable - pos.sample) // self.global_batch
            if left <= 0:
                pos = DataPosition(pos.epoch + 1, 0, pos.consumed)
                continue
            take = min(left, n_steps - done)
            it = self._epoch_dataset(pos.epoch, pos.sample // self.world).create_tuple_iterator(
                num_epochs=1, output_numpy=True)
            for _ in range(take):
                micro = [np.ascontiguousarray(next(it)[0], dtype=np.int32) for _ in range(self.grad_accum)]
                pos = DataPosition(pos.epoch, pos.sample + self.global_batch, pos.consumed + self.global_batch)
                done += 1
                self.position = pos
                yield micro, pos
            del it
