"""Training that continues a release (``train.from_release: weights``): the model it starts from, the earlier
release's validation sets it also scores, and the replay share of earlier releases' rows it mixes in."""

from __future__ import annotations

import os
from pathlib import Path

from pipeline.config import MindloomConfig
from pipeline.io import read_json
from pipeline.tasks.corpus_choice import corpus_summary_of_run, find_eval_sets


def release_checkpoint(data_root: str | Path, corpus: dict, last_stage: str) -> str | None:
    """Commit marker of the model an incremental release continues: the final checkpoint of stage ``last_stage`` of
    the newest training run (by its commit's time) whose corpus is the release this one extends; None when the
    corpus extends no release. A run's corpus is the ``data_dir`` of its stage's ``job.json``: one scan of the
    training runs' folders, no index to keep."""
    from pipeline.train.checkpoint.commit import commit_file, committed_steps

    release = (corpus.get("extends_release") or {}).get("name")
    if not release:
        return None
    previous = Path(corpus_summary_of_run(data_root, release)["mindrecord_dir"]).resolve()
    found = []
    for job_path in sorted((Path(data_root) / "train").glob(f"*/{last_stage}/job.json")):
        stage = job_path.parent
        if Path(read_json(job_path)["data_dir"]).resolve() != previous or not (stage / "summary.json").exists():
            continue
        steps, final = committed_steps(str(stage)), read_json(stage / "summary.json").get("steps")
        if steps and steps[0] == final:
            marker = commit_file(str(stage), final)
            found.append((os.stat(marker).st_mtime_ns, marker))
    if not found:
        raise FileNotFoundError(f"train.from_release: weights: no training run on release {release!r} finished "
                                f"stage {last_stage!r} with a committed final checkpoint (looked for job.json with "
                                f"data_dir {previous} under {Path(data_root) / 'train'}); train that release first, "
                                f"or set train.from_release: scratch")
    return max(found)[1]


def release_eval_sets(cfg: MindloomConfig, corpus: dict) -> dict[str, str]:
    """With ``train.from_release: weights`` on a corpus that extends a release, that release's validation sets,
    named ``<domain>@<release>``: every stage also scores them, so the held-out loss on the earlier release is
    reported before (the earlier run's own evaluation) and after continuing on the delta."""
    release = (corpus.get("extends_release") or {}).get("name")
    if cfg.train.from_release != "weights" or not release:
        return {}
    sets = find_eval_sets(corpus_summary_of_run(cfg.data_root, release))
    return {f"{domain}@{release}": path for domain, path in sets.items()}


def earlier_releases(data_root: str | Path, corpus: dict) -> list[dict]:
    """The corpus summaries of the releases ``corpus`` extends, newest first (each release names the one before)."""
    chain, seen = [], set()
    release = (corpus.get("extends_release") or {}).get("name")
    while release and release not in seen:
        seen.add(release)
        summary = corpus_summary_of_run(data_root, release)
        chain.append(summary)
        release = (summary.get("extends_release") or {}).get("name")
    return chain


def replay_files(cfg: MindloomConfig, corpus: dict) -> list[str]:
    """MindRecord files of earlier releases to train on beside the delta, ``train.replay_share`` of the rows.

    Whole files, drawn in a seeded order from every earlier release, until the replay rows are nearest
    ``share / (1 - share)`` times the delta's rows (file row counts from the manifests, nothing is read); the
    trainer reports the share it got. A release must have the delta's row length, else the error names both.
    """
    import random

    from pipeline.sink.mindrecord import MANIFEST

    share = cfg.train.replay_share
    if share <= 0 or not corpus.get("extends_release"):
        return []
    own = read_json(Path(corpus["mindrecord_dir"]) / MANIFEST)
    pool = []
    for summary in earlier_releases(cfg.data_root, corpus):
        folder = Path(summary["mindrecord_dir"])
        manifest = read_json(folder / MANIFEST)
        if manifest["seq_len"] != own["seq_len"]:
            raise ValueError(f"train.replay_share: release {Path(summary['run_dir']).name!r} has rows of seq_len "
                             f"{manifest['seq_len']}, this corpus {own['seq_len']}; set train.replay_share: 0")
        pool += [(str(folder / s["file"]), int(s["samples"])) for s in manifest["shards"]]
    random.Random(cfg.seed).shuffle(pool)
    want, got, chosen = share / (1.0 - share) * int(own["samples"]), 0, []
    for path, rows in pool:
        if got >= want or abs(got + rows - want) > abs(got - want) and chosen:
            break
        chosen.append(path)
        got += rows
    return sorted(chosen)
