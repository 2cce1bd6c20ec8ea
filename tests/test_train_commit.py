"""Checkpoints commit across ranks (pipeline/train/checkpoint/commit.py, resume.py): markers, pruning, agreement on one
step, layout refusals, and under msrun a rank killed between two ranks' saves and a corrupt rank file.

The msrun runs use the tiny TP=2 model of test_train_parallel (6 steps, a checkpoint every 2): the reference runs
uninterrupted; the crashed run dies in the middle of the step-6 save (rank 0's file written, rank 1 SIGKILLed before
its own), leaving steps 2 and 4 committed. Copies of the crashed folder resume: as it is (every rank restarts at 4),
and with rank 1's step-4 file corrupted (every rank falls back to 2). Both must reproduce the reference's losses.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
from dataclasses import replace

import numpy as np
import pytest
from conftest import MSRUN_CRASH_ENV

from pipeline.train.checkpoint import commit

SEQ, STEPS = 32, 6
TINY = {"preset": "debug", "vocab_size": 260, "dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2,
        "max_seq_len": SEQ}


def _fake_step(out_dir, step: int, ranks: int, layout=None, metas=None) -> None:
    """Rank files of ``step`` as checkpoint.save lays them out (tiny real checkpoints with metadata: a weights file
    and a state file per rank, each with its sidecar), then its marker."""
    ms = pytest.importorskip("mindspore")
    from pipeline.io import sha256_file

    layout = layout or {"tensor_parallel": ranks, "data_parallel": 1, "zero_shards": 1}
    for r in range(ranks):
        meta = {"step": step, "tensor_parallel": ranks, "tp_rank": r, "zero_shards": 1, "dp_rank": 0,
                **((metas or {}).get(r, {}))}
        files = [(commit.rank_file(str(out_dir), r, step), "adam_m.w")]
        if r < layout["tensor_parallel"]:
            files.append((commit.weights_file(str(out_dir), r, step), "w"))
        for path, name in files:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            ms.save_checkpoint([{"name": name, "data": ms.Tensor(np.full((2,), r, np.float32))}], path,
                               append_dict=meta)
            with open(path + ".sha256", "w") as f:
                f.write(f"{sha256_file(path)}  {os.path.basename(path)}\n")
    commit.write_marker(str(out_dir), step, layout, ranks)


def test_marker_lists_every_rank_with_its_digest_relative_to_the_stage(tmp_path):
    _fake_step(tmp_path / "s", 4, 2)
    (m,) = commit.committed(str(tmp_path / "s"))
    assert (m["step"], m["ranks"], m["layout"]) == (4, 2, {"tensor_parallel": 2, "data_parallel": 1,
                                                           "zero_shards": 1})
    assert [f["path"] for f in m["files"]] == ["checkpoints/step_00000004.ckpt",
                                              "ranks/rank_00001/checkpoints/step_00000004.ckpt"]
    assert [f["weights"]["path"] for f in m["files"]] == ["checkpoints/step_00000004.weights.ckpt",
                                                         "ranks/rank_00001/checkpoints/step_00000004.weights.ckpt"]
    shutil.move(tmp_path / "s", tmp_path / "moved")  # an archived stage folder stays loadable
    (m,) = commit.committed(str(tmp_path / "moved"))
    path, digest = commit.file_of(m, 1)
    assert path == str(tmp_path / "moved" / "ranks" / "rank_00001" / "checkpoints" / "step_00000004.ckpt")
    from pipeline.io import sha256_file

    assert digest == sha256_file(path)
    bad = tmp_path / "moved" / "checkpoints" / "step_00000002.commit.json"
    bad.write_text(json.dumps({"step": 2, "ranks": 2, "layout": {}, "files": [{"rank": 0}]}))
    with pytest.raises(ValueError, match=r"step_00000002\.commit\.json: field 'files' must list ranks 0\.\.1"):
        commit.read_marker(str(bad))
    assert [m["step"] for m in commit.committed(str(tmp_path / "moved"))] == [4]  # malformed: skipped


def test_prune_keeps_the_newest_committed_steps_and_anything_in_flight(tmp_path):
    out = tmp_path / "s"
    for step in (2, 4, 6):
        _fake_step(out, step, 2)
    _fake_step(out, 8, 2)
    os.remove(commit.commit_file(str(out), 8))  # step 8: written, not committed (a save in flight)
    for rank in (1, 0):
        commit.prune(commit.rank_dir(str(out), rank), str(out), keep=2, rank=rank)
    files = [f"step_0000000{s}{kind}" for s in (4, 6, 8) for kind in (
        ".ckpt", ".ckpt.sha256", ".weights.ckpt", ".weights.ckpt.sha256")]  # weights files pruned with the state
    assert sorted(os.listdir(out / "checkpoints")) == sorted(
        files + ["step_00000004.commit.json", "step_00000006.commit.json"])
    assert sorted(os.listdir(out / "ranks" / "rank_00001" / "checkpoints")) == files
    commit.prune(str(out), str(out), keep=1, rank=0)  # keep=1 still keeps the newest committed step
    assert commit.committed_steps(str(out)) == [6]
    assert os.path.exists(commit.rank_file(str(out), 0, 6))


def test_agree_falls_back_on_every_rank_and_never_past_a_layout_refusal(monkeypatch):
    # Two ranks simulated: this rank's view plus the other rank's flags added by the fake AllReduce.
    other = {"bad": {6}, "refuse": set()}
    seen = []

    calls = []

    def fake_sum(values, world):  # per candidate: the step check (2 calls, the other rank agrees), then the flags
        calls.append(values)
        if len(calls) % 3:
            return [v * world for v in values] if len(calls) % 3 == 1 else [0]
        step = seen[-1]
        return [values[0] + (step in other["bad"]), values[1] + (step in other["refuse"])]

    monkeypatch.setattr(commit, "world_sum", fake_sum)

    def load(c):
        seen.append(c["step"])
        if c["step"] == 4:
            raise ValueError("sha256 mismatch")
        return f"state {c['step']}"

    cands = [{"step": 6}, {"step": 4}, {"step": 2}]
    assert commit.agree(cands, load, 2, "checkpoint") == ({"step": 2}, "state 2")  # 6: other rank bad, 4: here
    other["refuse"] = {6}
    with pytest.raises(commit.LayoutMismatch, match="1 other rank"):
        commit.agree(cands, load, 2, "checkpoint")
    other["refuse"] = set()
    with pytest.raises(ValueError, match="sha256 mismatch"):  # the failing rank raises its own error
        commit.agree([{"step": 4}], load, 2, "init_from", last_word=True)
    with pytest.raises(ValueError, match="init_from: 1 other rank"):
        commit.agree([{"step": 6}], load, 2, "init_from", last_word=True)


def _ranks_at(steps_of_others: list[int], monkeypatch):
    """Fake AllReduce: this rank's values plus the other ranks' (which consider ``steps_of_others`` and agree
    with themselves only when their step is the mean)."""
    def fake_sum(values, world):
        if len(values) == 2 and fake_sum.phase == 0:  # the step check: hi, lo halves of every rank's step
            fake_sum.phase, fake_sum.mine = 1, values
            others = [divmod(s, 4096) for s in steps_of_others]
            fake_sum.total = [values[0] + sum(h for h, _ in others), values[1] + sum(lo for _, lo in others)]
            return fake_sum.total
        if fake_sum.phase == 1:  # the mismatch count
            fake_sum.phase = 2
            return [values[0] + sum(1 for h, lo in (divmod(s, 4096) for s in steps_of_others)
                                    if [world * h, world * lo] != fake_sum.total)]
        fake_sum.phase = 0  # the load flags: the other ranks loaded fine
        return list(values)

    fake_sum.phase = 0
    monkeypatch.setattr(commit, "world_sum", fake_sum)


@pytest.mark.parametrize("mine, others", [(6, [4]), (4, [2, 6]), (4096 + 6, [6])])
def test_ranks_that_pick_different_steps_are_refused(monkeypatch, mine, others):
    # (4, [2, 6]): this rank's own sum looks right (4 is the mean), the others' mismatch refuses it too
    _ranks_at(others, monkeypatch)
    with pytest.raises(commit.StepDisagreement, match=rf"this rank: step {mine}, mean over the "
                                                      rf"{len(others) + 1} ranks"):
        commit.agree([{"step": mine, "marker": "/s/checkpoints/m.json"}], lambda c: "state",
                     len(others) + 1, "checkpoint")
    _ranks_at([mine] * len(others), monkeypatch)
    assert commit.agree([{"step": mine}], lambda c: "state", len(others) + 1, "checkpoint") == ({"step": mine},
                                                                                                "state")


def test_no_verifying_marker_is_an_error_naming_every_marker(tmp_path, monkeypatch):
    from pipeline.train.checkpoint import resume
    from pipeline.train.model.parallel import rank_layout

    for step in (2, 4):
        _fake_step(tmp_path / "s", step, 1)
        with open(commit.rank_file(str(tmp_path / "s"), 0, step), "ab") as f:
            f.write(b"rot")  # both committed files no longer match their markers
    job = _job(tmp_path)
    with pytest.raises(ValueError) as e:
        resume.restore(job, None, None, None, rank_layout(0, 1, 1), 0, SEQ)
    msg = str(e.value)
    assert "none of the 2 committed steps verifies on every rank" in msg and "\n" not in msg
    for step in (2, 4):
        assert f"step_{step:08d}.commit.json: ValueError: checkpoint " in msg
    with open(commit.commit_file(str(tmp_path / "s"), 4), "w") as f:
        f.write("{")  # an unreadable marker is named too, never skipped into a fresh start
    os.remove(commit.commit_file(str(tmp_path / "s"), 2))
    with pytest.raises(ValueError, match=r"commit marker\(s\) \[.*step_00000004\.commit\.json'\] are all "
                                         r"malformed"):
        resume.restore(job, None, None, None, rank_layout(0, 1, 1), 0, SEQ)


def test_prune_after_a_fallback_resume_keeps_the_steps_it_writes(tmp_path):
    """Steps 2, 4, 6 committed; 6 was unusable, so the run resumed from 4 and now commits 5: with keep=1 the old
    code counted 6 as newest and deleted 5. Nothing newer than the step just committed is touched either."""
    out = tmp_path / "s"
    for step in (2, 4, 6, 5):
        _fake_step(out, step, 1)
    commit.prune(str(out), str(out), keep=1, rank=0, newest=5)
    assert commit.committed_steps(str(out)) == [6, 5]
    assert sorted(os.listdir(out / "checkpoints")) == [f"step_0000000{s}{kind}" for s in (5, 6) for kind in (
        ".ckpt", ".ckpt.sha256", ".commit.json", ".weights.ckpt", ".weights.ckpt.sha256")]


def test_check_layout_refuses_in_one_line_naming_file_and_field():
    from pipeline.train.checkpoint.checkpoint import check_file_layout

    with pytest.raises(commit.LayoutMismatch) as e:
        check_file_layout("/x/ranks/rank_00001/checkpoints/step_00000004.ckpt", {"tensor_parallel": 2, "tp_rank": 0},
                     {"tensor_parallel": 2, "tp_rank": 1})
    assert str(e.value) == ("checkpoint /x/ranks/rank_00001/checkpoints/step_00000004.ckpt: written with tp_rank=0, "
                            "this rank expects tp_rank=1")
    check_file_layout("f", {"tensor_parallel": 1}, {"tensor_parallel": 1, "data_parallel": 2})  # older file: passes


def _job(tmp_path, **kw):
    from pipeline.train.job import TrainJob

    return TrainJob(**{"stage": "s", "data_dir": "d", "out_dir": str(tmp_path / "s"), "model": TINY, **kw})


@pytest.mark.parametrize("case, match", [
    ("copied_rank0_file", r"^checkpoint .*/ranks/rank_00001/checkpoints/step_00000004\.ckpt: written with "
                          r"tp_rank=0, this rank expects tp_rank=1$"),
    ("other_tp", r"^checkpoint .*/step_00000004\.commit\.json: written with tensor_parallel=2, this run has "
                 r"tensor_parallel=1; resume this stage with its own layout"),
    ("continue_other_tp", r"^init_from .*/step_00000004\.commit\.json: written with tensor_parallel=2, this run "
                          r"has tensor_parallel=1; 'continue' keeps each rank's Adam moments"),
    ("plain_tp_shard", r"^init_from .*step_00000004\.ckpt: written with tensor_parallel=2 \(one TP shard\); pass "
                       r"its step's commit marker"),
])
def test_loads_with_a_mismatched_layout_are_refused_in_one_line(tmp_path, monkeypatch, case, match):
    """The bug this guards against: rank 1 loading rank 0's file (same shapes) trained on the wrong half."""
    from pipeline.train.checkpoint import resume
    from pipeline.train.model.parallel import rank_layout

    monkeypatch.setattr(commit, "world_sum", lambda values, world: [v * world for v in values])  # all alike
    meta = {1: {"tp_rank": 0}} if case == "copied_rank0_file" else None
    _fake_step(tmp_path / "prev", 4, 2, metas=meta)
    marker = commit.commit_file(str(tmp_path / "prev"), 4)
    if case == "copied_rank0_file":
        shutil.copytree(tmp_path / "prev", tmp_path / "s")
        job, lay, rank = _job(tmp_path, tensor_parallel=2, world_size=2), rank_layout(1, 2, 2), 1
    elif case == "other_tp":
        shutil.copytree(tmp_path / "prev", tmp_path / "s")
        job, lay, rank = _job(tmp_path), rank_layout(0, 1, 1), 0
    elif case == "continue_other_tp":
        job, lay, rank = _job(tmp_path, init_from=marker, init_mode="continue"), rank_layout(0, 1, 1), 0
    else:
        plain = commit.rank_file(str(tmp_path / "prev"), 0, 4)
        job, lay, rank = _job(tmp_path, init_from=plain), rank_layout(0, 1, 1), 0
    with pytest.raises(commit.LayoutMismatch) as e:
        resume.restore(job, None, None, None, lay, rank, SEQ)
    assert "\n" not in str(e.value)
    assert __import__("re").search(match, str(e.value)), str(e.value)


