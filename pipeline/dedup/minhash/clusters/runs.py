"""Slotted runs: the files that carry records from one mapped clustering step to the next.

Every clustering step is a shuffle: a task reads the records addressed to its share of a fixed space of
``SLOTS`` slots (a hash of the node the record is about) from every file the step before wrote, and writes its own
records addressed to the slots of the step after.  A *run* is one such file: an Arrow IPC file of one record batch
sorted by slot, and beside it ``<run>.slots``, the ``SLOTS + 1`` row offsets of the slots (raw little-endian int64,
so a reader takes the two or the range it needs with one positioned read).  A reader takes the
rows of a slot range from every run through a memory map of only those rows, copies them and closes the file, so
a task holds one run open at a time whatever the number of runs, and its memory is set by how many slots it reads
at once (:func:`plan_ranges`), not by the corpus.

A task writes one run per slot range it processed (:class:`RunWriter`), and a *task marker* once all of them are
written: its runs, its counts and a digest of its settings and of its inputs' markers, so a rerun skips a task
whose marker matches and redoes one whose inputs changed (:func:`done`).

Cost: a step of ``T`` tasks reading a step that wrote ``R`` runs opens ``R`` runs per slot range it reads: ``T x R``
opens in all, each a few small reads (the offsets of the range, the rows).  ``R`` grows with the data over the
memory budget, so the opens of one step grow as (data / memory_mb)^2; at 10 TB that is about 10^5 opens of a few
tens of microseconds each, next to minutes of sorting.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np

from pipeline.io import atomic_path, config_digest, read_json, write_json

SLOT_BITS = 16
SLOTS = 1 << SLOT_BITS
_M1, _M2, _G = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB), np.uint64(0x9E3779B97F4A7C15)


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: a bijection of uint64 that spreads consecutive ids over the whole range."""
    x = np.asarray(x, np.uint64) + _G
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * _M1
        x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


def slot_of(ids: np.ndarray) -> np.ndarray:
    """The slot of every node id (current-run global id or dedup-index node), as int64 in ``[0, SLOTS)``."""
    return (mix64(ids) >> np.uint64(64 - SLOT_BITS)).astype(np.int64)


def task_slots(task: int, tasks: int) -> tuple[int, int]:
    """Slot range ``[lo, hi)`` of task ``task`` of ``tasks``: contiguous, sizes differing by at most one."""
    return task * SLOTS // tasks, (task + 1) * SLOTS // tasks


# ------------------------------------------------------------------------------------------------------------
# Writing and reading runs


def _offsets_path(run: Path) -> Path:
    return run.with_name(run.name[: -len(".arrow")] + ".slots")


def _offsets(run: Path, lo: int, hi: int) -> np.ndarray:
    """Row offsets of slots ``lo`` .. ``hi`` (inclusive) of a run."""
    return np.fromfile(_offsets_path(run), dtype="<i8", count=hi - lo + 1, offset=8 * lo)


def write_run(path: Path, table, slots: np.ndarray) -> dict:
    """Write ``table`` (rows in any order) as a run sorted by ``slots`` (stable); return ``{"run", "rows"}``.

    The offsets are written first and the data renamed into place last, so a run whose ``.arrow`` exists is
    whole."""
    import pyarrow as pa

    order = np.argsort(slots, kind="stable")
    bounds = np.searchsorted(slots[order], np.arange(SLOTS + 1)).astype(np.int64)
    table = table.take(pa.array(order)) if len(order) and not np.all(order[1:] > order[:-1]) else table
    with atomic_path(_offsets_path(path)) as tmp:
        bounds.astype("<i8").tofile(tmp)
    with atomic_path(path) as tmp, pa.OSFile(str(tmp), "wb") as sink, \
            pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table.combine_chunks(), max_chunksize=max(1, table.num_rows))
    return {"run": path.name, "rows": int(table.num_rows)}


