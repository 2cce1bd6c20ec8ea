"""Cross-rank checkpoint commits: a step counts only when every rank has written and verified its file.

Why: with sharded state (TP weights, ZeRO moments) every rank writes its own file, and a crash between two ranks'
saves, or one corrupt file, must not resume rank 0 at step N and rank 1 at step N-k. Protocol of one save::

    every writing rank: save its state file (+ the weights file, on data-parallel rank 0) with .sha256
                        sidecars (digests computed while the bytes were written, checkpoint.py)
    barrier 1 (world AllReduce-sum of "my files are written" flags): all ranks or none go on
    rank 0: reads the digests from the sidecars (tiny files, no re-hash) and writes ONE marker
            out_dir/checkpoints/step_XXXXXXXX.commit.json {step, ranks, layout,
            files: [{rank, path, sha256, weights: {path, sha256} on the ranks that saved weights}]}
    barrier 2 (AllReduce-sum of "committed"): every rank sees the marker before it prunes its own files

Only AllReduce-sum in the world group is used (CPU mccl lacks Send/Recv and sub-group gathers). Resume and stage
chaining read the markers (every rank reads the same files) and agree on one step with one more AllReduce per
candidate (:func:`agree`): each rank checks ITS file against the marker's digest, and if any rank's check fails
every rank falls back to the previous committed step. Paths in a marker are relative to the stage folder, so an
archived (renamed) stage folder stays loadable. No MindSpore import at module level (the orchestrator reads markers).
"""

from __future__ import annotations

import glob
import logging
import os
import re

from pipeline.io import read_json

from ..jobs import fenced

log = logging.getLogger("mindloom.train")

_MARKER = re.compile(r"^step_(\d{8})\.commit\.json$")
LAYOUT_FIELDS = ("tensor_parallel", "data_parallel", "zero_shards")


class LayoutMismatch(ValueError):
    """A checkpoint written by another parallel layout than the loading rank's (refused, never fallen back from)."""


def commit_file(out_dir: str, step: int) -> str:
    return os.path.join(out_dir, "checkpoints", f"step_{step:08d}.commit.json")


def rank_dir(out_dir: str, rank: int) -> str:
    """Where rank ``rank`` keeps its checkpoints when state is sharded (rank 0: the stage folder itself)."""
    return out_dir if rank == 0 else os.path.join(out_dir, "ranks", f"rank_{rank:05d}")


def rank_file(out_dir: str, rank: int, step: int) -> str:
    return os.path.join(rank_dir(out_dir, rank), "checkpoints", f"step_{step:08d}.ckpt")


def weights_file(out_dir: str, rank: int, step: int) -> str:
    return os.path.join(rank_dir(out_dir, rank), "checkpoints", f"step_{step:08d}.weights.ckpt")


def committed_steps(out_dir: str) -> list[int]:
    """Steps with a commit marker, newest first (names only: cheap, no MindSpore; markers are not validated)."""
    out = []
    for p in glob.glob(os.path.join(out_dir, "checkpoints", "step_*.commit.json")):
        if m := _MARKER.match(os.path.basename(p)):
            out.append(int(m.group(1)))
    return sorted(out, reverse=True)


def read_marker(path: str) -> dict:
    """The marker at ``path`` with ``stage_dir`` added; a malformed one raises one line naming the file/field."""
    try:
        m = read_json(path)
    except (OSError, ValueError) as e:
        raise ValueError(f"commit marker {path}: unreadable ({type(e).__name__}: {e})") from None
    for field, typ in (("step", int), ("ranks", int), ("layout", dict), ("files", list)):
        if not isinstance(m.get(field), typ):
            raise ValueError(f"commit marker {path}: field {field!r} missing or not a {typ.__name__}")
    if len(m["files"]) != m["ranks"] or [f.get("rank") for f in m["files"]] != list(range(m["ranks"])):
        raise ValueError(f"commit marker {path}: field 'files' must list ranks 0..{m['ranks'] - 1} once each")
    for f in m["files"]:
        w = f.get("weights")
        if w is not None and not (isinstance(w, dict) and isinstance(w.get("path"), str)
                                  and isinstance(w.get("sha256"), str)):
            raise ValueError(f"commit marker {path}: rank {f['rank']}'s 'weights' must be {{path, sha256}}")
    m["stage_dir"] = os.path.dirname(os.path.dirname(os.path.abspath(path)))
    m["marker"] = os.path.abspath(path)
    return m