def test_resume_point_and_previous_checkpoint_use_commit_markers(tmp_path):
    from pipeline.io import write_json
    from pipeline.tasks.pretrain import previous_checkpoint, resume_point

    run = tmp_path / "run"
    _fake_step(run / "warmup", 2, 1)
    _fake_step(run / "warmup", 4, 1)
    os.remove(commit.commit_file(str(run / "warmup"), 4))  # step 4 written but never committed
    assert resume_point(run / "warmup")["checkpoint_step"] == 2
    write_json(run / "warmup" / "summary.json", {"steps": 4})
    with pytest.raises(FileNotFoundError, match=r"finished at step 4 without a committed final checkpoint .*: 2\)"):
        previous_checkpoint(run / "main", "warmup")
    _fake_step(run / "warmup", 4, 1)
    assert previous_checkpoint(run / "main", "warmup") == str(run / "warmup" / "checkpoints" /
                                                             "step_00000004.commit.json")


# --- msrun: a rank killed between two ranks' saves, a corrupt rank file --------------------------------------

def _msrun(job, tmp_path, name: str, env: dict | None = None) -> int:
    from pipeline.train.jobs.launch import env_with_venv, train_command

    job.to_json(tmp_path / f"{name}.json")
    with socket.socket() as s_:
        s_.bind(("127.0.0.1", 0))
        port = s_.getsockname()[1]
    cmd = train_command(str(tmp_path / f"{name}.json"), workers=2, log_dir=str(tmp_path / f"{name}_log"),
                        master_port=port, cluster_timeout_s=120)
    r = subprocess.run(cmd, capture_output=True, text=True, env={**env_with_venv(), **(env or {})}, cwd=tmp_path,
                       timeout=500)
    return r.returncode


