"""The one description of a parallel layout: tensor x data-parallel ranks over nodes, ZeRO-1 or the distributed
optimizer. The config (``TrainConfig.layout``), the job (``TrainJob.layout``), the memory plan
(``memory_plan.Layout`` extends it with batch and precision) and the launchers (local, Slurm, ``launcher.py``)
read the same object, and :meth:`ParallelLayout.rank` gives each rank its place (``parallel.RankLayout``). No
MindSpore import.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RankLayout:
    """One rank's place in a layout (``ParallelLayout.rank``)."""

    tp: int
    dp: int
    tp_rank: int
    dp_rank: int
    tp_group: str | None  # None: the world group (DP = 1)
    dp_group: str | None  # None: the world group (TP = 1)


@dataclass(frozen=True)
class ParallelLayout:
    """``tp`` ranks per tensor-parallel group (inside one node), ``dp`` data-parallel replicas, ``nodes`` hosts."""

    tp: int = 1
    dp: int = 1
    zero: bool = False                   # ZeRO-1: Adam moments sharded over the DP ranks
    distributed_optimizer: bool = False  # 16-bit weights, fp32 master blocks and moments sharded over DP
    nodes: int = 1

    @property
    def workers(self) -> int:
        """Every rank of the job (TP x DP)."""
        return self.tp * self.dp

    @property
    def world(self) -> int:
        return self.workers

    @property
    def per_node(self) -> int:
        return self.workers // self.nodes

    def problem(self) -> tuple[str, str] | None:
        """``(field, what is wrong)`` of an impossible layout, or None; callers name the field their way."""
        for name in ("tp", "dp", "nodes"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                return name, f"must be an integer >= 1, got {getattr(self, name)!r}"
        if self.workers % self.nodes:
            return "nodes", f"must divide the {self.workers} ranks, got {self.nodes}"
        if self.per_node % self.tp:
            return "tp", (f"a tensor-parallel group stays inside one node: must divide the {self.per_node} ranks "
                          f"per node, got {self.tp}")
        if self.distributed_optimizer and not self.zero:
            return "distributed_optimizer", "needs zero (it shards the ZeRO-1 state further: fp32 master weights too)"
        return None

    def rank(self, rank: int):
        """This rank's place: TP rank and DP rank (``rank = dp_rank * tp + tp_rank``), and its groups."""
        if not 0 <= rank < self.workers:
            raise ValueError(f"rank {rank}: outside the layout's {self.workers} ranks")
        return RankLayout(self.tp, self.dp, rank % self.tp, rank // self.tp,
                          None if self.dp == 1 else f"tp_{rank // self.tp}",
                          None if self.tp == 1 else f"dp_{rank % self.tp}")
