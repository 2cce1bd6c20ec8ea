"""#52: the records the chain's tasks pass each other are typed and checked where a task receives them."""

from __future__ import annotations

import pytest

from pipeline.tasks import records
from pipeline.tasks.corpus import run_step

HANDLE = {"run_dir": "/r", "task": 0, "of": 2, "first": 0, "last": 4}


def test_a_malformed_record_fails_naming_the_task_and_the_field():
    assert records.checked(dict(HANDLE), records.BatchHandle, "t") == HANDLE
    with pytest.raises(records.TaskRecordError, match=r"task ingest.ingest_shard: BatchHandle has no 'last'"):
        run_step("ingest.ingest_shard", {k: v for k, v in HANDLE.items() if k != "last"})
    with pytest.raises(records.TaskRecordError, match=r"task near_dedup.band: BandSpec.band must be int, got '3'"):
        run_step("near_dedup.band", {"run_dir": "/r", "band": "3"})
    with pytest.raises(records.TaskRecordError, match=r"task clean.exact_partition: PartitionItem has no "
                                                      r"'batches'"):
        run_step("clean.exact_partition", {"run_dir": "/r", "partition": 1})
    with pytest.raises(records.TaskRecordError, match=r"task tokenize.train_tokenizer: expected the list of batch "
                                                      r"handles"):
        run_step("tokenize.train_tokenizer", {"run_dir": "/r"})
    with pytest.raises(records.TaskRecordError, match=r"BatchHandle.task must be int, got True"):
        records.checked({**HANDLE, "task": True}, records.BatchHandle, "t")


def test_every_mapped_step_has_a_record_type():
    from pipeline.tasks.steps import STEPS

    assert {s.call for s in STEPS if s.kind == "map"} == set(records.MAPPED)