def _losses(out_dir) -> dict[int, float]:
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return {r["step"]: r["loss"] for r in map(json.loads, filter(str.strip, f))}


def _resumed_from(out_dir) -> list:
    out = []
    for r in (0, 1):
        with open(os.path.join(out_dir, "ranks", f"rank_{r:05d}.json")) as f:
            out.append(json.load(f)["resumed_from"])
    return out


@pytest.fixture(scope="module")
def tp2_runs(tmp_path_factory):
    """(reference TP=2 out_dir, crashed TP=2 out_dir, its job)."""
    pytest.importorskip("mindspore")
    from bytes_data import pack_bytes, stdlib_text, write_mindrecord

    from pipeline.train.job import TrainJob

    root = tmp_path_factory.mktemp("commit")
    write_mindrecord(pack_bytes(stdlib_text("argparse"), SEQ), str(root / "data"), shards=2)
    job = TrainJob(stage="tp2", data_dir=str(root / "data"), out_dir=str(root / "ref"), model=TINY, steps=STEPS,
                   micro_batch=8, lr=3e-3, min_lr=3e-4, warmup_steps=2, checkpoint_every=2, keep_checkpoints=3,
                   log_every=2, seed=7, metrics_every=2, tensor_parallel=2, world_size=2)
    assert _msrun(job, root, "ref") == 0
    crashed = replace(job, out_dir=str(root / "crashed"), fail_at_step=6, fail_mode="kill_between_saves")
    assert _msrun(crashed, root, "crashed", MSRUN_CRASH_ENV) != 0
    return root / "ref", root / "crashed", replace(crashed, fail_at_step=None, fail_mode="raise")


