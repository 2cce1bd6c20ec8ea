"""The records the corpus chain's tasks pass each other (as XCom values), typed and checked at the task boundary.

Each mapped task receives one of these and each fan-in task the list of batch handles; :func:`checked` runs in
:func:`pipeline.tasks.corpus.run_step` before the step's function, so a malformed record (a hand-edited conf, a
plan from another version) fails with the task and the field named, not with a ``KeyError`` deep in a stage. They
stay plain dicts on the wire: Airflow serialises dicts, and the DAG file imports none of this.
"""


import typing  # no "from __future__ import annotations": TypedDict reads NotRequired at class creation
from typing import NotRequired, TypedDict


class TaskRecordError(ValueError):
    """A task received a record without a field it needs, or with a field of the wrong type."""


class BatchHandle(TypedDict):
    """A contiguous range of plan shards (or of output files, ``kind: files``): what a batch task maps over."""

    run_dir: str
    task: int
    of: int
    first: int
    last: int
    kind: NotRequired[str]


class ShardSpec(TypedDict):
    """One shard of the plan (``plan.json``): what a per-shard stage function reads inside a batch."""

    run_dir: str
    shard: str
    domain: NotRequired[str]
    source: NotRequired[str]
    source_index: NotRequired[int]
    units: NotRequired[list]


class PartitionItem(TypedDict):
    """Exact dedup step 2: one hash partition over every batch's hash file."""

    run_dir: str
    partition: int
    batches: int


class BandSpec(TypedDict):
    """Near dedup stage 2 (and the release index): one LSH band."""

    run_dir: str
    band: int


class ClusterItem(TypedDict):
    """Near dedup stage 3: one task's slot share and document range of a clustering step."""

    run_dir: str
    task: int
    of: int
    shards: list


#: The record each mapped step's function takes, by the function's name (``Step.call``).
MAPPED: dict[str, type] = {"exact_partition": PartitionItem, "minhash_band": BandSpec,
                           "minhash_release_band": BandSpec, "minhash_cluster": ClusterItem,
                           "write_file_batch": BatchHandle}


def checked(record, kind: type, task: str):
    """``record`` itself when it has every required field of ``kind`` with the declared type; else
    :class:`TaskRecordError` naming the task, the record type and the field."""
    if not isinstance(record, dict):
        raise TaskRecordError(f"task {task}: expected a {kind.__name__} (a dict), got {type(record).__name__}")
    hints = typing.get_type_hints(kind)
    for name in kind.__required_keys__:
        if name not in record:
            raise TaskRecordError(f"task {task}: {kind.__name__} has no {name!r} (got fields {sorted(record)})")
    for name, hint in hints.items():
        if name in record:
            want = typing.get_origin(hint) or hint
            value = record[name]
            if not isinstance(value, want) or isinstance(value, bool) and want is int:
                raise TaskRecordError(f"task {task}: {kind.__name__}.{name} must be {want.__name__}, got "
                                      f"{value!r}")
    return record
