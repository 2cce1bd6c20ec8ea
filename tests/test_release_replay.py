"""#53: the replay share of a continued release (``train.replay_share``): which earlier files are mixed in.

The choice reads only the releases' manifests (row counts per file), so these tests write manifests and corpus
summaries by hand: a chain r1 <- r2 <- r3, files of known row counts.
"""

from __future__ import annotations

import json

import pytest
from conftest import tiny_config


def _release(root, name: str, rows: list[int], extends: str | None, seq_len: int = 32) -> dict:
    run = root / "runs" / name
    (run / "mindrecord").mkdir(parents=True)
    shards = [{"file": f"corpus-{i:05d}.mindrecord", "samples": n} for i, n in enumerate(rows)]
    (run / "mindrecord" / "manifest.json").write_text(json.dumps({"seq_len": seq_len, "samples": sum(rows),
                                                                  "shards": shards}))
    summary = {"run_dir": str(run), "mindrecord_dir": str(run / "mindrecord"),
               "extends_release": {"name": extends} if extends else None}
    (run / "corpus_summary.json").write_text(json.dumps(summary))
    return summary


def _cfg(tmp_path, share: float, seed: int = 7):
    from pipeline.config import load_config

    return load_config(tiny_config(tmp_path, seed=seed, train={"replay_share": share}))


def test_replay_draws_whole_files_of_every_earlier_release_nearest_the_share(tmp_path):
    from pipeline.tasks.release_training import earlier_releases, replay_files

    root = tmp_path / "data"
    _release(root, "r1", [100, 100, 100], None)
    _release(root, "r2", [50, 50], "r1")
    r3 = _release(root, "r3", [400], "r2")
    assert [s["run_dir"].rsplit("/", 1)[1] for s in earlier_releases(root, r3)] == ["r2", "r1"]

    assert replay_files(_cfg(tmp_path, 0.0), r3) == []                   # the delta alone
    assert replay_files(_cfg(tmp_path, 0.5), _release(root, "r0", [10], None)) == []   # extends nothing
    files = replay_files(_cfg(tmp_path, 0.2), r3)     # 0.2 / 0.8 x 400 = 100 rows wanted
    rows = {f"{r}/mindrecord/corpus-{i:05d}.mindrecord": n for r, ns in (("r1", [100] * 3), ("r2", [50] * 2))
            for i, n in enumerate(ns)}
    got = sum(rows[f.split("/runs/")[1]] for f in files)
    assert got == 100 and files == sorted(files)
    assert replay_files(_cfg(tmp_path, 0.2), r3) == files                 # the same seed: the same files
    every = replay_files(_cfg(tmp_path, 0.9), r3)                         # 3,600 rows wanted: all 400 there are
    assert len(every) == 5
    assert {f.split("/runs/")[1].split("/")[0] for f in every} == {"r1", "r2"}


def test_a_release_of_another_row_length_is_refused_by_name(tmp_path):
    from pipeline.tasks.release_training import replay_files

    root = tmp_path / "data"
    _release(root, "r1", [100], None, seq_len=64)
    r2 = _release(root, "r2", [100], "r1")
    with pytest.raises(ValueError, match=r"train.replay_share: release 'r1' has rows of seq_len 64, this corpus 32"):
        replay_files(_cfg(tmp_path, 0.3), r2)


def test_a_missing_replay_file_is_a_clear_error(tmp_path):
    pytest.importorskip("mindspore")
    from pipeline.train.data import TokenBatches

    with pytest.raises(FileNotFoundError, match=r"replay file .*gone.mindrecord \(or its .db\) is missing"):
        TokenBatches(str(tmp_path), 2, 1, extra_files=[str(tmp_path / "gone.mindrecord")])


def test_replay_is_refused_where_a_stage_repacks():
    from pipeline.train.job import TrainJob

    with pytest.raises(ValueError, match=r"TrainJob.replay_files=.*re-packs to another seq_len"):
        TrainJob(stage="long", data_dir="d", out_dir="o", seq_len=64, replay_files=["a.mindrecord"])