@pytest.mark.slow
def test_kill_between_two_ranks_saves_resumes_every_rank_at_the_last_commit(tp2_runs, tmp_path):
    ref, crashed, job = tp2_runs
    assert os.path.exists(commit.rank_file(str(crashed), 0, 6))  # rank 0 wrote step 6 ...
    assert not os.path.exists(commit.rank_file(str(crashed), 1, 6))  # ... rank 1 died before its write
    assert commit.committed_steps(str(crashed)) == [4, 2]  # step 6 never committed
    out = tmp_path / "resumed"
    shutil.copytree(crashed, out)
    assert _msrun(replace(job, out_dir=str(out)), tmp_path, "resume") == 0
    assert _resumed_from(out) == [4, 4]
    want, got = _losses(ref), _losses(out)
    assert sorted(got) == list(range(1, STEPS + 1))
    assert np.abs(np.array([got[s] - want[s] for s in want])).max() < 1e-5, (got, want)
    assert commit.committed_steps(str(out)) == [6, 4, 2]


@pytest.mark.slow
def test_a_corrupt_rank_file_makes_every_rank_fall_back(tp2_runs, tmp_path):
    ref, crashed, job = tp2_runs
    out = tmp_path / "corrupt"
    shutil.copytree(crashed, out)
    victim = commit.rank_file(str(out), 1, 4)
    raw = bytearray(open(victim, "rb").read())
    raw[len(raw) // 2: len(raw) // 2 + 64] = b"\xff" * 64  # bit rot inside rank 1's tensors only
    with open(victim, "wb") as f:
        f.write(bytes(raw))
    assert _msrun(replace(job, out_dir=str(out)), tmp_path, "resume") == 0
    assert _resumed_from(out) == [2, 2]  # rank 0's step-4 file is fine, yet rank 0 also restarts at 2
    want, got = _losses(ref), _losses(out)
    assert np.abs(np.array([got[s] - want[s] for s in want])).max() < 1e-5, (got, want)


@pytest.mark.parametrize("others_see, refused", [(0, True), (3, False), (1, True)])
def test_a_rank_that_lists_no_marker_while_others_do_is_refused_on_every_rank(monkeypatch, others_see, refused):
    """A stale directory listing on one rank (no markers) while the others list some: every rank raises, none
    starts fresh while the others wait in the step agreement.  ``others_see``: how many of the other 3 ranks list
    markers; this rank lists one."""
    monkeypatch.setattr(commit, "world_sum", lambda values, world: [values[0] + others_see])
    if refused:
        with pytest.raises(commit.StepDisagreement, match=rf"{1 + others_see} of 4 ranks see committed steps and "
                                                          rf"{3 - others_see} see none"):
            commit.same_view([{"step": 4}], 4, "resume of /s")
    else:
        commit.same_view([{"step": 4}], 4, "resume of /s")
    commit.same_view([], 1, "resume of /s")       # one rank: nothing to compare