def slot_counts(runs: list[Path], lo: int, hi: int) -> np.ndarray:
    """Rows per slot of ``[lo, hi)`` summed over ``runs`` (each run's offsets read through a memory map)."""
    counts = np.zeros(hi - lo, np.int64)
    for run in runs:
        counts += np.diff(_offsets(run, lo, hi))
    return counts


def read_range(runs: list[Path], lo: int, hi: int, schema):
    """The rows of slots ``[lo, hi)`` of every run, in run order, as one table with buffers of its own: each run
    is mapped, sliced, copied and closed before the next is opened, so one file is open at a time whatever the
    number of runs, and only the pages of those rows are read.  (Slicing without the copy and combining the slices
    once costs more CPU in the steps that read many runs.)"""
    import pyarrow as pa

    pieces = []
    for run in runs:
        r0, r1 = (int(x) for x in _offsets(run, lo, hi)[[0, -1]])
        if r1 == r0:
            continue
        with pa.memory_map(str(run), "r") as src:
            batch = pa.ipc.open_file(src).get_batch(0).slice(r0, r1 - r0)
            if batch.schema != schema:
                raise ValueError(f"{run}: columns {batch.schema.names} differ from the step's {schema.names}")
            pieces.append(pa.table([pa.concat_arrays([c]) for c in batch.columns], schema=schema))  # copies
            del batch
    if not pieces:
        return schema.empty_table()
    if len(pieces) == 1:
        return pieces[0]
    table = pa.concat_tables(pieces).combine_chunks()
    del pieces
    pa.default_memory_pool().release_unused()
    return table