def committed(out_dir: str) -> list[dict]:
    """Valid commit markers of ``out_dir``, newest first. A malformed marker is logged and skipped, and so is one
    that a job wrote after a later lease generation took the folder over (:func:`stale_reason`)."""
    out = []
    claims = _claims_adopted(out_dir)
    for step in committed_steps(out_dir):
        try:
            m = read_marker(commit_file(out_dir, step))
        except ValueError as e:
            log.warning("skipping %s", e)
            continue
        if why := stale_reason(m, claims):
            log.warning("skipping commit marker %s: %s", m["marker"], why)
            continue
        out.append(m)
    return out


def _claims_adopted(out_dir: str) -> dict[int, set[int] | None]:
    """Lease generation -> the committed steps its job found valid when it claimed the folder (None: a claim from
    before claims recorded them)."""
    out: dict[int, set[int] | None] = {}
    claims = os.path.join(out_dir, "lease.claims")
    for name in os.listdir(claims) if os.path.isdir(claims) else []:
        if not name.isdigit():
            continue
        try:
            steps = read_json(os.path.join(claims, name)).get("adopted_steps")
        except (OSError, ValueError, AttributeError):
            steps = None
        out[int(name)] = None if steps is None else {int(s) for s in steps}
    return out


def stale_reason(marker: dict, claims: dict[int, set[int] | None]) -> str | None:
    """Why ``marker`` is not part of the folder's history, or None: a marker of lease generation g counts only if
    every later generation adopted its step when it claimed the folder. One that appears after a takeover (its job
    stalled between its fence and its rename) was adopted by nobody."""
    gen = int(marker.get("generation") or 0)
    for later, adopted in sorted(claims.items()):
        if later > gen and adopted is not None and marker["step"] not in adopted:
            return (f"written by lease generation {gen} (job {marker.get('job_id')}) but not adopted by generation "
                    f"{later}, which took the stage folder over before it appeared")
    return None


def valid_rows(out_dir: str, rows: list[dict]) -> list[dict]:
    """Metric rows that belong to the folder's history: a row of lease generation g at step s is dropped when a
    later generation claimed the folder with no committed step at or past s (the row was written after it took
    over, by a job that stalled past its fence)."""
    claims = {g: max(a) if a else 0 for g, a in _claims_adopted(out_dir).items() if a is not None}
    if not claims:
        return rows
    return [r for r in rows if all(r.get("step", 0) <= upto for g, upto in claims.items()
                                   if g > int(r.get("generation") or 0))]


def file_of(marker: dict, rank: int) -> tuple[str, str]:
    """(absolute path, sha256) of the file that holds rank ``rank``'s state: its own, or where fewer ranks wrote
    (replicated state), the file of the writing rank it replicates: rank 0 when one rank wrote for all, its TP
    rank's (``rank % tp``) when the first data-parallel replica wrote."""
    f = marker["files"][rank % marker["ranks"]]
    return os.path.join(marker["stage_dir"], f["path"]), f["sha256"]


def weights_of(marker: dict, tp_rank: int) -> tuple[str, str]:
    """(absolute path, sha256) of the weights of TP rank ``tp_rank``: the weights file that its rank in the first
    data-parallel replica saved, or (a marker from before weights had their own file) that rank's one file."""
    f = marker["files"][tp_rank % marker["ranks"]]
    w = f.get("weights") or f
    return os.path.join(marker["stage_dir"], w["path"]), w["sha256"]


