"""Which published corpus a training run reads: a corpus run's summary, its validation sets and end-of-document id,
and the checks made before any training starts (the manifest is the published one; every path stays under the
allowed roots)."""

from __future__ import annotations

from pathlib import Path

from pipeline.config import MindloomConfig
from pipeline.io import read_json, safe_run_id


def find_eval_sets(corpus: dict) -> dict[str, str]:
    """Validation MindRecord folders per domain for the stage evaluation, looked up in this order:

    1. ``corpus["val_mindrecord_dirs"]``: an explicit ``{domain: dir}`` in the corpus summary;
    2. ``corpus["val_mindrecord_dir"]``, else ``<corpus["run_dir"]>/mindrecord_val``: every sub-folder holding
       ``*.mindrecord*`` data files is one domain, named after the folder.

    Empty when none exist (the stage then reports ``eval.skipped``); a listed folder that is missing is an error.
    """
    explicit = corpus.get("val_mindrecord_dirs")
    if explicit:
        missing = {d: p for d, p in explicit.items() if not Path(p).is_dir()}
        if missing:
            d, p = next(iter(missing.items()))
            raise FileNotFoundError(f"corpus val_mindrecord_dirs[{d!r}]: {p} is not a folder")
        return {d: str(p) for d, p in sorted(explicit.items())}
    root = corpus.get("val_mindrecord_dir") or (Path(corpus["run_dir"]) / "mindrecord_val" if corpus.get("run_dir")
                                                 else None)
    if not root or not Path(root).is_dir():
        return {}
    return {sub.name: str(sub) for sub in sorted(Path(root).iterdir())
            if sub.is_dir() and any(not f.name.endswith(".db") for f in sub.glob("*.mindrecord*"))}


def corpus_summary_of_run(data_root: str | Path, corpus_run: str) -> dict:
    """The ``corpus_summary.json`` of corpus run ``corpus_run``, looked up under ``<data_root>/runs/`` only."""
    path = Path(data_root) / "runs" / safe_run_id(corpus_run) / "corpus_summary.json"
    if not path.is_file():
        raise FileNotFoundError(f"corpus_run: no published corpus for run {corpus_run!r} ({path} does not exist; "
                                f"is it a finished corpus_build or corpus_refresh run?)")
    return read_json(path)


def resolve_corpus(params: dict, asset_extras: list[dict] | None = None,
                   cfg: MindloomConfig | None = None, manifest_path: str | Path | None = None,
                   full_check: bool = False) -> dict:
    """Which corpus to train on, first match wins:

    1. ``manifest_path``, a ``corpus_summary.json`` (the CLI's ``--corpus``; never taken from a run's conf);
    2. the ``corpus_run`` param, a corpus run id resolved under ``<data_root>/runs/``;
    3. the triggering Asset event;
    4. the latest published corpus.

    Before any training starts, the manifest must have the digest the corpus summary recorded and every shard the
    manifest's size: a stat per file, whatever the corpus size (each file was fully verified by the writer that
    wrote it).  ``full_check`` also hashes every file; ``mindloom verify DIR`` re-reads every row.
    """
    from pipeline import confine
    from pipeline.form import config_from_params
    from pipeline.sink import mindrecord
    from pipeline.tasks import corpus as corpus_mod

    cfg = cfg or config_from_params(params)
    if manifest_path:
        summary = read_json(manifest_path)
    elif params.get("corpus_run"):
        summary = corpus_summary_of_run(cfg.data_root, str(params["corpus_run"]))
    elif asset_extras and any("mindrecord_dir" in e for e in asset_extras):
        summary = [e for e in asset_extras if "mindrecord_dir" in e][-1]
    else:
        summary = corpus_mod.latest_corpus(cfg.data_root)
    if not manifest_path:               # a corpus named by a run's conf or an Asset event stays under data_root
        roots = confine.allowed_roots(cfg.data_root)
        summary = dict(summary)         # from here on only the resolved paths that were checked are read
        for key in ("mindrecord_dir", "run_dir", "val_mindrecord_dir"):
            if summary.get(key):
                summary[key] = confine.check_path(summary[key], roots, f"corpus {key}")
        if summary.get("val_mindrecord_dirs"):
            summary["val_mindrecord_dirs"] = {
                domain: confine.check_path(path, roots, f"corpus val_mindrecord_dirs[{domain!r}]")
                for domain, path in summary["val_mindrecord_dirs"].items()}
    check_manifest_digest(summary)
    mindrecord.verify(summary["mindrecord_dir"], full_read=False, hashes=full_check)
    return {k: v for k, v in summary.items() if k != "stats"}


def check_manifest_digest(summary: dict) -> None:
    """The corpus' ``manifest.json`` is the one published (``manifest_sha256`` of the summary, when recorded)."""
    import hashlib

    from pipeline.sink import mindrecord

    path = Path(summary["mindrecord_dir"]) / mindrecord.MANIFEST
    want = summary.get("manifest_sha256")
    if want and path.exists() and hashlib.sha256(path.read_bytes()).hexdigest() != want:
        raise mindrecord.ShardError(f"{path}: differs from the published corpus (manifest sha256 {want[:16]}…); "
                                    "the corpus was changed after publishing, run `mindloom verify` on it")


def corpus_eos_id(corpus: dict) -> int | None:
    """The end-of-document token of a published corpus: its summary's ``eos_id``, else its manifest's (corpora
    published before the summary carried it); None when neither says (rows then train with causal attention)."""
    if corpus.get("eos_id") is not None:
        return int(corpus["eos_id"])
    path = Path(corpus.get("mindrecord_dir") or "") / "manifest.json"
    if corpus.get("mindrecord_dir") and path.is_file():
        eos = read_json(path).get("eos_id")
        return None if eos is None else int(eos)
    return None