def read_lists(runs: list[Path], lo: int, hi: int, column: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The rows of slots ``[lo, hi)`` of runs with a ``gid`` and a list<uint64> ``column``, in run order, as
    ``(gids, starts, values)``: ``values[starts[k]:starts[k + 1]]`` is row ``k``'s list.  The values are copied
    once, from each mapped run into one array sized first (a first pass reads the runs' list offsets only), so
    the rows are never held twice."""
    import pyarrow as pa

    spans = []
    for run in runs:
        r0, r1 = (int(x) for x in _offsets(run, lo, hi)[[0, -1]])
        if r1 > r0:
            with pa.memory_map(str(run), "r") as src:
                offs = pa.ipc.open_file(src).get_batch(0).column(column).offsets.to_numpy()
                spans.append((run, r0, r1, int(offs[r1] - offs[r0])))
                del offs
    values = np.empty(sum(n for *_, n in spans), np.uint64)
    gids, starts, at = [], [np.zeros(1, np.int64)], 0
    for run, r0, r1, n in spans:
        with pa.memory_map(str(run), "r") as src:
            batch = pa.ipc.open_file(src).get_batch(0)
            col = batch.column(column)
            offs = col.offsets.to_numpy()[r0:r1 + 1].astype(np.int64)
            values[at:at + n] = col.values.to_numpy()[offs[0]:offs[-1]]
            gids.append(batch.column("gid").to_numpy()[r0:r1].copy())
            starts.append(offs[1:] - offs[0] + at)
            del batch, col
        at += n
    return (np.concatenate(gids) if gids else np.zeros(0, np.uint64)), np.concatenate(starts), values


def plan_ranges(counts: np.ndarray, lo: int, bytes_per_row: float, budget: int) -> list[tuple[int, int]]:
    """Cut slots ``[lo, lo + len(counts))`` into consecutive ranges whose rows cost at most ``budget`` bytes each
    (a single slot that costs more is a range by itself)."""
    cost = np.cumsum(counts.astype(np.float64) * bytes_per_row)
    out, start = [], 0
    while start < len(counts):
        base = cost[start - 1] if start else 0.0
        stop = max(start + 1, int(np.searchsorted(cost, base + budget, side="right")))
        out.append((lo + start, lo + stop))
        start = stop
    return out or [(lo, lo)]


# ------------------------------------------------------------------------------------------------------------
# Task markers


def step_dir(rdir: Path, step: str) -> Path:
    return Path(rdir) / "minhash" / "cc" / step


def task_name(task: int, tasks: int) -> str:
    return f"t{task:05d}-of-{tasks:05d}"


def marker_file(rdir: Path, step: str, task: int, tasks: int) -> Path:
    return step_dir(rdir, step) / f"{task_name(task, tasks)}.json"


def done(rdir: Path, step: str, task: int, tasks: int, digest: str) -> dict | None:
    """The task's marker when it matches ``digest`` and every run it lists is on disk; else None."""
    path = marker_file(rdir, step, task, tasks)
    if not path.exists():
        return None
    info = read_json(path)
    if info.get("digest") != digest:
        return None
    folder = step_dir(rdir, step)
    if not all((folder / r["run"]).exists() for runs in info.get("outputs", {}).values() for r in runs):
        return None
    return info


def commit(rdir: Path, step: str, task: int, tasks: int, digest: str, outputs: dict[str, list[dict]],
           stats: dict) -> dict:
    """Write the task's marker (after its runs): what a rerun and the next step read."""
    info = {"step": step, "task": task, "tasks": tasks, "digest": digest, "outputs": outputs, "stats": stats}
    write_json(marker_file(rdir, step, task, tasks), info)
    return info


def markers(rdir: Path, step: str, tasks: int, hint: str) -> list[dict]:
    """Every task marker of a finished step, in task order; a missing one names the step to run."""
    out = []
    for t in range(tasks):
        path = marker_file(rdir, step, t, tasks)
        if not path.exists():
            from pipeline.dedup.minhash.layout import MinhashError

            raise MinhashError(f"{path}: task {t + 1} of {tasks} of clustering step {step!r} has not finished; "
                               f"{hint}")
        out.append(read_json(path))
    return out


def input_runs(rdir: Path, step: str, found: list[dict], output: str) -> list[Path]:
    """The runs of ``output`` that the markers ``found`` of ``step`` list, in task then run order."""
    folder = step_dir(rdir, step)
    return [folder / r["run"] for m in found for r in m["outputs"].get(output, [])]


def digest_of(*parts, inputs: list[dict] = ()) -> str:
    """A task's digest: its settings and the digests of the markers it reads."""
    return config_digest(*parts, [m["digest"] for m in inputs])


def clear_outputs(rdir: Path, step: str, task: int, tasks: int) -> None:
    """Remove what an earlier attempt of the task wrote (its marker first), before writing again."""
    marker_file(rdir, step, task, tasks).unlink(missing_ok=True)
    for path in step_dir(rdir, step).glob(f"{task_name(task, tasks)}-*"):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


class RunWriter:
    """Names and writes a task's runs of one output (``<task>-<output>-<k>.arrow``) and lists them."""

    def __init__(self, rdir: Path, step: str, task: int, tasks: int, output: str):
        self.folder, self.prefix = step_dir(rdir, step), f"{task_name(task, tasks)}-{output}"
        self.written: list[dict] = []

    def write(self, table, slots: np.ndarray) -> None:
        if table.num_rows:
            self.written.append(write_run(self.folder / f"{self.prefix}-{len(self.written):04d}.arrow", table,
                                          slots))


def read_sorted(paths: list[Path], column: str, lo: int, hi: int, schema):
    """The rows whose ``column`` is in ``[lo, hi)`` of runs sorted by it (a binary search of each mapped run),
    copied, sorted by ``column`` (stable: runs in order)."""
    import pyarrow as pa

    pieces = []
    for run in paths:
        with pa.memory_map(str(run), "r") as src:
            batch = pa.ipc.open_file(src).get_batch(0)
            values = batch.column(column).to_numpy()
            r0, r1 = (int(x) for x in np.searchsorted(values, np.array([lo, hi], values.dtype)))
            if r1 > r0:
                part = batch.slice(r0, r1 - r0)
                pieces.append(pa.table([pa.concat_arrays([c]) for c in part.columns], schema=schema))
            del batch, values
    if not pieces:
        return schema.empty_table()
    table = pa.concat_tables(pieces).combine_chunks()
    order = np.argsort(table.column(column).to_numpy(), kind="stable")
    return table.take(pa.array(order))