def write_marker(out_dir: str, step: int, layout: dict, writers: int, job_id: str | None = None,
                 generation: int | None = None, fence=fenced.no_fence) -> str:
    """Rank 0, after barrier 1: one marker over the ``writers`` rank files of ``step`` and the weights files of
    ranks ``0..min(writers, tp)-1`` (data-parallel rank 0 of each TP rank; digests from sidecars), with the job id
    and lease generation that wrote it, published between two fences (``fenced.publish``)."""
    def entry(path: str) -> dict:
        with open(path + ".sha256", encoding="utf-8") as f:
            return {"path": os.path.relpath(path, out_dir), "sha256": f.read().split()[0]}

    files = []
    for r in range(writers):
        files.append({"rank": r, **entry(rank_file(out_dir, r, step))})
        if r < int(layout["tensor_parallel"]):
            files[-1]["weights"] = entry(weights_file(out_dir, r, step))
    dest = commit_file(out_dir, step)
    fenced.write_json(dest, {"step": step, "ranks": writers, "layout": {k: int(layout[k]) for k in LAYOUT_FIELDS},
                             "files": files, "job_id": job_id, "generation": generation}, fence)
    return dest


def world_sum(values: list[int], world: int) -> list[int]:
    """Element-wise sum of small non-negative ints over every rank (one AllReduce in the world group)."""
    if world <= 1:
        return list(values)
    import numpy as np
    from mindspore import Tensor, ops

    out = ops.AllReduce()(Tensor(np.asarray(values, np.float32)))
    return [int(round(float(x))) for x in out.asnumpy()]


def barrier(ok: bool, world: int, what: str) -> None:
    """Every rank says whether its part of ``what`` succeeded; all raise unless all succeeded (no rank waits
    forever in a later collective for a rank that gave up)."""
    n = world_sum([1 if ok else 0], world)[0]
    if n != world:
        raise RuntimeError(f"{what}: only {n} of {world} ranks succeeded; not committed (see the ranks' logs)")


class StepDisagreement(RuntimeError):
    """Ranks would resume from different steps (each read another set of markers): refused on every rank."""


def _same_candidate(c, world: int, what: str) -> None:
    """Every rank is looking at the same step: one AllReduce of the step (in two exact float32 halves), each rank
    compares the sum with ``world`` times its own, then one more AllReduce so a rank whose own sum looked right
    (a step between the others') refuses too. No-op for candidates without a step (an ``init_from`` path)."""
    step = c.get("step") if isinstance(c, dict) else None
    if step is None or world <= 1:
        return
    hi, lo = divmod(int(step), 4096)
    sum_hi, sum_lo = world_sum([hi, lo], world)
    mine = 0 if (sum_hi, sum_lo) == (world * hi, world * lo) else 1
    n = world_sum([mine], world)[0]
    if n:
        mean = (sum_hi * 4096 + sum_lo) / world
        raise StepDisagreement(f"{what}: the ranks did not choose the same step (this rank: step {step}, mean over "
                               f"the {world} ranks: {mean:g}; {n} rank(s) differ): their views of "
                               f"{os.path.dirname(c.get('marker', '')) or 'the checkpoints folder'} differ (a shared "
                               f"filesystem that is not coherent, or markers written during the start); refused "
                               f"rather than resuming ranks at different steps")


def same_view(markers: list, world: int, what: str) -> None:
    """Every rank sees committed steps, or none does: one AllReduce before the resume branches. A rank whose
    listing is empty while the others' is not (a stale NFS directory cache) would start fresh and never join the
    others' step agreement, which would then wait on it for ever; here every rank refuses instead."""
    if world <= 1:
        return
    n = world_sum([1 if markers else 0], world)[0]
    if 0 < n < world:
        raise StepDisagreement(f"{what}: {n} of {world} ranks see committed steps and {world - n} see none: their "
                               f"views of the checkpoints folder differ (a shared filesystem that is not coherent, "
                               f"e.g. an NFS directory cache); refused rather than some ranks resuming and others "
                               f"starting from scratch")


def agree(candidates: list, try_load, world: int, what: str, last_word: bool = False):
    """First candidate whose ``try_load`` succeeds on EVERY rank: ``(candidate, result)``, or None.

    Before each candidate the ranks check that they all consider the same step (:func:`_same_candidate`); ranks
    whose marker lists differ raise :class:`StepDisagreement` on every rank. A rank whose file is missing or
    corrupt makes every rank move on to the next (older) candidate; a :class:`LayoutMismatch` on any rank is
    raised on every rank (a wrong layout is never fallen back from). With ``last_word`` (one candidate, nothing
    older to fall back to) a failure is raised on every rank instead: the failing rank raises its own error, the
    others say which rank count failed.
    """
    return _agree(candidates, try_load, world, what, last_word, [])


def _agree(candidates, try_load, world, what, last_word, failures):
    for c in candidates:
        _same_candidate(c, world, what)
        result, bad, refused, own = None, 0, 0, None
        try:
            result = try_load(c)
        except LayoutMismatch as e:
            refused, own = 1, e
        except Exception as e:  # noqa: BLE001 - any unreadable/corrupt file means "the previous step" for all
            bad, own = 1, e
        n_bad, n_refused = world_sum([bad, refused], world)
        if n_refused or (n_bad and last_word):
            if own is not None:
                raise own
            kind = LayoutMismatch if n_refused else ValueError
            raise kind(f"{what}: {n_refused or n_bad} other rank(s) could not use their file (see their logs)")
        if n_bad == 0:
            return c, result
        failures.append((c, own, n_bad))
        log.warning("%s step %s not usable on %d rank(s)%s; every rank falls back to the previous committed step",
                    what, c.get("step") if isinstance(c, dict) else c, n_bad,
                    f" (here: {type(own).__name__}: {own})" if own else "")
    return None


def agree_or_explain(candidates: list, try_load, world: int, what: str):
    """:func:`agree`, but when no candidate verifies on every rank: a ``ValueError`` naming each marker and why
    (this rank's reason, or how many other ranks failed), never None. Resume uses it: committed steps exist, so
    a silent fresh start would train over them."""
    failures: list = []
    found = _agree(candidates, try_load, world, what, False, failures)
    if found is not None:
        return found
    lines = "; ".join(f"{c.get('marker', c)}: " + (f"{type(e).__name__}: {e}" if e is not None else
                                                   f"{n} other rank(s) failed") for c, e, n in failures)
    raise ValueError(f"{what}: none of the {len(candidates)} committed steps verifies on every rank ({lines}); "
                     f"repair or restore those files, or move the checkpoints folder aside to train this stage "
                     f"again from its start")


def prune(root: str, out_dir: str, keep: int, rank: int, newest: int | None = None) -> None:
    """Remove this rank's files (and, on rank 0, markers) outside the newest ``keep`` committed steps up to
    ``newest`` (the step just committed). Nothing newer than ``newest`` is touched: a save in flight, or steps of
    an earlier attempt newer than the step this run resumed from (a resume that fell back past a corrupt step
    must not count those markers and delete what it writes now)."""
    steps = [s for s in committed_steps(out_dir) if newest is None or s <= newest]
    if not steps:
        return
    kept = set(steps[:max(keep, 1)])
    for p in glob.glob(os.path.join(root, "checkpoints", "step_*.ckpt")):  # state and weights files
        m = re.match(r"^step_(\d{8})(\.weights)?\.ckpt$", os.path.basename(p))
        if m and int(m.group(1)) <= steps[0] and int(m.group(1)) not in kept:
            for f in (p, p + ".sha256"):
                _remove(f)
    if rank == 0:
        for s in steps[max(keep, 1):]:
            _remove(commit_file(out_dir, s))


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
